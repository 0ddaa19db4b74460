#!/usr/bin/env bash
# image_test.sh SOURCE_DIR BUILD_DIR BASE_DIR — the container_image test
# (tests/image/CMakeLists.txt, label image): builds the Containerfile's kvtierd
# stage from this build, offline, and runs kvtierd and its clients inside it.
#   1. scripts/image_context.sh stages the context from BUILD_DIR (cmake
#      --install, the kvtier wheel); BASE_DIR (scripts/image_base.sh) adds the
#      numpy wheel;
#   2. BASE_DIR/rootfs.tar (mmdebstrap: Debian 12 with the Containerfile's
#      RUNTIME_PACKAGES) becomes the base image, in place of debian:bookworm-slim;
#   3. buildah bud --isolation chroot builds the Containerfile's kvtierd stage
#      on it (PIP_ARGS=--no-index), and the image's user, volume, health check
#      and entry point are checked;
#   4. one `buildah run` starts kvtier-entrypoint (kvtierd, as the image's user,
#      socket in a host directory mounted as the volume); others, as a client
#      container would, run the health check, cachectl and the Python module
#      against it through that volume; SIGTERM stops kvtierd cleanly.
# Everything lives in BUILD_DIR/image-test (buildah's own storage included) and
# is removed at the end; nothing is left running. Exit 77 (skip) only where
# buildah cannot run at all. KVTIER_PYTHON: the interpreter that builds the wheel.
set -euo pipefail
source_dir=$1 build=$2 base=$3
work=$build/image-test
started=$SECONDS
step() { echo "== [$((SECONDS - started)) s] $*"; }
fail() { echo "FAIL: $*"; exit 1; }

command -v buildah >/dev/null || { echo "SKIP: buildah is not installed (scripts/setup.sh installs it)"; exit 77; }
if [ "$(id -u)" -ne 0 ]; then
  # Rootless: the whole test in buildah's user namespace, where it is root
  # (buildah mount and chown need that). Only root has run it so far.
  buildah unshare true 2>/dev/null ||
    { echo "SKIP: buildah cannot run rootless here (no user namespace: /etc/subuid, /etc/subgid); run as root"; exit 77; }
  exec buildah unshare -- bash "$0" "$@"
fi
[ -f "$base/.kvtier-ready" ] || fail "$base is not made: scripts/image_base.sh makes it (scripts/test.sh runs it)"

storage=$work/storage
driver=${KVTIER_IMAGE_STORAGE_DRIVER:-overlay}
bud() { buildah --root "$storage" --runroot "$work/runroot" --storage-driver "$driver" "$@"; }
daemon_pid="" run_pid=""
cleanup() {
  set +e
  # A kvtierd that became ready after the test gave up on it: its pid is in its log.
  [ -z "$daemon_pid" ] && [ -n "$run_pid" ] &&
    daemon_pid=$(sed -n 's/.*ready: listening on .* (pid \([0-9]*\)).*/\1/p' "$work/kvtierd.log" 2>/dev/null)
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
    kill -TERM "$daemon_pid"
    for _ in $(seq 100); do kill -0 "$daemon_pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$daemon_pid" 2>/dev/null && kill -KILL "$daemon_pid"
  fi
  if [ -n "$run_pid" ] && kill -0 "$run_pid" 2>/dev/null; then kill -TERM "$run_pid"; fi
  [ -n "$run_pid" ] && wait "$run_pid" 2>/dev/null
  if [ -d "$storage" ]; then
    bud rm --all >/dev/null 2>&1
    bud rmi --all --force >/dev/null 2>&1
    # Whatever buildah left mounted under its storage (nothing, normally).
    grep -o " $storage/[^ ]*" /proc/self/mountinfo | sort -r | while read -r m; do umount "$m"; done
  fi
  rm -rf "$storage" "$work/runroot" "$work/tmp"
}
trap cleanup EXIT
cleanup
rm -rf "$work"
mkdir -p "$work/tmp"
export TMPDIR=$work/tmp  # buildah's layer blobs while it commits

