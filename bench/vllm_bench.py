#!/usr/bin/env python3
"""vllm_bench.py --kvtierd PATH [--model DIR]: time to first token of a vLLM
engine on a prompt whose long prefix another engine computed.

Three engine processes on one kvtierd: A and B run KvtierConnector, R runs
without it. Each round draws a new prefix (--prefix tokens, 2,048 by default)
that engine A computes first; then, in an order that rotates from round to
round, the same prefix with a new question (--suffix tokens) goes to
  (i)   B, which loads the prefix from kvtierd            ttft_kvtier_ms
  (ii)  R, which recomputes it                            ttft_recompute_ms
  (iii) A, which finds it in its own prefix cache         ttft_own_prefix_cache_ms
and prompts nobody has seen go to B and to R (zero reuse: what the connector
costs when it finds nothing). zero_reuse_ratio compares B with itself: a new
prompt that the connector looks up and saves, against one with a cache_salt,
which it leaves alone (no lookup, no save: B as if without it), so that the
figure is the connector's work and not the difference between two processes.
That difference is zero_reuse_vs_engine_without_connector (B / R): engines
started alike differ by several percent in either direction on a small machine,
more than the connector costs. Ratios are medians of per-round ratios, with the
smallest and largest; TTFT is vLLM's own first-token latency. Each timed request waits --settle seconds first: after a step, a vLLM
worker busy-polls its queue for a second, which on a small machine takes a core
from the engine timed next. The model defaults to the real one (scripts/make_model.py), on a
kvtierd profile of its geometry in vLLM's CPU blocks (128 tokens). Prints progress, then one
JSON object as its last line.

--remote-store: two hosts. A real Redis Cluster (three redis-server nodes) is
the store below both kvtierd instances: host A's (engines A and B) and host
B's (engine H, which shares nothing with host A but the cluster). Each round,
H is also asked the prefix A computed: it finds nothing in its kvtierd's tiers,
its scheduler has kvtierd fetch the prefix from the cluster off the step, and
it loads it from there:                                  ttft_remote_store_ms
(against recomputing: remote_store_vs_recompute). Every timed engine's first
tokens are compared with R's.

--decode-save: instead, what the connector costs a decoding engine at 512 and
7,936 tokens of context, against an engine without it and split into the saves'
own work and the rest (decode_save_ratio_512, decode_save_ratio_8k;
vllm_decode.py).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python", "tests", "vllm"))
sys.path.insert(0, HERE)
import vllm_decode  # noqa: E402
from bench_kvtierd import emit, spread, start_kvtierd  # noqa: E402
from redis_cluster import RedisCluster  # noqa: E402
from vllm_engines import BLOCK as VLLM_CPU_BLOCK  # noqa: E402
from vllm_engines import Engine, store_total  # noqa: E402

import kvtier  # noqa: E402


def wait_for_commit(client, before: float, timeout: float = 10.0) -> None:
    """Waits until kvtierd committed blocks past `before`: an engine's saves run
    after its step, so its output can come back a few ms before they land."""
    deadline = time.monotonic() + timeout
    while client.stats()["committed_blocks"] <= before:
        if time.monotonic() > deadline:
            raise RuntimeError("engine A's blocks never reached kvtierd")
        time.sleep(0.005)


def wait_for_store(client, before: float, timeout: float = 10.0) -> None:
    """Waits until kvtierd's stores took blocks past `before` (written on their own thread)."""
    deadline = time.monotonic() + timeout
    while stored(client) <= before:
        if time.monotonic() > deadline:
            raise RuntimeError("engine A's blocks never reached the store")
        time.sleep(0.005)


