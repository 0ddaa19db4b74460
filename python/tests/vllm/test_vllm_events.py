"""events.format: vllm, read with vLLM's own types: a subscriber that decodes
kvtierd's stream into vllm.distributed.kv_events.KVEventBatch (msgspec), joins
through the replay socket and follows the live stream, rebuilds per medium
exactly the blocks per tier that Client.session() reports after a workload of
commits, promotions, demotions and pressure drops; with a write-back disk store,
its STORAGE medium is the store's block files (those sessions place on "disk"
among them). No engine runs here.
(CTest label vllm, with the connector tests.)"""

import os
import sys
import time

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from test_events import BT, tokens, workload  # noqa: E402

from conftest import Daemon  # noqa: E402

zmq = pytest.importorskip("zmq")
msgspec = pytest.importorskip("msgspec")
kv_events = pytest.importorskip("vllm.distributed.kv_events")
AllBlocksCleared = kv_events.AllBlocksCleared
BlockRemoved = kv_events.BlockRemoved
BlockStored = kv_events.BlockStored
KVEventBatch = kv_events.KVEventBatch

TOPIC = "kv@host-a@tiny"
# Small tiers: 8 sessions of 6 blocks overflow both, so pressure demotes and drops.
PROFILE = """\
  - name: py
    layers: 2
    kv_heads: 2
    head_dim: 8
    dtype: fp32
    block_tokens: 4
    gpu_blocks: 16
    host_blocks: 24"""
EVENTS = f"""events:
  enabled: true
  format: vllm
  topic: "{TOPIC}"
  max_batch_events: 16
"""
END_SEQ = b"\xff" * 8  # vLLM's ZmqEventPublisher.END_SEQ: (-1).to_bytes(8, "big", signed=True)
MEDIUM = {"gpu": "GPU", "host": "CPU"}
# A write-back disk tier of 40 records of the profile above (96 + 16 + 512 bytes each): pressure
# drops fill it, and it evicts.
DISK = """stores:
  tiers:
    - kind: disk
      path: {path}
      max_bytes: 24960
      write: back
"""


def vllm_hash(key_hex):
    """The hash the vllm format gives a key: its last 8 bytes (the low word), as vLLM's int hashes."""
    return int(key_hex, 16) & ((1 << 64) - 1)


class VllmSubscriber:
    """A router's view of one vLLM-format stream: SUB for live batches, a DEALER
    for replays (vLLM's ROUTER answers a request [empty, start] with one message
    per batch: a REQ socket would take the first alone)."""

    def __init__(self, publish, replay):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
        self.sub.connect(publish)
        self.replay_ep = replay
        self.dealer = self.ctx.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.LINGER, 0)
        self.dealer.connect(replay)
        self.decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self.media = {}  # "GPU" / "CPU" -> set of block hashes
        self.tokens = {}  # hash -> token ids of its last BlockStored
        self.parent = {}  # hash -> parent hash
        self.last_seq = 0
        self.gaps = 0

    def close(self):
        self.ctx.destroy(linger=0)

    def replay(self, start):
        self.dealer.send_multipart([b"", start.to_bytes(8, "big")])
        out = []
        while True:
            assert self.dealer.poll(5000), "no answer to the replay"
            empty, topic, seq, payload = self.dealer.recv_multipart()
            assert empty == b""
            if seq == END_SEQ:
                assert topic == b"" and payload == b""
                return out
            assert topic == TOPIC.encode()
            out.append((int.from_bytes(seq, "big"), payload))

    def apply(self, seq, payload):
        assert seq == self.last_seq + 1, f"batch {seq} after {self.last_seq}"
        self.last_seq = seq
        batch = self.decoder.decode(payload)
        assert isinstance(batch, KVEventBatch) and batch.data_parallel_rank == 0
        for e in batch.events:
            if isinstance(e, AllBlocksCleared):
                self.media.clear()
            elif isinstance(e, BlockStored):
                assert e.medium in ("GPU", "CPU", "STORAGE") and e.block_size == BT and e.lora_id is None
                assert len(e.token_ids) == BT * len(e.block_hashes), "token_ids always come with the vllm format"
                blocks = self.media.setdefault(e.medium, set())
                for i, h in enumerate(e.block_hashes):
                    assert isinstance(h, int) and 0 <= h < 1 << 64
                    assert h not in blocks, f"{h:x} stored twice in {e.medium}"
                    blocks.add(h)
                    self.tokens[h] = e.token_ids[i * BT:(i + 1) * BT]
                    self.parent[h] = e.parent_block_hash if i == 0 else e.block_hashes[i - 1]
            elif isinstance(e, BlockRemoved):
                for h in e.block_hashes:
                    assert h in self.media.get(e.medium, ()), f"{h:x} removed from {e.medium} before stored there"
                    self.media[e.medium].discard(h)
            else:
                raise AssertionError(f"unexpected event {e!r}")

    def read(self, timeout):
        """Applies at most one live batch, filling a gap from the replay first."""
        if not self.sub.poll(timeout):
            return False
        topic, seq_bytes, payload = self.sub.recv_multipart()
        assert topic == TOPIC.encode()
        seq = int.from_bytes(seq_bytes, "big")
        if seq <= self.last_seq:
            return True
        if seq > self.last_seq + 1:
            self.gaps += 1
            for s, p in self.replay(self.last_seq + 1):
                if self.last_seq < s < seq:
                    self.apply(s, p)
        self.apply(seq, payload)
        return True

    def blocks(self):
        return {m: s for m, s in self.media.items() if s}


