"""kvtier.events against a real kvtierd: a subscriber that joins late through the
replay ends with exactly the host's blocks per tier (as Client.session() reports
them), fills a gap from the replay, and says when batches are lost for good."""

import time

import pytest

# pyzmq and msgpack come with python/requirements.txt (scripts/python_env.sh): missing, this fails.
import kvtier  # noqa: E402
from conftest import Daemon
from kvtier.events import EventsLost, EventStream, HostBlocks  # noqa: E402

BT = 4  # block_tokens of the test profile (conftest.PROFILE)
# 64 GPU and 256 host blocks (conftest); small host tier here so that blocks are dropped.
EVENTS = """events:
  enabled: true
  token_ids: true
  max_batch_events: 16
  replay_batches: {replay}
"""


def tokens(seed, blocks):
    return [seed * 1000 + i for i in range(blocks * BT)]


def workload(c, seed, blocks=12):
    """Commits, demotes, promotes and evicts sessions of `blocks` blocks: every kind of event."""
    for i in range(8):
        sid = f"s{seed}-{i}"
        with c.allocate(blocks) as w:
            c.commit(w, sid, tokens(seed * 100 + i, blocks))
        if i % 3 == 0:
            c.demote(sid)
        if i % 3 == 2:
            with c.acquire(tokens(seed * 100, blocks), session=f"s{seed}-0") as lease:
                lease.wait()
    c.evict(f"s{seed}-7")


def daemon_blocks(c):
    out = {}
    for s in c.sessions():
        for key, tier in c.session(s["id"])["chain"]:
            out[key] = tier
    return out


def stat(c, name):
    return c.stats()[name]


def settle(c, stream, host):
    """Applies batches until the replica equals the daemon's blocks (copies may still be landing)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        want = stat(c, "event_seq")
        while (stream.last_seq or 0) < want:
            batch = stream.next(timeout=5)
            assert batch is not None, f"batch {stream.last_seq + 1} of {want} never came"
            host.apply(batch)
        if host.tier_of == daemon_blocks(c) and stat(c, "event_seq") == want:
            return
        time.sleep(0.05)
    assert host.tier_of == daemon_blocks(c)


@pytest.fixture
def events_daemon(tmp_path):
    d = Daemon(tmp_path, EVENTS.format(replay=4096))
    yield d
    d.stop()


def test_a_late_subscriber_ends_with_the_hosts_blocks_per_tier(events_daemon):
    c = events_daemon.client()
    workload(c, 1)
    host = HostBlocks()
    with EventStream(socket=events_daemon.socket, from_seq=1) as stream:
        first = stream.next(timeout=5)
        assert first["seq"] == 1 and first["events"][0]["type"] == "cleared"
        host.apply(first)
        workload(c, 2)
        settle(c, stream, host)
    assert host.tier_of, "the workload left blocks cached"
    assert set(host.tier_of.values()) <= {"gpu", "host"}
    keys = c.keys(tokens(106, 12))
    assert host.cached_prefix(keys) == 12
    assert host.cached_prefix(c.keys(tokens(999, 3))) == 0


def test_a_gap_is_filled_from_the_replay(events_daemon):
    c = events_daemon.client()
    host = HostBlocks()
    with EventStream(socket=events_daemon.socket, from_seq=1) as stream:
        host.apply(stream.next(timeout=5))
        # Joined: a live batch arrives (the subscription took).
        for i in range(100):
            with c.allocate(1) as w:
                c.commit(w, f"probe-{i}", tokens(5000 + i, 1))
            batch = stream.next(timeout=0.1)
            if batch is not None:
                host.apply(batch)
                break
        # Two live batches are read past, as if dropped: the next one shows the gap.
        workload(c, 3)
        lost = 0
        while lost < 2:
            if stream._sub.poll(5000):
                stream._sub.recv_multipart()
                lost += 1
        workload(c, 4)
        settle(c, stream, host)
        assert stream.gaps_filled >= 1


def test_batches_the_replay_no_longer_holds_are_reported_lost(tmp_path):
    d = Daemon(tmp_path, EVENTS.format(replay=2))
    try:
        c = d.client()
        workload(c, 5)
        time.sleep(0.1)  # The last batch closes at the next tick.
        with EventStream(socket=d.socket, from_seq=1) as stream:
            with pytest.raises(EventsLost) as lost:
                stream.next(timeout=5)
        assert lost.value.first == 1
    finally:
        d.stop()


def test_an_isolated_tenants_blocks_and_sessions_never_reach_the_stream(tmp_path):
    """The stream's readers are the socket's whole group: an isolated tenant's
    keys, token ids and session ids must not be among what they read."""
    d = Daemon(tmp_path, EVENTS.format(replay=4096) + """tenants:
  - name: ta
    isolated: true
    gpu_blocks: 16
    host_blocks: 64
  - name: tb