step "stage the build context from $build"
KVTIER_PYTHON=${KVTIER_PYTHON:-python3} "$source_dir/scripts/image_context.sh" "$build" "$work/context" >/dev/null
cp "$base"/wheels/*.whl "$work/context/wheels/"
ls "$work/context/wheels"

step "import the base: $base/rootfs.tar ($driver storage)"
import_base() {
  local c m
  c=$(bud from scratch) && m=$(bud mount "$c") && tar -C "$m" -xf "$base/rootfs.tar" && bud umount "$c" >/dev/null &&
    bud commit --quiet --rm "$c" localhost/kvtier-test-base >/dev/null
}
if ! import_base; then
  [ "$driver" = vfs ] && fail "cannot import the base image"
  echo "   ($driver storage does not work here; using vfs)"
  cleanup
  driver=vfs
  import_base || fail "cannot import the base image"
fi

step "buildah bud --target kvtierd (Containerfile, offline)"
bud bud --isolation chroot --format docker --pull=never --quiet \
  --build-arg BASE=localhost/kvtier-test-base --build-arg PIP_ARGS=--no-index \
  --target kvtierd -f "$source_dir/Containerfile" -t localhost/kvtier:test "$work/context" >"$work/bud.log" 2>&1 ||
  { cat "$work/bud.log"; fail "the image does not build"; }
bud images

step "the image's configuration"
bud inspect --type image localhost/kvtier:test >"$work/image.json"
python3 - "$work/image.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))["Docker"]["config"]
def check(what, got, want):
    print(f"   {what}: {got}")
    if got != want:
        sys.exit(f"FAIL: the image's {what} is {got!r}, expected {want!r}")
check("user", c.get("User"), "10001:10001")
check("volumes", sorted(c.get("Volumes") or {}), ["/run/kvtier"])
check("entrypoint", c.get("Entrypoint"), ["kvtier-entrypoint"])
check("cmd", c.get("Cmd") or [], [])
check("healthcheck", (c.get("Healthcheck") or {}).get("Test"), ["CMD", "cachectl", "status"])
env = dict(e.split("=", 1) for e in c.get("Env", []))
check("KVTIER_SOCKET", env.get("KVTIER_SOCKET"), "/run/kvtier/kvtierd.sock")
EOF

ctr=$(bud from --pull=never localhost/kvtier:test)
# buildah 1.28 mounts the image's anonymous volume over a -v of the same path
# now and then (its mounts' order varies): the test gives the volume itself.
bud config --volume /run/kvtier- "$ctr"
vol=$work/run-kvtier  # the volume: kvtierd's socket, seen by every container that mounts it
mkdir -m 0750 "$vol"
chown 10001:10001 "$vol"
cat >"$work/kvtierd.yaml" <<'EOF'
instance: kvtier-image-test
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
EOF
# A container of the image with the volume mounted, as the image's user;
# as_root: the same as root.
in_image() { bud run --isolation chroot -v "$vol:/run/kvtier" "$ctr" -- "$@"; }
as_root() { bud run --isolation chroot --user 0:0 -v "$vol:/run/kvtier" "$ctr" -- "$@"; }

step "every library kvtierd and cachectl load is in the image"
in_image sh -c 'ldd /usr/local/bin/kvtierd /usr/local/bin/cachectl' >"$work/ldd.log"
! grep "not found" "$work/ldd.log" || fail "libraries missing from the image (the Containerfile's RUNTIME_PACKAGES)"

step "the entry point refuses a socket directory its user cannot write"
if bud run --isolation chroot "$ctr" -- sh -c 'KVTIER_SOCKET=/var/log/kvtierd.sock exec kvtier-entrypoint' \
     >"$work/refused.log" 2>&1; then
  fail "kvtier-entrypoint started with an unwritable socket directory"
fi
cat "$work/refused.log"
grep -q "cannot write the socket's directory /var/log" "$work/refused.log" || fail "not the expected refusal"

step "kvtierd from the entry point, its socket in the volume"
bud run --isolation chroot -v "$vol:/run/kvtier" -v "$work/kvtierd.yaml:/etc/kvtier-test/kvtierd.yaml:ro" \
  -e KVTIER_CONFIG=/etc/kvtier-test/kvtierd.yaml "$ctr" -- kvtier-entrypoint >"$work/kvtierd.log" 2>&1 &
run_pid=$!
for _ in $(seq 300); do
  grep -q "ready: listening" "$work/kvtierd.log" && break
  kill -0 "$run_pid" 2>/dev/null || { cat "$work/kvtierd.log"; fail "kvtierd exited at start"; }
  sleep 0.1
done
cat "$work/kvtierd.log"
# Chroot isolation keeps the host's PID namespace: the pid kvtierd logs is this machine's.
daemon_pid=$(sed -n 's/.*ready: listening on .* (pid \([0-9]*\)).*/\1/p' "$work/kvtierd.log")
[ -n "$daemon_pid" ] || fail "kvtierd did not log that it is ready within 30 s"
uid=$(awk '/^Uid:/ {print $2}' "/proc/$daemon_pid/status")
echo "   kvtierd pid $daemon_pid runs as uid $uid; the volume holds: $(ls "$vol" | tr "\n" " ")"
[ "$uid" = 10001 ] || fail "kvtierd runs as uid $uid, not the image's user 10001"
[ -S "$vol/kvtierd.sock" ] && [ "$(stat -c %u "$vol/kvtierd.sock")" = 10001 ] ||
  fail "no socket of uid 10001 in the volume"

