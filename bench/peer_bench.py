#!/usr/bin/env python3
"""peer_bench.py --kvtierd PATH [--cases ...]: kvtier side by side with LMCache
(its multiprocess server, 0.5.6, and vLLM's LMCacheMPConnector) and with no
connector, on the same vLLM engine processes, prompts and settings.

Each system's cache server runs for the whole run (bench/peers.py): kvtierd on
the host backend, `lmcache server` on CPU. The cases, each one named:

  prefix     engine A of a system computes a prefix (--prefix tokens: 2,048 and
             7,936 by default); then, in an order that rotates from round to
             round, the prefix with a new question (--suffix tokens) goes to
             engine B of each system (a new process: it loads the prefix from
             its cache server), to engine R (no connector: recomputes it) and
             to each system's engine A (its own prefix cache). Every answer is
             compared with R's (greedy tokens and top-5 logprobs).
  miss       a prompt nobody has seen (the first --prefix length) to each B and
             to R: what a connector costs when it finds nothing; and to kvtier's
             B with a cache_salt (which its connector leaves alone): the same
             cost, measured within one process.
  decode     a new 300-token prompt decoded for --decode-tokens tokens by each B
             and by R: what a connector costs each step (time per output token).
  footprint  each cache server's memory and CPU seconds, beside the KV it holds:
             after the cases above (footprint_after_cases: caches partly full),
             then after each system's writer engine has been sent distinct
             prompts of --fill times the largest cache's capacity, so that
             every cache is full and evicting (footprint: the same bytes held,
             each server's whole capacity; rss_kvtier_vs_lmcache is from it).
  chat       multi-turn conversations from concurrent clients through
             vllm-router (round-robin and cache-aware) in front of two
             OpenAI-compatible vLLM servers per system (peer_chat.py).
  faults     the chat workload while the cache server is killed and restarted
             (and, for kvtier, stopped and continued) (peer_chat.py).

Ratios are medians of per-round ratios with a 95% bootstrap interval; TTFT is
vLLM's own first-token latency. Each timed request waits --settle seconds first
(a vLLM worker busy-polls its queue for a second after a step, taking a core from
the engine timed next). --smoke: one round of every case at small sizes, so that
the harness cannot rot (no figure is judged). Prints progress, then one JSON
object as its last line; --out also writes it, --plots DIR draws the TTFT
distributions and the chat throughput.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python", "tests", "vllm"))
sys.path.insert(0, HERE)
import peers  # noqa: E402
from bench_kvtierd import emit, ratio, spread  # noqa: E402
from vllm_engines import Engine, difference  # noqa: E402

CASES = ("prefix", "miss", "decode", "footprint", "chat", "faults")


def say(msg):
    print("peer_bench: " + msg, file=sys.stderr, flush=True)


def start_engines(specs: dict, model: str, run: str, kv_bytes: int, llm: dict) -> dict:
    """Starts one engine process per spec {name: system} at once (vLLM's start-up
    is mostly waiting on imports and compilation, so they overlap); returns
    {name: Engine}, or stops them all and raises if any failed."""
    out: dict = {}
    errors = []

    def one(name, system):
        try:
            out[name] = Engine(model, os.path.join(run, f"engine-{name}.log"), kv_transfer=system.kv_transfer(),
                               python=system.python, kv_cache_bytes=kv_bytes, llm=llm, start_timeout=600)
        except BaseException as e:  # noqa: BLE001 - reported below, with the others stopped
            errors.append(f"{name}: {e}")

    threads = [threading.Thread(target=one, args=(n, s)) for n, s in specs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        for e in out.values():
            e.kill()
        raise RuntimeError("engines did not start: " + "; ".join(errors))
    return out


def wait_for_commit(kvtier_system, before: float, timeout: float = 20.0) -> None:
    """Waits until kvtierd committed blocks past `before`: KvtierConnector's saves
    run after the step, so the writer's output can come back before they land."""
    import kvtier
    client = kvtier.Client(socket=kvtier_system.socket, client_name="peer_bench")
    deadline = time.monotonic() + timeout
    while client.stats()["committed_blocks"] <= before:
        if time.monotonic() > deadline:
            raise RuntimeError("engine A's blocks never reached kvtierd")
        time.sleep(0.005)


def committed(kvtier_system) -> float:
    import kvtier
    return kvtier.Client(socket=kvtier_system.socket, client_name="peer_bench").stats()["committed_blocks"]


