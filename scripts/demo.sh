#!/usr/bin/env bash
# The main job: build kvtier, start kvtierd on its default configuration, serve a
# multi-turn chat workload with two model-worker processes (a libtorch transformer)
# in each cache mode -- kvtier, an in-process cache, no cache -- report time to first
# token, hit rate and where the blocks are, then stop the daemon.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build -G Ninja >/dev/null
cmake --build build --target kvtierd kvtier-worker kvtier-bench cachectl
run=$(mktemp -d /tmp/kvtier-demo.XXXXXX)
sock="$run/kvtierd.sock"
./build/daemon/kvtierd --config configs/kvtierd.yaml --socket "$sock" --instance "kvtier-demo-$$" 2>"$run/kvtierd.log" &
daemon=$!
# The daemon is normally stopped (and reaped) before the script ends; under set -e
# a failing kill or wait in the trap would become the script's exit status.
cleanup() {
  local rc=$?
  kill -TERM "$daemon" 2>/dev/null || true
  wait "$daemon" 2>/dev/null || true
  rm -rf "$run"
  rm -f /dev/shm/kvtier-demo-$$.*
  exit "$rc"
}
trap cleanup EXIT
for _ in $(seq 100); do grep -q "ready:" "$run/kvtierd.log" && break; sleep 0.05; done
grep "ready:" "$run/kvtierd.log" || { cat "$run/kvtierd.log"; exit 1; }
echo "== two workers, eight chats of four turns sharing a system prompt; every turn is served"
echo "   in each cache mode back to back (histories of 1.3k-1.5k tokens: the chats need more"
echo "   blocks than the GPU tier holds, so each revisit promotes its demoted blocks back)"
./build/bench/kvtier-bench e2e --socket "$sock" --workers 2 --sessions 8 --turns 4 \
  --system-tokens 256 --first-tokens 1024 --user-tokens 40 --output-tokens 16 \
  --zero-sessions 8 --zero-tokens 512 --sweep none
echo "== one turn, as the worker prints it"
./build/model_worker/kvtier-worker --socket "$sock" --sessions 1 --turns 2 --first-tokens 200 \
  --session-prefix demo- --text
echo "== cachectl status"
./build/client/cachectl --socket "$sock" status
echo "== cachectl sessions --sort blocks (the ten largest)"
./build/client/cachectl --socket "$sock" sessions --sort blocks | head -11 || true
kill -TERM $daemon
wait $daemon || true
echo "== kvtierd log (last lines)"
tail -5 "$run/kvtierd.log"
