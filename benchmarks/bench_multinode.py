"""Two machines vs one: the train stage as a 2-node job (torchrun c10d rendezvous, gloo) between two Linux network
namespaces joined by a veth pair, each node pinned to its own core, against the same job on one host (2 ranks on
both cores). ``--rate`` caps the link with a token bucket (``tc tbf``, e.g. ``--rate 1gbit``; this kernel has no
netem, so no added delay); without it the veth runs at memory speed, so the difference is the protocol's, not a
network's.

Needs root (network namespaces). The graph is the pipeline's default (override with ``--set key=value``), built up
to hotness once in ``--root`` through the CLI and cached there. Prints one JSON line::

    .venv/bin/python benchmarks/bench_multinode.py --root benchmarks/work/multinode --set epochs=5
    .venv/bin/python benchmarks/bench_multinode.py --root benchmarks/work/multinode --set epochs=5 --rate 1gbit
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from storage import ArtifactStore  # noqa: E402
from storage.train_summary import TrainSummary  # noqa: E402
from tests import _netns  # noqa: E402  (the test suite's two-host network)

GNNPIPE = [sys.executable, "-m", "flows.cli"]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PREFECT_HOME": str(REPO / ".prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PYTHONUNBUFFERED": "1", **extra}


def _run(cmd: list[str], **extra: str) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=_env(**extra), capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{' '.join(cmd[:6])}... failed:\n{proc.stderr[-3000:]}")
    return time.perf_counter() - start


def _two_nodes(net: _netns.TwoHosts, cfg: Path) -> float:
    start = time.perf_counter()
    procs = [subprocess.Popen([*net.exec_prefix(i), "taskset", "-c", str(i), *GNNPIPE, "train", "-c", str(cfg),
                               "--nnodes", "2", "--node-rank", str(i), "--rdzv", f"{net.addr[0]}:29400",
                               "--local-addr", net.addr[i], "--force"],
                              cwd=REPO, env=_env(GLOO_SOCKET_IFNAME=net.ifname[i]), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for i in (0, 1)]
    errors = [p.communicate()[1] for p in procs]
    if any(p.returncode for p in procs):
        sys.exit("the 2-node job failed:\n" + "\n".join(e[-2000:] for e in errors))
    return time.perf_counter() - start


def _shape(net: _netns.TwoHosts, rate: str | None) -> None:
    if not rate:
        return
    for ns, ifname in zip(net.netns, net.ifname):
        subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", ifname, "root", "tbf", "rate", rate,
                        "burst", "1mb", "latency", "50ms"], check=True)


def _figures(summary: dict, wall_s: float) -> dict:
    return {"wall_s": round(wall_s, 2), "mean_epoch_s": round(summary["mean_epoch_s"], 3),
            "test_acc": TrainSummary.from_json(summary).test_metric, "nodes": summary.get("nodes", 1),
            "remote_mib_per_epoch": round(summary["remote_bytes_per_epoch"] / 2**20, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=str(REPO / "benchmarks" / "work" / "multinode"))
    parser.add_argument("--set", dest="sets", action="append", default=[], help="pipeline parameter key=value")
    parser.add_argument("--rate", help="cap each direction of the link (tc tbf), e.g. 1gbit")
    args = parser.parse_args()
    reason = _netns.unavailable()
    if reason:
        sys.exit(f"error: {reason}")
    from flows.config import stage_keys
    from flows.load import load_config

    cfg = load_config(None, args.sets, artifacts=args.root)
    cfg_path = Path(args.root).with_suffix(".yaml")
    cfg_path.parent.mkdir(parents=True, exist_ok=True)
    cfg_path.write_text(yaml.safe_dump({k: v for k, v in cfg.model_dump(mode="json").items()
                                        if k not in ("until", "force")}))
    _run([*GNNPIPE, "run", "-c", str(cfg_path), "--until", "hotness"])
    store, key = ArtifactStore(args.root), stage_keys(cfg)["train"]

    one = _run([*GNNPIPE, "train", "-c", str(cfg_path), "--force"])
    one_host = _figures(store.load("train", key).summary, one)
    with _netns.two_hosts() as net:
        _shape(net, args.rate)
        two = _two_nodes(net, cfg_path)
        crossed = net.rx_bytes(0) + net.rx_bytes(1)
    two_hosts = _figures(store.load("train", key).summary, two)
    print(json.dumps({"bench": "multinode", "num_nodes": cfg.download.num_nodes,
                      "num_partitions": cfg.partition.num_partitions, "epochs": cfg.train.epochs,
                      "link_rate": args.rate or "unlimited veth",
                      "one_host": one_host, "two_hosts": two_hosts, "veth_mib": round(crossed / 2**20, 1),
                      "epoch_time_ratio": round(two_hosts["mean_epoch_s"] / one_host["mean_epoch_s"], 3)}))


if __name__ == "__main__":
    main()