def daemon_media(c, places=None):
    """Per medium, the hashes of every session's blocks, as Client.session() names their tiers;
    blocks placed below the host tier go into `places` by place ("disk"; "nowhere": the first alone)."""
    out = {}
    for s in c.sessions():
        lost = False
        for key, tier in c.session(s["id"])["chain"]:
            if places is not None and tier not in MEDIUM:
                # A session's first block no store holds; those after it are nowhere a fetch reaches.
                if tier != "nowhere" or not lost:
                    places.setdefault(tier, set()).add(vllm_hash(key))
                lost |= tier == "nowhere"
                continue
            assert tier in MEDIUM, f"a block in {tier}"
            out.setdefault(MEDIUM[tier], set()).add(vllm_hash(key))
    return out


def disk_hashes(path):
    """The hashes of the disk store's block files (each named by its store key, the key's 32 hex digits last)."""
    return {vllm_hash(n[-32:]) for n in os.listdir(path) if not n.startswith(".")}


@pytest.fixture
def vllm_daemon(tmp_path):
    d = Daemon(tmp_path, EVENTS, profiles=PROFILE)
    yield d
    d.stop()


@pytest.fixture
def vllm_disk_daemon(tmp_path):
    disk = tmp_path / "disk"
    d = Daemon(tmp_path, EVENTS + DISK.format(path=disk), profiles=PROFILE)
    d.disk = str(disk)
    yield d
    d.stop()


def join(c, sub):
    """Brings `sub` up from batch 1 through the replay, then until a live batch shows the subscription took."""
    for seq, payload in sub.replay(1):
        sub.apply(seq, payload)
    for i in range(100):
        with c.allocate(1) as w:
            c.commit(w, f"probe-{i}", tokens(5000 + i, 1))
        if sub.read(100):
            return
    pytest.fail("no live batch reached the subscriber")


