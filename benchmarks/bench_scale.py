"""How the pipeline grows with the graph ([2/5]): a papers100M-shaped synthetic graph at several sizes, every stage
in its own ``gnnpipe stage`` process under one memory budget, measured from outside.

    python benchmarks/bench_scale.py --nodes 1750000 3500000 7000000 14000000 --budget 4GiB \
        --root /work/scale-artifacts --full-at 14000000 --out benchmarks/results_scale.jsonl

papers100M's shape: 111 M nodes, 1.6 B directed edges, which symmetrised are ~29 CSR entries per node
(``--avg-degree 29``: ~400 M entries at 14 M nodes), 128 float32 features, 172 classes, 1.1 % of the nodes train
(0.11 % valid, 0.19 % test). The degree law is the synthetic generator's power law (Pareto tail 2.2,
``stages.download.synthetic``).

Per stage: wall time of the process (interpreter and Prefect start included), peak anonymous memory (``RssAnon``
summed over the process and its children, read from /proc every ``--poll-s``: the page cache of memory-mapped
files is not counted, as the budget does not count it), the stage's own ``peak_anon_bytes`` and ``wall_s`` from its
manifest, and disk: peak and final bytes of the files under the artifact root over the start (spill files
included; walked every second). ``--repo`` runs another checkout's stages (the same venv), for a side-by-side
comparison in one invocation; ``--preset products`` is the products-scale graph. ``--executors local dask:1
dask:2`` builds every data stage once per executor, one after the other (``gnnpipe stage`` forces the rebuild; the
key is the same), for [3/5]'s side by side: the Dask workers are children of the stage's process, so "peak anon"
counts them, and each unit's own wall time and peak (``units`` in the manifest) are kept per row. ``--full-at``
sizes also train one epoch on 2 ranks and run exact inference, with ``--hidden`` channels (64 by default: see the
option's comment).

The fit (``--fit``, from the JSON lines of a run): per stage, time ~ a * entries^b by least squares in log-log and
its projection to papers100M and IGBH-full (one process, as measured: no parallel speed-up assumed), and the
memory each stage needs there at least, from its own planner's constants (``minimum``): past that minimum a stage
keeps within ``memory_budget_bytes`` by construction, so its peak is the budget.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from stages.meter import anon_rss_bytes

REPO = Path(__file__).resolve().parents[1]
DATA_STAGES = ("download", "partition", "features", "hotness")
FULL_STAGES = ("train", "infer")
ALL_STAGES = DATA_STAGES + FULL_STAGES
# what a stage's time grows with: the features stage copies feature bytes (128 float32 a node here), the others
# walk the CSR
SIZE_OF = {"download": "entries", "partition": "entries", "features": "feature_bytes", "hotness": "entries"}
FEATURE_BYTES_PER_NODE = 128 * 4
PAPERS = {"nodes": 111_059_956, "entries": 3_231_371_744, "feature_bytes": 111_059_956 * 128 * 4}
# IGBH-full (MLPerf R-GAT): 547 M nodes, 5.8 B edges (11.6 B entries once reversed edges are added), 1024 float32
# features per paper and author node (2.2 TB)
IGBH = {"nodes": 547_306_935, "entries": 11_600_000_000, "feature_bytes": 2_200_000_000_000}


# the graph's shape: papers100M's (module docstring), or the products-scale graph of benchmarks/RESULTS.md's earlier
# sections (2.4 M nodes, 50 entries a node, 100 features, 47 classes, the synthetic default split, METIS)
PRESETS = {"papers": ["num_features=128", "num_classes=172", "split=0.011,0.0011,0.0019", "method=kaminpar"],
           "products": ["num_features=100", "num_classes=47", "method=metis"]}


def settings(nodes: int, args: argparse.Namespace) -> list[str]:
    budget = [f"memory_budget_bytes={args.budget}"] if args.budget != "default" else []
    return [f"num_nodes={nodes}", f"avg_degree={args.avg_degree}", *PRESETS[args.preset], *budget,
            "num_partitions=2", "epochs=1", f"hidden={args.hidden}", *args.set]


def tree_anon_bytes(pid: int) -> int:
    """``RssAnon`` of ``pid`` and every descendant (training ranks, KaMinPar runs in-process)."""
    total, stack, seen = 0, [pid], set()
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        total += anon_rss_bytes(p) or 0
        stack.extend(children(p))
    return total


def children(pid: int) -> list[int]:
    """Child processes of every thread of ``pid``: a Dask LocalCluster's nannies spawn the worker processes from
    its event-loop thread, and /proc lists a child under the thread that forked it (the main thread's list missed
    them: the first [3/5] rows counted the stage's process alone)."""
    out: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    return out


def du_bytes(root: str) -> int:
    """Bytes of the files under ``root`` (spill files included; other processes' writes elsewhere are not)."""
    total = 0
    for folder, _, names in os.walk(root):
        for name in names:
            try:
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
            except OSError:   # a spill file removed between the listing and the stat
                continue
    return total


def run_stage(stage: str, nodes: int, args: argparse.Namespace, executor: str | None = None) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "flows.cli", "stage", stage, "--artifacts", args.root]
    for s in settings(nodes, args) + ([f"executor={executor}"] if executor else []):
        cmd += ["--set", s]
    disk0 = du_bytes(args.root)
    start = time.perf_counter()
    log = open(Path(args.root) / f"{stage}-{nodes}.log", "w")
    proc = subprocess.Popen(cmd, cwd=args.repo, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    peak_anon, peak_disk, polls = 0, 0, 0
    try:
        while proc.poll() is None:
            peak_anon = max(peak_anon, tree_anon_bytes(proc.pid))
            if polls % 10 == 0:   # a walk of the root: every second, not every poll
                peak_disk = max(peak_disk, du_bytes(args.root) - disk0)
            polls += 1
            time.sleep(args.poll_s)
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGTERM)
        raise
    wall = time.perf_counter() - start
    log.close()
    if proc.returncode != 0:
        tail = (Path(args.root) / f"{stage}-{nodes}.log").read_text()[-2000:]
        raise SystemExit(f"{stage} at {nodes} nodes exited {proc.returncode}:\n{tail}")
    key, summary = newest_summary(Path(args.root), stage)
    return {"stage": stage, "nodes": nodes, "repo": args.repo, "commit": commit(args.repo),
            "entries": summary.get("num_edges"), "budget": args.budget,
            "wall_s": round(wall, 1), "stage_wall_s": summary.get("wall_s"),
            "peak_anon_bytes": peak_anon, "stage_peak_anon_bytes": summary.get("peak_anon_bytes"),
            "peak_disk_bytes": peak_disk, "final_disk_bytes": du_bytes(args.root) - disk0,
            "path": summary.get("canonical_path") or summary.get("memory_path") or summary.get("csr")
            or summary.get("path"), "key": key, "edge_cut": summary.get("edge_cut"), "load": os.getloadavg()[0],
            **({"executor": executor, "units": unit_figures(summary)} if executor else {})}


