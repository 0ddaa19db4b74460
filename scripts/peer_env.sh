#!/usr/bin/env bash
# Makes (once per machine) the environment of the peers kvtier is measured
# against (bench/requirements-peers.txt: LMCache, vllm-router) and prints its
# directory. It is layered over the project's environment (scripts/python_env.sh):
# a .pth file puts that environment's packages on its path, so torch and vLLM are
# the same ones and the project's environment is left untouched; the peers are
# installed without their dependencies. LMCache pins numpy, protobuf,
# prometheus_client and setuptools at versions other than the project's; those
# are not installed, and the benchmark's smoke test shows the peers run on the
# project's. Nothing is downloaded after the first run.
#   KVTIER_PEER_ENV=DIR   use DIR instead of ~/.cache/kvtier/peers-<hash>
set -euo pipefail
cd "$(dirname "$0")/.."
base=$(scripts/python_env.sh)
req=bench/requirements-peers.txt
hash=$( (cat "$req"; echo "$base") | sha256sum | cut -c1-12)
env_dir="${KVTIER_PEER_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvtier/peers-$hash}"
if [ ! -x "$env_dir/bin/python" ] || [ ! -f "$env_dir/.kvtier-ready" ]; then
  echo "peer_env: creating $env_dir from $req over $base" >&2
  rm -rf "$env_dir"
  mkdir -p "$(dirname "$env_dir")"
  "$base/bin/python" -m venv --without-pip "$env_dir"
  site() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
  site "$base/bin/python" >"$(site "$env_dir/bin/python")/kvtier-base.pth"
  "$env_dir/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
    --cache-dir "${XDG_CACHE_HOME:-$HOME/.cache}/kvtier/pip" -r "$req" >&2
  "$env_dir/bin/python" -c 'import lmcache, vllm_router, vllm' >&2
  touch "$env_dir/.kvtier-ready"
fi
echo "$env_dir"