def prefix_and_miss(a, engines, systems, tokens, cases) -> dict:
    """The prefix and miss cases, round by round (module docstring)."""
    connected = [s for s in systems if s.name != "none"]
    by_name = {s.name: s for s in systems}
    ttft: dict = {}  # (length, who) -> [ms]
    wrong: dict = {}  # who -> answers that differ from R's
    cached: dict = {}
    miss: dict = {}
    decode: dict = {}  # who -> [ms per output token]
    for r in range(a.rounds):
        for length in a.prefix:
            if "prefix" not in cases:
                break
            prefix = tokens(length)
            before = committed(by_name["kvtier"]) if "kvtier" in by_name else 0
            for s in connected:  # Each system's writer computes the prefix and saves it.
                engines[f"{s.name}-A"].generate([prefix + tokens(a.suffix)], max_tokens=1)
            if "kvtier" in by_name:
                wait_for_commit(by_name["kvtier"], before)
            question = tokens(a.suffix)
            who = [f"{s.name}-B" for s in connected] + ["none-R"] + [f"{s.name}-A" for s in connected]
            k = r % len(who)
            outs = {}
            for name in who[k:] + who[:k]:
                time.sleep(a.settle)
                outs[name] = engines[name].generate([prefix + question], max_tokens=4)[0]
                ttft.setdefault((length, name), []).append(outs[name]["ttft"] * 1000)
                cached.setdefault((length, name), []).append(outs[name]["cached"])
            for name, out in outs.items():
                if name != "none-R" and difference(out, outs["none-R"]) is not None:
                    wrong[name] = wrong.get(name, 0) + 1
            say(f"round {r + 1}, prefix {length}: " + ", ".join(
                f"{n} {ttft[(length, n)][-1]:.0f} ms ({cached[(length, n)][-1]} cached)" for n in who))
        if "miss" in cases:
            # kvtier's connector leaves a request with a cache_salt alone (no lookup, no save), so
            # "kvtier-B salted" is the same engine process without the connector's work: the
            # connector's own cost, free of the few percent engines started alike differ by.
            who = [f"{s.name}-B" for s in connected] + ["none-R"] + (["kvtier-B salted"] if "kvtier" in by_name
                                                                      else [])
            k = r % len(who)
            for name in who[k:] + who[:k]:
                time.sleep(a.settle)
                salted = name.endswith(" salted")
                out = engines[name.removesuffix(" salted")].generate(
                    [tokens(a.prefix[0] + a.suffix)], max_tokens=1, salts=[f"miss-{r}"] if salted else None)[0]
                miss.setdefault(name, []).append(out["ttft"] * 1000)
            say(f"round {r + 1}, miss: " + ", ".join(f"{n} {miss[n][-1]:.0f} ms" for n in who))
        if "decode" in cases:
            who = [f"{s.name}-B" for s in connected] + ["none-R"]
            k = r % len(who)
            for name in who[k:] + who[:k]:
                time.sleep(a.settle)
                started = time.perf_counter()
                out = engines[name].generate([tokens(300)], max_tokens=a.decode_tokens)[0]
                steps = max(1, len(out["tokens"]) - 1)
                decode.setdefault(name, []).append((time.perf_counter() - started - out["ttft"]) / steps * 1000)
            say(f"round {r + 1}, decode: " + ", ".join(f"{n} {decode[n][-1]:.1f} ms/token" for n in who))
    result: dict = {"ttft_ms": {}, "different_from_recompute": wrong}
    for (length, name), xs in ttft.items():
        result["ttft_ms"].setdefault(str(length), {})[name] = spread(xs)
        result.setdefault("cached_tokens", {}).setdefault(str(length), {})[name] = statistics.median(
            cached[(length, name)])
    names = [s.name for s in connected]
    for length in a.prefix if "prefix" in cases else ():
        t = {n: ttft[(length, n)] for n in {w for (L, w) in ttft if L == length}}
        tag = "" if length == a.prefix[0] else f"_{length}"
        for n in names:
            result[f"prefix_{n}_vs_own{tag}"] = ratio([b / o for b, o in zip(t[f"{n}-B"], t[f"{n}-A"])])
            result[f"prefix_recompute_vs_{n}{tag}"] = ratio([c / b for c, b in zip(t["none-R"], t[f"{n}-B"])])
        if {"kvtier", "lmcache"} <= set(names):
            result[f"prefix_kvtier_vs_lmcache{tag}"] = ratio(
                [k / m for k, m in zip(t["kvtier-B"], t["lmcache-B"])])
    if miss:
        result["ttft_miss_ms"] = {n: spread(xs) for n, xs in miss.items()}
        for n in names:
            result[f"miss_cost_{n}"] = ratio([b / o for b, o in zip(miss[f"{n}-B"], miss["none-R"])])
        if "kvtier-B salted" in miss:
            result["miss_cost_kvtier_same_process"] = ratio(
                [b / o for b, o in zip(miss["kvtier-B"], miss["kvtier-B salted"])])
    if decode:
        result["decode_ms_per_token"] = {n: spread(xs) for n, xs in decode.items()}
        for n in names:
            result[f"decode_{n}_vs_none"] = ratio([b / o for b, o in zip(decode[f"{n}-B"], decode["none-R"])])
    result["_ttft_raw"] = {f"{L}/{n}": xs for (L, n), xs in ttft.items()}
    return result


