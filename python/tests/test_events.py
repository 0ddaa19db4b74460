"""kvtier.events against a real kvtierd: a subscriber that joins late through the
replay ends with exactly the host's blocks per tier (as Client.session() reports
them), fills a gap from the replay, and says when batches are lost for good."""

import time

import pytest

from conftest import Daemon

# pyzmq and msgpack come with python/requirements.txt (scripts/python_env.sh): missing, this fails.
from kvtier.events import EventStream, EventsLost, HostBlocks  # noqa: E402

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


def workload(c, seed):
    """Commits, demotes, promotes and evicts sessions: every kind of event."""
    for i in range(8):
        sid = f"s{seed}-{i}"
        with c.allocate(12) as w:
            c.commit(w, sid, tokens(seed * 100 + i, 12))
        if i % 3 == 0:
            c.demote(sid)
        if i % 3 == 2:
            with c.acquire(tokens(seed * 100, 12), session=f"s{seed}-0") as lease:
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
