#!/usr/bin/env python3
"""vllm_fault_bench.py --kvtierd PATH [--model DIR]: what kvtierd's absence costs
a vLLM engine with KvtierConnector, request by request and step by step.

One engine with the connector (K) and one without (R, the reference) on a
kvtierd that is absent, then started, SIGKILLed, started again, SIGSTOPped (a
hung daemon), and started again. In each phase, prompts arrive every --every
seconds (a burst of --burst at the phase's start, when the fault happens):
each is a prefix shared by all of them plus a question of its own, so that
while kvtierd is up the prefix is a hit, and when it goes the lookups that
still see it cached plan loads that fail (the fault is proved by the
connector's load_error_blocks; a killed phase whose lookups all saw kvtierd
gone first is tried again, at most three times). Every output is compared
with R's (greedy tokens and top-5 logprobs). The figure: the longest engine
step in each phase against the connector's request_timeout (the bound a
kvtierd that stops answering may hold a step), and the median step beside
the phases where kvtierd is up. Prints progress, then one JSON object as its
last line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python", "tests", "vllm"))
sys.path.insert(0, HERE)
from bench_kvtierd import CONFIG, emit  # noqa: E402
from vllm_engines import BLOCK, Engine, difference, make_model, prompt  # noqa: E402

import kvtier  # noqa: E402

PHASES = ("absent", "up", "killed", "back", "hung", "back after hang")
FAULTS = ("killed", "hung")
WATCHED = ("vllm:kvtier_lookups", "vllm:kvtier_load_error_blocks", "vllm:kvtier_loaded_blocks",
           "vllm:kvtier_saved_blocks", "vllm:kvtier_saves_dropped", "vllm:kvtier_save_errors")


class Kvtierd:
    """kvtierd on one configuration file, started and stopped as the phases say."""

    def __init__(self, binary, run, geometry, blocks):
        self.binary, self.run = binary, run
        self.socket = os.path.join(run, "kvtierd.sock")
        self.config = os.path.join(run, "kvtierd.yaml")
        self.instance = "bench-fault-" + uuid.uuid4().hex[:8]
        with open(self.config, "w") as f:
            f.write(CONFIG.format(instance=self.instance, socket=self.socket, blocks=blocks, extra="",
                                  block_tokens=BLOCK, **geometry))
        self.proc = None

    def start(self):
        log = open(os.path.join(self.run, "kvtierd.log"), "a")  # noqa: SIM115 - the daemon's, for its life
        self.proc = subprocess.Popen([self.binary, "--config", self.config], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                kvtier.Client(socket=self.socket, connect_timeout=0.2).ping()
                return
            except kvtier.Error:
                time.sleep(0.02)
        raise SystemExit("kvtierd did not start; see " + log.name)

    def gone(self):
        """Reaps a kvtierd that was killed (or kills a stopped one) and clears what it left."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.proc = None
        for name in os.listdir("/dev/shm"):
            if name.startswith(self.instance + "."):
                os.unlink(os.path.join("/dev/shm", name))

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
        self.gone()