def decode_during_fetch(a_engine, h_engine, watch, tokens, args) -> float | None:
    """Engine H decodes a request alone; then a prompt arrives whose prefix engine A
    computed (only the cluster holds it for H). While H's scheduler waits for its
    kvtierd to fetch it, the decoding request goes on alone: the median time
    between its tokens then, over the median before the prompt arrived (None: the
    prompt's first token came before two of the other's)."""
    prefix = tokens(args.prefix)
    committed, put = watch.stats()["committed_blocks"], stored(watch)
    a_engine.generate([prefix + tokens(args.suffix)], max_tokens=1)
    wait_for_commit(watch, committed)
    wait_for_store(watch, put)
    arrive = 0.6
    steps = h_engine.stream([tokens(32), prefix + tokens(args.suffix)], at=[0.0, arrive], max_tokens=160)["steps"]
    ends = [s["at"] + s["seconds"] for s in steps]
    first = next((e for s, e in zip(steps, ends) if 1 in s["out"]), float("inf"))  # The prompt's first token.
    tokens0 = [e for s, e in zip(steps, ends) if 0 in s["out"]]  # When the decoding request got each token.
    gaps = [(b, b - a) for a, b in zip(tokens0, tokens0[1:])]
    alone = [g for t, g in gaps if 0.2 <= t < arrive]
    waiting = [g for t, g in gaps if arrive <= t < first]
    return statistics.median(waiting) / statistics.median(alone) if len(waiting) >= 2 and alone else None


def stored(client) -> float:
    return store_total(client.stats(), "put_blocks")


