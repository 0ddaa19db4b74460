#!/usr/bin/env bash
# Makes (once per machine) what the container image test builds from offline,
# and prints its directory:
#   rootfs.tar  a Debian 12 root file system (mmdebstrap --variant=minbase) with
#               the Containerfile's RUNTIME_PACKAGES installed, the base it
#               imports in place of debian:bookworm-slim; also the clean root
#               the Debian package test installs kvtier's .deb into
#   wheels/     numpy, the kvtier wheel's one dependency, at its pin in
#               python/requirements.txt, for the image's CPython 3.11
# Kept in ~/.cache/kvtier/image-<hash of the package list and pins>, so every
# clone reuses it and a change to either makes a new one. Needs the network
# (Debian's mirror, PyPI) the first time, and mmdebstrap (scripts/setup.sh).
#   KVTIER_IMAGE_BASE=DIR            use DIR instead
#   KVTIER_DEBIAN_MIRROR=URL         instead of http://deb.debian.org/debian
#   KVTIER_DEBIAN_SECURITY=URL       instead of http://deb.debian.org/debian-security
#   KVTIER_PYTHON=PY                 the pip that downloads the wheels (default python3)
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "image_base: $*" >&2; }

packages=$(sed -n 's/^ARG RUNTIME_PACKAGES="\(.*\)"$/\1/p' Containerfile)
[ -n "$packages" ] || { say "no ARG RUNTIME_PACKAGES=\"...\" line in the Containerfile"; exit 1; }
# The package test (tests/package/deb_test.sh) installs kvtier's .deb into this
# root offline: what its Depends name beyond the image's libraries (procps: the
# unit's ExecReload=/bin/kill) must be here already.
packages="$packages procps"
numpy=$(grep -E '^numpy==' python/requirements.txt)
mirror=${KVTIER_DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${KVTIER_DEBIAN_SECURITY:-http://deb.debian.org/debian-security}
python=${KVTIER_PYTHON:-python3}
hash=$(printf '%s\n' "$packages" "$numpy" "$(cat "$0")" | sha256sum | cut -c1-12)
dir="${KVTIER_IMAGE_BASE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvtier/image-$hash}"
if [ -f "$dir/.kvtier-ready" ]; then
  echo "$dir"
  exit 0
fi
command -v mmdebstrap >/dev/null || { say "mmdebstrap is missing (scripts/setup.sh installs it)"; exit 1; }
say "making $dir (once per machine): Debian 12 with $packages; $numpy"
started=$SECONDS
tmp="$dir.tmp.$$"
rm -rf "$tmp"
mkdir -p "$tmp/wheels"
trap 'rm -rf "$tmp"' EXIT
# As debian:bookworm-slim: no manuals, no translations, no documentation but
# the copyrights. Security updates too, as an apt-get upgrade would bring them.
dpkgopts=(--dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*'
          --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright')
mmdebstrap --quiet --variant=minbase --include="${packages// /,}" "${dpkgopts[@]}" bookworm "$tmp/rootfs.tar" \
  "deb $mirror bookworm main" "deb $mirror bookworm-updates main" \
  "deb $security bookworm-security main" >&2 ||
  { say "mmdebstrap failed (is $mirror reachable from this machine?)"; exit 1; }
"$python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.11 --implementation cp --abi cp311 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$tmp/wheels" "$numpy" >&2 ||
  { say "cannot download $numpy from the Python package index (is it reachable from this machine?)"; exit 1; }
touch "$tmp/.kvtier-ready"
rm -rf "$dir"
mkdir -p "$(dirname "$dir")"
mv "$tmp" "$dir"
trap - EXIT
say "ready in $((SECONDS - started)) s ($(du -sh "$dir" | cut -f1))"
echo "$dir"
