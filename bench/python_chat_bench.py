#!/usr/bin/env python3
"""Time to first token of a Python transformers chat in three cache modes,
interleaved turn by turn in one run on one model:

  none   recompute the whole conversation every turn
  local  an in-process DynamicCache per session (the project's starting design)
  kvtier kvtier.hf.PrefixCache over a real kvtierd (started here)

Every turn of every session is served in each mode back to back with the same
prompt, in a rotating order; TTFT is the prefill of the turn's new tokens plus
the first token's argmax (kvtier: the load from kvtierd included; storing the
turn afterwards is not). Reports p50/p99 per mode and the medians of per-turn
paired ratios with 95% bootstrap intervals; the last line is one JSON object.

  PYTHONPATH=build/python python3 bench/python_chat_bench.py --kvtierd build/daemon/kvtierd
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import torch
from bench_kvtierd import bench_llama, bootstrap_median_ci, start_kvtierd

import kvtier
import kvtier.hf


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kvtierd", required=True, help="the kvtierd binary to start")
    p.add_argument("--sessions", type=int, default=6)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--history", type=int, default=1900, help="tokens of each session's first prompt")
    p.add_argument("--user-tokens", type=int, default=48, help="new user tokens per turn")
    p.add_argument("--reply-tokens", type=int, default=16, help="reply tokens appended per turn")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--threads", type=int, default=max(1, os.cpu_count() or 1))
    p.add_argument("--seed", type=int, default=int(time.time()) % 100000, help="prompts' seed (default: from the clock)")
    p.add_argument("--warmup", type=int, default=1, help="turns per session left out of the figures")
    return p.parse_args()


@torch.no_grad()
def main():
    a = parse_args()
    torch.set_num_threads(a.threads)
    heads = a.hidden // 64
    model = bench_llama(a.layers, a.hidden, a.history + a.turns * 128 + 64)
    per_session_blocks = (a.history + a.turns * (a.user_tokens + a.reply_tokens)) // 16 + 2
    blocks = per_session_blocks * a.sessions + 64
    tmp = tempfile.mkdtemp(prefix="kvtier-pybench-")
    proc, sock = start_kvtierd(a.kvtierd, tmp, a.layers, heads, 64, blocks)
    try:
        client = kvtier.Client(socket=sock, model_id=kvtier.hf.model_identity(model), client_name="python-bench")
        prefix = kvtier.hf.PrefixCache(client, model)
        rng = np.random.default_rng(a.seed)
        histories = [torch.tensor(rng.integers(3, 1024, a.history)).unsqueeze(0) for _ in range(a.sessions)]
        local = [None] * a.sessions
        ttft = {"none": [], "local": [], "kvtier": []}
        cached_tokens = []
        cpu = {m: 0.0 for m in ttft}
        modes = ["none", "local", "kvtier"]
        for turn in range(a.turns):
            for s in range(a.sessions):
                ids = histories[s]
                order = modes[(turn + s) % 3:] + modes[: (turn + s) % 3]
                first = {}
                for mode in order:
                    c0, t0 = time.process_time(), time.perf_counter()
                    if mode == "none":
                        logits = model(ids).logits
                    elif mode == "local":
                        seen = 0 if local[s] is None else local[s].get_seq_length()
                        out = model(ids[:, seen:], past_key_values=local[s], use_cache=True)
                        local[s], logits = out.past_key_values, out.logits
                    else:
                        past, cached = prefix.load(f"chat-{s}", ids)
                        out = model(ids[:, cached:], past_key_values=past, use_cache=True)
                        logits = out.logits
                    first[mode] = int(logits[0, -1].argmax())
                    elapsed = time.perf_counter() - t0
                    if turn >= a.warmup:
                        ttft[mode].append(elapsed)
                        cpu[mode] += time.process_time() - c0
                    if mode == "kvtier":
                        kv_out, kv_cached = out, cached
                if len(set(first.values())) != 1:
                    raise SystemExit(f"turn {turn} session {s}: modes disagree on the first token: {first}")
                prefix.store(f"chat-{s}", ids, kv_out.past_key_values)
                if turn >= a.warmup:
                    cached_tokens.append(kv_cached)
                reply = torch.tensor(rng.integers(3, 1024, a.reply_tokens)).unsqueeze(0)
                user = torch.tensor(rng.integers(3, 1024, a.user_tokens)).unsqueeze(0)
                histories[s] = torch.cat([ids, reply, user], dim=1)
        stats = client.stats()
    finally:
        proc.terminate()
        proc.wait(15)
        shutil.rmtree(tmp, ignore_errors=True)

    boot = np.random.default_rng(1)
    ms = {m: np.array(v) * 1000 for m, v in ttft.items()}
    kv_local = ms["kvtier"] / ms["local"]
    none_kv = ms["none"] / ms["kvtier"]
    result = {
        "bench": "python_chat",
        "sessions": a.sessions, "turns": a.turns, "warmup_turns": a.warmup, "pairs": int(len(kv_local)),
        "history_tokens": a.history, "new_tokens_per_turn": a.user_tokens + a.reply_tokens,
        "model": f"llama {a.layers} layers, hidden {a.hidden}, fp32, CPU ({a.threads} threads)",
        "seed": a.seed,
        "ttft_ms": {m: {"p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99)),
                        "min": float(v.min()), "max": float(v.max())} for m, v in ms.items()},
        "cpu_s": cpu,
        "kvtier_over_local_p50": dict(zip(("median", "ci_lo", "ci_hi"), bootstrap_median_ci(kv_local, boot))),
        "none_over_kvtier_p50": dict(zip(("median", "ci_lo", "ci_hi"), bootstrap_median_ci(none_kv, boot))),
        "kvtier_over_local_p99": float(np.percentile(ms["kvtier"], 99) / np.percentile(ms["local"], 99)),
        "cached_tokens_median": float(np.median(cached_tokens)) if cached_tokens else 0.0,
        "daemon_hit_blocks": stats.get("hit_blocks"), "daemon_miss_blocks": stats.get("miss_blocks"),
    }
    result["targets"] = {
        "kvtier_over_local_p50<=1.10": result["kvtier_over_local_p50"]["median"] <= 1.10,
        "none_over_kvtier_p50>=10": result["none_over_kvtier_p50"]["median"] >= 10,
    }
    for m, v in result["ttft_ms"].items():
        print(f"{m:7s} TTFT p50 {v['p50']:8.2f} ms  p99 {v['p99']:8.2f} ms", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
