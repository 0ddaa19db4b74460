"""kvtier.vllm's saves: the thread that runs them off the engine's step, and
what each request's session holds in kvtierd, so that a save sends only the
new blocks, in one round trip."""

from __future__ import annotations

import collections
import logging
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

import kvtier
from kvtier.paged import PagedKV, _end, _gpu_stream, save_blocks, save_new_blocks

_log = logging.getLogger("vllm.kvtier")

# The save thread's nice value: on a machine where the engine's threads take
# every core, its copies give way to the forward and the step's output path.
NICE = 10


class Saver:
    """One thread that runs the steps' saves, in order, at most `limit` waiting:
    put() refuses one past that (the caller counts it dropped; a dropped save
    is a later miss, never a wait). wait_for(ids) returns once no save of those
    requests is waiting or running: what a step waits for before it may write
    blocks that vLLM freed (their request finished or was preempted)."""

    def __init__(self, limit: int = 64):
        self.limit = limit
        self._cv = threading.Condition()
        self._queue: collections.deque = collections.deque()
        self._pending: dict[str, int] = {}  # Request id -> its saves waiting or running.
        self._running = 0
        self._thread = threading.Thread(target=self._run, name="kvtier-save", daemon=True)
        self._thread.start()

    def put(self, fn: Callable[[], None] | None, rid: str | None = None, always: bool = False) -> bool:
        """Queues fn (for request rid); always: even past the limit (small work that
        must not be lost, such as ending sessions). False when refused."""
        with self._cv:
            if not always and len(self._queue) >= self.limit:
                return False
            if rid is not None:
                self._pending[rid] = self._pending.get(rid, 0) + 1
            self._queue.append((fn, rid))
            self._cv.notify_all()
        return True

    def _run(self) -> None:
        try:  # Behind the engine's own threads for the CPU (Linux: a thread's nice value is its own).
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
        except (AttributeError, OSError):
            pass
        while True:
            with self._cv:
                while not self._queue:
                    self._cv.wait()
                fn, rid = self._queue.popleft()
                self._running += 1
            try:
                if fn is None:
                    return
                fn()
            except Exception:  # noqa: BLE001 - a save that fails is logged; the engine goes on
                _log.exception("kvtier: a save failed")
            finally:
                with self._cv:
                    self._running -= 1
                    if rid is not None:
                        if self._pending[rid] == 1:
                            del self._pending[rid]
                        else:
                            self._pending[rid] -= 1
                    self._cv.notify_all()

    def busy(self, rids: Iterable[str]) -> bool:
        with self._cv:
            return any(r in self._pending for r in rids)

    def wait_for(self, rids: Iterable[str]) -> None:
        """Returns once no save of requests `rids` waits or runs."""
        rids = set(rids)
        with self._cv:
            while any(r in self._pending for r in rids):
                self._cv.wait()

    def drain(self) -> None:
        """Returns once everything queued so far has run."""
        with self._cv:
            while self._queue or self._running:
                self._cv.wait()

    def close(self, timeout: float = 60) -> None:
        self.put(None, always=True)
        self._thread.join(timeout=timeout)


class Chains:
    """Per request, the kvtierd instance its session is on, how many of the
    prompt's blocks that session holds there and the last one's key; and the
    write lease kept from one save to the next. So a save costs what its new
    blocks cost, however long the context: the first save of a request probes
    the shared index (no round trip) for where kvtierd's copy of the prompt
    ends and hashes that prefix once; every save then writes only the blocks
    kvtierd lacks into the kept lease's slots and sends them with one
    client.save, which adopts the cached prefix as the session's chain by its
    last key and hands back the lease with slots for the next save. A save
    whose prefix kvtierd no longer holds in full goes the long way
    (save_blocks: acquire the prefix, allocate, commit). Used on the saver's
    thread only; loaded() and forget() may come from vLLM's."""

    def __init__(self, refill: int = 4):
        self.refill = refill  # Slots the kept lease holds for the next save.
        self.one_trip = True  # False once a kvtierd refused SaveRequest (it predates it).
        self._held: dict[str, tuple[int, int, str | None]] = {}
        self._spare: tuple[Any, Any] | None = None  # (client, write lease) from the last save.

    def loaded(self, rid: str, instance: int, held: int) -> None:
        """A load made request `rid`'s session hold `held` blocks on kvtierd `instance`."""
        self._held[rid] = (instance, held, None)

    def forget(self, rid: str) -> None:
        self._held.pop(rid, None)

    def save(self, client, paged: PagedKV, tokens: list[int], session: str, rid: str, block_ids: list[int],
             stream=None) -> int:
        """Saves what kvtierd lacks of engine blocks `block_ids` (the prompt's
        first blocks, `tokens` theirs) as request `rid`'s `session`. Returns
        the blocks stored. Raises kvtier.Error, as save_blocks."""
        instance, have, last = self._held.get(rid, (0, 0, None))
        if instance != client.instance_id:
            have, last = 0, None  # What a session held on another kvtierd is nothing here.
        total = len(block_ids)
        if have >= total:
            return 0
        if not self.one_trip:
            return self._long_way(client, paged, tokens, session, rid, block_ids, have, stream)
        bt = client.block_tokens
        if have == 0:
            have = client.probe(tokens[: total * bt])  # The shared index: no round trip.
            if have >= total:
                return 0  # Every block is in kvtierd already (another engine's, an earlier request's).
        if have and last is None:
            last = client.keys(tokens[: have * bt])[-1]  # Once per request (after its load or first probe).
        lease, kept = self._lease(client, total - have)
        try:
            stored, _, _, last = save_new_blocks(client, paged, lease, tokens, session, block_ids, have, last,
                                                 self.refill, stream)
        except kvtier.UnavailableError:
            _end(lease, _gpu_stream(client, paged, stream))
            if not kept:
                raise
            # The kept lease went with its connection (kvtierd restarted since the last save: a
            # lease's calls are never resent). A new one connects again; it fails as any call would.
            return self.save(client, paged, tokens, session, rid, block_ids, stream)
        except kvtier.FailedPreconditionError:
            # Part of the prefix went (evicted since the probe), or the lease grew stale.
            _end(lease, _gpu_stream(client, paged, stream))
            return self._long_way(client, paged, tokens, session, rid, block_ids, 0, stream)
        except kvtier.ProtocolErrorError as e:
            _log.warning("kvtier: kvtierd cannot save in one round trip (%s): saves take the long way; "
                         "upgrade kvtierd", e)
            self.one_trip = False
            raise
        except kvtier.Error:
            _end(lease, _gpu_stream(client, paged, stream))
            raise
        self._spare = (client, lease) if lease.id else None
        self._held[rid] = (client.instance_id, total, last)
        return stored

    def _lease(self, client, n: int) -> tuple[Any, bool]:
        """The kept lease when it is this client's, fresh and has n slots; else a
        new one of n. And whether it is the kept one."""
        spare, self._spare = self._spare, None
        if spare is not None:
            owner, lease = spare
            if owner is client and lease.id and lease.fresh and len(lease) >= n:
                return lease, True
            try:
                lease.release()  # Its slots were never written since the save that granted them.
            except kvtier.Error:
                pass  # Gone with its kvtierd.
        return client.allocate(n), False

    def _long_way(self, client, paged: PagedKV, tokens: list[int], session: str, rid: str, block_ids: list[int],
                  have: int, stream) -> int:
        have, stored = save_blocks(client, paged, tokens, session, block_ids, have, stream)
        self._held[rid] = (client.instance_id, have, None)
        return stored