def spread(xs):
    xs = sorted(xs)
    return {"median": round(statistics.median(xs), 2), "min": round(xs[0], 2), "max": round(xs[-1], 2), "n": len(xs)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kvtierd", required=True)
    p.add_argument("--model", default="", help="a Llama model directory (default: a small seeded one)")
    p.add_argument("--prefix", type=int, default=1024, help="tokens of the prefix every prompt shares")
    p.add_argument("--suffix", type=int, default=24, help="tokens of each prompt's own question")
    p.add_argument("--every", type=float, default=0.2, help="seconds between prompts")
    p.add_argument("--burst", type=int, default=4, help="prompts arriving together at each phase's start")
    p.add_argument("--phase-seconds", type=float, default=3.0)
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--request-timeout", type=float, default=2.0, help="the connector's request_timeout")
    p.add_argument("--out", default="", help="also write the JSON line here")
    a = p.parse_args()

    run = tempfile.mkdtemp(prefix="kvtier-vllm-fault.")
    model = a.model or make_model(os.path.join(run, "tiny"), seed=1)
    with open(os.path.join(model, "config.json")) as f:
        cfg = json.load(f)
    heads = cfg["num_attention_heads"]
    geometry = {"layers": cfg["num_hidden_layers"], "kv_heads": cfg.get("num_key_value_heads", heads),
                "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // heads}
    daemon = Kvtierd(a.kvtierd, run, geometry, blocks=256)
    engines = {}
    try:
        print(f"vllm_fault_bench: model {model}, prompts of {a.prefix} + {a.suffix} tokens every {a.every} s, "
              f"request_timeout {a.request_timeout} s; starting two engines (logs in {run})", file=sys.stderr,
              flush=True)
        # K starts with kvtierd absent: the first phase.
        engines["K"] = Engine(model, os.path.join(run, "k.log"), socket=daemon.socket,
                              extra={"request_timeout": a.request_timeout}, llm={"enable_prefix_caching": False})
        engines["R"] = Engine(model, os.path.join(run, "r.log"))
        shared = prompt(1, a.prefix)
        per_phase = max(1, int(a.phase_seconds / a.every))
        count = {"n": 0}

        def prompts(n):
            count["n"] += n
            return [shared + prompt(1000 + count["n"] - n + i, a.suffix) for i in range(n)]

        phases = {}
        attempts = {"killed": 0}

        def phase(name, events=(), seconds=a.phase_seconds):
            n = a.burst + max(per_phase, int(seconds / a.every))
            batch = prompts(n)
            at = [0.0] * a.burst + [a.every * (i + 1) for i in range(n - a.burst)]
            want = engines["R"].generate(batch, max_tokens=a.max_tokens)
            before = engines["K"].metrics()
            out = engines["K"].stream(batch, at, events, max_tokens=a.max_tokens)
            after = engines["K"].metrics()
            steps = [s["seconds"] * 1000 for s in out["steps"]]
            phases[name] = {
                "prompts": n,
                "equal_outputs": sum(difference(g, w) is None for g, w in zip(out["outputs"], want)),
                "cached_tokens": sum(o["cached"] for o in out["outputs"]),
                "longest_step_ms": round(max(steps), 1),
                "step_ms": spread(steps),
                **{k.split(":kvtier_")[1]: after.get(k, 0) - before.get(k, 0) for k in WATCHED},
            }
            r = phases[name]
            print(f"  {name}: {r['equal_outputs']}/{n} outputs equal, {r['cached_tokens']} tokens cached, "
                  f"{r['load_error_blocks']} load errors, longest step {r['longest_step_ms']} ms, median "
                  f"{r['step_ms']['median']} ms", file=sys.stderr, flush=True)

        phase("absent")
        daemon.start()
        time.sleep(1.0)  # The scheduler's link finds it within a second.
        phase("up")
        while True:
            attempts["killed"] += 1
            phase("killed", events=[{"at": 0.0, "pid": daemon.proc.pid, "signal": "SIGKILL"}])
            daemon.gone()
            if phases["killed"]["load_error_blocks"] > 0 or attempts["killed"] == 3:
                break
            # Every lookup saw kvtierd gone before a load tried it: again, with the prefix cached.
            daemon.start()
            time.sleep(1.0)
            phase("up")
        daemon.start()
        time.sleep(1.0)
        phase("back")
        phase("hung", events=[{"at": 0.0, "pid": daemon.proc.pid, "signal": "SIGSTOP"}],
              seconds=max(a.phase_seconds, 2 * a.request_timeout + 1))
        daemon.gone()
        daemon.start()
        time.sleep(1.0)
        phase("back after hang")
        up_median = statistics.median([phases[n]["step_ms"]["median"] for n in ("up", "back", "back after hang")])
        away = max(phases[n]["longest_step_ms"] for n in FAULTS)
        result = {
            "bench": "vllm_fault", "model": os.path.basename(os.path.normpath(model)), "prefix_tokens": a.prefix,
            "suffix_tokens": a.suffix, "every_s": a.every, "request_timeout_ms": a.request_timeout * 1000,
            "phases": phases, "killed_attempts": attempts["killed"],
            "all_outputs_equal": all(r["equal_outputs"] == r["prompts"] for r in phases.values()),
            "faults_with_failed_loads": [n for n in FAULTS if phases[n]["load_error_blocks"] > 0],
            "longest_step_while_away_ms": away,
            "median_step_while_up_ms": up_median,
            "targets": {"longest step while away <= request_timeout + 500 ms":
                        away <= a.request_timeout * 1000 + 500},
            "machine": f"{os.cpu_count()} cores",
        }
    finally:
        for e in engines.values():
            e.stop()
        daemon.stop()
    emit(result, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
