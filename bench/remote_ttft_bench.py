#!/usr/bin/env python3
"""Time to first token of a follow-up turn on "host B" when the conversation
was started on "host A", two kvtierd processes sharing one redis-server (all
started here), one Python transformers model:

  remote  host B has nothing of it: its prefix comes from Redis (fetched,
          verified, placed in the host tier, promoted), then the new tokens' prefill
  host    host B holds the prefix in its host tier (the same turn again after
          the remote one, its session demoted): promoted, then the prefill
  none    the whole conversation recomputed

Every chat's follow-up turn is served in each mode back to back with the same
prompt (remote always before host, which needs it; none rotates among them).
TTFT is kvtier.hf's load plus the prefill and the first token's argmax.
Reports p50/p99 per mode and medians of per-chat paired ratios with 95%
bootstrap intervals; the last line is one JSON object.

  PYTHONPATH=build/python python3 bench/remote_ttft_bench.py --kvtierd build/daemon/kvtierd
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
from bench_kvtierd import bench_llama, bootstrap_median_ci, start_kvtierd, start_redis

import kvtier
import kvtier.hf


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kvtierd", required=True, help="the kvtierd binary to start (twice)")
    p.add_argument("--redis-server", default=shutil.which("redis-server") or "/usr/bin/redis-server")
    p.add_argument("--chats", type=int, default=12)
    p.add_argument("--history", type=int, default=1900, help="tokens host A computed and stored")
    p.add_argument("--user-tokens", type=int, default=48, help="new tokens of the follow-up turn")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--threads", type=int, default=max(1, os.cpu_count() or 1))
    p.add_argument("--seed", type=int, default=int(time.time()) % 100000, help="prompts' seed (default: from the clock)")
    return p.parse_args()


def stat(client, name):
    return dict(client.stats()).get(name, 0)


def wait_for(predicate, limit=30.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.005)
    raise SystemExit("timed out waiting for kvtierd")


@torch.no_grad()
def main():
    a = parse_args()
    torch.set_num_threads(a.threads)
    heads = a.hidden // 64
    model = bench_llama(a.layers, a.hidden, a.history + a.user_tokens + 64)
    identity = kvtier.hf.model_identity(model)
    blocks = ((a.history + a.user_tokens) // 16 + 2) * a.chats + 64
    tmp = tempfile.mkdtemp(prefix="kvtier-remote-bench-")
    procs = []
    try:
        redis, port = start_redis(a.redis_server, tmp)
        procs.append(redis)
        stores = (f"stores:\n  fetch_budget_ms: 5000\n  tiers:\n    - kind: redis\n      nodes: [127.0.0.1:{port}]\n"
                  "      timeout_ms: 2000\n")
        socks = []
        for host in ("a", "b"):
            os.mkdir(os.path.join(tmp, host))
            proc, sock = start_kvtierd(a.kvtierd, os.path.join(tmp, host), a.layers, heads, 64, blocks, stores)
            procs.append(proc)
            socks.append(sock)
        client_a = kvtier.Client(socket=socks[0], model_id=identity, client_name="host-a")
        client_b = kvtier.Client(socket=socks[1], model_id=identity, client_name="host-b")
        on_a = kvtier.hf.PrefixCache(client_a, model)
        on_b = kvtier.hf.PrefixCache(client_b, model)
        rng = np.random.default_rng(a.seed)

        # Host A: every chat's first turn, written through to Redis as it is committed.
        stored = 0
        histories = []
        for s in range(a.chats):
            ids = torch.tensor(rng.integers(3, 1024, a.history)).unsqueeze(0)
            out = model(ids, use_cache=True)
            stored += on_a.store(f"chat-{s}", ids, out.past_key_values)
            histories.append(ids)
        wait_for(lambda: stat(client_a, "store.redis.put_blocks") >= stored)

        ttft = {"remote": [], "host": [], "none": []}
        cached = {"remote": [], "host": []}
        orders = [["remote", "host", "none"], ["none", "remote", "host"], ["remote", "none", "host"]]
        for s in range(a.chats):
            user = torch.tensor(rng.integers(3, 1024, a.user_tokens)).unsqueeze(0)
            ids = torch.cat([histories[s], user], dim=1)
            first = {}
            for mode in orders[s % 3]:
                if mode == "host":
                    # The remote turn left the prefix in host B's GPU tier: demote it.
                    demoted = stat(client_b, "demoted_blocks") + client_b.demote(f"chat-{s}")
                    wait_for(lambda: stat(client_b, "demoted_blocks") >= demoted)
                t0 = time.perf_counter()
                if mode == "none":
                    logits = model(ids).logits
                else:
                    past, n = on_b.load(f"chat-{s}", ids)
                    logits = model(ids[:, n:], past_key_values=past, use_cache=True).logits
                    cached[mode].append(n)
                first[mode] = int(logits[0, -1].argmax())
                ttft[mode].append(time.perf_counter() - t0)
            if len(set(first.values())) != 1:
                raise SystemExit(f"chat {s}: modes disagree on the first token: {first}")
        remote_hits = stat(client_b, "store.redis.hit_blocks")
        imported = stat(client_b, "imported_blocks")
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(15)
        shutil.rmtree(tmp, ignore_errors=True)

    boot = np.random.default_rng(1)
    ms = {m: np.array(v) * 1000 for m, v in ttft.items()}
    result = {
        "bench": "remote_ttft",
        "chats": a.chats, "history_tokens": a.history, "new_tokens": a.user_tokens,
        "model": f"llama {a.layers} layers, hidden {a.hidden}, fp32, CPU ({a.threads} threads)",
        "kv_bytes_per_chat": int(2 * a.layers * heads * 64 * 4 * (a.history // 16 * 16)),
        "seed": a.seed,
        "ttft_ms": {m: {"p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99)),
                        "min": float(v.min()), "max": float(v.max())} for m, v in ms.items()},
        "remote_over_host_p50": dict(zip(("median", "ci_lo", "ci_hi"),
                                         bootstrap_median_ci(ms["remote"] / ms["host"], boot))),
        "none_over_remote_p50": dict(zip(("median", "ci_lo", "ci_hi"),
                                         bootstrap_median_ci(ms["none"] / ms["remote"], boot))),
        "cached_tokens_median": {m: float(np.median(v)) for m, v in cached.items()},
        "host_b_remote_hit_blocks": remote_hits, "host_b_imported_blocks": imported,
    }
    for m, v in result["ttft_ms"].items():
        print(f"{m:7s} TTFT p50 {v['p50']:8.2f} ms  p99 {v['p99']:8.2f} ms", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
