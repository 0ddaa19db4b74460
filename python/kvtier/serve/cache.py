"""Where a conversation's K/V waits between turns: kvtierd (KvtierLink: a
kvtier.link.Link that keeps the connection on its own thread, and the
PrefixCache over it), or this process alone (LocalCache, --cache local: the
design kvtier replaces, kept for comparison). The generator calls them under
its model lock; /health and /metrics read KvtierLink.connected() from any
thread without waiting (the link's state, which its pings keep)."""

from __future__ import annotations

import collections
import logging
import warnings
from typing import Any

import kvtier
import kvtier.hf
from kvtier.link import Link

log = logging.getLogger(__name__)


class KvtierLink:
    """kvtierd for one service. Its link connects at start (or as soon as
    kvtierd is there), pings every 0.5 s and reconnects, so a restarted kvtierd
    is used again within a second of answering; a turn never waits on a
    connection: while kvtierd is away (or a call to it just failed) turns are
    recomputed and not stored. A hung kvtierd holds a turn request_timeout at
    most (2 s), once: that failure takes the link down."""

    REQUEST_TIMEOUT = 2.0

    def __init__(self, model: Any, identity: str, name: str, socket: str, tenant: str = "",
                 profile: str = "") -> None:
        self.model, self.identity, self.name = model, identity, name
        self.socket, self.tenant, self.profile = socket, tenant, profile
        self.cache: kvtier.hf.PrefixCache | None = None  # Over the client the link last checked.
        self.link = Link(self._make, interval=0.5, check=self._check, name="kvtier-serve-link", start=False)

    def start(self) -> None:
        """Connects now if kvtierd is there (at most 0.5 s), and starts the link's thread."""
        self.link.start()

    def _make(self) -> kvtier.Client:
        return kvtier.Client(socket=self.socket, tenant=self.tenant, profile=self.profile, model_id=self.identity,
                             client_name=f"kvtier.serve:{self.name}", connect_timeout=0.5,
                             request_timeout=self.REQUEST_TIMEOUT)

    def _check(self, client: kvtier.Client) -> None:
        """On the link's thread, for each kvtierd it reaches: the model must fit its profile."""
        try:
            self.cache = kvtier.hf.PrefixCache(client, self.model, on_unavailable=self.link.failed)
        except kvtier.FailedPreconditionError as e:
            raise ValueError(str(e)) from e
        log.info("kvtier: connected to %s (model identity %s)", self.socket, self.identity)

    def prefix_cache(self) -> kvtier.hf.PrefixCache | None:
        """Deprecated (start() connects, usable() gives the cache): starts the link
        and returns the PrefixCache if kvtierd answers."""
        warnings.warn("KvtierLink.prefix_cache is deprecated: call start(), then usable()", DeprecationWarning,
                      stacklevel=2)
        self.start()
        return self.usable()

    def connected(self) -> bool:
        """Whether kvtierd answered the link's last ping (and no call failed since). Never waits."""
        return self.link.up

    def usable(self) -> kvtier.hf.PrefixCache | None:
        """The PrefixCache while kvtierd answers; None while it is away."""
        return self.cache if self.link.get() is not None else None


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
