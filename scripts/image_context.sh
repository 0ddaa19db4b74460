#!/usr/bin/env bash
# image_context.sh BUILD_DIR CONTEXT_DIR: stages the build context of the
# Containerfile from a build of kvtier (cmake --build BUILD_DIR done), replacing
# CONTEXT_DIR:
#   kvtier_<version>_<arch>.deb  the Debian package, made by cpack from BUILD_DIR
#                     (cmake/KvtierPackage.cmake, as tests/package/deb_test.sh makes it)
#   kvtier-entrypoint the image's entry point (container/entrypoint.sh)
#   wheels/           the kvtier wheel (pip wheel of this source)
#   constraints.txt   python/requirements.txt: the image's Python packages pinned
#   make_model.py     the real model's recipe, for the model stage
# Then: podman build -f Containerfile --target kvtierd -t kvtier CONTEXT_DIR
#
#   KVTIER_PYTHON=PY  the interpreter that builds the wheel (default python3). It
#                     must be a Python 3.11, the image's (Debian 12). One that has
#                     scikit-build-core and pybind11 (scripts/python_env.sh's)
#                     builds offline; another has pip fetch them.
#   KVTIER_IMAGE_WHEELS=DIR  wheels to add to wheels/, e.g. numpy's for a build
#                     with --build-arg PIP_ARGS=--no-index (offline)
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 BUILD_DIR CONTEXT_DIR" >&2; exit 2; }
source_dir=$(cd -P "$(dirname "$0")/.." && pwd)
build=$(cd -P "$1" && pwd)
ctx=$2
python=${KVTIER_PYTHON:-python3}
say() { echo "image_context: $*" >&2; }

[ -f "$build/CMakeCache.txt" ] || { say "$build is not a CMake build directory"; exit 1; }
rm -rf "$ctx"
mkdir -p "$ctx/wheels"
ctx=$(cd "$ctx" && pwd)

say "cpack: the Debian package from $build"
cpack --config "$build/CPackConfig.cmake" -B "$ctx/cpack" >"$ctx/cpack.log" 2>&1 ||
  { cat "$ctx/cpack.log" >&2; say "cpack failed"; exit 1; }
mv "$ctx"/cpack/kvtier_*.deb "$ctx/"
rm -rf "$ctx/cpack"
install -m 0755 "$source_dir/container/entrypoint.sh" "$ctx/kvtier-entrypoint"
cp "$source_dir/python/requirements.txt" "$ctx/constraints.txt"
cp "$source_dir/scripts/make_model.py" "$ctx/make_model.py"

# The wheel, built through the project's CMake (scikit-build-core,
# KVTIER_PYTHON_ONLY) in a directory of the build, so that a rebuild is
# incremental; with the build's compiler launcher (ccache) if it has one.
wheel_args=(--no-deps --disable-pip-version-check --quiet -w "$ctx/wheels"
            -C "build-dir=$build/image-wheel")
if "$python" -c 'import scikit_build_core, pybind11' 2>/dev/null; then
  wheel_args+=(--no-build-isolation --no-index)
fi
launcher=$(sed -n 's/^CMAKE_CXX_COMPILER_LAUNCHER:[A-Z]*=//p' "$build/CMakeCache.txt")
[ -n "$launcher" ] && wheel_args+=(-C "cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=$launcher")
say "building the kvtier wheel with $python"
"$python" -m pip wheel "${wheel_args[@]}" "$source_dir" >"$ctx/wheel.log" 2>&1 ||
  { cat "$ctx/wheel.log" >&2; say "the wheel did not build"; exit 1; }
wheel=$(cd "$ctx/wheels" && ls kvtier-*.whl)
if [ -n "${KVTIER_IMAGE_WHEELS:-}" ]; then
  cp "$KVTIER_IMAGE_WHEELS"/*.whl "$ctx/wheels/"
fi
case "$wheel" in
  *-cp311-cp311-*) ;;
  *) say "$wheel is not for CPython 3.11, the image's Python (Debian 12): set KVTIER_PYTHON to a Python 3.11"; exit 1 ;;
esac
say "staged $ctx ($(cd "$ctx" && ls kvtier_*.deb), $wheel)"
echo "$ctx"
