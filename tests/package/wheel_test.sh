#!/usr/bin/env bash
# wheel_test.sh SOURCE_DIR BUILD_DIR BASE_DIR — the package_wheel test
# (tests/package/CMakeLists.txt, label package):
#   1. scripts/build_wheel.py makes the binary wheel from BUILD_DIR (KVTIER_PYTHON
#      runs it); it must be a manylinux wheel with kvtierd and cachectl inside;
#   2. the README's wheel block (<!-- install: wheel -->) runs as written, in a
#      directory holding only the wheel and a configuration, with a plain python3
#      (the interpreter KVTIER_PYTHON's environment was made from) and no source
#      tree: a fresh virtual environment, `pip install` of the wheel offline
#      (numpy from BASE_DIR/wheels, scripts/image_base.sh's; wheels only, so
#      nothing can be compiled), and kvtierd from the environment's console
#      command, in the foreground;
#   3. the environment's Python commits blocks and reads them back; its cachectl
#      sees them; its programs load their libraries from the wheel;
#   4. SIGTERM stops kvtierd, and the block ends with status 0.
# Everything lives in BUILD_DIR/package-wheel-test and is removed at the end;
# nothing is left running.
set -euo pipefail
source_dir=$1 build=$2 base=$3
work=$build/package-wheel-test
started=$SECONDS
step() { echo "== [$((SECONDS - started)) s] $*"; }
fail() { echo "FAIL: $*"; [ -f "$work/block.log" ] && { echo "--- the block's output:"; cat "$work/block.log"; }; exit 1; }
source "$source_dir/tests/package/readme_block.sh"
instance=kvtier-test.wheel.$$
block_pid="" daemon_pid=""
cleanup() {
  set +e
  for pid in $daemon_pid $block_pid; do
    kill -TERM "$pid" 2>/dev/null
  done
  [ -n "$block_pid" ] && wait "$block_pid" 2>/dev/null
  rm -f /dev/shm/"$instance".*
  rm -rf "$work"
}
trap cleanup EXIT
rm -rf "$work"
mkdir -p "$work/dist" "$work/user" "$work/home" "$work/run" "$work/bin"
chmod 0700 "$work/run"

step "scripts/build_wheel.py $build"
wheel=$("${KVTIER_PYTHON:?}" "$source_dir/scripts/build_wheel.py" "$build" "$work/dist") || fail "the wheel did not build"
name=$(basename "$wheel")
echo "   $name ($(du -h "$wheel" | cut -f1))"
case "$name" in
  kvtier-*-cp3*-manylinux_*_x86_64.whl) ;;
  *) fail "$name is not a manylinux wheel" ;;
esac
"$KVTIER_PYTHON" -m auditwheel show "$wheel" >"$work/show.log"
sed -n "2,3p" "$work/show.log" | sed "s/^/   /"
"$KVTIER_PYTHON" - "$wheel" <<'PY' || fail "the wheel lacks what it must hold"
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
for need in ("kvtier/bin/kvtierd", "kvtier/bin/cachectl", "kvtier/_commands.py"):
    assert need in names, need
assert any(n.startswith("kvtier/_native.") for n in names)
libs = sorted(n.split("/")[1] for n in names if n.startswith("kvtier.libs/"))
print("   kvtier.libs:", " ".join(libs))
ep = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
text = zipfile.ZipFile(sys.argv[1]).read(ep).decode()
assert "kvtierd = kvtier._commands:kvtierd" in text and "cachectl = kvtier._commands:cachectl" in text, text
PY

step "the README's wheel block, offline, in an empty directory"
readme_block "$source_dir/README.md" wheel >"$work/block.sh"
[ -s "$work/block.sh" ] || fail "README.md has no <!-- install: wheel --> block"
sed 's/^/   | /' "$work/block.sh"
cp "$wheel" "$work/user/"
cat >"$work/user/kvtierd.yaml" <<YAML
instance: $instance
socket: /run/kvtier/kvtierd.sock
backend: host
profiles:
  - name: test
    layers: 2
    kv_heads: 2
    head_dim: 8
    dtype: fp32
    block_tokens: 4
    gpu_blocks: 64
    host_blocks: 256
