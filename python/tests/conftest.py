"""A real kvtierd per test (host backend, its own socket and shared-memory names)."""

import glob
import os
import subprocess
import time
import uuid

import pytest

import kvtier

# 2 layers x 2 KV heads x 8 dims, fp32, 4-token blocks (by default): 512-byte blocks.
CONFIG = """\
instance: {instance}
socket: {socket}
backend: {backend}
log_level: info
profiles:
{profiles}
{extra}"""
PROFILE = """\
  - name: py
    layers: 2
    kv_heads: 2
    head_dim: {head_dim}
    dtype: fp32
    block_tokens: {block_tokens}
    gpu_blocks: 64
    host_blocks: 256"""


def until(predicate, timeout, what):
    """Polls predicate() until it holds (returns that time.monotonic()) or
    `timeout` seconds pass (an AssertionError naming `what`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return time.monotonic()
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def stop_process(proc):
    """Ends a child process: SIGTERM, then SIGKILL after 15 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Daemon:
    def __init__(self, tmp_path, extra="", backend="host", head_dim=8, profiles=None, block_tokens=4, prefix=()):
        """prefix: a command kvtierd runs under (a network namespace's `ip netns exec NAME`)."""
        self.socket = str(tmp_path / "kvtierd.sock")
        self.config = tmp_path / "kvtierd.yaml"
        instance = "pytest-" + uuid.uuid4().hex[:12]
        self.instance = instance
        self.config.write_text(CONFIG.format(instance=instance, socket=self.socket, extra=extra, backend=backend,
                                             profiles=profiles or PROFILE.format(head_dim=head_dim,
                                                                                     block_tokens=block_tokens)))
        self.log = tmp_path / "kvtierd.log"
        self._log_file = open(self.log, "w")
        self.proc = subprocess.Popen([*prefix, os.environ["KVTIERD"], "--config", str(self.config)],
                                     stdout=self._log_file, stderr=subprocess.STDOUT)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()  # Never leave a daemon running behind a failed start.
            raise

    def _wait_ready(self):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("kvtierd exited at start:\n" + self.log.read_text())
            try:
                kvtier.Client(socket=self.socket, connect_timeout=0.2).ping()
                return
            except kvtier.PermissionDeniedError:
                return  # It answered: a profile that lists models refuses a client without one.
            except kvtier.UnavailableError:
                time.sleep(0.05)
        raise RuntimeError("kvtierd did not start:\n" + self.log.read_text())

    def client(self, **kw):
        return kvtier.Client(socket=self.socket, **kw)

    def stop(self):
        stop_process(self.proc)
        self._log_file.close()
        # A kvtierd that was SIGKILLed left its shared memory behind.
        for f in glob.glob(f"/dev/shm/{self.instance}.*"):
            os.unlink(f)


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(tmp_path)
    yield d
    d.stop()
    assert "AddressSanitizer" not in d.log.read_text()


@pytest.fixture
def make_daemon(tmp_path):
    made = []

    def make(extra="", backend="host", head_dim=8, block_tokens=4):
        d = Daemon(tmp_path, extra, backend, head_dim, block_tokens=block_tokens)
        made.append(d)
        return d

    yield make
    for d in made:
        d.stop()
