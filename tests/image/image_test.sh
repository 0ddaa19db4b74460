#!/usr/bin/env bash
# image_test.sh SOURCE_DIR BUILD_DIR BASE_DIR — the container_image test
# (tests/image/CMakeLists.txt, label image): builds the Containerfile's kvtierd
# stage from this build, offline, and runs kvtierd and its clients inside it.
#   1. BASE_DIR/rootfs.tar (scripts/image_base.sh, mmdebstrap: Debian 12 with
#      the Containerfile's RUNTIME_PACKAGES) becomes the base image, in place of
#      debian:bookworm-slim;
#   2. the README's image block (<!-- install: image -->) runs as written, in a
#      tree whose build/ is BUILD_DIR: scripts/image_context.sh stages the
#      context in BUILD_DIR/image (cpack's .deb, the kvtier wheel, and BASE_DIR's
#      numpy wheel through KVTIER_IMAGE_WHEELS), `podman build` builds the
#      kvtierd stage and `podman run --rm kvtier --check-config` checks the
#      configuration the package installs. podman is podman_shim.sh: buildah bud
#      and run --isolation chroot, on that base, pip offline (PIP_ARGS=--no-index);
#   3. the image's user, volume, health check and entry point are checked, and
#      that kvtierd and cachectl are the package's, with every library they load;
#   4. one `buildah run` starts kvtier-entrypoint (kvtierd, as the image's user,
#      socket in a host directory mounted as the volume); others, as a client
#      container would, run the health check, cachectl and the Python module
#      against it through that volume; SIGTERM stops kvtierd cleanly.
# Everything lives in BUILD_DIR/image-test (buildah's own storage included) and
# BUILD_DIR/image (the block's context), and is removed at the end; nothing is
# left running. Exit 77 (skip) only where buildah cannot run at all or cpack
# cannot make the package (no dpkg-shlibdeps). KVTIER_PYTHON: the interpreter
# that builds the wheel.
set -euo pipefail
source_dir=$1 build=$2 base=$3
work=$build/image-test
started=$SECONDS
step() { echo "== [$((SECONDS - started)) s] $*"; }
fail() { echo "FAIL: $*"; exit 1; }

for tool in buildah cpack dpkg-shlibdeps; do
  command -v $tool >/dev/null || { echo "SKIP: $tool is not installed (scripts/setup.sh installs it)"; exit 77; }
done
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
  rm -rf "$storage" "$work/runroot" "$work/tmp" "$build/image"
}
trap cleanup EXIT
cleanup
rm -rf "$work"
mkdir -p "$work/tmp"
export TMPDIR=$work/tmp  # buildah's layer blobs while it commits

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

step "the README's image block, in a tree whose build/ is $build"
source "$source_dir/tests/package/readme_block.sh"
tree=$work/tree
mkdir -p "$tree/bin"
ln -s "$source_dir/Containerfile" "$source_dir/scripts" "$tree/"
ln -s "$build" "$tree/build"
install -m 0755 "$source_dir/tests/image/podman_shim.sh" "$tree/bin/podman"
readme_block "$source_dir/README.md" image >"$work/block.sh"
[ -s "$work/block.sh" ] || fail "README.md has no <!-- install: image --> block"
sed 's/^/   | /' "$work/block.sh"
(cd "$tree" && PATH=$tree/bin:$PATH KVTIER_PYTHON=${KVTIER_PYTHON:-python3} KVTIER_IMAGE_WHEELS=$base/wheels \
   KVTIER_TEST_BUILDAH="--root $storage --runroot $work/runroot --storage-driver $driver" \
   KVTIER_TEST_BASE=localhost/kvtier-test-base bash -euo pipefail "$work/block.sh") >"$work/block.log" 2>&1 ||
  { cat "$work/block.log"; fail "the block failed"; }
grep -E "^(image_context|instance|socket|backend):" "$work/block.log" | sed 's/^/   /'
grep -qx "socket: /run/kvtier/kvtierd.sock" "$work/block.log" ||
  fail "kvtierd --check-config in the image does not show the package's configuration"
ls "$build/image" "$build/image/wheels" | sed 's/^/   /'
bud images

step "the image's configuration"
bud inspect --type image localhost/kvtier >"$work/image.json"
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

ctr=$(bud from --pull=never localhost/kvtier)
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

step "kvtierd and cachectl are the package's; every library they load is in the image"
in_image sh -c 'dpkg-query -W -f="\${Package} \${Version}: \${Status}\n" kvtier; dpkg -S /usr/bin/kvtierd /usr/bin/cachectl;
                command -v kvtierd cachectl; getent passwd kvtier; ldd /usr/bin/kvtierd /usr/bin/cachectl' >"$work/files.log"
sed -n '1,6p' "$work/files.log" | sed 's/^/   /'
grep -qx "kvtier [^ ]*: install ok installed" "$work/files.log" || fail "the package kvtier is not installed in the image"
[ "$(grep -cxE "kvtier: /usr/bin/(kvtierd|cachectl)" "$work/files.log")" = 2 ] ||
  fail "/usr/bin/kvtierd and /usr/bin/cachectl are not the package's"
grep -qx "/usr/bin/kvtierd" "$work/files.log" || fail "kvtierd on PATH is not /usr/bin/kvtierd"
grep -q "^kvtier:x:10001:10001:" "$work/files.log" || fail "user kvtier is not uid and gid 10001"
! grep "not found" "$work/files.log" || fail "libraries missing from the image (the package's Depends)"

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
