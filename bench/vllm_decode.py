"""vllm_bench.py --decode-save: what the connector costs a decoding engine, at
a short and a long context.

Two engines: one with KvtierConnector, one without it. Each decodes
--decode-tokens tokens after a new prompt of 512 tokens and of --long-context
tokens (vLLM's CPU blocks are 128 tokens, so a save happens every 128 decoded
tokens, besides the prompt's own save as its prefill ends). Each round runs
three requests per length, interleaved, in an order that rotates from round to
round, each after --settle seconds (a vLLM worker busy-polls for a second after
its last step, taking a core from whichever engine runs next):
  saved   the connector's engine, the prompt as is: looked up, its prompt and
          each block its decode completes saved;
  salted  the connector's engine, the prompt with a cache_salt: the connector
          leaves the request alone, but is loaded and called every step;
  none    the engine without the connector.
decode_save_ratio_<n> (the issue's figure) is the median over rounds of the
decode rate without the connector over the rate with it and saving (tokens
after the first, over the time from the first token to the last), with its 95%
bootstrap interval (lo, hi) and range: 1.0 means
the connector costs nothing, the same ratio at both lengths means a save's cost
does not grow with the context. Two engines also differ as processes, so the
split is reported too: decode_save_vs_salted_<n> (the saves' own work, within
one engine) and decode_salted_vs_none_<n> (what the connector costs when it
does nothing for a request, plus the two processes' difference).
decode_step_ratio_<n> is decode_save_ratio_<n> from each run's median time
between tokens: a typical decode step, without the few steps that the prompt's
own save (right after the prefill) slows. (Until this comparison had an engine
without the connector, it compared saved with salted only; a cost that every
request pays, such as the OpenMP team a save's copy once started, was then
invisible.)"""

from __future__ import annotations

import os
import statistics
import sys
import time

from bench_kvtierd import ratio, spread

CASES = ("saved", "salted", "none")


def decode_rate(engine, prompt, tokens, salt=None) -> tuple[float, float]:
    """Tokens per second after the first, as the engine's steps returned them:
    over the whole decode, and from the median time between two tokens (a
    typical step: what a decode save costs, without the prompt's own save
    right after the prefill)."""
    steps = engine.stream([prompt], at=[0.0], max_tokens=tokens, salts=[salt])["steps"]
    ends = [s["at"] + s["seconds"] for s in steps if 0 in s["out"]]
    gaps = [b - a for a, b in zip(ends, ends[1:])]
    return (len(ends) - 1) / (ends[-1] - ends[0]), 1 / statistics.median(gaps)


def run(engine_cls, model, run_dir, sock, kv_bytes, tokens_fn, a) -> dict:
    lengths = {"512": 512, "8k": a.long_context}
    llm = {"max_model_len": a.long_context + a.decode_tokens}
    engines = {"kvtier": engine_cls(model, os.path.join(run_dir, "decode.log"), socket=sock,
                                    kv_cache_bytes=kv_bytes, llm=llm)}
    try:
        engines["none"] = engine_cls(model, os.path.join(run_dir, "decode-none.log"), kv_cache_bytes=kv_bytes,
                                     llm=llm)
        for e in engines.values():
            e.generate([tokens_fn(300)], max_tokens=1)  # Warm-up.
        rates = {n: {c: [] for c in CASES} for n in lengths}
        typical = {n: {c: [] for c in CASES} for n in lengths}
        for r in range(a.rounds):
            for name, n in lengths.items():
                for case in CASES[r % 3:] + CASES[:r % 3]:
                    time.sleep(a.settle)
                    salt = f"decode-{r}-{name}" if case == "salted" else None
                    engine = engines["none" if case == "none" else "kvtier"]
                    whole, step = decode_rate(engine, tokens_fn(n), a.decode_tokens, salt)
                    rates[name][case].append(whole)
                    typical[name][case].append(step)
                print(f"  round {r + 1}, {name}: " + ", ".join(f"{c} {rates[name][c][-1]:.2f}" for c in CASES)
                      + " tokens/s", file=sys.stderr, flush=True)
    finally:
        for e in engines.values():
            e.stop()

    def ratios(table, name, faster, slower):
        return [f / s for f, s in zip(table[name][faster], table[name][slower])]

    out: dict = {"decode_tokens": a.decode_tokens, "long_context_tokens": a.long_context}
    for name in lengths:
        save = ratios(rates, name, "none", "saved")
        out[f"decode_save_ratio_{name}"] = round(statistics.median(save), 3)
        out[f"decode_save_ratio_{name}_spread"] = ratio(save)
        out[f"decode_save_vs_salted_{name}"] = ratio(ratios(rates, name, "salted", "saved"))
        out[f"decode_salted_vs_none_{name}"] = ratio(ratios(rates, name, "none", "salted"))
        out[f"decode_tokens_per_s_{name}"] = {k: round(statistics.median(v), 2) for k, v in rates[name].items()}
        out[f"decode_tokens_per_s_{name}_rounds"] = {k: [round(x, 2) for x in v] for k, v in rates[name].items()}
        out[f"decode_step_ratio_{name}"] = spread(ratios(typical, name, "none", "saved"))
    out["targets"] = {f"decode_save_ratio_{n} within 3%": abs(out[f"decode_save_ratio_{n}"] - 1) <= 0.03
                      for n in lengths}
    return out
