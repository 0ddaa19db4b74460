"""vllm_bench.py --decode-save: what the connector's saves cost a decoding
engine, at a short and a long context.

One engine with KvtierConnector decodes --decode-tokens tokens after a new
prompt of 512 tokens and of --long-context tokens (vLLM's CPU blocks are 128
tokens, so a save happens every 128 decoded tokens, besides the prompt's own
save as its prefill ends). Each prompt runs twice, interleaved and in an order
that alternates from round to round: as is (the connector looks it up, saves
its prompt and each block its decode completes), and with a cache_salt (the
connector leaves the request alone: the same engine as if without it).
decode_save_ratio_<n> is the median over rounds of the decode rate with the
salt over the rate without it (tokens after the first, over the time from the
first token to the last): 1.0 means the saves cost nothing; the same ratio at
both lengths means a save's cost does not grow with the context.
decode_step_ratio_<n> is the same from each run's median time between tokens:
a typical decode step, without the few steps the prompt's own save (right
after the prefill) or a block's save slows. On a small shared machine the
decode rate drifts by several percent from one run to the next, so the
whole-decode ratio needs many rounds; the step ratio needs fewer."""

from __future__ import annotations

import os
import statistics
import sys


def decode_rate(engine, prompt, tokens, salt=None) -> tuple[float, float]:
    """Tokens per second after the first, as the engine's steps returned them:
    over the whole decode, and from the median time between two tokens (a
    typical step: what a decode save costs, without the prompt's own save
    right after the prefill)."""
    steps = engine.stream([prompt], at=[0.0], max_tokens=tokens, salts=[salt])["steps"]
    ends = [s["at"] + s["seconds"] for s in steps if 0 in s["out"]]
    gaps = [b - a for a, b in zip(ends, ends[1:])]
    return (len(ends) - 1) / (ends[-1] - ends[0]), 1 / statistics.median(gaps)


def run(engine_cls, model, run_dir, sock, kv_bytes, tokens_fn, a, spread) -> dict:
    lengths = {"512": 512, "8k": a.long_context}
    engine = engine_cls(model, os.path.join(run_dir, "decode.log"), socket=sock, kv_cache_bytes=kv_bytes,
                        llm={"max_model_len": a.long_context + a.decode_tokens})
    try:
        engine.generate([tokens_fn(300)], max_tokens=1)  # Warm-up.
        rates = {n: {"saved": [], "salted": []} for n in lengths}
        typical = {n: {"saved": [], "salted": []} for n in lengths}
        for r in range(a.rounds):
            for name, n in lengths.items():
                order = ["saved", "salted"] if r % 2 == 0 else ["salted", "saved"]
                for case in order:
                    salt = f"decode-{r}-{name}" if case == "salted" else None
                    whole, step = decode_rate(engine, tokens_fn(n), a.decode_tokens, salt)
                    rates[name][case].append(whole)
                    typical[name][case].append(step)
                print(f"  round {r + 1}, {name}: {rates[name]['saved'][-1]:.1f} tokens/s saved, "
                      f"{rates[name]['salted'][-1]:.1f} without the connector", file=sys.stderr, flush=True)
    finally:
        engine.stop()
    out: dict = {"decode_tokens": a.decode_tokens, "long_context_tokens": a.long_context}
    for name in lengths:
        ratio = [s / k for s, k in zip(rates[name]["salted"], rates[name]["saved"])]
        out[f"decode_save_ratio_{name}"] = round(statistics.median(ratio), 3)
        out[f"decode_save_ratio_{name}_spread"] = spread(ratio)
        out[f"decode_tokens_per_s_{name}"] = {k: round(statistics.median(v), 2) for k, v in rates[name].items()}
        step = [s / k for s, k in zip(typical[name]["salted"], typical[name]["saved"])]
        out[f"decode_step_ratio_{name}"] = spread(step)
    out["targets"] = {f"decode_save_ratio_{n} within 3%": abs(out[f"decode_save_ratio_{n}"] - 1) <= 0.03
                      for n in lengths}
    return out
