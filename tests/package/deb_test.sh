#!/usr/bin/env bash
# deb_test.sh SOURCE_DIR BUILD_DIR BASE_DIR — the package_deb test
# (tests/package/CMakeLists.txt, label package):
#   1. cpack makes kvtier_<version>_<arch>.deb from BUILD_DIR (cmake/KvtierPackage.cmake);
#      its Depends come from dpkg-shlibdeps, /etc/kvtier/kvtierd.yaml is a conffile;
#   2. BASE_DIR/rootfs.tar (scripts/image_base.sh: Debian 12, minbase, with the
#      image's runtime libraries, no network) is unpacked as a clean root, and the
#      README's Debian block (<!-- install: deb -->) runs in it as written, by
#      chroot: apt-get install ./kvtier_*.deb, systemctl enable --now kvtierd,
#      cachectl status. systemd cannot run there (it is not installed, and this
#      sandbox is not a booted system): `systemctl` is tests/package/unit_runner.sh,
#      which starts the unit's ExecStart= as its User= in its RuntimeDirectory=
#      with its limits, as systemd would; `sudo` runs the command (root already);
#   3. the files are where the FHS says, user kvtier exists, `systemd-analyze
#      verify` (this machine's, on the root) accepts the unit, kvtierd
#      --check-config accepts the shipped configuration, kvtierd runs as kvtier with
#      its socket in /run/kvtier, and cachectl, run as kvtier, talks to it;
#   4. stop, apt-get remove: only the conffile is left; apt-get purge: nothing is.
# Runs in its own mount and PID namespaces (unshare): its mounts and processes end
# with it. Everything lives in BUILD_DIR/package-deb-test and is removed at the
# end. Needs root (chroot, dpkg); skips (77) otherwise.
set -euo pipefail
source_dir=$1 build=$2 base=$3
work=$build/package-deb-test
if [ "$(id -u)" -ne 0 ]; then echo "SKIP: needs root (chroot and dpkg in a scratch root)"; exit 77; fi
for tool in cpack dpkg-deb dpkg-shlibdeps unshare; do
  command -v $tool >/dev/null || { echo "SKIP: $tool is not installed (scripts/setup.sh installs it)"; exit 77; }
done
if [ -z "${KVTIER_DEB_TEST_NS:-}" ]; then
  exec unshare --mount --pid --fork --mount-proc env KVTIER_DEB_TEST_NS=1 bash "$0" "$@"
