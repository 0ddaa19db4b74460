#!/usr/bin/env bash
# Builds kvtier and runs the whole test suite with CTest.
#   scripts/test.sh                 release-with-debug-info build in build/
#   KVTIER_SANITIZE=address,undefined scripts/test.sh   sanitizer build in build-asan/
#   KVTIER_SANITIZE=thread scripts/test.sh              sanitizer build in build-tsan/
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
san="${KVTIER_SANITIZE:-}"
case "$san" in
  "") dir=build ;;
  thread) dir=build-tsan ;;
  *) dir=build-asan ;;
esac
launcher=()
command -v ccache >/dev/null && [ -z "${CI:-}" ] && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$dir" -G Ninja -DKVTIER_SANITIZE="$san" "${launcher[@]}" ${KVTIER_CMAKE_ARGS:-}
cmake --build "$dir"
ctest --test-dir "$dir" --output-on-failure -j"$(nproc)" ${KVTIER_CTEST_ARGS:-}
