#!/usr/bin/env bash
# Warm-restart timing on a large host tier: fills the host tier of a kvtierd
# (host backend) through real worker processes, then measures
#   - a clean restart: SIGTERM (demote + manifest) and the start that adopts it;
#   - a crash restart: SIGKILL after a periodic snapshot, and the start that adopts it;
#   - a cold start on the same configuration, for comparison.
# Usage: scripts/warm_restart_timing.sh [HOST_BLOCKS] [SESSIONS]   (build/ must hold
# kvtierd and kvtier-test-worker; blocks are 128 KiB, so 8192 blocks = 1 GiB.)
set -euo pipefail
cd "$(dirname "$0")/.."
host_blocks=${1:-8192}
sessions=${2:-64}
blocks_per_session=$(( host_blocks * 9 / 10 / sessions ))
[ "$blocks_per_session" -ge 1 ] || { echo "too few host blocks for $sessions sessions" >&2; exit 2; }
kvtierd=./build/daemon/kvtierd
worker=./build/tests/integration/kvtier-test-worker
run=$(mktemp -d /tmp/kvtier-warm-timing.XXXXXX)
instance=kvtier-warm-timing-$$
daemon=""
cleanup() {
  if [ -n "$daemon" ]; then kill -KILL "$daemon" 2>/dev/null || true; wait "$daemon" 2>/dev/null || true; fi
  rm -f /dev/shm/"$instance".*
  [ -n "${KEEP_RUN:-}" ] && echo "kept $run" || rm -rf "$run"
}
trap cleanup EXIT

write_config() {  # $1: warm_restart
  cat >"$run/kvtierd.yaml" <<YAML
instance: $instance
socket: $run/kvtierd.sock
backend: host
log_level: debug
warm_restart: $1
profiles:
  - name: big
    layers: 4
    kv_heads: 8
    head_dim: 64
    dtype: fp16
    block_tokens: 16
    gpu_blocks: 512
    host_blocks: $host_blocks
tiering:
  warm_snapshot_ms: 500
YAML
}

now_ms() { date +%s%3N; }
start() {  # waits for the ready line; sets $took to the milliseconds it took
  [ -f "$run/kvtierd.log" ] && cat "$run/kvtierd.log" >>"$run/all.log"
  : >"$run/kvtierd.log"
  local t0; t0=$(now_ms)
  "$kvtierd" --config "$run/kvtierd.yaml" 2>>"$run/kvtierd.log" &
  daemon=$!
  until grep -q "ready: listening" "$run/kvtierd.log"; do
    kill -0 "$daemon" 2>/dev/null || { cat "$run/kvtierd.log"; exit 1; }
    sleep 0.01
  done
  took=$(( $(now_ms) - t0 ))
}
stop() {  # $1: signal; sets $took to the milliseconds until the process was gone
  local t0; t0=$(now_ms)
  kill -"$1" "$daemon"
  wait "$daemon" 2>/dev/null || true
  daemon=""
  took=$(( $(now_ms) - t0 ))
}
stat_of() { ./build/client/cachectl --socket "$run/kvtierd.sock" stats 2>/dev/null | awk -v k="$1" '$1==k || $1==k":" {print $2; exit}'; }
verify() {  # reads sessions $@ back, checking every block's bytes
  local ok=0
  for s in "$@"; do
    "$worker" "$run/kvtierd.sock" read "s$s" "$s" "$blocks_per_session" |
      grep -q "\"matched\":$blocks_per_session,.*\"intact\":true" && ok=$((ok + 1))
  done
  echo "$ok/$# sampled sessions hit in full ($blocks_per_session blocks) with intact bytes"
}

write_config true
start
echo "filling: $sessions sessions x $blocks_per_session blocks of 128 KiB (host tier: $host_blocks blocks, $(( host_blocks / 8 )) MiB)"
for s in $(seq 0 $(( sessions - 1 ))); do
  "$worker" "$run/kvtierd.sock" commit "s$s" "$s" "$blocks_per_session" >/dev/null
done
sleep 1  # watermark demotions and a snapshot
echo "periodic snapshot while serving (debug log): $(grep -o 'snapshot of profile .* in [0-9.]* ms' "$run/kvtierd.log" | tail -1)"
stop TERM
echo "clean stop (demote what fits + manifest):  ${took} ms  [$(grep -o 'demoted [0-9]* blocks and wrote the manifests in [0-9.]* ms' "$run/kvtierd.log")]"
start
echo "clean restart to ready:                    ${took} ms  [$(grep -o 'adopted .* in [0-9.]* ms' "$run/kvtierd.log")]"
echo "  $(verify 0 $(( sessions / 2 )) $(( sessions - 1 )))"
sleep 1.2  # a periodic snapshot after the adoption (reads promoted some blocks)
stop KILL
start
echo "crash restart to ready:                    ${took} ms  [$(grep -o 'adopted .* in [0-9.]* ms' "$run/kvtierd.log")]"
# The sessions read above were promoted to the GPU tier, which a crash loses.
echo "  $(verify 1 2 3)"
stop TERM
write_config false
start
echo "cold start (warm_restart off):             ${took} ms  [$(grep -o 'removed .* (warm_restart is off)' "$run/kvtierd.log" || true)]"
stop TERM
