"""KvtierConnector across hosts and below the host tier, in real vLLM engines:
two kvtierd instances ("host A" and "host B": separate instances, sockets and
shared memory) that share nothing but a real Redis Cluster, each with an
engine; engine B answers a prompt engine A computed, loading the prefix from
the cluster; and a kvtierd restarted cold (its GPU and host tiers lost) with
its disk store kept. The faults (kvtierd B SIGKILLed and restarted cold,
engine A SIGKILLed, kvtierd B SIGKILLed while a lookup waits on it for the
paused cluster, a Redis master SIGKILLed) are proved to have happened
before outputs are compared. Every output, tokens and top-5 logprobs, is an engine's without the
connector. (CTest label multihost.)

Where the machine allows it (root, iproute2), each host is a network
namespace of its own (its kvtierd and engine in it), reaching the cluster on
the machine over a veth pair; elsewhere, processes reaching it over loopback
(the test says which)."""

import json
import os
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from netns import Namespaces  # noqa: E402
from redis_cluster import RedisCluster  # noqa: E402
from vllm_engines import BLOCK, NO_APC, ROOT, Engine, hit, kvtierd_stats, make_model, profile, prompt, same, store_total, wait_for  # noqa: E402

from conftest import Daemon  # noqa: E402

pytest.importorskip("vllm")

@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_model(str(tmp_path_factory.mktemp("models") / "tiny"), seed=1)


@pytest.fixture(scope="module")
def reference(model, tmp_path_factory):
    e = Engine(model, str(tmp_path_factory.mktemp("ref") / "engine.log"))
    yield e
    e.stop()


def host(tmp_path, name, stores, prefix=()):
    d = tmp_path / name
    d.mkdir(exist_ok=True)
    return Daemon(d, stores, profiles=profile(64, 256), prefix=prefix)


@pytest.fixture
def hosts():
    """Each host's command prefix, the address the cluster is reached at, and
    what reads the bytes host B received over its veth pair (None: loopback)."""
    if not Namespaces.available():
        print("multihost: no network namespaces here (not root, or no iproute2): hosts reach the cluster "
              "over loopback")
        yield [(), ()], "127.0.0.1", None
        return
    ns = Namespaces()
    try:
        (a, gateway), (b, _) = ns.add(), ns.add()
        print(f"multihost: hosts in network namespaces, reaching the cluster at {gateway} over veth pairs")
        yield [a, b], gateway, lambda: ns.received(2)
    finally:
        ns.close()


def test_engine_b_on_host_b_continues_what_engine_a_computed_on_host_a_through_redis_cluster(
        model, reference, tmp_path, hosts):
    (in_a, in_b), address, b_received = hosts
    cluster = RedisCluster(tmp_path, address=address)
    daemons, engines = [], []
    try:
        a_host, b_host = host(tmp_path, "a", cluster.store(), in_a), host(tmp_path, "b", cluster.store(), in_b)
        daemons += [a_host, b_host]
        p1, p2 = prompt(1, 1000), prompt(2, 700)
        want = reference.generate([p1, p2], max_tokens=16)
        a = Engine(model, str(tmp_path / "a.log"), socket=a_host.socket, prefix=in_a)
        engines.append(a)
        got = a.generate([p1, p2], max_tokens=16)
        assert [o["cached"] for o in got] == [0, 0]
        same(got, want)
        blocks = (hit(len(p1)) + hit(len(p2))) // BLOCK
        wait_for(lambda: cluster.keys() >= blocks, 10, "host A's blocks to reach the cluster")

        b = Engine(model, str(tmp_path / "b.log"), socket=b_host.socket, llm=NO_APC, prefix=in_b)
        engines.append(b)
        assert kvtierd_stats(b_host.socket)["store_fetched_blocks"] == 0  # Host B holds nothing of its own.
        before = b_received() if b_received else 0
        got = b.generate([p1], max_tokens=16)
        assert got[0]["cached"] == hit(len(p1))
        same(got, want[:1])
        if b_received:  # Host B's fetch crossed its veth pair.
            assert b_received() - before > 0
        m = b.metrics()
        assert m["vllm:kvtier_store_lookup_hit_tokens"] == hit(len(p1)), m
        assert kvtierd_stats(b_host.socket)["store_fetched_blocks"] == hit(len(p1)) // BLOCK

        # kvtierd B dies and comes back cold (no warm restart): its tiers are empty, the cluster is not.
        b_host.proc.kill()
        b_host.proc.wait()
        b_host.stop()
        daemons.remove(b_host)
        b_host = host(tmp_path, "b", cluster.store(), in_b)
        daemons.append(b_host)
        assert kvtierd_stats(b_host.socket)["committed_blocks"] == 0
        time.sleep(1.0)  # The engine's links find the new kvtierd within a ping interval (0.5 s).
        got = b.generate([p2], max_tokens=16)
        assert got[0]["cached"] == hit(len(p2))
        same(got, want[1:])

        # Engine A computes two more prompts and is SIGKILLed: what it saved is host B's all the same.
        p3, p4 = prompt(3, 900), prompt(4, 800)
        want34 = reference.generate([p3, p4], max_tokens=16)
        same(a.generate([p3, p4], max_tokens=16), want34)
        blocks += (hit(len(p3)) + hit(len(p4))) // BLOCK
        wait_for(lambda: cluster.keys() >= blocks, 10, "p3's and p4's blocks to reach the cluster")
        a.kill()
        engines.remove(a)
        assert a.proc.poll() is not None
        got = b.generate([p3], max_tokens=16)
        assert got[0]["cached"] == hit(len(p3))
        same(got, want34[:1])

        # kvtierd B is SIGKILLed while engine B's lookup waits on it for the cluster (every node
        # paused, so the fetch is in flight): the request is computed; a kvtierd started again serves on.
        m0 = b.metrics()
        cluster.pause()
        try:
            out = b.stream([p4], at=[0.0], max_tokens=16,
                           events=[{"at": 0.3, "pid": b_host.proc.pid, "signal": "SIGKILL"}])["outputs"]
        finally:
            cluster.resume()
        assert b_host.proc.wait(10) is not None, "kvtierd B did not die"
        m1 = b.metrics()
        lookup = {k: m1[f"vllm:kvtier_store_{k}"] - m0.get(f"vllm:kvtier_store_{k}", 0)
                  for k in ("lookups", "lookup_errors", "lookup_seconds")}
        assert lookup["lookups"] == 1 and lookup["lookup_errors"] == 1, m1
        assert lookup["lookup_seconds"] >= 0.2, (f"the lookup failed at once, not while it waited: {lookup} "
                                                 f"{ {k: (m0.get(k), v) for k, v in m1.items() if 'lookup' in k} }")
        assert out[0]["cached"] == 0
        same(out, want34[1:])
        b_host.stop()
        daemons.remove(b_host)
        b_host = host(tmp_path, "b", cluster.store(), in_b)
        daemons.append(b_host)
        time.sleep(1.0)  # The engine's links find the new kvtierd within a ping interval.
        got = b.generate([p3], max_tokens=16)
        assert got[0]["cached"] == hit(len(p3)), "the new kvtierd B fetches p3 from the cluster"
        same(got, want34[:1])

        # A Redis master dies: what host B asks for next is partly, or wholly, out of reach. (Engine B's
        # save of p4, computed above, began as kvtierd B died; its call reconnects within connect_timeout
        # and is resent, so it may land on the new kvtierd B (docs/design.md): its tiers are emptied first.)
        subprocess.run([os.environ["CACHECTL"], "--socket", b_host.socket, "evict", "--all"], check=True,
                       capture_output=True)
        assert kvtierd_stats(b_host.socket)["blocks"] == 0
        cluster.kill(cluster.ports[0])
        before = kvtierd_stats(b_host.socket)
        got = b.generate([p4], max_tokens=16)
        after = kvtierd_stats(b_host.socket)
        faults = [store_total(x, "errors") + store_total(x, "down") for x in (before, after)]
        assert faults[1] > faults[0], ("host B's store saw no fault: the test did not test a dead Redis node: "
                                       f"{ {k: (before.get(k), v) for k, v in after.items() if k.startswith('store')} } "
                                       f"{got[0]['cached']}")
        same(got, want34[1:])  # Whatever of the prefix came, the rest was computed.
    finally:
        for e in engines:
            e.stop()
        for d in daemons:
            d.stop()
        cluster.stop()


