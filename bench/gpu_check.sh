#!/usr/bin/env bash
# gpu_check.sh [BUILD_DIR [RESULTS_DIR]]: the GPU checks, for a machine with a CUDA
# device, in under 8 minutes (its step timeouts add up to 470 s): build the CUDA
# backend's tests and kvtier-bench
# (skipped when BUILD_DIR already holds them), run `ctest -L gpu`, then
# `kvtier-bench gpu`. The gpu tests are the backend's own (cuda_backend_test) and
# kvtierd on the cuda backend with worker processes (gpu_integration_test: IPC
# reads, promotion fences on a worker's stream, demotions after writer events, a
# worker killed mid-lease). Results go to RESULTS_DIR (default $OUT, else BUILD_DIR/gpu-results):
#   nvidia-smi.txt  ctest-gpu.log  bench-gpu.log  bench-gpu.json (the bench's JSON line)
# Exit status: 0 when every step passed; a gpu test that skipped counts as a failure here.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath -m "${1:-$root/build-gpu}")
results=$(realpath -m "${2:-${OUT:-$build/gpu-results}}")
mkdir -p "$results"
log() { echo "gpu_check [$((SECONDS))s]: $*"; }

nvidia-smi > "$results/nvidia-smi.txt" 2>&1 || log "nvidia-smi failed (see nvidia-smi.txt)"

if [[ ! -x $build/tests/tiering/cuda_backend_test || ! -x $build/tests/integration/gpu_integration_test ||
      ! -x $build/bench/kvtier-bench ]]; then
  launcher=()
  command -v ccache > /dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  log "configuring and building $build"
  cmake -S "$root" -B "$build" -G Ninja -DKVTIER_WITH_CUDA=ON -DKVTIER_BUILD_MODEL_WORKER=OFF \
    -DKVTIER_BUILD_BENCH=ON "${launcher[@]}" > "$results/configure.log" 2>&1 ||
    { tail -30 "$results/configure.log"; exit 1; }
  # Only what the checks run: the full suite is scripts/test.sh's job.
  timeout 170 cmake --build "$build" -j "$(nproc)" \
    --target cuda_backend_test backend_select_test cuda_planner_test gpu_integration_test kvtier-gpu-test-worker \
    kvtierd backend_test kvtier-bench > "$results/build.log" 2>&1 ||
    { tail -40 "$results/build.log"; exit 1; }
fi

status=0
log "ctest -L gpu"
timeout 100 ctest --test-dir "$build" -L gpu --output-on-failure -V 2>&1 | tee "$results/ctest-gpu.log" ||
  status=1
if grep -q "needs a GPU" "$results/ctest-gpu.log"; then
  log "the gpu tests skipped: this machine's CUDA device was not usable"
  status=1
fi

log "backend_test (backend choice with a GPU present)"
timeout 30 ctest --test-dir "$build" -R '^backend_test$' --output-on-failure 2>&1 | tee "$results/ctest-backend.log" ||
  status=1

log "kvtier-bench gpu"
if timeout 170 "$build/bench/kvtier-bench" gpu 2>&1 | tee "$results/bench-gpu.log"; then
  tail -n 1 "$results/bench-gpu.log" > "$results/bench-gpu.json"
else
  status=1
fi
log "done, results in $results (status $status)"
exit "$status"
