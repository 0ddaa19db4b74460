"""The stores below the host tier from Python workers: two kvtierd processes
("host A" and "host B") share a real redis-server; a conversation a worker on
host A started continues on host B with the prefix from Redis and the logits of
a full recomputation. A model of another identity never loads it, and a Redis
that is down costs recomputing, not a failed turn."""

import shutil
import socket
import subprocess
import time

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_hf import prompt, tiny_llama  # noqa: E402

import kvtier  # noqa: E402
import kvtier.hf  # noqa: E402
from conftest import Daemon, stop_process  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    def __init__(self, tmp_path):
        # scripts/setup.sh installs it: a missing server fails the test rather than skip it.
        assert shutil.which("redis-server"), "redis-server is not on PATH: scripts/setup.sh installs it (Debian: redis-server)"
        self.port = free_port()
        self.dir = tmp_path / "redis"
        self.dir.mkdir()
        self.proc = None
        self.start()

    def start(self):
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", str(self.dir)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self):
        stop_process(self.proc)


@pytest.fixture
def redis(tmp_path):
    r = Redis(tmp_path)
    yield r
    r.stop()


@pytest.fixture
def hosts(tmp_path, redis):
    """Two daemons whose remote tier is the same Redis."""
    extra = ("stores:\n  fetch_budget_ms: 2000\n  tiers:\n    - kind: redis\n"
             f"      nodes: [127.0.0.1:{redis.port}]\n      timeout_ms: 300\n")
    made = []
    for name in ("a", "b"):
        d = tmp_path / name
        d.mkdir()
        made.append(Daemon(d, extra))
    yield made
    for d in made:
        d.stop()


def stat(client, name):
    return dict(client.stats())[name]


def wait_for_stat(client, name, value, limit=10.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if stat(client, name) >= value:
            return True
        time.sleep(0.01)
    return False


@torch.no_grad()
def test_a_chat_started_on_host_a_continues_on_host_b_with_the_logits_of_recomputing(hosts):
    a, b = hosts
    model = tiny_llama(seed=5)
    identity = kvtier.hf.model_identity(model)
    on_a = kvtier.hf.PrefixCache(a.client(model_id=identity), model)
    ids = prompt(30, 23)
    past, cached = on_a.load("chat", ids)
    out = model(ids, past_key_values=past, use_cache=True)
    assert on_a.store("chat", ids, out.past_key_values) == 5
    assert wait_for_stat(a.client(), "store.redis.put_blocks", 5), "host A writes its blocks through to Redis"

    client_b = b.client(model_id=identity)
    on_b = kvtier.hf.PrefixCache(client_b, model)
    longer = torch.cat([ids, prompt(31, 9)], dim=1)
    past, cached = on_b.load("chat", longer)
    assert cached == 20
    step = model(longer[:, cached:], past_key_values=past, use_cache=True).logits[0, -1]
    torch.testing.assert_close(step, model(longer).logits[0, -1], rtol=1e-5, atol=1e-5)
    assert stat(client_b, "store.redis.hit_blocks") == 5
    assert stat(client_b, "imported_blocks") == 5

    # Another model on host B (same geometry, other weights) never loads them.
    other = tiny_llama(seed=6)
    past, cached = kvtier.hf.PrefixCache(b.client(model_id=kvtier.hf.model_identity(other)), other).load(
        "other", longer)
    assert cached == 0


@torch.no_grad()
def test_redis_down_means_recomputing_on_host_b_not_a_failed_turn(hosts, redis):
    a, b = hosts
    model = tiny_llama(seed=7)
    identity = kvtier.hf.model_identity(model)
    on_a = kvtier.hf.PrefixCache(a.client(model_id=identity), model)
    ids = prompt(40, 16)
    out = model(ids, use_cache=True)
    assert on_a.store("chat", ids, out.past_key_values) == 4
    assert wait_for_stat(a.client(), "store.redis.put_blocks", 4)
    redis.stop()

    on_b = kvtier.hf.PrefixCache(b.client(model_id=identity), model)
    longer = torch.cat([ids, prompt(41, 5)], dim=1)
    started = time.monotonic()
    past, cached = on_b.load("chat", longer)
    assert time.monotonic() - started < 1.5, "a Redis that is down costs at most a timeout"
    assert cached == 0
    logits = model(longer[:, cached:], past_key_values=past, use_cache=True).logits[0, -1]
    torch.testing.assert_close(logits, model(longer).logits[0, -1])
    assert stat(b.client(), "store.redis.errors") >= 1
