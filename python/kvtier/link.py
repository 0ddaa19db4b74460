"""kvtier.link: the one way a Python process keeps its connection to kvtierd.

    link = kvtier.link.Link(lambda: kvtier.Client(socket=..., connect_timeout=0.5))
    client = link.get()          # never waits: None while kvtierd is away
    if client is not None:
        try:
            ... client.acquire(...) ...
        except kvtier.Error as e:
            link.failed(e)       # nobody uses it again until kvtierd answers a ping
    link.state()                 # for /health and /metrics
    link.close()

A thread connects, then pings every `interval` seconds (0.5 by default): a
kvtierd that died is noticed by the next ping, or at once by a caller whose
call failed (failed()); one that comes back, restarted or new, is found within
an interval, and the check the link was given (a profile that must fit the
model) runs again on every kvtierd it reaches. No request ever waits for a
connection: get() returns the client while kvtierd answered the last ping (and
no call failed since), else None, so a caller recomputes instead. kvtier.serve,
kvtier.vllm's connector and workers built on kvtier.hf all stand on it.

Roles: a client serializes its calls, so a thread that must never wait behind
another's call to a hung kvtierd asks for a client of its own (get("save")).
Every role's client is made from the same `make`, once kvtierd answers, and is
dropped with the link's state: a failed call on any of them takes the link down.

Thread-safe. Torch-free and vLLM-free.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import kvtier

__all__ = ["Link"]

log = logging.getLogger("kvtier.link")


class Link:
    """A kvtier.Client kept by a thread (see the module docstring).

    make: returns a connected kvtier.Client (its connect_timeout bounds how long
      a try takes, on the link's thread). check: called with every client the
      link connects and again whenever its kvtierd changed (another instance
      answered: a restart); raising ValueError (a profile that does not fit)
      keeps the link down, with the message in state(). ping_while_up: False for
      a user whose own calls show kvtierd's absence soon enough (then the thread
      only looks for kvtierd while it is away, and never contends for the
      client with the caller). logger: where the link says kvtierd went away or
      came back (default "kvtier.link"; a host such as vLLM passes its own, so
      that the lines carry its process and time stamps)."""

    def __init__(self, make: Callable[[], kvtier.Client], *, interval: float = 0.5, ping_while_up: bool = True,
                 check: Callable[[kvtier.Client], None] | None = None, name: str = "kvtier-link",
                 start: bool = True, logger: logging.Logger | None = None) -> None:
        self._make, self._check = make, check
        self._log = logger or log
        self.interval, self._ping_while_up, self.name = interval, ping_while_up, name
        self._lock = threading.Lock()
        self._client: kvtier.Client | None = None
        self._roles: dict[str, kvtier.Client] = {}
        self._up = False
        self._instance = 0          # The kvtierd instance `check` last passed.
        self._error: str | None = None
        self._refused: str | None = None  # Why `check` refused the kvtierd last reached, if it did.
        self._since = time.monotonic()
        self._connects = 0          # Times kvtierd answered after being away (or first).
        self._failures = 0          # Calls that failed (failed()).
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if start:
            self.start()

    # --- for callers ---------------------------------------------------------------
    def start(self) -> None:
        """Tries once now (the caller waits at most one connect_timeout), then starts the thread."""
        if self._thread is not None:
            return
        self._try()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    @property
    def up(self) -> bool:
        return self._up

    @property
    def refused(self) -> str | None:
        """What `check` said of the kvtierd the link reached last, if it refused it
        (a user that must not start against it raises this at start-up)."""
        return self._refused

    def get(self, role: str = "") -> kvtier.Client | None:
        """The client of `role` ("": the one the link pings) while kvtierd answers;
        None while it is away. A role's client is made at its first get() once
        kvtierd is up (a connect, on the caller's thread); a failure to make it
        takes the link down and returns None. A client reconnects by itself when
        a call finds kvtierd restarted: the first get() after that runs the check
        on the new kvtierd and drops the role clients still mapping the old one
        (a client that made no call since would read the old index)."""
        with self._lock:
            if not self._up or not self._follow(self._client):
                return None
            if not role:
                return self._client
            client = self._roles.get(role)
            if client is not None and client.instance_id == self._instance:
                return client
        try:
            client = self._make()
        except kvtier.Error as e:
            self.failed(e)
            return None
        with self._lock:
            if not self._up or not self._follow(client):
                return None
            self._roles[role] = client
            return client

    def _follow(self, client: kvtier.Client | None) -> bool:
        """Under the lock: takes `client`'s kvtierd as the one the link follows when
        it is another than the last checked (it restarted, or this is the first),
        if the check passes, and drops the role clients of any other; False (the
        link down, refused) when the check fails."""
        if client is None:
            return False
        instance = client.instance_id
        if instance == self._instance:
            return True
        if self._check is not None:
            try:
                self._check(client)
            except ValueError as e:
                self._down(str(e), refused=True)
                return False
        self._instance = instance
        self._roles = {r: c for r, c in self._roles.items() if c.instance_id == instance}
        return True

    def _down(self, why: str, refused: bool = False) -> None:
        """Under the lock: kvtierd is away (or refused: it does not fit this user)."""
        if self._up or self._error != why:
            self._since = time.monotonic()
            if refused:
                self._log.error("%s", why)
            elif self._up:
                self._log.warning("kvtier: kvtierd unreachable (%s); going on without it until it answers", why)
        self._up, self._error = False, why
        self._refused = why if refused else None

    def failed(self, error: BaseException | str) -> None:
        """A call failed (kvtierd gone, hung past request_timeout, refused the
        connection): no client of the link is handed out again until kvtierd
        answers a ping."""
        with self._lock:
            self._failures += 1
            if self._up:
                self._down(str(error))

    def state(self) -> dict[str, Any]:
        """up, seconds since the last change, the last error, connects, failures."""
        with self._lock:
            return {"up": self._up, "for_seconds": round(time.monotonic() - self._since, 3), "error": self._error,
                    "connects": self._connects, "failures": self._failures}

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    # --- the thread ----------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if self._up and not self._ping_while_up:
                continue
            try:
                self._try()
            except Exception:  # noqa: BLE001 - the link's thread never dies of a bad kvtierd
                self._log.exception("kvtier: the link to kvtierd failed unexpectedly")

    def _try(self) -> None:
        client = self._client
        try:
            if client is None:
                client = self._make()
            else:
                client.ping()  # A call: a client whose kvtierd went away reconnects here.
        except kvtier.Error as e:
            with self._lock:
                self._down(str(e))
            return
        with self._lock:
            self._client = client
            came_up = not self._up
            if not self._follow(client):
                return
            if came_up:
                self._roles.clear()  # Their connections may have broken with the failure that took it down.
                self._since = time.monotonic()
                self._connects += 1
            self._up, self._error, self._refused = True, None, None
        if came_up:
            self._log.info("kvtier: connected to kvtierd (profile %s)", client.profile.get("name"))