""")
    try:
        ta, tb = d.client(tenant="ta"), d.client(tenant="tb")
        secret, public = tokens(7, 4), tokens(8, 4)
        with ta.allocate(4) as w:
            ta.commit(w, "ta-secret-session", secret)
        ta.demote("ta-secret-session")
        with tb.allocate(4) as w:
            tb.commit(w, "tb-session", public)
        ta.evict("ta-secret-session")
        tb.evict("tb-session")
        with tb.allocate(4) as w:
            tb.commit(w, "tb-again", public)
        time.sleep(0.2)  # The last batch closes at the next tick.
        events = []
        with EventStream(socket=d.socket, from_seq=1) as stream:
            while (stream.last_seq or 0) < stat(tb, "event_seq"):
                batch = stream.next(timeout=5)
                assert batch is not None
                events += batch["events"]
        seen_keys = {e["key"] for e in events if "key" in e}
        seen_tokens = {t for e in events for t in e.get("tokens", [])}
        seen_sessions = {e.get("session") for e in events if e["type"] == "session_evicted"}
        assert set(tb.keys(public)) <= seen_keys, "the shared tenant's blocks are published"
        assert "tb-session" in seen_sessions
        assert not set(ta.keys(secret)) & seen_keys
        assert not set(secret) & seen_tokens
        assert "ta-secret-session" not in seen_sessions
    finally:
        d.stop()


def _rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def test_the_replay_endpoint_bounds_message_size_and_request_rate(events_daemon):
    """Peers of the socket's group once grew kvtierd by 1.4 GiB with two huge
    frames on the replay socket, and took its CPU with a pipelined replay flood."""
    import zmq

    c = events_daemon.client()
    workload(c, 6)
    time.sleep(0.1)
    ctx = zmq.Context()
    endpoint = f"ipc://{events_daemon.socket}.replay"
    try:
        rss = _rss_kib(events_daemon.proc.pid)
        big = [ctx.socket(zmq.DEALER) for _ in range(4)]
        for s in big:
            s.setsockopt(zmq.LINGER, 0)
            s.connect(endpoint)
            s.send_multipart([b"", b"x" * (64 << 20)])  # 64 MiB each: refused as it arrives.
        time.sleep(1.0)
        assert _rss_kib(events_daemon.proc.pid) - rss < 64 << 10, "kvtierd buffered the huge frames"

        flood = ctx.socket(zmq.DEALER)
        flood.setsockopt(zmq.LINGER, 0)
        flood.setsockopt(zmq.RCVHWM, 0)
        flood.connect(endpoint)
        started = time.monotonic()
        for _ in range(2000):
            flood.send_multipart([b"", (1).to_bytes(8, "big")])
        pings = []
        while time.monotonic() - started < 1.5:
            t = time.perf_counter()
            c.ping()
            pings.append(time.perf_counter() - t)
            time.sleep(0.01)
        elapsed = time.monotonic() - started
        stats = c.stats()
        assert stats["event_replays"] <= 20 + 20 * elapsed + 2, stats["event_replays"]
        assert stats["event_replays_refused"] > 0
        pings.sort()
        assert pings[len(pings) // 2] < 0.02, f"a bystander's ping p50 {pings[len(pings) // 2] * 1000:.1f} ms"

        # An honest subscriber still gets its replay once the rate allows.
        time.sleep(1.1)
        with EventStream(socket=events_daemon.socket, from_seq=1) as stream:
            assert stream.next(timeout=5)["seq"] == 1
    finally:
        ctx.destroy(linger=0)


def test_lost_events_are_a_kvtier_error():
    """One `except kvtier.Error` handles a stale replica as it does the client's errors."""
    assert issubclass(EventsLost, kvtier.Error)
    e = EventsLost(3, 5)
    assert (e.first, e.last, e.code) == (3, 5, "events_lost") and "3..5" in str(e)
