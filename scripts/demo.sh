#!/usr/bin/env bash
# The main job: build kvtier and run the engine demo on the host backend.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build -G Ninja -DKVTIER_BUILD_TESTS=OFF -DKVTIER_BUILD_BENCH=OFF >/dev/null
cmake --build build --target kvtier-engine-demo
./build/tiering/kvtier-engine-demo "$@"
