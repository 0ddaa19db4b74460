#!/usr/bin/env bash
# gpu_bundle.sh [BUILD_DIR [BUNDLE_DIR]]: builds, on this machine, everything the
# GPU check runs and packs it into one folder that runs on a bare GPU machine
# (a CUDA 13 driver, and none of kvtier's Debian libraries: no Boost, yaml-cpp,
# GTest, hiredis, libsystemd):
#   bin/       kvtierd, cachectl, kvtier-bench, the gpu tests and their worker, stripped
#   lib/       every shared library they load but glibc and the NVIDIA driver
#   static/    libkvtier.a and libkvtier_proto.a: the GPU machine builds the Python
#              module (python/src/module.cc) against them with its own Python
#   MANIFEST   the commit, the toolkit, and each file's size
# Defaults: BUILD_DIR build-gpu/ (CUDA on, Release, no model worker), BUNDLE_DIR
# BUILD_DIR/bundle. The CUDA runtime is linked statically; the driver is the GPU
# machine's. Then, on the GPU machine, from a copy of the repository with the
# bundle beside it: bench/gpu_check.sh BUNDLE_DIR OUT_DIR.
# The bundle must stay under 60 MiB (what travels to the device is capped at 64).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath -m "${1:-$root/build-gpu}")
bundle=$(realpath -m "${2:-$build/bundle}")
log() { echo "gpu_bundle [$((SECONDS))s]: $*"; }

[[ -n ${KVTIER_SKIP_SETUP:-} ]] || "$root/scripts/setup.sh"
command -v nvcc > /dev/null || [[ -x /usr/local/cuda/bin/nvcc ]] ||
  { echo "gpu_bundle: no CUDA toolkit (nvcc) here: the bundle needs the CUDA backend" >&2; exit 1; }

targets=(kvtierd cachectl kvtier-bench cuda_backend_test cuda_planner_test backend_select_test gpu_integration_test
  kvtier-gpu-test-worker backend_test)
static_libs=(kvtier_client kvtier_proto)
log "configuring $build"
mkdir -p "$build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVTIER_WITH_CUDA=ON \
  -DKVTIER_BUILD_MODEL_WORKER=OFF -DKVTIER_BUILD_BENCH=ON > "$build/configure.log" 2>&1 ||
  { tail -30 "$build/configure.log"; exit 1; }
grep -q '^KVTIER_WITH_CUDA:BOOL=ON' "$build/CMakeCache.txt" ||
  { echo "gpu_bundle: CMake did not enable the CUDA backend (see $build/configure.log)" >&2; exit 1; }
log "building ${targets[*]}"
cmake --build "$build" --target "${targets[@]}" "${static_libs[@]}"

rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib" "$bundle/static"
cp "$build/client/libkvtier.a" "$build/proto/libkvtier_proto.a" "$bundle/static/"
strip --strip-debug "$bundle"/static/*.a
for t in "${targets[@]}"; do
  path=$(find "$build" -path "$bundle" -prune -o -type f -name "$t" -perm -u+x -print | head -n 1)
  [[ -n $path ]] || { echo "gpu_bundle: built $t but cannot find it under $build" >&2; exit 1; }
  cp "$path" "$bundle/bin/$t"
  strip --strip-unneeded "$bundle/bin/$t"
done

# Every library the programs load, resolved here, but glibc's own (the GPU
# machine's is at least as new) and the NVIDIA driver's (it must be the machine's).
system_lib='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil|libcuda|libnvidia)[.-]'
for f in "$bundle"/bin/*; do
  ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  if [[ $name =~ $system_lib ]]; then continue; fi
  cp -L "$path" "$bundle/lib/$name"
done
missing=$(for f in "$bundle"/bin/*; do LD_LIBRARY_PATH="$bundle/lib" ldd "$f" | grep 'not found' || true; done)
[[ -z $missing ]] || { echo "gpu_bundle: unresolved libraries: $missing" >&2; exit 1; }

{
  echo "kvtier gpu bundle"
  echo "commit: $(git -C "$root" rev-parse HEAD 2> /dev/null || echo unknown)$(git -C "$root" diff --quiet 2> /dev/null || echo ' (with uncommitted changes)')"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
  echo "toolkit: $( (nvcc --version 2> /dev/null || /usr/local/cuda/bin/nvcc --version) | grep -o 'release [0-9.]*')"
  # The newest glibc symbol any file needs: the GPU machine's glibc must be at least as new.
  echo "glibc: $(for f in "$bundle"/bin/* "$bundle"/lib/*; do objdump -T "$f" 2> /dev/null | grep -o 'GLIBC_[0-9.]*'; done |
    sort -uV | tail -n 1 | cut -d_ -f2)"
  echo "files:"
  (cd "$bundle" && find bin lib static -type f -printf '  %p %s\n' | sort)
} > "$bundle/MANIFEST"

size=$(du -sb "$bundle" | cut -f1)
log "bundle $bundle: $((size / 1024)) KiB in $(find "$bundle" -type f | wc -l) files"
if ((size > 60 * 1024 * 1024)); then
  echo "gpu_bundle: the bundle is $((size >> 20)) MiB, over the 60 MiB that may travel to a GPU machine" >&2
  exit 1
fi