def compare(a, model, seed, run, sock, kv, tokens, cluster, daemons, engines) -> dict:
    """The TTFT comparison (the default mode): engines A, B, R (and H) in `engines`, started here."""
    print(f"vllm_bench: model {model}, prefix {a.prefix} + {a.suffix} tokens, {a.rounds} rounds, seed {seed}; "
          f"starting three engines (logs in {run})", file=sys.stderr, flush=True)
    engines["A"] = Engine(model, os.path.join(run, "a.log"), socket=sock, kv_cache_bytes=kv)
    engines["B"] = Engine(model, os.path.join(run, "b.log"), socket=sock, kv_cache_bytes=kv)
    engines["R"] = Engine(model, os.path.join(run, "r.log"), kv_cache_bytes=kv)
    if cluster:
        engines["H"] = Engine(model, os.path.join(run, "h.log"), socket=daemons[1][1], kv_cache_bytes=kv)
    watch = kvtier.Client(socket=sock, client_name="vllm_bench")  # Reads kvtierd's figures.
    for e in engines.values():  # Warm-up: the first request of an engine pays for its set-up.
        e.generate([tokens(300)], max_tokens=1)
    cases = {"kvtier": "B", "recompute": "R", "own_prefix_cache": "A"}
    if cluster:
        cases["remote_store"] = "H"
    ttft = {k: [] for k in cases}
    cached = {k: [] for k in cases}
    zero = {"B": [], "B salted": [], "R": []}
    same_tokens = 0
    during: list[float | None] = []  # tpot_during_fetch_ratio per round (--remote-store).
    for r in range(a.rounds):
        prefix = tokens(a.prefix)
        committed, put = watch.stats()["committed_blocks"], stored(watch)
        engines["A"].generate([prefix + tokens(a.suffix)], max_tokens=1)  # A computes (and saves) it.
        wait_for_commit(watch, committed)
        if cluster:
            wait_for_store(watch, put)
        question = tokens(a.suffix)
        order = list(cases)[r % len(cases):] + list(cases)[:r % len(cases)]
        firsts = []
        for case in order:
            time.sleep(a.settle)
            out = engines[cases[case]].generate([prefix + question], max_tokens=4)[0]
            ttft[case].append(out["ttft"] * 1000)
            cached[case].append(out["cached"])
            firsts.append(out["tokens"])
        same_tokens += all(t == firsts[0] for t in firsts)
        zorder = list(zero)[r % 3:] + list(zero)[:r % 3]
        for name in zorder:
            time.sleep(a.settle)
            salt = [f"zero-reuse-{r}"] if name == "B salted" else None
            zero[name].append(engines[name.split()[0]].generate([tokens(a.prefix + a.suffix)], max_tokens=1,
                                                                salts=salt)[0]["ttft"] * 1000)
        if cluster:
            time.sleep(a.settle)
            during.append(decode_during_fetch(engines["A"], engines["H"], watch, tokens, a))
        remote = f"remote store {ttft['remote_store'][-1]:.1f} ms, " if cluster else ""
        print(f"  round {r + 1}: {remote}kvtier {ttft['kvtier'][-1]:.1f} ms ({cached['kvtier'][-1]} cached), recompute "
              f"{ttft['recompute'][-1]:.1f} ms, own prefix cache {ttft['own_prefix_cache'][-1]:.1f} ms "
              f"({cached['own_prefix_cache'][-1]} cached); zero reuse B {zero['B'][-1]:.1f}, B salted "
              f"{zero['B salted'][-1]:.1f}, R {zero['R'][-1]:.1f} ms", file=sys.stderr, flush=True)
    ratio_own = [k / o for k, o in zip(ttft["kvtier"], ttft["own_prefix_cache"])]
    ratio_recompute = [c / k for c, k in zip(ttft["recompute"], ttft["kvtier"])]
    ratio_zero = [b / o for b, o in zip(zero["B"], zero["B salted"])]
    ratio_zero_r = [b / r for b, r in zip(zero["B"], zero["R"])]
    result = {
        "bench": "vllm", "model": os.path.basename(os.path.normpath(model)), "prefix_tokens": a.prefix,
        "suffix_tokens": a.suffix, "rounds": a.rounds, "seed": seed,
        "ttft_kvtier_ms": round(statistics.median(ttft["kvtier"]), 2),
        "ttft_recompute_ms": round(statistics.median(ttft["recompute"]), 2),
        "ttft_own_prefix_cache_ms": round(statistics.median(ttft["own_prefix_cache"]), 2),
        "ttft_kvtier_spread": spread(ttft["kvtier"]),
        "ttft_recompute_spread": spread(ttft["recompute"]),
        "ttft_own_prefix_cache_spread": spread(ttft["own_prefix_cache"]),
        "kvtier_vs_own_prefix_cache": spread(ratio_own),
        "recompute_vs_kvtier": spread(ratio_recompute),
        "zero_reuse_ratio": round(statistics.median(ratio_zero), 3),
        "zero_reuse_ratio_spread": spread(ratio_zero),
        "zero_reuse_vs_engine_without_connector": spread(ratio_zero_r),
        "ttft_zero_reuse_ms": {k: round(statistics.median(v), 2) for k, v in zero.items()},
        "cached_tokens_kvtier": statistics.median(cached["kvtier"]),
        "cached_tokens_own_prefix_cache": statistics.median(cached["own_prefix_cache"]),
        "rounds_with_equal_tokens": same_tokens,
        "targets": {"kvtier_vs_own_prefix_cache <= 1.3": statistics.median(ratio_own) <= 1.3,
                    "recompute_vs_kvtier >= 5": statistics.median(ratio_recompute) >= 5,
                    "zero_reuse_ratio <= 1.03": statistics.median(ratio_zero) <= 1.03},
        "machine": f"{os.cpu_count()} cores",
    }
    if cluster:
        ratio_remote = [c / h for c, h in zip(ttft["recompute"], ttft["remote_store"])]
        result.update({
            "ttft_remote_store_ms": round(statistics.median(ttft["remote_store"]), 2),
            "ttft_remote_store_spread": spread(ttft["remote_store"]),
            "cached_tokens_remote_store": statistics.median(cached["remote_store"]),
            "recompute_vs_remote_store": spread(ratio_remote),
            # Decode steps while a prompt waits for the stores, over decode steps alone (rounds where the
            # fetch outlasted a step; the others are counted in tpot_during_fetch_rounds_shorter_than_a_step).
            "tpot_during_fetch_ratio": (round(statistics.median([d for d in during if d]), 3)
                                        if any(during) else None),
            "tpot_during_fetch_spread": spread([d for d in during if d]) if any(during) else None,
            "tpot_during_fetch_rounds_shorter_than_a_step": sum(1 for d in during if not d),
        })
        result["targets"]["recompute_vs_remote_store >= 5"] = statistics.median(ratio_remote) >= 5
    return result