def footprint(systems) -> dict:
    out = {}
    for s in systems:
        f = s.footprint()
        if f is None:
            continue
        if hasattr(s, "cached_bytes"):
            f["cached_mib"] = round(s.cached_bytes() / (1 << 20), 1)
            f["capacity_mib"] = round(s.capacity_bytes() / (1 << 20), 1)
        out[s.name] = f
    return out


def memory_ratios(f: dict, tag: str = "") -> dict:
    """kvtier's memory held over LMCache's (anonymous + the shared memory its tiers
    or buffers took, not RSS: kvtierd's tiers are written by the engines, into
    memory its page tables never touch), and the same per MiB of KV held."""
    if "kvtier" not in f or "lmcache" not in f:
        return {}
    k, m = f["kvtier"], f["lmcache"]
    out = {f"rss_kvtier_vs_lmcache{tag}": round(k["memory_mib"] / m["memory_mib"], 3)}
    if k.get("cached_mib") and m.get("cached_mib"):
        out[f"memory_per_cached_kvtier_vs_lmcache{tag}"] = round(
            (k["memory_mib"] / k["cached_mib"]) / (m["memory_mib"] / m["cached_mib"]), 3)
    return out


def fill(a, engines, systems, tokens, geometry) -> dict:
    """Sends each connected system's writer engine distinct prompts of the longest
    prefix length, --fill times the largest cache's capacity of KV in all (one
    prompt in a smoke run), so that every cache is full and evicting."""
    connected = [s for s in systems if s.name != "none"]
    if not connected:
        return {}
    length = max(a.prefix)
    per_prompt = length * peers.kv_bytes_per_token(geometry)
    capacity = max(s.capacity_bytes() for s in connected)
    n = 1 if a.smoke else max(1, math.ceil(a.fill * capacity / per_prompt))
    say(f"footprint: filling the caches with {n} prompts of {length} tokens each "
        f"({n * per_prompt / (1 << 30):.2f} GiB of KV; the largest cache holds {capacity / (1 << 30):.2f})")
    started = time.monotonic()
    kvtier_system = next((s for s in connected if s.name == "kvtier"), None)
    for i in range(n):
        before = committed(kvtier_system) if kvtier_system else 0
        for s in connected:
            engines[f"{s.name}-A"].generate([tokens(length)], max_tokens=1)
        if kvtier_system:
            wait_for_commit(kvtier_system, before)
        if (i + 1) % 5 == 0 or i + 1 == n:
            say(f"footprint: {i + 1} of {n} prompts in {time.monotonic() - started:.0f} s")
    return {"fill_prompts": n, "fill_prompt_tokens": length, "fill_kv_mib": round(n * per_prompt / (1 << 20), 1)}


def plot(result, raw, directory):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(directory, exist_ok=True)
    paths = []
    lengths = sorted({k.split("/")[0] for k in raw}, key=int)
    if lengths:
        fig, axes = plt.subplots(1, len(lengths), figsize=(5.5 * len(lengths), 4), squeeze=False)
        for ax, length in zip(axes[0], lengths):
            names = sorted(n.split("/")[1] for n in raw if n.startswith(length + "/"))
            data = [raw[f"{length}/{n}"] for n in names]
            ax.boxplot(data, showfliers=True)
            ax.set_xticks(range(1, len(names) + 1), names, rotation=30, ha="right")
            ax.set_yscale("log")
            ax.set_ylabel("time to first token (ms, log)")
            ax.set_title(f"{length}-token prefix, {result['rounds']} rounds")
        fig.suptitle(f"TTFT per system ({result['model']}, {result['machine']}, {result['date']})")
        fig.tight_layout()
        path = os.path.join(directory, "peer_prefix_ttft.png")
        fig.savefig(path, dpi=110)
        paths.append(path)
    if "chat" in result:
        paths.append(plot_chat(result, directory))
    return paths


