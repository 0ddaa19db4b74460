#!/usr/bin/env bash
# Installs every Debian package kvtier needs to build and test. Idempotent, non-interactive.
set -euo pipefail
packages=(
  build-essential cmake ninja-build ccache pkg-config clang
  # libFuzzer's runtime (libclang_rt.fuzzer*.a) for scripts/fuzz.sh; Debian 12's clang is 14.
  libclang-rt-14-dev
  libxxhash-dev libyaml-cpp-dev libboost-dev nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev libsystemd-dev
  redis-server libhiredis-dev
  # Store records' MAC (HMAC-SHA-256, stores.record_key_file).
  libssl-dev
  # KV events: ZMQ sockets (cppzmq over libzmq) and msgpack batches.
  libzmq3-dev cppzmq-dev libmsgpack-cxx-dev
  # The model worker: libtorch (CPU) and a fast BLAS for its matrix products
  # (the reference BLAS Debian selects by default is about 10x slower).
  libtorch-dev libopenblas0-pthread
  # The container image (Containerfile): its test builds and runs it with buildah
  # (chroot isolation) on a Debian 12 base that mmdebstrap makes (scripts/image_base.sh).
  buildah podman mmdebstrap
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all ${#packages[@]} packages present"
fi