def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kvtierd", required=True)
    p.add_argument("--model", default="", help="a Llama model directory (default: scripts/make_model.py's)")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--prefix", type=int, default=2048, help="tokens of the shared prefix")
    p.add_argument("--suffix", type=int, default=32, help="new tokens after it")
    p.add_argument("--kv-cache-mib", type=int, default=512, help="each engine's KV cache")
    p.add_argument("--blocks", type=int, default=182,
                   help="kvtier blocks per tier (of vLLM's CPU block, 128 tokens: 1 GiB of the real model's)")
    p.add_argument("--settle", type=float, default=1.2,
                   help="seconds to wait before each timed request: a vLLM worker busy-polls for 1 s after "
                        "its last step, taking a core from whichever engine runs next")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="", help="also write the JSON here")
    p.add_argument("--remote-store", action="store_true",
                   help="also time an engine on a second kvtierd that reaches the prefix through a Redis Cluster")
    p.add_argument("--decode-save", action="store_true",
                   help="instead: what the connector costs a decoding engine at 512 and --long-context tokens, against an "
                        "engine without it (vllm_decode.py)")
    p.add_argument("--decode-tokens", type=int, default=256, help="--decode-save: tokens decoded per request")
    p.add_argument("--long-context", type=int, default=7936, help="--decode-save: the long prompt's tokens")
    a = p.parse_args()
    model = a.model or subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_model.py")],
                                      check=True, capture_output=True, text=True).stdout.strip()
    with open(os.path.join(model, "config.json")) as f:
        cfg = json.load(f)
    heads = cfg["num_attention_heads"]
    geometry = {"layers": cfg["num_hidden_layers"], "kv_heads": cfg.get("num_key_value_heads", heads),
                "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // heads}
    vocab = cfg["vocab_size"]
    seed = a.seed or random.SystemRandom().randrange(1, 1 << 31)
    rng = random.Random(seed)

    def tokens(n):  # Ordinary token ids (the special ones are at the start of the vocabulary).
        return [rng.randrange(100, vocab - 1) for _ in range(n)]

    run = tempfile.mkdtemp(prefix="kvtier-vllm-bench.")
    cluster = RedisCluster(pathlib.Path(run)) if a.remote_store else None
    stores = cluster.store() if cluster else ""
    daemons = [start_kvtierd(a.kvtierd, run, geometry["layers"], geometry["kv_heads"], geometry["head_dim"],
                             a.blocks, extra=stores, block_tokens=VLLM_CPU_BLOCK)]
    if cluster:
        os.makedirs(os.path.join(run, "host-b"))
        daemons.append(start_kvtierd(a.kvtierd, os.path.join(run, "host-b"), geometry["layers"],
                                     geometry["kv_heads"], geometry["head_dim"], a.blocks, extra=stores,
                                     block_tokens=VLLM_CPU_BLOCK))
    sock = daemons[0][1]
    engines = {}
    try:
        kv = a.kv_cache_mib << 20
        if a.decode_save:
            print(f"vllm_bench: decode saves, model {model}, {a.rounds} rounds, seed {seed} (logs in {run})",
                  file=sys.stderr, flush=True)
            result = {"bench": "vllm_decode", "model": os.path.basename(os.path.normpath(model)), "rounds": a.rounds,
                      "seed": seed, **vllm_decode.run(Engine, model, run, sock, kv, tokens, a),
                      "machine": f"{os.cpu_count()} cores"}
        else:
            result = compare(a, model, seed, run, sock, kv, tokens, cluster, daemons, engines)
    finally:
        for e in engines.values():
            e.stop()
        for daemon, _ in daemons:
            daemon.terminate()
            daemon.wait(30)
        if cluster:
            cluster.stop()
    emit(result, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