def plot_chat(result, directory, name="peer_chat.png"):
    """Throughput and TTFT p50/p99 per system and routing policy (medians over rounds)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    detail = result["chat"]["detail"]
    names = list(detail)
    policies = list(next(iter(detail.values())))
    profiled = any("profile" in detail[n][p] for n in names for p in policies)
    fig, axes = plt.subplots(1, 5 if profiled else 4, figsize=(25 if profiled else 20, 4.4))
    width = 0.8 / len(names)
    for k, (key, label) in enumerate((("requests_per_s", "requests / s"), ("ttft_p50_ms", "TTFT p50 (ms)"),
                                      ("ttft_p99_ms", "TTFT p99 (ms)"))):
        ax = axes[k]
        for i, n in enumerate(names):
            vals = [(detail[n][p].get(key) or {}).get("median") or 0 for p in policies]
            lo = [v - ((detail[n][p].get(key) or {}).get("min") or v) for v, p in zip(vals, policies)]
            hi = [((detail[n][p].get(key) or {}).get("max") or v) - v for v, p in zip(vals, policies)]
            ax.bar([j + i * width for j in range(len(policies))], vals, width, yerr=[lo, hi], label=n, capsize=3)
        ax.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(policies))], policies)
        ax.set_ylabel(label)
    axes[0].legend()
    # Every request's TTFT, pooled over the rounds: the distribution behind the p50 and p99.
    boxes, labels = [], []
    for p in policies:
        for n in names:
            xs = [x for r in detail[n][p].get("rounds", []) for x in r.get("ttft_ms", [])]
            if xs:
                boxes.append(xs)
                labels.append(f"{n}\n{p}")
    if boxes:
        axes[3].boxplot(boxes, showfliers=True)
        axes[3].set_xticks(range(1, len(labels) + 1), labels, fontsize=8)
        axes[3].set_yscale("log")
        axes[3].set_ylabel("TTFT of every request (ms, log)")
    if profiled:  # Where a request's time went: vLLM's queue, prefill and decode seconds (medians over rounds).
        ax, x, labels = axes[4], 0, []
        for p in policies:
            for n in names:
                prof = detail[n][p].get("profile") or {}
                bottom = 0.0
                for key, color in (("queue", "tab:gray"), ("prefill", "tab:orange"), ("decode", "tab:blue")):
                    v = (prof.get(f"{key}_s_per_request") or {}).get("median") or 0.0
                    ax.bar(x, v, 0.8, bottom=bottom, color=color, label=key if x == 0 else None)
                    bottom += v
                labels.append(f"{n}\n{p}")
                x += 1
        ax.set_xticks(range(len(labels)), labels, fontsize=8)
        ax.set_ylabel("seconds per request (vLLM's)")
        ax.legend()
    c = result["chat"]
    model = os.path.basename(result.get("model", "SmolLM2-135M-Instruct"))
    fig.suptitle(f"chat through vllm-router: {c['conversations']} conversations x {c['turns']} turns, "
                 f"{c['clients']} clients, {c['rounds']} rounds ({model}, {result['machine']}, "
                 f"{result['date']})")
    fig.tight_layout()
    path = os.path.join(directory, name)
    fig.savefig(path, dpi=110)
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kvtierd", required=True)
    p.add_argument("--model", default="", help="a Llama model directory (default: scripts/make_model.py's)")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    p.add_argument("--systems", default="kvtier,lmcache,none", help="of kvtier, lmcache and none")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--prefix", default="2048,7936", help="prefix lengths (tokens) of the prefix case")
    p.add_argument("--suffix", type=int, default=32, help="new tokens after the prefix")
    p.add_argument("--kv-cache-mib", type=int, default=512, help="each prefix engine's KV cache")
    p.add_argument("--blocks", type=int, default=182,
                   help="kvtierd's slots per tier (vLLM CPU blocks of 128 tokens: 1 GiB of the real model's)")
    p.add_argument("--l1-gb", type=float, default=2.0, help="LMCache's L1 (GiB): kvtierd's two tiers by default")
    p.add_argument("--kvtier-disk-mib", type=int, default=0,
                   help="also give kvtierd a disk store of this many MiB, written through (what survives its "
                        "SIGKILL in the faults case); 0: none, as LMCache runs with its L1 alone")
    p.add_argument("--fill", type=float, default=1.25,
                   help="footprint: KV sent to each writer engine, in multiples of the largest cache's capacity")
    p.add_argument("--settle", type=float, default=1.2, help="seconds before each timed request")
    p.add_argument("--decode-tokens", type=int, default=160, help="tokens each engine decodes in the decode case")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="one round of each case at small sizes; nothing judged")
    p.add_argument("--out", default="", help="also write the JSON here")
    p.add_argument("--plots", default="", help="draw the figures into this directory")
    try:
        import peer_chat
        peer_chat.add_args(p)
    except ImportError:
        peer_chat = None
    a = p.parse_args()
    cases = [c for c in a.cases.split(",") if c]
    for c in cases:
        if c not in CASES:
            p.error(f"unknown case {c!r}")
    if peer_chat is None and {"chat", "faults"} & set(cases):
        say("peer_chat.py is missing: skipping the chat and faults cases")
        cases = [c for c in cases if c not in ("chat", "faults")]
    if a.smoke:
        a.rounds, a.prefix, a.suffix, a.settle, a.decode_tokens = 1, "512", 16, 0.2, 16
    a.prefix = [int(x) for x in str(a.prefix).split(",")]
    model = a.model or subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_model.py")],
                                      check=True, capture_output=True, text=True).stdout.strip()
    vocab = peers.model_geometry(model)["vocab"]
    seed = a.seed or random.SystemRandom().randrange(1, 1 << 31)
    rng = random.Random(seed)

    def tokens(n):  # Ordinary token ids (the special ones are at the start of the vocabulary).
        return [rng.randrange(100, vocab - 1) for _ in range(n)]

    names = [n for n in a.systems.split(",") if n]
    run = tempfile.mkdtemp(prefix="kvtier-peer-bench.")
    systems = peers.systems(a.kvtierd, model, names, a.blocks, a.l1_gb, a.kvtier_disk_mib)
    say(f"model {model}, systems {', '.join(names)}, cases {', '.join(cases)}, {a.rounds} rounds, seed {seed} "
        f"(logs in {run})")
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    result: dict = {"bench": "peer", "model": os.path.basename(os.path.normpath(model)), "cases": cases,
                    "systems": names, "rounds": a.rounds, "prefix_tokens": a.prefix, "suffix_tokens": a.suffix,
                    "seed": seed, "smoke": a.smoke, "commit": commit,
                    "date": datetime.date.today().isoformat(), "machine": f"{os.cpu_count()} cores"}
    engines: dict = {}
    raw: dict = {}
    try:
        for s in systems:
            s.start(run)
        if {"prefix", "miss", "decode", "footprint"} & set(cases):
            specs = {}
            for s in systems:
                if s.name == "none":
                    specs["none-R"] = s
                else:
                    specs[f"{s.name}-A"] = specs[f"{s.name}-B"] = s
            say(f"starting {len(specs)} engines ({', '.join(specs)})")
            started = time.monotonic()
            llm = {"max_model_len": max(a.prefix) + a.suffix + 64}
            engines = start_engines(specs, model, run, a.kv_cache_mib << 20, llm)
            say(f"engines up in {time.monotonic() - started:.0f} s")
            for e in engines.values():  # The first request of an engine pays for its set-up.
                e.generate([tokens(300)], max_tokens=1)
            part = prefix_and_miss(a, engines, systems, tokens, cases)
            raw = part.pop("_ttft_raw")
            result.update(part)
        if "footprint" in cases:
            result["footprint_after_cases"] = footprint(systems)
            result.update(memory_ratios(result["footprint_after_cases"], "_after_cases"))
            result["footprint_fill"] = fill(a, engines, systems, tokens, peers.model_geometry(model))
            result["footprint"] = footprint(systems)
            result.update(memory_ratios(result["footprint"]))
        for e in engines.values():
            e.stop()
        engines = {}
        chat_cases = tuple(c for c in cases if c in ("chat", "faults"))
        if peer_chat is not None and chat_cases:
            part = peer_chat.run_cases(systems, model, run, a, rng, a.smoke, chat_cases)
            for case, r in part.items():
                result[case] = r
                result.update(r.get("figures", {}))
    finally:
        for e in engines.values():
            e.stop()
        for s in systems:
            s.stop()
    if a.plots:
        result["plots"] = [os.path.relpath(x, ROOT) for x in plot(result, raw, a.plots)]
    emit(result, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