DISK_STORE = """stores:
  locate_budget_ms: 5000
  tiers:
    - kind: disk
      path: {path}
      max_bytes: 256MiB
      write: through
"""


def test_an_engine_restarted_after_kvtierd_lost_its_tiers_loads_its_prefix_from_the_disk_store(
        model, reference, tmp_path):
    disk = tmp_path / "disk"
    d = host(tmp_path, "h", DISK_STORE.format(path=disk))
    engines = []
    try:
        p = prompt(5, 1200)
        want = reference.generate([p], max_tokens=16)
        a = Engine(model, str(tmp_path / "a.log"), socket=d.socket)
        engines.append(a)
        same(a.generate([p], max_tokens=16), want)
        wait_for(lambda: store_total(kvtierd_stats(d.socket), "put_blocks") >= hit(len(p)) // BLOCK, 10, "the disk store")
        a.stop()
        engines.remove(a)
        d.stop()
        d = host(tmp_path, "h", DISK_STORE.format(path=disk))
        assert kvtierd_stats(d.socket)["committed_blocks"] == 0  # Cold: the host tier was lost.
        a2 = Engine(model, str(tmp_path / "a2.log"), socket=d.socket)
        engines.append(a2)
        got = a2.generate([p], max_tokens=16)
        assert got[0]["cached"] == hit(len(p))
        same(got, want)
        assert kvtierd_stats(d.socket)["store_fetched_blocks"] == hit(len(p)) // BLOCK
    finally:
        for e in engines:
            e.stop()
        d.stop()


def test_the_benchmark_runs_and_names_its_figures(model, tmp_path):
    """bench/vllm_bench.py --remote-store, smoke-sized on the small model (no
    timing thresholds): engine A's prefix reached by engine B on the same
    kvtierd, by engine H on another through the Redis Cluster, recomputed by R."""
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "vllm_bench.py"), "--kvtierd",
                          os.environ["KVTIERD"], "--model", model, "--rounds", "1", "--prefix", "256",
                          "--suffix", "16", "--blocks", "512", "--settle", "0", "--remote-store"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("ttft_kvtier_ms", "ttft_recompute_ms", "ttft_own_prefix_cache_ms", "ttft_remote_store_ms",
                "zero_reuse_ratio", "ttft_kvtier_spread", "zero_reuse_ratio_spread", "recompute_vs_remote_store",
                "zero_reuse_vs_engine_without_connector"):
        assert key in result, key
    assert result["cached_tokens_kvtier"] == hit(256 + 16)
    assert result["cached_tokens_remote_store"] == hit(256 + 16)
    assert result["rounds_with_equal_tokens"] == 1