def unit_figures(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Each executor unit's own figures, under the key its stage records them (download: its sort buckets)."""
    for key in ("units", "sort_units", "export_units"):
        if isinstance(summary.get(key), list):
            return list(summary[key])
    return []


def commit(repo: str) -> str:
    out = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip()


def newest_summary(root: Path, stage: str) -> tuple[str, dict[str, Any]]:
    """(key, summary) of the stage's newest build under ``root``."""
    manifests = sorted((root / stage).glob("*/manifest.json"), key=lambda p: p.stat().st_mtime)
    if not manifests:
        return "", {}
    manifest = json.loads(manifests[-1].read_text())
    return manifest["key"], manifest["summary"]


def measure(args: argparse.Namespace) -> None:
    Path(args.root).mkdir(parents=True, exist_ok=True)
    entries: dict[int, Any] = {}
    with open(args.out, "a") as out:
        for nodes in args.nodes:
            stages = DATA_STAGES + (FULL_STAGES if nodes in args.full_at else ())
            stages = tuple(s for s in stages if not args.stages or s in args.stages)
            for stage in stages:
                for executor in (args.executors if stage in DATA_STAGES else [None]):
                    row = run_stage(stage, nodes, args, executor)
                    if stage == "download":
                        entries[nodes] = row["entries"]
                    row["entries"] = entries.get(nodes, row["entries"])
                    print(json.dumps(row), flush=True)
                    out.write(json.dumps(row) + "\n")
            if not args.keep:
                shutil.rmtree(args.root, ignore_errors=True)
                Path(args.root).mkdir(parents=True, exist_ok=True)


def fit(path: str) -> None:
    rows = sorted((json.loads(line) for line in open(path) if line.strip() and line.startswith("{")),
                  key=lambda r: (ALL_STAGES.index(r["stage"]), r["nodes"]))
    if any("executor" in r for r in rows):
        executor_table(rows)
        return
    print("| stage | nodes | CSR entries | wall s | stage s | peak anon GiB | stage anon GiB | peak disk GiB | "
          "kept GiB | path | load |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for r in rows:
        print(f"| {r['stage']} | {r['nodes']:,} | {r['entries'] or 0:,} | {r['wall_s']:.0f} | "
              f"{r.get('stage_wall_s') or 0:.0f} | {r['peak_anon_bytes'] / 2**30:.2f} | "
              f"{(r.get('stage_peak_anon_bytes') or 0) / 2**30:.2f} | {r['peak_disk_bytes'] / 2**30:.1f} | "
              f"{r['final_disk_bytes'] / 2**30:.1f} | {r.get('path') or ''} | {r['load']:.1f} |")
    print("\n| stage | time ~ a·size^b: b | s per M entries (features: per GB) at the largest | papers100M h | "
          "IGBH-full h | minimum at papers100M GiB | at IGBH-full GiB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for stage in DATA_STAGES:
        pts = [r for r in rows if r["stage"] == stage and r["entries"]]
        if len(pts) < 2:
            continue
        law = growth(pts, size=SIZE_OF[stage])
        cells = [f"{law['b']:.2f}", f"{law['s_per_m']:.2f}"]
        cells += [f"{law['a'] * t[SIZE_OF[stage]] ** law['b'] / 3600:.1f}" for t in (PAPERS, IGBH)]
        cells += [f"{minimum(stage, t) / 2**30:.1f}" for t in (PAPERS, IGBH)]
        print(f"| {stage} | " + " | ".join(cells) + " |")


def executor_table(rows: list[dict[str, Any]]) -> None:
    """[3/5]'s side by side: each stage on each executor, the process tree's peak (workers included) and each
    unit's own (a worker's peak minus what it held before the unit: the interpreter and its imports)."""
    print("| stage | nodes | executor | wall s | stage s | peak anon GiB (all processes) | units: wall s | "
          "units: peak GiB | load |")
    print("|---|---:|---|---:|---:|---:|---|---|---:|")
    for r in rows:
        units = r.get("units") or []
        walls = " / ".join(f"{u['wall_s']:.0f}" for u in units if "wall_s" in u) or "-"
        peaks = " / ".join(f"{u['peak_anon_bytes'] / 2**30:.2f}" for u in units if u.get("peak_anon_bytes")) or "-"
        print(f"| {r['stage']} | {r['nodes']:,} | {r['executor']} | {r['wall_s']:.0f} | "
              f"{r.get('stage_wall_s') or 0:.0f} | {r['peak_anon_bytes'] / 2**30:.2f} | {walls} | {peaks} | "
              f"{r['load']:.1f} |")


def growth(pts: list[dict[str, Any]], size: str) -> dict[str, float]:
    """Least squares in log-log of one stage's points (sorted by size): ``stage_wall_s = a * size^b`` (the
    stage's own time: the ~10 s of interpreter and Prefect start would flatten the small sizes), ``size`` the
    graph's CSR entries or (features) its feature bytes; ``s_per_m``: seconds per million entries (per GB of
    features) at the largest."""
    x = np.array([r[size] if size in r else FEATURE_BYTES_PER_NODE * r["nodes"] for r in pts], dtype=float)
    t = np.array([r.get("stage_wall_s") or r["wall_s"] for r in pts], dtype=float)   # without the process start
    b, log_a = np.polyfit(np.log(x), np.log(t), 1)
    per = 1e9 if size == "feature_bytes" else 1e6
    return {"a": float(np.exp(log_a)), "b": float(b), "s_per_m": float(t[-1] / x[-1] * per)}


def minimum(stage: str, target: dict[str, int]) -> int:
    """The stage's fixed minimum on ``target`` by its own planner's constants (what ``memory_budget_bytes`` must
    at least be there): beyond it, every stage stays within the budget by construction, so the peak is the budget."""
    from stages.download import streamed
    from stages.features import stream
    from stages.hotness import whole_csr
    from stages.partition import footprint

    n, e = target["nodes"], target["entries"]
    if stage == "download":   # a `files` dataset (what papers100M or IGBH would be): its O(N) arrays, the writes
        return streamed.NODE_BYTES * n + streamed.WRITE_BUFFERS * (64 << 20)
    if stage == "partition":   # KaMinPar loaded compressed, 2 parts: the peak of its phases
        chunk = min(footprint.CHUNK_EDGES, e) * footprint.CHUNK_BYTES_PER_ENTRY
        return max(b for _, b in footprint.kaminpar_phases(n, e, 2, chunk, 0, compress=True))
    if stage == "features":   # papers100M's 1.5 % split nodes
        return stream.FIXED_BYTES_PER_NODE * n + stream.FIXED_BYTES_PER_SPLIT_NODE * int(0.015 * n)
    return (whole_csr.FIXED_BYTES_PER_NODE + 8) * n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[1_750_000, 3_500_000, 7_000_000, 14_000_000])
    ap.add_argument("--avg-degree", type=float, default=29.0)
    ap.add_argument("--budget", default="4GiB", help="memory_budget_bytes; 'default': not set (what a checkout "
                    "from before the budget needs)")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="papers")
    ap.add_argument("--repo", default=str(REPO), help="the checkout whose stages run (another one: side by side)")
    ap.add_argument("--root", default="/tmp/gnnpipe-scale")
    ap.add_argument("--full-at", type=int, nargs="*", default=[14_000_000])
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results_scale.jsonl"))
    # exact inference holds two layer matrices of (own + halo rows) x hidden float32 per rank (stages/infer/halo.py):
    # at 14 M nodes and hidden 256 that is up to 2 x 14 GB per rank, beyond this 24 GiB host; 64 keeps it near 7 GB
    ap.add_argument("--hidden", type=int, default=64, help="the model's hidden width (train and infer)")
    ap.add_argument("--set", action="append", default=[], help="another NAME=VALUE for every stage")
    ap.add_argument("--stages", nargs="*", help="only these stages (their upstream must be built: --keep)")
    ap.add_argument("--executors", nargs="*", default=[None], help="build each data stage on each of these "
                    "executors in turn (local, dask:1, dask:2, tcp://...); default: the configured one, once")
    ap.add_argument("--poll-s", type=float, default=0.1)
    ap.add_argument("--keep", action="store_true", help="keep each size's artifacts (default: removed)")
    ap.add_argument("--fit", metavar="JSONL", help="print the table, fit and projections of a run's lines")
    args = ap.parse_args()
    if args.fit:
        fit(args.fit)
        return
    measure(args)


if __name__ == "__main__":
    main()
