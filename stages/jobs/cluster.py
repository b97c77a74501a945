"""Where the ranks of one train job run: one host (torchrun ``--standalone``) or N hosts joined by torchrun's c10d
rendezvous, described by the command line (``--nnodes/--node-rank/--rdzv``) or by the Slurm environment.

Torch-free, so that a bad cluster description fails in milliseconds, before anything is launched.

One rank per partition (docs/design.md): ``num_partitions`` ranks spread evenly, ``num_partitions / nnodes`` per
node. Which global ranks a node gets is torchrun's choice (c10d orders the nodes by address); nothing here
depends on it: every node keeps its own copy of the results and checkpoints (see ``stages.train.rank.checkpoint``).
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

import psutil

from storage.errors import InputError

DEFAULT_PORT = 29400             # torchrun's own default c10d port
DEFAULT_RDZV_ID = "gnnpipe"
DEFAULT_JOIN_TIMEOUT_S = 600.0   # torchrun's default: how long the first node waits for the others


@dataclass(frozen=True)
class Cluster:
    """The job's shape as this node sees it. ``nnodes == 1`` without an endpoint is a single-host job."""

    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None     # HOST:PORT of the c10d rendezvous (served by the node at that address)
    rdzv_id: str = DEFAULT_RDZV_ID       # the same on every node of one job; Slurm: the job id
    local_addr: str | None = None        # this node's address as the others reach it (torchrun --local-addr)
    join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.nnodes < 1:
            raise InputError(f"--nnodes must be >= 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise InputError(f"--node-rank {self.node_rank} is not in 0..{self.nnodes - 1} for --nnodes {self.nnodes}")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise InputError(f"--nnodes {self.nnodes} needs --rdzv HOST:PORT, the address of one node (the same on "
                             f"every node), or --slurm inside an srun step")
        if self.rdzv_endpoint is not None:
            parse_endpoint(self.rdzv_endpoint)
        if self.join_timeout_s <= 0:
            raise InputError(f"the rendezvous join timeout must be > 0 s, got {self.join_timeout_s:g}")

    @property
    def multi_node(self) -> bool:
        return self.rdzv_endpoint is not None

    @property
    def publishes(self) -> bool:
        """Node 0 publishes the artifact; the other nodes only lend their ranks."""
        return self.node_rank == 0

    def check_fits(self, num_partitions: int) -> None:
        """One rank per partition, spread evenly: raise the one-line error naming partition counts that fit."""
        self.nproc_per_node(num_partitions)

    def nproc_per_node(self, num_partitions: int) -> int:
        """Ranks on each node (``check_fits`` says why a count does not fit)."""
        if num_partitions % self.nnodes:
            lower = num_partitions - num_partitions % self.nnodes
            options = sorted({n for n in (lower, lower + self.nnodes) if n > 0})
            raise InputError(f"{num_partitions} partitions on {self.nnodes} nodes: training runs one rank per "
                             f"partition, spread evenly over the nodes; repartition into "
                             f"{' or '.join(map(str, options))} partitions, or change --nnodes")
        return num_partitions // self.nnodes

    def torchrun_args(self, num_partitions: int) -> list[str]:
        """torchrun's arguments for this node, up to (not including) the program."""
        nproc = self.nproc_per_node(num_partitions)
        if not self.multi_node:
            return ["--standalone", f"--nproc_per_node={nproc}"]
        # no --node_rank: c10d ignores it (it orders nodes by address); ours only says which node publishes
        args = [f"--nnodes={self.nnodes}", f"--nproc_per_node={nproc}",
                "--rdzv_backend=c10d", f"--rdzv_endpoint={self.rdzv_endpoint}", f"--rdzv_id={self.rdzv_id}",
                f"--rdzv_conf={self.rdzv_conf()}"]
        if self.local_addr:
            args.append(f"--local_addr={self.local_addr}")
        return args


    def rdzv_conf(self) -> str:
        conf = f"join_timeout={self.join_timeout_s:g}"
        host, _ = parse_endpoint(self.rdzv_endpoint or "")
        if bound_here(host):
            # torchrun decides who serves the rendezvous by comparing the endpoint with this machine's hostname
            # and its addresses, and misses addresses of secondary NICs (a cluster's fabric, a veth): then no node
            # serves it and every node times out as a client. Say it outright when the address is on this node.
            conf += ",is_host=1"
        return conf


def bound_here(host: str) -> bool:
    """Whether ``host`` resolves to a non-loopback address of one of this node's interfaces (in its network
    namespace). Loopback is left to torchrun, which also copes with several nodes sharing one machine."""
    try:
        resolved = {str(info[4][0]) for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except (OSError, UnicodeError):
        return False
    resolved = {a for a in resolved if not ipaddress.ip_address(a.split("%")[0]).is_loopback}
    local = {addr.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for addr in addrs}
    return bool(resolved & local)


def rank_threads(threads_per_rank: int | None, ranks_on_node: int) -> int:
    """Threads each rank uses: the explicit setting, else this node's usable CPUs shared among its ranks."""
    return threads_per_rank or max(1, usable_cpus() // ranks_on_node)


def usable_cpus() -> int:
    """CPUs this process may run on: a Slurm step, a cgroup cpuset or ``taskset`` limit them, and
    ``os.cpu_count()`` (the whole machine) would oversubscribe the ones we have."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:   # not Linux
        return os.cpu_count() or 1


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) → (host, port), or a one-line error."""
    m = re.fullmatch(r"\[?([^\[\]]+?)\]?:(\d+)", endpoint.strip())
    if not m or not m.group(1) or not 0 < int(m.group(2)) < 65536:
        raise InputError(f"--rdzv expects HOST:PORT (e.g. node01:{DEFAULT_PORT}), got '{endpoint}'")
    return m.group(1), int(m.group(2))


def expand_hostlist(hostlist: str) -> list[str]:
    """Slurm's compressed host list, e.g. ``gpu[01-03,07],login1`` → ``gpu01 gpu02 gpu03 gpu07 login1``
    (zero padding kept; several bracket groups in one name are expanded as a product)."""
    hosts: list[str] = []
    for item in _split_top_level(hostlist):
        hosts.extend(_expand_one(item))
    return hosts


def _split_top_level(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch == "[") - (ch == "]")
        if depth < 0:
            raise InputError(f"malformed Slurm host list '{text}'")
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise InputError(f"malformed Slurm host list '{text}'")
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def _expand_one(name: str) -> list[str]:
    m = re.match(r"^([^\[]*)\[([^\]]+)\](.*)$", name)
    if not m:
        return [name]
    prefix, ranges, rest = m.groups()
    out: list[str] = []
    for part in ranges.split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise InputError(f"malformed Slurm host range '[{ranges}]' in '{name}'")
        width = len(lo)
        for n in range(int(lo), int(hi or lo) + 1):
            out.extend(f"{prefix}{n:0{width}d}{tail}" for tail in _expand_one(rest))
    return out


def from_slurm(env: Mapping[str, str], *, port: int = DEFAULT_PORT,
               join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_S) -> Cluster:
    """The cluster of the current ``srun`` step: one task per node, the first node of the allocation serves the
    rendezvous on ``port``, the job (and step) id names it."""
    if "SLURM_JOB_ID" not in env:
        raise InputError("--slurm needs a Slurm job: run it as `srun --ntasks-per-node=1 gnnpipe train --slurm ...` "
                         "inside an allocation (SLURM_JOB_ID is not set)")
    nnodes = int(env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1)
    ntasks = int(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or nnodes)
    if ntasks != nnodes:
        raise InputError(f"the Slurm step has {ntasks} tasks on {nnodes} nodes: gnnpipe starts one rank per "
                         f"partition itself, so run one task per node (srun --ntasks-per-node=1)")
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise InputError("the Slurm environment names no nodes (SLURM_JOB_NODELIST is not set)")
    hosts = expand_hostlist(nodelist)
    node_rank = int(env.get("SLURM_NODEID", 0))
    step = env.get("SLURM_STEP_ID")
    rdzv_id = f"slurm-{env['SLURM_JOB_ID']}" + (f".{step}" if step else "")
    if nnodes == 1:
        return Cluster(rdzv_id=rdzv_id, join_timeout_s=join_timeout_s)
    return Cluster(nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=f"{hosts[0]}:{port}", rdzv_id=rdzv_id,
                   join_timeout_s=join_timeout_s)
