"""A real Redis Cluster for the tests: redis-server nodes in cluster mode on
loopback ports, joined by redis-cli --cluster create (scripts/setup.sh installs
both; a missing one fails the test rather than skip it)."""

import shutil
import signal
import socket
import subprocess
import time


def _free_port():
    """A port that is free with its cluster bus port (+10000) free too."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 > 65535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port pair for a cluster node")


def _ask(port, command, timeout=0.5):
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(command.encode() + b"\r\n")
        return s.recv(65536).decode(errors="replace")


class RedisCluster:
    """`masters` redis-server nodes (no replicas) in one cluster, in tmp_path."""

    def __init__(self, tmp_path, masters=3, address="127.0.0.1"):
        """address: where the nodes are announced (and clients reach them); with
        another than loopback they listen on every address of the machine."""
        for tool in ("redis-server", "redis-cli"):
            assert shutil.which(tool), f"{tool} is not on PATH: scripts/setup.sh installs it (Debian: redis-server)"
        self.ports = [_free_port() for _ in range(masters)]
        self.procs = {}
        self.address = address
        self.dir = tmp_path / "redis-cluster"
        for port in self.ports:
            d = self.dir / str(port)
            d.mkdir(parents=True)
            self.procs[port] = subprocess.Popen(
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1" if address == "127.0.0.1" else "*",
                 "--protected-mode", "no", "--save", "", "--appendonly", "no",
                 "--dir", str(d), "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                 "--cluster-node-timeout", "1000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for port in self.ports:
                self._wait(lambda p=port: _ask(p, "PING").startswith("+PONG"), f"node {port} to answer")
            subprocess.run(["redis-cli", "--cluster", "create", *self.nodes, "--cluster-replicas", "0",
                            "--cluster-yes"], check=True, capture_output=True, timeout=30)
            for port in self.ports:
                self._wait(lambda p=port: "cluster_state:ok" in _ask(p, "CLUSTER INFO"), f"node {port}: state ok")
        except BaseException:
            self.stop()
            raise

    @property
    def nodes(self):
        return [f"{self.address}:{p}" for p in self.ports]

    def store(self, write="through"):
        """The stores: section of a kvtierd config naming this cluster."""
        return ("stores:\n  fetch_budget_ms: 2000\n  locate_budget_ms: 5000\n  tiers:\n    - kind: redis\n"
                f"      nodes: [{', '.join(self.nodes)}]\n      cluster: true\n      timeout_ms: 500\n"
                f"      write: {write}\n")

    def keys(self):
        """Keys the cluster holds, summed over its live masters."""
        total = 0
        for port in self.ports:
            if self.procs[port].poll() is None:
                reply = _ask(port, "DBSIZE")
                total += int(reply.strip().lstrip(":") or 0)
        return total

    def kill(self, port):
        self.procs[port].send_signal(signal.SIGKILL)
        self.procs[port].wait()

    def pause(self):
        """Every node stops answering (SIGSTOP), as a cluster behind a stalled network would."""
        for p in self.procs.values():
            p.send_signal(signal.SIGSTOP)

    def resume(self):
        """SIGCONT, then waits until every live node says the cluster is ok again (a pause past the
        node timeout makes the nodes mark each other failing for a while)."""
        for p in self.procs.values():
            p.send_signal(signal.SIGCONT)
        for port in self.ports:
            if self.procs[port].poll() is None:
                self._wait(lambda p=port: "cluster_state:ok" in _ask(p, "CLUSTER INFO"), f"node {port}: state ok",
                           limit=60.0)

    def stop(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    @staticmethod
    def _wait(predicate, what, limit=20.0):
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            try:
                if predicate():
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"redis cluster: timed out waiting for {what}")


