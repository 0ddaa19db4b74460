"""Where a conversation's K/V waits between turns: kvtierd (KvtierLink: the
connection, made again while kvtierd is away, and whether it answers now), or
this process alone (LocalCache, --cache local: the design kvtier replaces, kept
for comparison). Neither is locked: the generator calls them under its model
lock, /health and /metrics call KvtierLink.connected from any thread (its state
is a few plain fields, each written whole)."""

from __future__ import annotations

import collections
import logging
import time
from typing import Any

import kvtier
import kvtier.hf

log = logging.getLogger(__name__)


class KvtierLink:
    def __init__(self, model: Any, identity: str, name: str, socket: str, tenant: str = "",
                 profile: str = "") -> None:
        self.model, self.identity, self.name = model, identity, name
        self.socket, self.tenant, self.profile = socket, tenant, profile
        self.cache: kvtier.hf.PrefixCache | None = None
        self._next_connect = 0.0
        self._checked_at = -10.0  # When connected() last asked kvtierd, and what it found.
        self._connected = False
        self._check_every = 0.0  # Seconds between its asks: 0 while kvtierd answers, 1 doubling to 30 while not.

    def prefix_cache(self) -> kvtier.hf.PrefixCache | None:
        """The PrefixCache, connecting (again) at most every 2 s while kvtierd is away."""
        if self.cache is None and time.monotonic() >= self._next_connect:
            self._next_connect = time.monotonic() + 2.0
            try:
                client = kvtier.Client(socket=self.socket, tenant=self.tenant, profile=self.profile,
                                       model_id=self.identity, client_name=f"kvtier.serve:{self.name}",
                                       connect_timeout=0.5)
                self.cache = kvtier.hf.PrefixCache(client, self.model)
                log.info("kvtier: connected to %s (model identity %s)", self.socket, self.identity)
            except kvtier.UnavailableError as e:
                log.warning("kvtier: %s; serving without the cache until it is back", e)
        return self.cache

    def connected(self) -> bool:
        """Whether kvtierd answers now: a ping (a round trip, ~0.1 ms) each time
        while it does; while it does not, the next ping waits 1, 2, 4 ... 30 s,
        the answer remembered in between, so a request pays at most one failed
        connection attempt per interval. A client object alone says nothing: it
        outlives the kvtierd it was connected to. Blocks for the ping."""
        cache = self.cache
        if cache is None:
            return False
        now = time.monotonic()
        if now - self._checked_at >= self._check_every:
            try:
                cache.client.ping()
                self._connected, self._check_every = True, 0.0
            except kvtier.Error:
                self._connected = False
                self._check_every = min(30.0, max(1.0, self._check_every * 2))
            self._checked_at = now
        return self._connected

    def usable(self) -> kvtier.hf.PrefixCache | None:
        """The PrefixCache when kvtierd answers; None while it is away (no load or
        store tries it, each of which waited to connect: ~0.9 s a request)."""
        cache = self.prefix_cache()
        return cache if cache is not None and self.connected() else None


class LocalCache:
    """Each conversation's DynamicCache in this process, the coldest dropped first."""

    def __init__(self, sessions: int) -> None:
        self.sessions = sessions
        self._kept: collections.OrderedDict[str, tuple[list[int], Any]] = collections.OrderedDict()

    def load(self, session: str, ids: list[int]) -> tuple[Any, int]:
        """The conversation's cache cut to the prefix it shares with ids (at least
        one token left to compute), and that prefix's length; (None, 0) if none."""
        entry = self._kept.get(session)
        if entry is None:
            return None, 0
        seen, past = entry
        n = 0
        limit = min(len(seen), len(ids) - 1, past.get_seq_length())
        while n < limit and seen[n] == ids[n]:
            n += 1
        if n == 0:
            return None, 0
        past.crop(n)
        return past, n

    def store(self, session: str, ids: list[int], past: Any) -> None:
        self._kept[session] = (ids, past)
        self._kept.move_to_end(session)
        while len(self._kept) > self.sessions:
            self._kept.popitem(last=False)
