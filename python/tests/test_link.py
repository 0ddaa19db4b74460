"""kvtier.link.Link against a real kvtierd: it finds kvtierd at start or later,
notices it gone (a ping, or a caller's failed call), finds it again within a
second of a restart, re-checks the profile of every kvtierd it reaches, and
never makes a caller wait."""

import logging
import time

import pytest

import kvtier
from conftest import Daemon, until
from kvtier.link import Link


def make(d, **kw):
    return lambda: kvtier.Client(socket=d.socket, connect_timeout=0.3, request_timeout=1.0, **kw)


def test_a_link_follows_kvtierd_away_and_back_within_a_second(tmp_path):
    d = Daemon(tmp_path)
    link = Link(make(d), interval=0.2)
    try:
        assert link.up and link.get() is not None
        first = link.get().instance_id
        d.proc.kill()
        d.proc.wait()
        d.stop()
        until(lambda: not link.up, 3, "the link to see kvtierd gone")
        started = time.monotonic()
        assert link.get() is None  # Never waits: none while kvtierd is away.
        assert time.monotonic() - started < 0.05
        assert link.state()["error"]
        d = Daemon(tmp_path)  # The same socket, another instance.
        answered = time.monotonic()
        back = until(lambda: link.up, 5, "the link to find kvtierd again")
        assert back - answered < 1.0
        client = link.get()
        assert client.instance_id != first
        assert client.probe([1, 2, 3, 4]) == 0  # The new kvtierd's index is mapped.
        assert link.state()["connects"] == 2
    finally:
        link.close()
        d.stop()


def test_a_link_says_what_happened_through_its_hosts_logger(tmp_path, caplog):
    """vLLM passes its own logger, so that the lines carry its process and time stamps."""
    caplog.set_level(logging.INFO, logger="host")
    d = Daemon(tmp_path)
    link = Link(make(d), interval=0.1, logger=logging.getLogger("host"))
    try:
        d.proc.kill()
        d.proc.wait()
        d.stop()
        until(lambda: not link.up, 3, "the link to see kvtierd gone")
        d = Daemon(tmp_path)
        until(lambda: link.up, 3, "the link to find kvtierd again")
        said = [r.getMessage() for r in caplog.records if r.name == "host"]
        assert any("kvtierd unreachable" in m for m in said), said
        assert any("connected to kvtierd" in m for m in said), said
        assert not [r for r in caplog.records if r.name == "kvtier.link"]
    finally:
        link.close()
        d.stop()


def test_a_link_started_before_kvtierd_finds_it(tmp_path):
    link = Link(lambda: kvtier.Client(socket=str(tmp_path / "kvtierd.sock"), connect_timeout=0.1), interval=0.1)
    d = None
    try:
        assert not link.up and link.get() is None
        d = Daemon(tmp_path)
        until(lambda: link.up, 3, "the link to find kvtierd")
        assert link.get().ping() >= 0
    finally:
        link.close()
        if d is not None:
            d.stop()


def test_a_failed_call_takes_the_link_down_until_a_ping_answers(tmp_path):
    d = Daemon(tmp_path)
    link = Link(make(d), interval=0.1, ping_while_up=False)
    try:
        assert link.up and link.state()["connects"] == 1
        first = link.get().instance_id
        link.failed(kvtier.UnavailableError("kvtierd did not answer"))
        assert link.get() is None and link.get("save") is None
        assert link.state()["failures"] == 1
        until(lambda: link.up, 2, "a ping to find kvtierd there")
        assert link.state()["connects"] == 2
        assert link.get().instance_id == first  # The same kvtierd: it only seemed away.
    finally:
        link.close()
        d.stop()


def test_roles_have_clients_of_their_own(tmp_path):
    d = Daemon(tmp_path)
    link = Link(make(d), interval=0.2)
    try:
        main, save = link.get(), link.get("save")
        assert main is not None and save is not None and main is not save
        assert link.get("save") is save
        assert main.client_id != save.client_id  # Two connections: neither waits behind the other's call.
    finally:
        link.close()
        d.stop()


def test_a_kvtierd_whose_profile_does_not_fit_keeps_the_link_down_saying_why(tmp_path):
    d = Daemon(tmp_path)

    def check(client):
        if client.block_tokens != 16:
            raise ValueError(f"profile of {client.block_tokens}-token blocks; this user needs 16")

    link = Link(make(d), interval=0.1, check=check)
    try:
        assert not link.up and link.get() is None and link.get("save") is None
        assert "4-token blocks" in link.state()["error"]
        d.stop()
        d = Daemon(tmp_path, block_tokens=16)  # Restarted with a profile that fits.
        until(lambda: link.up, 3, "the link to accept the new kvtierd")
        assert link.get().block_tokens == 16
    finally:
        link.close()
        d.stop()


@pytest.mark.parametrize("interval", [0.1])
def test_a_hung_kvtierd_never_holds_get(tmp_path, interval):
    import os
    import signal

    d = Daemon(tmp_path)
    link = Link(make(d), interval=interval)
    try:
        os.kill(d.proc.pid, signal.SIGSTOP)
        worst = 0.0
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and link.up:
            t = time.monotonic()
            link.get()
            worst = max(worst, time.monotonic() - t)
            time.sleep(0.005)
        assert not link.up  # The ping timed out (request_timeout 1 s).
        assert worst < 0.05, worst
        os.kill(d.proc.pid, signal.SIGCONT)
        until(lambda: link.up, 3, "the link to see kvtierd answer again")
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
        link.close()
        d.stop()
