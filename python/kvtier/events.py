"""KV events from kvtierd, for cache-aware routers written in Python.

kvtierd (with ``events: {enabled: true}``) publishes every block stored, moved
between tiers or removed, and every session evicted, in msgpack batches over
ZMQ; docs/events.md gives the format field by field. This module
subscribes to that stream (pyzmq), fills gaps in sequence numbers from
kvtierd's replay socket, and keeps one host's blocks per tier::

    from kvtier.events import EventStream, HostBlocks

    host = HostBlocks()
    with EventStream(socket="/run/kvtier/kvtierd.sock", from_seq=1) as stream:
        for batch in stream:          # dicts, in sequence order, none missing
            host.apply(batch)
            ...                       # host.cached_prefix(keys) for routing

Keys are 32 hex digits, as ``Client.keys()`` and ``cachectl session`` print them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgpack
import zmq

from . import Error

__all__ = ["EventStream", "HostBlocks", "EventsLost", "FORMAT_VERSION", "REPLAY_END"]

FORMAT_VERSION = 1
REPLAY_END = 2**64 - 1


class EventsLost(Error):
    """Batches the replay no longer holds (or that kvtierd dropped) are gone:
    a replica built from the stream is stale and must start over. A kvtier.Error
    (code "events_lost"), so one handler catches it with the client's errors."""

    code = "events_lost"

    def __init__(self, first: int, last: int) -> None:
        super().__init__(f"KV event batches {first}..{last} are lost (not kept for replay)")
        self.first, self.last = first, last


def _hex_keys(value: Any) -> Any:
    """Batch fields as Python values, block keys (16-byte binaries) as hex."""
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {k: _hex_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_hex_keys(v) for v in value]
    return value


def _seq(frame: bytes) -> int:
    return int.from_bytes(frame, "big")


class EventStream:
    """A subscription to one kvtierd's KV events.

    ``socket``: kvtierd's socket; the endpoints default to kvtierd's defaults
    next to it (``ipc://SOCKET.events`` and ``ipc://SOCKET.replay``), or are
    given (``publish``, ``replay``: ``tcp://HOST:PORT`` for a remote host).
    ``from_seq``: first replay what kvtierd keeps from this sequence number on
    (1: from the start of its stream); None: live batches only.
    """

    def __init__(self, socket: str = "/run/kvtier/kvtierd.sock", publish: str | None = None,
                 replay: str | None = None, topic: str = "kvtier", from_seq: int | None = None,
                 timeout: float = 5.0, context: zmq.Context[Any] | None = None) -> None:
        self._ctx = context or zmq.Context.instance()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self._sub.connect(publish or f"ipc://{socket}.events")
        self._dealer = self._ctx.socket(zmq.DEALER)
        self._dealer.setsockopt(zmq.LINGER, 0)
        self._dealer.connect(replay or f"ipc://{socket}.replay")
        self._timeout_ms = int(timeout * 1000)
        self.last_seq: int | None = None  # The last batch handed out (None: none yet, live only).
        self.gaps_filled = 0  # Gaps in the live stream filled from the replay.
        self._pending: list[tuple[int, dict[str, Any]]] = []  # Batches fetched but not handed out yet, in order.
        if from_seq is not None:
            self.last_seq = max(from_seq, 1) - 1  # A replay that starts later than asked: lost batches.
            self._pending = self.replay(from_seq)

    def replay(self, start: int) -> list[tuple[int, dict[str, Any]]]:
        """The batches kvtierd keeps from sequence number ``start`` on, as (seq, batch) pairs."""
        self._dealer.send_multipart([b"", start.to_bytes(8, "big")])
        out: list[tuple[int, dict[str, Any]]] = []
        while True:
            if not self._dealer.poll(self._timeout_ms):
                raise TimeoutError("kvtierd did not answer the KV event replay")
            _, frame, payload = self._dealer.recv_multipart()
            seq = _seq(frame)
            if seq == REPLAY_END:
                return out
            out.append((seq, self._decode(payload)))

    @staticmethod
    def _decode(payload: bytes) -> dict[str, Any]:
        batch = _hex_keys(msgpack.unpackb(payload, raw=False))
        if batch.get("v") != FORMAT_VERSION:
            raise ValueError(f"KV event batch of format version {batch.get('v')}; this module reads {FORMAT_VERSION}")
        return batch

    def _hand_out(self, seq: int, batch: dict[str, Any]) -> dict[str, Any]:
        if self.last_seq is not None and seq > self.last_seq + 1:
            raise EventsLost(self.last_seq + 1, seq - 1)
        self.last_seq = seq
        return batch

    def next(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The next batch (a dict), or None if none came within ``timeout`` seconds (None: wait)."""
        while self._pending:
            seq, batch = self._pending.pop(0)
            if self.last_seq is None or seq > self.last_seq:
                return self._hand_out(seq, batch)
        while True:
            if not self._sub.poll(None if timeout is None else int(timeout * 1000)):
                return None
            _, frame, payload = self._sub.recv_multipart()
            seq = _seq(frame)
            if self.last_seq is not None and seq <= self.last_seq:
                continue  # Handed out already (from the replay).
            if self.last_seq is not None and seq > self.last_seq + 1:
                # This subscriber fell behind and lost messages: fill the gap from the replay.
                self.gaps_filled += 1
                missed = [(s, b) for s, b in self.replay(self.last_seq + 1) if self.last_seq < s < seq]
                self._pending = missed + [(seq, self._decode(payload))]
                return self.next(timeout)
            return self._hand_out(seq, self._decode(payload))

    def __iter__(self) -> Iterator[dict[str, Any] | None]:
        while True:
            yield self.next()

    def close(self) -> None:
        self._sub.close()
        self._dealer.close()

    def __enter__(self) -> EventStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class HostBlocks:
    """One host's cached blocks and the tier of each, replayed from its events."""

    def __init__(self) -> None:
        self.tier_of: dict[str, str] = {}  # key (hex) -> "gpu" | "host"
        self.instance: Any = None

    def apply(self, batch: dict[str, Any]) -> None:
        if batch.get("instance") != self.instance and self.instance is not None:
            self.tier_of.clear()  # Another kvtierd run: its stream starts with "cleared" anyway.
        self.instance = batch.get("instance")
        for e in batch["events"]:
            kind = e["type"]
            if kind == "cleared":
                self.tier_of.clear()
            elif kind == "stored":
                self.tier_of[e["key"]] = e["tier"]
            elif kind == "moved":
                self.tier_of[e["key"]] = e["to"]
            elif kind == "removed":
                self.tier_of.pop(e["key"], None)

    def cached_prefix(self, keys: list[str]) -> int:
        """How many of ``keys`` (a prompt's block keys, in order) the host holds from the first on."""
        n = 0
        for k in keys:
            if k not in self.tier_of:
                break
            n += 1
        return n
