"""Two "hosts" on one machine: Linux network namespaces joined by a veth pair, made and removed by the tests.

Each namespace has only its loopback and its end of the veth pair, so whatever one node sends the other must
cross the veth link: a real two-host network as far as torchrun, c10d and gloo can tell. Creating namespaces
needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2; ``unavailable()`` says why not, for a skip.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

_NAME = re.compile(r"^gnnpipe-(\d+)-[ab]\b")


@dataclass(frozen=True)
class TwoHosts:
    netns: tuple[str, str]
    ifname: tuple[str, str]
    addr: tuple[str, str]

    def exec_prefix(self, i: int) -> list[str]:
        """Run a command inside host ``i``'s namespace (``ip netns exec`` execs it: the pid stays the command's)."""
        return ["ip", "netns", "exec", self.netns[i]]

    def rx_bytes(self, i: int) -> int:
        out = _ip("-n", self.netns[i], "-s", "-j", "link", "show", "dev", self.ifname[i])
        import json

        return int(json.loads(out)[0]["stats64"]["rx"]["bytes"])


def _ip(*args: str) -> str:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if proc.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None when they can."""
    if not shutil.which("ip"):
        return "iproute2's `ip` is not installed (apt install iproute2)"
    if os.geteuid() != 0:
        return "creating network namespaces needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN); run the suite as root"
    probe = f"gnnpipe-{os.getpid()}-a"
    try:
        _ip("netns", "add", probe)
    except RuntimeError as err:
        return f"this machine forbids network namespaces ({err})"
    _ip("netns", "del", probe)
    return None


def _remove_stale() -> None:
    """Namespaces left by a test process that was killed before its cleanup ran."""
    for line in _ip("netns", "list").splitlines():
        m = _NAME.match(line)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            subprocess.run(["ip", "netns", "del", line.split()[0]], capture_output=True, timeout=30)


@contextmanager
def two_hosts() -> Iterator[TwoHosts]:
    _remove_stale()
    pid = os.getpid()
    net = TwoHosts(netns=(f"gnnpipe-{pid}-a", f"gnnpipe-{pid}-b"), ifname=("gpveth-a", "gpveth-b"),
                   addr=("10.213.0.1", "10.213.0.2"))
    try:
        for ns in net.netns:
            _ip("netns", "add", ns)
        _ip("link", "add", net.ifname[0], "netns", net.netns[0], "type", "veth",
            "peer", "name", net.ifname[1], "netns", net.netns[1])
        for ns, ifname, addr in zip(net.netns, net.ifname, net.addr):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", ifname)
            _ip("-n", ns, "link", "set", ifname, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield net
    finally:
        for ns in net.netns:   # deleting a namespace deletes its end of the pair, and with it the pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
