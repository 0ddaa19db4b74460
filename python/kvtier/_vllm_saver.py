"""The thread that runs kvtier.vllm's saves, off the engine's step."""

from __future__ import annotations

import collections
import logging
import os
import threading
from collections.abc import Callable, Iterable

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
