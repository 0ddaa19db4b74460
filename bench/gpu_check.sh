#!/usr/bin/env bash
# gpu_check.sh BUNDLE [OUT]: the GPU checks, run from a bundle that
# scripts/gpu_bundle.sh built on another machine, with no build step: on a GPU
# machine that has the NVIDIA driver and nothing of kvtier's own dependencies.
# In under 8 minutes (the step timeouts add up to 455 s):
#   1. nvidia-smi, and the bundle's MANIFEST
#   2. the gpu tests, each program run directly (no CTest: its files hold the
#      build machine's paths): cuda_planner_test, backend_select_test,
#      cuda_backend_test (the backend's own: pools, IPC handles, copies against a
#      reference), backend_test (what backend: auto picks), gpu_integration_test
#      (kvtierd on backend: cuda with worker processes exchanging blocks through
#      CUDA IPC: reads, promotion fences on a worker's stream, demotions after
#      writer events, a worker killed mid-lease)
#   3. kvtier-bench gpu (copy bandwidth per direction and block size)
#   4. the Python module, built here against the bundle's static libkvtier with
#      this machine's Python, pybind11 and torch, then python/tests with pytest
#      (test_gpu.py: a transformers model on the GPU reading and writing kvtierd's
#      GPU tier in place through CUDA IPC); skipped (not failed) where the
#      machine has no Python with pybind11, pytest and torch
# Results go to OUT (default $OUT, else ./gpu-results): one log per step,
# junit XML per test program, nvidia-smi.txt, MANIFEST, bench-gpu.json, and
# summary.txt (a line per step: PASS, FAIL or SKIP, and its time).
# Exit status: 0 when every step passed; a gpu test that skipped counts as failed.
set -uo pipefail

bundle=$(realpath -m "${1:?usage: gpu_check.sh BUNDLE [OUT]}")
out=$(realpath -m "${2:-${OUT:-gpu-results}}")
[[ -x $bundle/bin/kvtierd ]] || { echo "gpu_check: $bundle is not a bundle (no bin/kvtierd); make one with scripts/gpu_bundle.sh" >&2; exit 2; }
mkdir -p "$out"
log() { echo "gpu_check [$((SECONDS))s]: $*"; }

export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KVTIERD="$bundle/bin/kvtierd"
export KVTIER_GPU_WORKER="$bundle/bin/kvtier-gpu-test-worker"
export TMPDIR="${TMPDIR:-/tmp}"
root=$(cd "$(dirname "$0")/.." && pwd)

cp "$bundle/MANIFEST" "$out/MANIFEST" 2> /dev/null || true
need=$(sed -n 's/^glibc: //p' "$bundle/MANIFEST" 2> /dev/null)
have=$(getconf GNU_LIBC_VERSION 2> /dev/null | awk '{print $2}')
if [[ -n $need && -n $have && $(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n 1) != "$need" ]]; then
  echo "gpu_check: the bundle needs glibc $need or newer; this machine has $have (build the bundle on an older distribution)" >&2
  exit 2
fi
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || log "nvidia-smi failed (see nvidia-smi.txt)"
: > "$out/summary.txt"
status=0

# step NAME TIMEOUT COMMAND...: runs it, logs to OUT/NAME.log, records the outcome.
step() {
  local name=$1 limit=$2
  shift 2
  log "$name"
  local start=$SECONDS rc=0 outcome=PASS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1 || rc=$?
  if ((rc != 0)); then
    outcome="FAIL (exit $rc$( ((rc == 124)) && echo ', timed out'))"
    status=1
  elif grep -q -e '^\[  SKIPPED \]' -e '^SKIPPED .*test_gpu' "$out/$name.log"; then
    outcome="SKIP (counted as a failure: the device was not usable; see $name.log)"
    status=1
  fi
  printf '%-24s %-40s %4ds\n' "$name" "$outcome" $((SECONDS - start)) | tee -a "$out/summary.txt"
  ((rc == 0)) || tail -n 30 "$out/$name.log"
}

gtest() {
  local name=$1 limit=$2
  step "$name" "$limit" "$bundle/bin/$name" --gtest_output="xml:$out/$name.xml"
}

gtest cuda_planner_test 15
gtest backend_select_test 30
gtest cuda_backend_test 120
gtest backend_test 30
gtest gpu_integration_test 120
step bench-gpu 140 "$bundle/bin/kvtier-bench" gpu
tail -n 1 "$out/bench-gpu.log" > "$out/bench-gpu.json"

# The Python module: compiled here (its ABI is this Python's), then its tests.
python_module() {
  local py=${PYTHON:-python3} pkg=$out/python/kvtier
  mkdir -p "$pkg" && cp "$root"/python/kvtier/*.py "$pkg/"
  local suffix
  suffix=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))') || return 1
  # shellcheck disable=SC2046  # pybind11's include flags are several words.
  c++ -O2 -std=c++20 -shared -fPIC $("$py" -m pybind11 --includes) -I"$root/client/include" -I"$root/proto/include" \
    "$root"/python/src/*.cc "$bundle/static/libkvtier.a" "$bundle/static/libkvtier_proto.a" -ldl -pthread \
    -o "$pkg/_native$suffix" || return 1
  # test_stores.py needs a redis-server, test_events.py pyzmq and msgpack, vllm/ vLLM and real_model/ the model
  # made on the build machine: the GPU machine has none of them (and the vLLM connector's GPU copies are
  # test_gpu.py's, through kvtier.paged).
  PYTHONPATH="$out/python" "$py" -m pytest -q -p no:cacheprovider -rs --ignore "$root/python/tests/test_stores.py" \
    --ignore "$root/python/tests/test_events.py" --ignore "$root/python/tests/vllm" --ignore "$root/python/tests/real_model" \
    "$root/python/tests"
}
if ${PYTHON:-python3} -c 'import pybind11, pytest, torch' 2> /dev/null; then
  export root out bundle
  step python 180 bash -c "$(declare -f python_module); python_module"
else
  log "python: no Python with pybind11, pytest and torch here: skipped"
  printf '%-24s %-40s %4ds\n' python "SKIP (no Python with pybind11, pytest, torch)" 0 | tee -a "$out/summary.txt"
fi

log "done, results in $out (status $status)"
cat "$out/summary.txt"
exit "$status"