def test_vllms_decoder_rebuilds_the_blocks_per_tier_from_the_stream(vllm_daemon):
    c = vllm_daemon.client()
    sub = VllmSubscriber(f"ipc://{vllm_daemon.socket}.events", f"ipc://{vllm_daemon.socket}.replay")
    try:
        # Joins late: the replay brings it up from batch 1, which opens with AllBlocksCleared.
        workload(c, 1, blocks=6)
        first = sub.replay(1)
        assert first and first[0][0] == 1
        assert isinstance(sub.decoder.decode(first[0][1]).events[0], AllBlocksCleared)
        for seq, payload in first:
            sub.apply(seq, payload)
        for i in range(100):  # Until a live batch shows the subscription took.
            with c.allocate(1) as w:
                c.commit(w, f"probe-{i}", tokens(5000 + i, 1))
            if sub.read(100):
                break
        else:
            pytest.fail("no live batch reached the subscriber")
        workload(c, 2, blocks=6)
        workload(c, 3, blocks=6)
        deadline = time.monotonic() + 10
        while True:  # Copies may still be landing: until the stream is quiet and the sets agree.
            want = c.stats()["event_seq"]
            while sub.last_seq < want:
                assert sub.read(5000), f"batch {sub.last_seq + 1} of {want} never came"
            daemon = daemon_media(c)
            if (sub.blocks() == daemon and c.stats()["event_seq"] == want) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert sub.blocks() == daemon
        assert daemon.get("GPU") and daemon.get("CPU"), "blocks in both tiers"
        stats = c.stats()
        assert stats["event_batches_dropped"] == 0
        assert stats["dropped_blocks"] > 0, "pressure dropped blocks (their BlockRemoved came too)"
        assert stats["promoted_blocks"] > 0 and stats["demoted_blocks"] > 0

        # A promoted block (s2-0's first, acquired back after its demotion) is in GPU, with its tokens and no parent.
        keys = [vllm_hash(k) for k in c.keys(tokens(200, 6))]
        assert sub.tokens[keys[0]] == tokens(200, 1)
        assert sub.parent[keys[0]] is None and sub.parent[keys[1]] == keys[0]

        # vLLM's example client asks with a REQ socket: it gets the first batch it asked for, framed as vLLM frames it.
        req = sub.ctx.socket(zmq.REQ)
        req.setsockopt(zmq.LINGER, 0)
        req.connect(sub.replay_ep)
        req.send((2).to_bytes(8, "big"))
        assert req.poll(5000)
        topic, seq, payload = req.recv_multipart()
        assert (topic, int.from_bytes(seq, "big")) == (TOPIC.encode(), 2)
        assert isinstance(sub.decoder.decode(payload), KVEventBatch)
    finally:
        sub.close()


def test_the_storage_medium_is_what_the_disk_store_holds(vllm_disk_daemon):
    c = vllm_disk_daemon.client()
    sub = VllmSubscriber(f"ipc://{vllm_disk_daemon.socket}.events", f"ipc://{vllm_disk_daemon.socket}.replay")
    try:
        join(c, sub)
        workload(c, 1, blocks=6)
        workload(c, 2, blocks=6)
        workload(c, 3, blocks=6)
        deadline = time.monotonic() + 10
        while True:  # Copies and writes may still be landing: until the stream is quiet and the sets agree.
            want = c.stats()["event_seq"]
            while sub.last_seq < want:
                assert sub.read(5000), f"batch {sub.last_seq + 1} of {want} never came"
            places = {}
            daemon = daemon_media(c, places)  # Its locates may learn of blocks gone: read the stream again after.
            files = disk_hashes(vllm_disk_daemon.disk)
            media = sub.blocks()
            storage = media.pop("STORAGE", set())
            ok = (media == daemon and storage == files and places.get("disk", set()) <= storage
                  and not places.get("nowhere", set()) & storage)
            if (ok and c.stats()["event_seq"] == want) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert media == daemon
        assert storage == files, "STORAGE is the disk store's block files"
        assert places.get("disk") and places["disk"] <= storage, "the sessions' blocks on disk are in STORAGE"
        assert not places.get("nowhere", set()) & storage
        stats = c.stats()
        assert stats["store.disk.put_blocks"] > 0 and stats["store.disk.evicted_files"] > 0
        assert stats["event_storage_dropped"] == 0 and stats["event_storage_forgotten"] == 0
    finally:
        sub.close()
