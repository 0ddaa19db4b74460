"""The systems the side-by-side benchmark (peer_bench.py) drives the same vLLM
engines through: kvtier (kvtierd and KvtierConnector), LMCache (its
multiprocess server and vLLM's LMCacheMPConnector) and no connector at all.

Each system owns its cache server (none for "none"): start() starts it in a
scratch directory and waits until it answers; kill(sig) signals it; restart()
starts it again on the same address; footprint() reads its resident memory and
CPU seconds. kv_transfer() gives the KVTransferConfig arguments an engine of
that system runs with, and python the interpreter its engines run under (LMCache
lives in the environment scripts/peer_env.sh layers over the project's).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_kvtierd import start_kvtierd  # noqa: E402

# vLLM's block on its CPU backend (tokens): a kvtier block is one vLLM block.
VLLM_CPU_BLOCK = 128


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peer_env() -> str:
    """The peers' environment (made once per machine by scripts/peer_env.sh; the
    test command makes it before the suite, so nothing is downloaded here)."""
    return os.environ.get("KVTIER_PEER_ENV") or subprocess.run(
        [os.path.join(ROOT, "scripts", "peer_env.sh")], check=True, capture_output=True, text=True).stdout.strip()


def model_geometry(model: str) -> dict:
    with open(os.path.join(model, "config.json")) as f:
        cfg = json.load(f)
    heads = cfg["num_attention_heads"]
    return {"layers": cfg["num_hidden_layers"], "kv_heads": cfg.get("num_key_value_heads", heads),
            "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // heads, "vocab": cfg["vocab_size"]}


def kv_bytes_per_token(geometry: dict) -> int:
    """A token's K and V over every layer, fp32 (the engines' dtype here)."""
    return 2 * geometry["layers"] * geometry["kv_heads"] * geometry["head_dim"] * 4


def proc_footprint(pid: int) -> dict:
    """What process pid and every process under it hold: memory_mib, their
    anonymous memory (heap, Python objects) plus the memory taken by the shared
    memory they hold open or map (memfd and /dev/shm files, each once, whoever
    wrote it: kvtierd's tiers are written by the engines); beside it RSS (pages
    mapped in their own page tables, which misses shared memory others wrote) and
    CPU seconds (user + system)."""
    pids = [pid] + _descendants(pid)
    anon = rss = cpu = 0.0
    shared: dict[tuple[int, int], int] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for p in pids:
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Rss:"):
                        rss += int(line.split()[1]) / 1024
                    elif line.startswith("Anonymous:"):
                        anon += int(line.split()[1]) / 1024
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cpu += sum(int(x) for x in fields[11:13]) / tick
        except (OSError, ValueError):
            continue
        for path in _shared_files(p):
            try:
                st = os.stat(path)
            except OSError:
                continue
            shared[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    shm = sum(shared.values()) / (1 << 20)
    return {"memory_mib": round(anon + shm, 1), "anonymous_mib": round(anon, 1), "shared_mib": round(shm, 1),
            "rss_mib": round(rss, 1), "cpu_seconds": round(cpu, 2), "processes": len(pids)}


def _shared_files(pid: int) -> list[str]:
    """Paths that reach the shared-memory files pid holds open or maps."""
    out = []
    for d in (f"/proc/{pid}/fd", f"/proc/{pid}/map_files"):
        for name in _listdir(d):
            try:
                if os.readlink(f"{d}/{name}").startswith(("/memfd:", "/dev/shm/")):
                    out.append(f"{d}/{name}")
            except OSError:
                pass
    return out


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(p))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


class System:
    """No connector: the engine alone, its own prefix cache its only cache."""

    name = "none"
    python = sys.executable

    def start(self, run: str) -> None:
        pass

    def stop(self) -> None:
        pass

    def kill(self, sig: int = signal.SIGKILL) -> None:
        pass

    def restart(self) -> None:
        pass

    def pid(self) -> int | None:
        return None

    def alive(self) -> bool:
        return True

    def kv_transfer(self) -> dict | None:
        return None

    def footprint(self) -> dict | None:
        pid = self.pid()
        return proc_footprint(pid) if pid else None


DISK_STORE = """stores:
  tiers:
    - kind: disk
      path: {path}
      max_bytes: {mib}MiB
      write: through