fi
started=$SECONDS
step() { echo "== [$((SECONDS - started)) s] $*"; }
fail() { echo "FAIL: $*"; exit 1; }
source "$source_dir/tests/package/readme_block.sh"
root=$work/root
cleanup() {
  set +e
  # This shell is the namespace's init: whatever it started dies with it.
  for m in "$root/dev/shm" "$root/run" "$root/proc"; do mountpoint -q "$m" && umount -l "$m"; done
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT
cleanup
mkdir -p "$work/cpack" "$root"

step "cpack: the Debian package from $build"
cpack --config "$build/CPackConfig.cmake" -B "$work/cpack" >"$work/cpack.log" 2>&1 ||
  { cat "$work/cpack.log"; fail "cpack failed"; }
deb=$(ls "$work"/cpack/kvtier_*.deb)
echo "   $(basename "$deb") ($(du -h "$deb" | cut -f1))"
dpkg-deb --field "$deb" Package Version Architecture Depends | sed 's/^/   /'
depends=$(dpkg-deb --field "$deb" Depends)
for lib in libc6 libstdc++6 libyaml-cpp0.7 libzmq5 libhiredis0.14 libssl3 libsystemd0; do
  grep -q "\b$lib\b" <<<"$depends" || fail "Depends does not name $lib (dpkg-shlibdeps)"
done
[ "$(dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles)" = /etc/kvtier/kvtierd.yaml ] ||
  fail "/etc/kvtier/kvtierd.yaml is not the package's conffile"

step "a clean Debian 12 root from $base/rootfs.tar"
tar -C "$root" -xf "$base/rootfs.tar"
mount -t proc proc "$root/proc"
mount -t tmpfs -o mode=0755 run "$root/run"
mount -t tmpfs -o mode=1777 shm "$root/dev/shm"
# The files the package may add or remove, to compare before and after: not
# dpkg's and apt's own records, logs, caches, and the scratch directories.
snapshot() {
  (cd "$root" && find . \( -path ./proc -o -path ./dev -o -path ./run -o -path ./tmp -o -path ./var/lib/dpkg \
     -o -path ./var/lib/apt -o -path ./var/cache -o -path ./var/log \) -prune -o -print | sort)
}
snapshot >"$work/before.list"
cp "$deb" "$root/tmp/"
install -d "$root/tmp/kvtier-test-bin"
install -m 0755 "$source_dir/tests/package/unit_runner.sh" "$root/tmp/kvtier-test-bin/systemctl"
printf '#!/bin/sh\nexec "$@"\n' >"$root/tmp/kvtier-test-bin/sudo"
chmod 0755 "$root/tmp/kvtier-test-bin/sudo"
# apt-get as a script runs it: no questions (none are expected: every dependency is installed).
printf 'APT::Get::Assume-Yes "true";\n' >"$root/tmp/apt.conf"
in_root() {
  chroot "$root" env -i PATH=/tmp/kvtier-test-bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
    DEBIAN_FRONTEND=noninteractive APT_CONFIG=/tmp/apt.conf "$@"
}

step "the README's Debian block, in the root"
readme_block "$source_dir/README.md" deb >"$root/tmp/block.sh"
[ -s "$root/tmp/block.sh" ] || fail "README.md has no <!-- install: deb --> block"
sed 's/^/   | /' "$root/tmp/block.sh"
in_root sh -c 'cd /tmp && exec bash -euo pipefail /tmp/block.sh' >"$work/block.log" 2>&1 ||
  { cat "$work/block.log"; [ -f "$root/run/kvtierd.log" ] && cat "$root/run/kvtierd.log"; fail "the block failed"; }
grep -E "^(Setting up|Unpacking) kvtier|^backend:|^profile:" "$work/block.log" | sed 's/^/   /'

step "installed: dependencies, files, user, unit, configuration"
in_root dpkg-query -W -f='   ${Package} ${Version}: ${Status}\n' kvtier
in_root apt-get check >/dev/null || fail "apt-get check: the package's dependencies are not satisfied"
for f in /usr/bin/kvtierd /usr/bin/cachectl /etc/kvtier/kvtierd.yaml /usr/lib/systemd/system/kvtierd.service \
         /usr/lib/sysusers.d/kvtier.conf; do
  [ -e "$root$f" ] || fail "$f is not installed"
done
# The documentation is in the package; this root, as debian:bookworm-slim, tells
# dpkg to leave /usr/share/doc out (scripts/image_base.sh).
for f in /usr/share/doc/kvtier/README.md /usr/share/doc/kvtier/docs/operating.md; do
  in_root dpkg -L kvtier | grep -qx "$f" || fail "the package has no $f"
done
stray=$(in_root dpkg -L kvtier | grep -E '^/(usr/local|usr/etc|opt|home)(/|$)' || true)
[ -z "$stray" ] || fail "files outside the FHS places: $stray"
echo "   $(in_root dpkg -L kvtier | wc -l) paths, in /usr/bin, /usr/lib, /usr/share/doc/kvtier and /etc/kvtier"
user=$(in_root getent passwd kvtier) || fail "no user kvtier"
echo "   $user"
[ "${user##*:}" = /usr/sbin/nologin ] || fail "kvtier's shell is not nologin"
in_root getent group kvtier >/dev/null || fail "no group kvtier"
grep -qx "ExecStart=/usr/bin/kvtierd --config /etc/kvtier/kvtierd.yaml" "$root/usr/lib/systemd/system/kvtierd.service" ||
  fail "the unit does not start /usr/bin/kvtierd with /etc/kvtier/kvtierd.yaml"
if command -v systemd-analyze >/dev/null; then
  # The root has no systemd, so none of its targets: the one complaint allowed
  # is that the unit's default dependency, sysinit.target, is missing. Commands
  # the unit runs (ExecStart=, ExecReload=) must exist in the root.
  out=$(systemd-analyze verify --man=no --root="$root" /usr/lib/systemd/system/kvtierd.service 2>&1 |
        grep -v "Unit sysinit.target not found" || true)
  [ -z "$out" ] || { echo "$out"; fail "systemd-analyze verify --root complains about the unit"; }
  echo "   systemd-analyze verify --root: nothing but the root's missing sysinit.target (no systemd there)"
else
  echo "   (systemd-analyze is not installed here: the unit is not verified)"
fi
in_root kvtierd --check-config --config /etc/kvtier/kvtierd.yaml >"$work/check.log" || { cat "$work/check.log"; fail "--check-config"; }
echo "   kvtierd --check-config accepts /etc/kvtier/kvtierd.yaml"

step "kvtierd runs as the unit says; cachectl as user kvtier talks to it"
pid=$(cat "$root/run/kvtierd.pid")
uid=$(awk '/^Uid:/ {print $2}' "/proc/$pid/status")
[ "$uid" = "$(in_root id -u kvtier)" ] || fail "kvtierd runs as uid $uid, not kvtier's"
ids="$(in_root id -u kvtier):$(in_root id -g kvtier)"  # the root's numbers, not this machine's names
[ "$(stat -c '%u:%g %a' "$root/run/kvtier")" = "$ids 750" ] || fail "/run/kvtier is $(stat -c '%u:%g %a' "$root/run/kvtier")"
[ -S "$root/run/kvtier/kvtierd.sock" ] || fail "no socket /run/kvtier/kvtierd.sock"
echo "   kvtierd pid $pid, uid $uid (kvtier); /run/kvtier $ids 0750; $(stat -c '%A %u:%g' "$root/run/kvtier/kvtierd.sock") kvtierd.sock"
in_root setpriv --reuid kvtier --regid kvtier --init-groups cachectl --socket /run/kvtier/kvtierd.sock status \
  >"$work/status.log" || { cat "$work/status.log"; fail "cachectl status as kvtier"; }
grep -E '^(backend|profile):' "$work/status.log" | sed 's/^/   /'
in_root systemctl stop kvtierd
grep -q "kvtierd: info: stopped" "$root/run/kvtierd.log" || { cat "$root/run/kvtierd.log"; fail "kvtierd did not stop cleanly"; }
[ ! -e "$root/run/kvtier" ] || fail "/run/kvtier is left after the stop"

step "apt-get remove: only the conffile is left"
in_root apt-get remove kvtier >"$work/remove.log" 2>&1 || { cat "$work/remove.log"; fail "apt-get remove"; }
in_root dpkg-query -W -f='   ${Package}: ${Status}\n' kvtier
left=$(diff "$work/before.list" <(snapshot) | sed -n 's/^> //p' | grep -vE '^\./etc/(passwd|group|shadow|gshadow)-$' || true)
[ "$left" = "$(printf './etc/kvtier\n./etc/kvtier/kvtierd.yaml')" ] || fail "after remove, left: $left"
echo "   left: $(echo $left)"
step "apt-get purge: nothing is left"
in_root apt-get purge kvtier >"$work/purge.log" 2>&1 || { cat "$work/purge.log"; fail "apt-get purge"; }
! in_root dpkg-query -W kvtier >/dev/null 2>&1 || fail "dpkg still knows kvtier after purge"
changed=$(diff "$work/before.list" <(snapshot) | grep -E '^[<>]' | grep -vE '^> \./etc/(passwd|group|shadow|gshadow)-$' || true)
[ -z "$changed" ] || fail "after purge, the root differs: $changed"
echo "   the root holds the files it held before the install (user kvtier stays, as Debian leaves system users)"
step "PASS"
