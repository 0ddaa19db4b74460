#!/usr/bin/env bash
# The main job: build kvtier, start kvtierd on its default configuration, drive it
# with two worker processes that share a system prompt, show what was reused, stop.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build -G Ninja >/dev/null
cmake --build build --target kvtierd kvtier-chat-demo cachectl
run=$(mktemp -d /tmp/kvtier-demo.XXXXXX)
sock="$run/kvtierd.sock"
./build/daemon/kvtierd --config configs/kvtierd.yaml --socket "$sock" --instance "kvtier-demo-$$" 2>"$run/kvtierd.log" &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$run"' EXIT
for _ in $(seq 100); do grep -q "ready:" "$run/kvtierd.log" && break; sleep 0.05; done
grep "ready:" "$run/kvtierd.log" || { cat "$run/kvtierd.log"; exit 1; }
echo "== two workers, eight chats each, six turns (the GPU tier is smaller than the working set)"
./build/client/kvtier-chat-demo --socket "$sock" --name worker-a --seed 1 --sessions 8 --turns 6 &
a=$!
./build/client/kvtier-chat-demo --socket "$sock" --name worker-b --seed 2 --sessions 8 --turns 6 &
b=$!
wait $a
wait $b
echo "== cachectl status"
./build/client/cachectl --socket "$sock" status
echo "== cachectl sessions --sort idle"
./build/client/cachectl --socket "$sock" sessions --sort idle
echo "== cachectl stats"
./build/client/cachectl --socket "$sock" stats
kill -TERM $daemon
wait $daemon || true
echo "== kvtierd log"
cat "$run/kvtierd.log"
