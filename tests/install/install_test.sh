#!/usr/bin/env bash
# install_test.sh BUILD_DIR WORK_DIR CONSUMER_SRC — the install_consumer test
# (registered in cmake/KvtierInstall.cmake, which sets the KVTIER_* variables):
#   1. cmake --install BUILD_DIR into WORK_DIR/prefix;
#   2. every expected file is there, include/ holds the public headers only, and
#      the systemd unit starts kvtierd and its configuration where they install;
#   3. CONSUMER_SRC (a worker project) configures and builds against the prefix
#      with find_package(kvtier), finding it there and nowhere else;
#   4. the installed kvtierd validates the installed configuration, serves a
#      small one, and the consumer and the installed cachectl talk to it.
# Any failing step fails the test.
set -euo pipefail
build=$1 work=$2 consumer_src=$3
prefix=$work/prefix

rm -rf "$work"
mkdir -p "$work"

echo "== install into $prefix"
cmake --install "$build" --prefix "$prefix" --config "$KVTIER_BUILD_TYPE" >"$work/install.log"

echo "== installed files"
missing=0
for f in $KVTIER_EXPECT; do
  if [ -e "$prefix/$f" ]; then echo "  $f"; else echo "  MISSING $f"; missing=1; fi
done
[ "$missing" -eq 0 ] || { echo "FAIL: files missing from the install"; exit 1; }
expected_headers=$(printf '%s\n' $KVTIER_HEADERS | sort)
installed_headers=$(cd "$prefix" && find "$KVTIER_INCLUDEDIR" -type f | sort)
if [ "$installed_headers" != "$expected_headers" ]; then
  echo "FAIL: installed headers differ from the public ones:"
  diff <(echo "$expected_headers") <(echo "$installed_headers") || true
  exit 1
fi

if [ -n "$KVTIER_UNIT" ]; then
  exec_line=$(grep '^ExecStart=' "$prefix/$KVTIER_UNIT")
  case "$exec_line" in
    "ExecStart=$KVTIER_UNIT_EXEC "*"--config $KVTIER_UNIT_CONFIG"*) echo "  unit: $exec_line" ;;
    *)
      echo "FAIL: the unit's '$exec_line' does not start $KVTIER_UNIT_EXEC --config $KVTIER_UNIT_CONFIG,"
      echo "      where this build installs them (with a /usr prefix, pass -DCMAKE_INSTALL_SYSCONFDIR=/etc)"
      exit 1 ;;
  esac
fi

echo "== consumer project"
flags=()
[ -n "$KVTIER_CXX_LAUNCHER" ] && flags+=("-DCMAKE_CXX_COMPILER_LAUNCHER=$KVTIER_CXX_LAUNCHER")
[ -n "$KVTIER_CXX_FLAGS" ] && flags+=("-DCMAKE_CXX_FLAGS=$KVTIER_CXX_FLAGS" "-DCMAKE_EXE_LINKER_FLAGS=$KVTIER_CXX_FLAGS")
# No package registries: the only kvtier it may find is the one just installed.
cmake -S "$consumer_src" -B "$work/consumer" -G "$KVTIER_GENERATOR" \
  -DCMAKE_BUILD_TYPE="$KVTIER_BUILD_TYPE" -DCMAKE_CXX_COMPILER="$KVTIER_CXX" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
  -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF "${flags[@]}" >"$work/consumer-configure.log" ||
  { cat "$work/consumer-configure.log"; echo "FAIL: the consumer does not configure"; exit 1; }
found=$(sed -n 's/^kvtier_DIR:PATH=//p' "$work/consumer/CMakeCache.txt")
case "$found" in
  "$prefix"/*) echo "  find_package(kvtier): $found" ;;
  *) echo "FAIL: find_package(kvtier) found '$found', not the install in $prefix"; exit 1 ;;
esac
cmake --build "$work/consumer" >"$work/consumer-build.log" ||
  { cat "$work/consumer-build.log"; echo "FAIL: the consumer does not build"; exit 1; }
consumer=$work/consumer/kvtier-consumer
out=$("$consumer")
echo "$out"
grep -q "^kvtier $KVTIER_VERSION " <<<"$out" || { echo "FAIL: the package reports another version than $KVTIER_VERSION"; exit 1; }

echo "== installed kvtierd"
"$prefix/$KVTIER_BINDIR/kvtierd" --check-config --config "$prefix/$KVTIER_CONFIG_FILE" >/dev/null
run=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-install.XXXXXX")
instance=kvtier-test.install.$$
daemon=""
# A kvtierd still running here failed the test: kill it and remove what it left.
cleanup() {
  if [ -n "$daemon" ]; then
    kill -KILL "$daemon" 2>/dev/null || true
    wait "$daemon" 2>/dev/null || true
  fi
  # Whatever the daemon left (after a crash, or warm_restart's kept segments).
  rm -f /dev/shm/"$instance".*
  rm -rf "$run"
}
trap cleanup EXIT
daemon_failed() {
  cat "$work/kvtierd.log"
  echo "FAIL: $1"
  exit 1
}
# The small configuration of the integration tests, on a private socket and instance.
cat >"$run/kvtierd.yaml" <<YAML
instance: $instance
socket: $run/kvtierd.sock
backend: host
profiles:
  - name: consumer
    layers: 2
    kv_heads: 2
    head_dim: 32
    dtype: fp16
    block_tokens: 16
    gpu_blocks: 256
    host_blocks: 1024
YAML
"$prefix/$KVTIER_BINDIR/kvtierd" --config "$run/kvtierd.yaml" 2>"$work/kvtierd.log" &
daemon=$!
"$consumer" "$run/kvtierd.sock" || daemon_failed "the consumer could not use the installed kvtierd"
"$prefix/$KVTIER_BINDIR/cachectl" --socket "$run/kvtierd.sock" status || daemon_failed "cachectl status failed"
kill -TERM "$daemon"
rc=0
wait "$daemon" || rc=$?
daemon=""
[ "$rc" -eq 0 ] || daemon_failed "kvtierd exited with $rc after SIGTERM"
if grep -Eq 'ThreadSanitizer|AddressSanitizer|LeakSanitizer|runtime error:' "$work/kvtierd.log"; then
  daemon_failed "sanitizer report in kvtierd's log"
fi
echo "PASS"
