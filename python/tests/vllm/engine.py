"""A vLLM engine in its own process, driven over stdin/stdout by the tests and
the benchmark: python engine.py CONFIG_JSON, then one JSON request a line.

CONFIG_JSON: {"model": DIR, "socket": PATH or null (no connector), "extra": {...}
(kv_connector_extra_config), "llm": {...} (more LLM(...) arguments), "kv_transfer":
{...} (instead of socket: KVTransferConfig's arguments, for another connector)}.
Requests: {"prompts": [[token ids], ...], "max_tokens": N, "salts": [str|null, ...]}
-> {"outputs": [{"tokens": [...], "logprobs": [{token id: logprob}, ...],
"cached": prompt tokens vLLM did not compute, "ttft": seconds}]}, one line
starting with RESULT_PREFIX, on the file descriptor CONFIG_JSON's "result_fd"
names (stdout without it: vLLM's processes log there too, and a long reply
written there can be cut by another process's log line); {"quit": true}
ends it. Requests run one batch at a time: several prompts are served together.
{"stream": true, "prompts": [...], "every": seconds or "at": [seconds, ...],
"events": [{"at": s, "pid": p, "signal": "SIGSTOP"}, ...], "max_tokens": N}:
prompts arriving over time while the engine steps, signals sent on the way ->
{"outputs": [...], "steps": [{"at": s, "seconds": s}, ...]}. {"metrics": true} -> {"metrics":
{name: value summed over labels}}: vLLM's own and the connector's.
"""

import json
import os
import sys
import time

RESULT_PREFIX = "KVTIER-ENGINE "


_replies = sys.stdout  # main() sets the channel only this process writes.


def reply(obj):
    _replies.write(RESULT_PREFIX + json.dumps(obj) + "\n")
    _replies.flush()


def metrics(llm):
    """vLLM's metrics (its own and the connector's vllm:kvtier_*), each summed over its labels.
    The connector's seconds are read from the Prometheus registry itself: vLLM's reader
    truncates every counter to an integer."""
    from prometheus_client import REGISTRY

    out = {}
    for m in llm.get_metrics():
        value = getattr(m, "value", None)
        if isinstance(value, (int, float)):
            out[m.name] = out.get(m.name, 0) + value
    for m in REGISTRY.collect():
        if m.name.startswith("vllm:kvtier_") and m.name.endswith("_seconds"):
            out[m.name] = sum(s.value for s in m.samples if s.name.endswith("_total"))
    return out


def stream(llm, req, SamplingParams):
    """Requests arriving over time: prompt i is added at req["at"][i] seconds
    (default every x i; with req["salts"][i] as its cache_salt, if given) while
    the engine steps, and each event {"at": s, "pid": p, "signal": "SIGKILL"}
    is sent when its time comes, before the prompts of that time; returns each
    output and every step's start, duration and the prompts it returned output
    for."""
    import signal

    engine = llm.llm_engine
    sp = SamplingParams(max_tokens=req.get("max_tokens", 8), temperature=0, logprobs=5)
    prompts = req["prompts"]
    at = req.get("at") or [req["every"] * i for i in range(len(prompts))]
    salts = req.get("salts") or [None] * len(prompts)
    events = sorted(req.get("events") or [], key=lambda e: e["at"])
    tag = f"{time.monotonic_ns()}-"  # Request ids never seen before by this engine.
    started = time.perf_counter()
    outputs, steps, added = {}, [], 0
    while len(outputs) < len(prompts):
        now = time.perf_counter() - started
        while events and events[0]["at"] <= now:
            e = events.pop(0)
            os.kill(e["pid"], getattr(signal, e["signal"]))
        while added < len(prompts) and at[added] <= now:
            prompt = {"prompt_token_ids": prompts[added]}
            if salts[added]:
                prompt["cache_salt"] = salts[added]
            engine.add_request(tag + str(added), prompt, sp)
            added += 1
        if not engine.has_unfinished_requests():
            upcoming = ([at[added]] if added < len(prompts) else []) + [e["at"] for e in events[:1]]
            nxt = min(upcoming, default=now)
            time.sleep(min(0.005, max(0.0, nxt - now)))
            continue
        t = time.perf_counter()
        out = []
        for o in engine.step():
            out.append(int(o.request_id[len(tag):]))
            if o.finished:
                outputs[out[-1]] = o
        steps.append({"at": round(t - started, 4), "seconds": round(time.perf_counter() - t, 4), "out": out})
    return {"outputs": [{
        "tokens": list(outputs[i].outputs[0].token_ids),
        "logprobs": [{str(k): v.logprob for k, v in lp.items()} for lp in (outputs[i].outputs[0].logprobs or [])],
        "cached": outputs[i].num_cached_tokens or 0,
    } for i in range(len(prompts))], "steps": steps}


def main():
    global _replies
    cfg = json.loads(sys.argv[1])
    if cfg.get("result_fd") is not None:
        os.set_inheritable(cfg["result_fd"], False)  # Not for the processes vLLM starts.
        _replies = os.fdopen(cfg["result_fd"], "w")
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    kw = dict(model=cfg["model"], dtype="float32", max_model_len=4096, enforce_eager=True, seed=0,
              kv_cache_memory_bytes=cfg.get("kv_cache_bytes", 128 << 20), disable_log_stats=False)
    kw.update(cfg.get("llm", {}))
    if cfg.get("kv_transfer"):
        kw["kv_transfer_config"] = KVTransferConfig(**cfg["kv_transfer"])
    elif cfg.get("socket"):
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="KvtierConnector", kv_connector_module_path="kvtier.vllm", kv_role="kv_both",
            kv_connector_extra_config={"socket": cfg["socket"], **cfg.get("extra", {})})
    llm = LLM(**kw)
    reply({"ready": True, "pid": os.getpid()})
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("quit"):
            break
        if req.get("metrics"):
            reply({"metrics": metrics(llm)})
            continue
        if req.get("stream"):
            reply(stream(llm, req, SamplingParams))
            continue
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
