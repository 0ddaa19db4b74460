"""kvtier.vllm's lookups in the stores below kvtierd's host tier (disk, Redis
Cluster), off the scheduler's step.

The shared index (Client.probe) answers for the GPU and host tiers without a
round trip; it cannot see what only the stores hold. When a probe finds less
than a request could use and kvtierd has stores, the scheduler asks this
thread to have kvtierd bring the rest into its host tier (Client.locate: one
request that leases nothing, bounded by kvtierd's stores.locate_budget_ms) and
answers vLLM "not known yet" (None: the request waits, unscheduled, and is
asked about again next step; nothing of vLLM's is allocated for it meanwhile,
so an abort or a preemption elsewhere needs nothing undone). Once the answer
came, the next probe sees what the stores held, in the host tier, and the
request loads it like any hit. A lookup that fails or times out is a miss:
the request computes its prompt.

One thread, one client per tensor-parallel rank's identity (each of its own,
so that a long locate never delays the link's pings or a worker's load)."""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable

import kvtier
from kvtier._vllm_stats import KvtierConnectorStats

# How long a lookup whose answer is still to come waits for it while the engine
# has nothing else to run (the scheduler asks again at once otherwise).
IDLE_WAIT = 0.005


class StoreLookups:
    """Requests' lookups in kvtierd's stores, run on a thread (see the module
    docstring). `make(rank)` connects a client for rank `rank`'s identity whose
    request timeout outlasts kvtierd's locate budget; `first_wait`: how long
    the scheduler waits for the answer, once per request, before it answers
    vLLM "not known yet" (then the request waits a step or more);
    `give_up`: no request waits longer for an answer (should the thread or a
    call hang past its timeout): then it is a miss."""

    def __init__(self, make: Callable[[int], kvtier.Client], ranks: int, stats: KvtierConnectorStats,
                 log: logging.Logger, first_wait: float = 0.002, give_up: float = 11.0):
        self._make, self._ranks, self._stats, self._log = make, ranks, stats, log
        self._first_wait, self._give_up = first_wait, give_up
        self._clients: list[kvtier.Client | None] = [None] * ranks
        self._cond = threading.Condition()
        self._queue: collections.deque[tuple[str, list[int]]] = collections.deque()
        self._pending: dict[str, float] = {}  # Asked, no answer yet: when to give up waiting for it.
        self._answered: set[str] = set()  # Answered: a probe now sees what the stores held.
        self._old_kvtierd = False         # One that predates locate: an acquire and a release instead.
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="kvtier-store-lookups", daemon=True)
        self._thread.start()

    def ask(self, rid: str, tokens: list[int]) -> bool:
        """True once the stores were asked for `tokens`' blocks on behalf of
        request `rid` and answered; else asks them (the first time) and returns
        False: ask again later. The first time it waits up to `first_wait`
        seconds for the answer: a miss in a local disk store or a nearby Redis
        is answered sooner, and the request is then scheduled in this step, not
        the next."""
        with self._cond:
            if rid in self._answered:
                return True
            if rid in self._pending:
                return not self._still_waiting(rid)
            self._pending[rid] = time.monotonic() + self._give_up
            self._queue.append((rid, tokens))
            self._cond.notify_all()
            self._cond.wait_for(lambda: rid in self._answered or self._closed, timeout=self._first_wait)
            return rid in self._answered

    def waiting(self, rid: str, idle: bool) -> bool:
        """Whether the stores' answer for request `rid` is still to come. `idle`:
        the engine has nothing else to run, so vLLM asks again at once, in a
        loop; then this waits for the answer up to IDLE_WAIT, leaving the CPU
        to kvtierd and the stores (on a small host the loop took a core)."""
        with self._cond:
            if rid not in self._pending:
                return False
            if idle:
                self._cond.wait_for(lambda: rid not in self._pending or self._closed, timeout=IDLE_WAIT)
            return rid in self._pending and self._still_waiting(rid)

    def _still_waiting(self, rid: str) -> bool:
        """Under the lock, `rid` pending: False (and answered, as a miss) once past its time."""
        if time.monotonic() < self._pending[rid]:
            return True
        del self._pending[rid]
        self._answered.add(rid)
        self._stats.add(store_lookup_errors=1)
        self._log.warning("kvtier: no answer from kvtierd's stores for request %s in %.1f s: it computes its "
                          "prompt", rid, self._give_up)
        return False

    def forget(self, rid: str) -> None:
        """Request `rid` is finished: an answer still to come is dropped."""
        with self._cond:
            self._pending.pop(rid, None)
            self._answered.discard(rid)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=5)

    # --- the thread -------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                rid, tokens = self._queue.popleft()
                if rid not in self._pending:
                    continue  # Finished while it waited.
            started = time.perf_counter()
            try:
                found = min((self._locate(rank, tokens) for rank in range(self._ranks)), default=0)
            except Exception:  # noqa: BLE001 - the thread never dies: its requests would wait for good
                self._log.exception("kvtier: a lookup in kvtierd's stores failed unexpectedly")
                found = 0
            with self._cond:
                if self._pending.pop(rid, None) is not None:
                    self._answered.add(rid)
                    self._cond.notify_all()
            self._stats.add(store_lookups=1, store_lookup_seconds=time.perf_counter() - started)
            self._log.debug("kvtier: stores asked for request %s: %d blocks cached", rid, found)

    def _locate(self, rank: int, tokens: list[int]) -> int:
        """Blocks of `tokens` cached once kvtierd (rank `rank`'s identity) asked its
        stores; 0 when it cannot be asked."""
        client = self._clients[rank]
        try:
            if client is None:
                client = self._clients[rank] = self._make(rank)
            if not self._old_kvtierd:
                try:
                    return client.locate(tokens)
                except (kvtier.ProtocolErrorError, kvtier.InvalidArgumentError) as e:
                    self._log.warning("kvtier: kvtierd cannot locate (%s): asking its stores with an acquire "
                                      "and a release instead; upgrade kvtierd", e)
                    self._old_kvtierd = True
            lease = client.acquire(tokens, promote=False)
            found = lease.matched
            lease.release()
            return found
        except kvtier.Error as e:
            self._log.info("kvtier: asking kvtierd's stores failed (%s): the request computes its prompt", e)
            self._stats.add(store_lookup_errors=1)
            self._clients[rank] = None  # Connected again for the next lookup.
            return 0
