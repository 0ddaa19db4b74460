"""Network namespaces for the multihost tests: each "host" gets a namespace of
its own, joined to the machine's by a veth pair, so its kvtierd and engine
reach the Redis Cluster over a network link, not loopback. Made with
iproute2 as root; Namespaces.available() says whether this machine allows it."""

import os
import subprocess
import uuid


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


class Namespaces:
    """Namespaces made by add(), each reaching the machine at its gateway
    address (10.231.<n>.1, on the machine's side of its veth pair) and through
    it every address of the machine. close() removes them all."""

    def __init__(self):
        self._names: list[str] = []
        self.tag = uuid.uuid4().hex[:6]

    @staticmethod
    def available() -> bool:
        if os.geteuid() != 0 or subprocess.run(["which", "ip"], capture_output=True).returncode != 0:
            return False
        probe = Namespaces()
        try:
            probe.add()
            return True
        except (subprocess.CalledProcessError, OSError):
            return False
        finally:
            probe.close()

    def add(self) -> tuple[list[str], str]:
        """A new namespace: (the command prefix that runs a program in it, its gateway address)."""
        n = len(self._names) + 1
        name = f"kvt-{self.tag}-{n}"
        outer, inner = f"kvt{self.tag}{n}o", f"kvt{self.tag}{n}i"  # Interface names: at most 15 characters.
        self._names.append(name)
        gateway, address = f"10.231.{n}.1", f"10.231.{n}.2"
        _ip("netns", "add", name)
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", name)
        _ip("addr", "add", f"{gateway}/24", "dev", outer)
        _ip("link", "set", outer, "up")
        inside = ["ip", "netns", "exec", name]
        for cmd in (["ip", "addr", "add", f"{address}/24", "dev", inner], ["ip", "link", "set", inner, "up"],
                    ["ip", "link", "set", "lo", "up"], ["ip", "route", "add", "default", "via", gateway]):
            subprocess.run(inside + cmd, check=True, capture_output=True)
        return inside, gateway

    def received(self, n: int) -> int:
        """Bytes namespace n (1, 2, ...) has received over its veth pair."""
        with open(f"/sys/class/net/kvt{self.tag}{n}o/statistics/tx_bytes") as f:
            return int(f.read())

    def close(self):
        for name in self._names:  # Its end of the veth pair goes with it, and so does the other end.
            _ip("netns", "del", name, check=False)
        self._names.clear()
