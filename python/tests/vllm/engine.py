"""A vLLM engine in its own process, driven over stdin/stdout by the tests and
the benchmark: python engine.py CONFIG_JSON, then one JSON request a line.

CONFIG_JSON: {"model": DIR, "socket": PATH or null (no connector), "extra": {...}
(kv_connector_extra_config), "llm": {...} (more LLM(...) arguments)}.
Requests: {"prompts": [[token ids], ...], "max_tokens": N, "salts": [str|null, ...]}
-> {"outputs": [{"tokens": [...], "logprobs": [{token id: logprob}, ...],
"cached": prompt tokens vLLM did not compute, "ttft": seconds}]}, one line
starting with RESULT_PREFIX (vLLM logs to the same streams); {"quit": true}
ends it. Requests run one batch at a time: several prompts are served together.
"""

import json
import os
import sys
import time

RESULT_PREFIX = "KVTIER-ENGINE "


def reply(obj):
    sys.stdout.write(RESULT_PREFIX + json.dumps(obj) + "\n")
    sys.stdout.flush()


def main():
    cfg = json.loads(sys.argv[1])
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    kw = dict(model=cfg["model"], dtype="float32", max_model_len=4096, enforce_eager=True, seed=0,
              kv_cache_memory_bytes=cfg.get("kv_cache_bytes", 128 << 20), disable_log_stats=False)
    kw.update(cfg.get("llm", {}))
    if cfg.get("socket"):
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="KvtierConnector", kv_connector_module_path="kvtier.vllm", kv_role="kv_both",
            kv_connector_extra_config={"socket": cfg["socket"], **cfg.get("extra", {})})
    llm = LLM(**kw)
    reply({"ready": True, "pid": os.getpid()})
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("quit"):
            break
        sp = SamplingParams(max_tokens=req.get("max_tokens", 8), temperature=0, logprobs=5)
        salts = req.get("salts") or [None] * len(req["prompts"])
        prompts = []
        for ids, salt in zip(req["prompts"], salts):
            p = {"prompt_token_ids": ids}
            if salt:
                p["cache_salt"] = salt
            prompts.append(p)
        started = time.perf_counter()
        outs = llm.generate(prompts, sp, use_tqdm=False)
        elapsed = time.perf_counter() - started
        reply({"outputs": [{
            "tokens": list(o.outputs[0].token_ids),
            "logprobs": [{str(k): v.logprob for k, v in lp.items()} for lp in (o.outputs[0].logprobs or [])],
            "cached": o.num_cached_tokens or 0,
            "ttft": (o.metrics.first_token_latency if getattr(o, "metrics", None) is not None and
                     getattr(o.metrics, "first_token_latency", None) else elapsed),
        } for o in outs], "seconds": elapsed})


if __name__ == "__main__":
    main()