"""


class Kvtier(System):
    """kvtierd on the host backend, a profile of the model's geometry in vLLM's CPU
    blocks, `blocks` slots in each of its two tiers (a tier of 1 GiB of the real
    model's KV at the default), and KvtierConnector in the engines. disk_mib:
    also a disk store of that size below the host tier, written through (every
    committed block), in the run's directory: what a kvtierd SIGKILLed and
    started again finds (its GPU and host tiers go with the process)."""

    name = "kvtier"

    def __init__(self, kvtierd: str, geometry: dict, blocks: int = 182, extra_config: dict | None = None,
                 disk_mib: int = 0):
        self.binary, self.geometry, self.blocks = kvtierd, geometry, blocks
        self.extra_config = extra_config or {}
        self.disk_mib = disk_mib
        self.proc: subprocess.Popen | None = None
        self.dir = self.socket = ""

    def start(self, run: str) -> None:
        self.dir = os.path.join(run, "kvtierd")
        os.makedirs(self.dir, exist_ok=True)
        self.restart()

    def restart(self) -> None:
        g = self.geometry
        stores = DISK_STORE.format(path=os.path.join(self.dir, "disk"), mib=self.disk_mib) if self.disk_mib else ""
        self.proc, self.socket = start_kvtierd(self.binary, self.dir, g["layers"], g["kv_heads"], g["head_dim"],
                                               self.blocks, extra=stores, block_tokens=VLLM_CPU_BLOCK)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            if sig == signal.SIGKILL:
                self.proc.wait()

    def pid(self) -> int | None:
        return self.proc.pid if self.proc and self.proc.poll() is None else None

    def alive(self) -> bool:
        return self.pid() is not None

    def kv_transfer(self) -> dict:
        return {"kv_connector": "KvtierConnector", "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_both",
                "kv_connector_extra_config": {"socket": self.socket, **self.extra_config}}

    def cached_bytes(self) -> int:
        """The bytes of KV kvtierd holds (committed blocks in its tiers)."""
        import kvtier
        stats = kvtier.Client(socket=self.socket, client_name="peer_bench").stats()
        return int(stats.get("gpu_used", 0) + stats.get("host_used", 0)) * self._block_bytes()

    def capacity_bytes(self) -> int:
        """The bytes of KV its two tiers hold when full."""
        return 2 * self.blocks * self._block_bytes()

    def _block_bytes(self) -> int:
        return kv_bytes_per_token(self.geometry) * VLLM_CPU_BLOCK


class LMCache(System):
    """LMCache's multiprocess server (`lmcache server`, CPU, engine-driven transfers
    over POSIX shared memory, an LRU L1 of `l1_gb` GiB) and LMCacheMPConnector in
    the engines, which run under the peers' environment."""

    name = "lmcache"

    def __init__(self, env: str, l1_gb: float = 2.0, chunk: int = 256):
        self.env, self.l1_gb, self.chunk = env, l1_gb, chunk
        self.python = os.path.join(env, "bin", "python")
        self.proc: subprocess.Popen | None = None
        self.dir = ""
        self.port = self.http_port = 0
        self.shm = ""

    def start(self, run: str) -> None:
        self.dir = os.path.join(run, "lmcache")
        os.makedirs(self.dir, exist_ok=True)
        self.port, self.http_port = free_port(), free_port()
        self.shm = "kvtier-peer-" + uuid.uuid4().hex[:8]
        self.restart()

    def restart(self, timeout: float = 120) -> None:
        log = open(os.path.join(self.dir, "server.log"), "a")
        self.proc = subprocess.Popen(
            [os.path.join(self.env, "bin", "lmcache"), "server", "--host", "localhost", "--port", str(self.port),
             "--http-port", str(self.http_port), "--chunk-size", str(self.chunk), "--l1-size-gb", str(self.l1_gb),
             "--eviction-policy", "LRU", "--supported-transfer-mode", "engine_driven", "--shm-name", self.shm],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"lmcache server exited ({self.proc.returncode}); see {log.name}")
            try:
                with urllib.request.urlopen(f"http://localhost:{self.http_port}/healthcheck", timeout=1) as r:
                    if r.status == 200:
                        with socket.create_connection(("localhost", self.port), timeout=1):
                            return
            except OSError:
                pass
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"lmcache server did not answer in {timeout} s; see {log.name}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        self._unlink_shm()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            if sig == signal.SIGKILL:
                self.proc.wait()

    def _unlink_shm(self) -> None:
        for f in os.listdir("/dev/shm"):
            if self.shm and f.startswith(self.shm):
                try:
                    os.unlink(os.path.join("/dev/shm", f))
                except OSError:
                    pass

    def pid(self) -> int | None:
        return self.proc.pid if self.proc and self.proc.poll() is None else None

    def alive(self) -> bool:
        return self.pid() is not None

    def cached_bytes(self) -> int:
        """The bytes of KV its L1 holds (its /status: each L1's memory_used_bytes)."""
        with urllib.request.urlopen(f"http://localhost:{self.http_port}/status", timeout=10) as r:
            status = json.load(r)
        return sum(int(m["memory_used_bytes"]) for m in status["storage_manager"]["l1_managers"].values())

    def capacity_bytes(self) -> int:
        """The bytes of KV its L1 holds when full (--l1-size-gb is GiB)."""
        return int(self.l1_gb * (1 << 30))

    def kv_transfer(self) -> dict:
        return {"kv_connector": "LMCacheMPConnector", "kv_role": "kv_both",
                "kv_connector_extra_config": {"lmcache.mp.host": "tcp://localhost", "lmcache.mp.port": self.port,
                                              "lmcache.mp.mp_transfer_mode": "engine_driven"}}


def systems(kvtierd: str, model: str, names: list[str], blocks: int = 182, l1_gb: float = 2.0,
            kvtier_disk_mib: int = 0) -> list[System]:
    """The named systems ("kvtier", "lmcache", "none"), not started."""
    out: list[System] = []
    for n in names:
        if n == "kvtier":
            out.append(Kvtier(kvtierd, model_geometry(model), blocks, disk_mib=kvtier_disk_mib))
        elif n == "lmcache":
            out.append(LMCache(peer_env(), l1_gb))
        elif n == "none":
            out.append(System())
        else:
            raise SystemExit(f"unknown system {n!r}: kvtier, lmcache or none")
    return out