step "the health check (cachectl status) from another container"
in_image cachectl status | tee "$work/status.log"
grep -Eq '^backend: +host' "$work/status.log" || fail "cachectl status does not show the host backend"
grep -Eq '^profile: +test: 2 layers' "$work/status.log" || fail "cachectl status does not show the profile"

step "the Python module writes and reads blocks (as root, whom kvtierd lets in)"
as_root python3 -c '
import kvtier
c = kvtier.Client(profile="test")
toks = list(range(1, 13))
with c.allocate(3) as w:
    for i in range(3):
        w.block(i)[...] = i + 1
    assert c.commit(w, "image-chat", toks) == (3, 0)
assert c.probe(toks) == 3 and c.backend == "host"
with c.acquire(toks + [99], session="image-chat") as lease:
    lease.wait()
    means = [float(lease.block(i).mean()) for i in range(lease.matched)]
assert means == [1.0, 2.0, 3.0], means
print("   python: committed 3 blocks of session image-chat and read them back:", means)
'

step "cachectl (as the image's user) sees them"
in_image cachectl sessions | tee "$work/sessions.log"
grep -Eq '^image-chat +- +- +3 +3 +0 +12 ' "$work/sessions.log" || fail "cachectl sessions does not list image-chat's 3 blocks"
in_image cachectl stats >"$work/stats.log"
head -3 "$work/stats.log"
grep -q 'blocks 100.0% (3 of 3)' "$work/stats.log" || fail "cachectl stats does not show the 3 blocks read"

step "SIGTERM stops kvtierd; the health check then fails"
kill -TERM "$daemon_pid"
wait "$run_pid" || fail "kvtierd exited with status $? at SIGTERM"
run_pid=""
daemon_pid=""
tail -2 "$work/kvtierd.log"
grep -q "kvtierd: info: stopped" "$work/kvtierd.log" || fail "kvtierd did not stop cleanly"
[ -z "$(ls -A "$vol")" ] || fail "kvtierd left $(ls "$vol") in the volume"
if in_image cachectl status >"$work/status-after.log" 2>&1; then fail "the health check passes with kvtierd stopped"; fi
cat "$work/status-after.log"

step "PASS"
