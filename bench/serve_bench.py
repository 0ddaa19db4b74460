#!/usr/bin/env python3
"""TTFT through the OpenAI-style HTTP service per cache mode, interleaved in one
run: three kvtier.serve processes on one model -- --cache kvtier (over a
kvtierd started here), --cache local (each conversation's DynamicCache in the
process), --cache none (recompute) -- and every turn of every conversation sent
to all three back to back, in a rotating order, through the openai client
(streamed; TTFT = the first content chunk). Reports p50/p99 per mode for the
follow-up turns and the medians of per-turn paired ratios with 95% bootstrap
intervals; the last line is one JSON object.

  bench/serve_bench.py --kvtierd build/daemon/kvtierd    (PYTHONPATH=build/python, the
                                                          scripts/python_env.sh interpreter)
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np
import openai
from bench_kvtierd import start_kvtierd

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url, proc, what):
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited at start")
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{what} did not start")


def boot_ci(x, rng, n=2000):
    x = np.asarray(x)
    meds = np.median(rng.choice(x, size=(n, len(x)), replace=True), axis=1)
    return {"median": float(np.median(x)), "ci_lo": float(np.percentile(meds, 2.5)),
            "ci_hi": float(np.percentile(meds, 97.5))}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kvtierd", required=True)
    p.add_argument("--chats", type=int, default=6)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--system-words", type=int, default=1900, help="words (tokens) of the shared-nothing first prompt")
    p.add_argument("--user-words", type=int, default=40)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--threads", type=int, default=1, help="torch threads per service")
    a = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="kvtier-servebench-")
    model = os.path.join(tmp, "model")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_tiny_model.py"), model,
                    "--layers", str(a.layers), "--hidden", str(a.hidden), "--heads", str(a.heads),
                    "--kv-heads", str(a.kv_heads), "--head-dim", str(a.head_dim)], check=True,
                   capture_output=True, env=env)
    blocks = a.chats * (a.system_words + a.turns * (a.user_words + a.max_tokens + 16)) // 16 + 256
    daemon, sock = start_kvtierd(a.kvtierd, tmp, a.layers, a.kv_heads, a.head_dim, blocks)
    procs = [daemon]
    try:
        modes = ["kvtier", "local", "none"]
        clients = {}
        for mode in modes:
            port = free_port()
            proc = subprocess.Popen([sys.executable, "-m", "kvtier.serve", "--model", model, "--socket", sock,
                                     "--cache", mode, "--port", str(port), "--threads", str(a.threads), "--log-level",
                                     "warning"], env=env, stderr=open(os.path.join(tmp, f"serve-{mode}.log"), "w"))
            procs.append(proc)
            wait_http(f"http://127.0.0.1:{port}/health", proc, f"kvtier.serve --cache {mode}")
            clients[mode] = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
        name = clients["kvtier"].models.list().data[0].id
        words = ("the gpu tier holds a kv cache of every chat session and each worker process reads its prefix "
                 "from host memory when it is cold").split()
        rng = np.random.default_rng(a.seed)

        def text(n):
            return " ".join(words[i] for i in rng.integers(0, len(words), n))

        chats = [[{"role": "system", "content": text(a.system_words)}, {"role": "user", "content": text(a.user_words)}]
                 for _ in range(a.chats)]
        ttft = {m: [] for m in modes}
        cached = []
        for turn in range(a.turns):
            for c, messages in enumerate(chats):
                order = modes[(turn + c) % 3:] + modes[: (turn + c) % 3]
                replies = {}
                for mode in order:
                    start = time.perf_counter()
                    first, parts, usage = None, [], None
                    for chunk in clients[mode].chat.completions.create(model=name, messages=messages, stream=True,
                                                                       max_tokens=a.max_tokens, temperature=0):
                        if first is None and chunk.choices and chunk.choices[0].delta.content:
                            first = time.perf_counter() - start
                        if chunk.choices and chunk.choices[0].delta.content:
                            parts.append(chunk.choices[0].delta.content)
                        if getattr(chunk, "usage", None):
                            usage = chunk.usage
                    replies[mode] = "".join(parts)
                    if turn > 0:  # Follow-up turns: what the cache is for.
                        ttft[mode].append(1000 * (first if first is not None else time.perf_counter() - start))
                        if mode == "kvtier":
                            cached.append(usage.prompt_tokens_details.cached_tokens)
                if len(set(replies.values())) != 1:
                    raise SystemExit(f"chat {c} turn {turn}: the modes replied differently: {replies}")
                messages += [{"role": "assistant", "content": replies["kvtier"]},
                             {"role": "user", "content": text(a.user_words)}]
    finally:
        for proc in procs[::-1]:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)  # The model's weights: hundreds of MB.
    ms = {m: np.array(v) for m, v in ttft.items()}
    boot = np.random.default_rng(1)
    result = {
        "bench": "serve_ttft", "chats": a.chats, "turns": a.turns, "follow_up_pairs": int(len(ms["kvtier"])),
        "history_words": a.system_words, "seed": a.seed,
        "model": f"llama {a.layers} layers, hidden {a.hidden}, {a.heads} heads ({a.kv_heads} kv) x {a.head_dim}, "
                 f"fp32, CPU ({a.threads} thread(s) per service)",
        "ttft_ms": {m: {"p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99))} for m, v in ms.items()},
        "kvtier_over_local": boot_ci(ms["kvtier"] / ms["local"], boot),
        "none_over_kvtier": boot_ci(ms["none"] / ms["kvtier"], boot),
        "cached_tokens_median": float(np.median(cached)),
    }
    result["targets"] = {"kvtier_over_local_p50<=1.10": result["kvtier_over_local"]["median"] <= 1.10,
                         "none_over_kvtier_p50>=10": result["none_over_kvtier"]["median"] >= 10}
    for m, v in result["ttft_ms"].items():
        print(f"{m:7s} follow-up TTFT p50 {v['p50']:8.1f} ms  p99 {v['p99']:8.1f} ms", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