YAML
# python3: the plain interpreter the project's environment was made from (the
# wheel's CPython), not that environment; no compiler is needed or reachable
# through pip (wheels only, no index).
base_python=$("$KVTIER_PYTHON" -c 'import sys; print(sys._base_executable)')
ln -s "$base_python" "$work/bin/python3"
(cd "$work/user" && exec env -i PATH="$work/bin:/usr/bin:/bin" HOME="$work/home" XDG_RUNTIME_DIR="$work/run" \
   PIP_NO_INDEX=1 PIP_FIND_LINKS="$base/wheels" PIP_ONLY_BINARY=:all: PIP_NO_CACHE_DIR=1 \
   PIP_DISABLE_PIP_VERSION_CHECK=1 bash -euo pipefail "$work/block.sh") >"$work/block.log" 2>&1 &
block_pid=$!
for _ in $(seq 1200); do
  grep -q "ready: listening" "$work/block.log" && break
  kill -0 "$block_pid" 2>/dev/null || fail "the block ended before kvtierd listened"
  sleep 0.1
done
daemon_pid=$(sed -n 's/.*ready: listening on .* (pid \([0-9]*\)).*/\1/p' "$work/block.log")
[ -n "$daemon_pid" ] || fail "kvtierd did not listen within 120 s"
grep -E "Successfully installed|ready: listening" "$work/block.log" | sed 's/^/   /'
venv=$work/home/kvtier-env
socket=$work/run/kvtierd.sock
exe=$(readlink -f "/proc/$daemon_pid/exe")
case "$exe" in
  "$venv"/lib/python3*/site-packages/kvtier/bin/kvtierd) echo "   kvtierd (pid $daemon_pid) is $exe" ;;
  *) fail "the running kvtierd is $exe, not the environment's" ;;
esac

step "the environment's Python client commits blocks and reads them back"
env -i "$venv/bin/python" -c '
import sys, kvtier
assert kvtier.__file__.startswith(sys.argv[1]), kvtier.__file__
c = kvtier.Client(socket=sys.argv[2], profile="test")
toks = list(range(1, 13))
with c.allocate(3) as w:
    for i in range(3):
        w.block(i)[...] = i + 1
    assert c.commit(w, "wheel-chat", toks) == (3, 0)
assert c.probe(toks) == 3
with c.acquire(toks + [99], session="wheel-chat") as lease:
    lease.wait()
    means = [float(lease.block(i).mean()) for i in range(lease.matched)]
assert means == [1.0, 2.0, 3.0], means
print("   kvtier", kvtier.__version__, "from", kvtier.__file__, "- read back:", means)
' "$venv" "$socket" || fail "the Python client failed"

step "the environment's cachectl"
"$venv/bin/cachectl" --socket "$socket" sessions | tee "$work/sessions.log" | sed 's/^/   /'
grep -Eq '^wheel-chat +- +- +3 +3 +0 +12 ' "$work/sessions.log" || fail "cachectl sessions does not list wheel-chat's 3 blocks"

step "the programs load the wheel's libraries"
site=$(dirname "$(dirname "$exe")")
for prog in "$site/bin/kvtierd" "$site/bin/cachectl"; do
  ldd "$prog" >"$work/ldd.log"
  ! grep -q "not found" "$work/ldd.log" || { cat "$work/ldd.log"; fail "$prog misses libraries"; }
  # Every library is the wheel's (kvtier.libs) or one the manylinux policy promises.
  outside=$(awk '$2 == "=>" && $1 !~ /^lib(c|m|stdc\+\+|gcc_s|pthread|dl|rt|resolv)\.so\.[0-9]+$/ {print $3}' \
              "$work/ldd.log" | xargs -r readlink -f | grep -v "^$site.libs/" || true)
  [ -z "$outside" ] || fail "$prog loads these from outside the wheel: $outside"
  echo "   $(basename "$prog"): $(grep -c "=> .*/kvtier.libs/" "$work/ldd.log") libraries from kvtier.libs, the rest glibc's and libstdc++'s"
done

step "SIGTERM stops kvtierd; the block ends with status 0"
kill -TERM "$daemon_pid"
rc=0
wait "$block_pid" || rc=$?
block_pid="" daemon_pid=""
[ "$rc" -eq 0 ] || fail "the block ended with status $rc"
grep -q "kvtierd: info: stopped" "$work/block.log" || fail "kvtierd did not stop cleanly"
step "PASS"
