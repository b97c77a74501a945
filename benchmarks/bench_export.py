"""The infer stage's export in orig-id order, alone: ``nodes.zarr`` and ``predictions.parquet`` from the ranks' parts.

At products scale on an H200 machine the export took ~21 s of the infer stage's 49.9 s (benchmarks/RESULTS.md,
session 31). This times ``storage.infer_export.export_orig_order`` on synthetic part outputs of the same shape: a
node classifier's ``pred`` and ``prob`` and its last hidden layer's rows, ``--parts`` parts whose orig ids are spread
at random over the parts, each part keeping orig order (as the partition stage numbers them); one part: every gid
is its orig id. The parts are made once in ``--root`` and reused.

``--tree DIR`` imports ``storage`` from another source tree (``git archive <commit> | tar -x -C DIR``), so that two
versions can be timed in turn against the same parts on the same load. Prints one JSON line per round: seconds,
the output bytes written (nodes.zarr's arrays, predictions.parquet) and the export's chunks::

    python benchmarks/bench_export.py --nodes 600000 --classes 47 --hidden 256 --parts 1 --rounds 2

``--rank-writes`` times what precedes the export instead: one rank's writes of its outputs (its hidden layer, then
``pred`` and ``prob``), ``hidden_write_s`` and ``pred_prob_write_s``::

    python benchmarks/bench_export.py --rank-writes --nodes 2400000 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]


class Out:
    """Where the export writes (a ``StageWriter``'s ``url`` and ``file_url``): the folder of the ranks' parts."""

    def __init__(self, url: str) -> None:
        self.url = url

    def file_url(self, rel: str) -> str:
        return f"{self.url}/{rel}"


def book_of(nodes: int, parts: int, seed: int) -> Any:
    """A partition book: orig ids spread at random over ``parts``, orig order kept within each part."""
    from storage.partition import PartitionBook

    owner = np.random.default_rng(seed).integers(0, parts, nodes) if parts > 1 else np.zeros(nodes, dtype=np.int64)
    orig_of_gid = np.argsort(owner, kind="stable").astype(np.int64)
    gid_of_orig = np.empty_like(orig_of_gid)
    gid_of_orig[orig_of_gid] = np.arange(nodes, dtype=np.int64)
    bounds = np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=parts))]).astype(np.int64)
    return PartitionBook(bounds=bounds, orig_of_gid=orig_of_gid, gid_of_orig=gid_of_orig)


def make_parts(folder: Path, book: Any, classes: int, hidden: int, seed: int) -> None:
    """The ranks' ``part-<p>.zarr``: random probabilities (their argmax as ``pred``) and hidden rows."""
    from storage.infer import open_part_outputs, write_part_embedding, write_part_predictions

    rng = np.random.default_rng(seed)
    for p in range(book.num_partitions):
        n = int(book.bounds[p + 1] - book.bounds[p])
        group = open_part_outputs(str(folder), p)
        write_part_embedding(group, hidden_layer := 1, rng.standard_normal((n, hidden), dtype=np.float32))
        prob = rng.dirichlet(np.ones(classes), size=n).astype(np.float32)
        write_part_predictions(group, part=p, start_gid=int(book.bounds[p]), pred=prob.argmax(1), prob=prob,
                               embedding_layers=[hidden_layer])
    (folder / "ready").touch()


def export_bytes(folder: Path) -> int:
    """What the export wrote: nodes.zarr's files and predictions.parquet."""
    files = [*(folder / "nodes.zarr").rglob("*"), folder / "predictions.parquet"]
    return sum(f.stat().st_size for f in files if f.is_file())


def time_rank_writes(args: argparse.Namespace) -> None:
    """One rank's writes of its outputs (``storage.infer``), as an inference rank makes them: its hidden layer's
    rows, then ``pred`` and ``prob``, of ``--nodes`` rows, into a fresh part each round."""
    import storage.infer
    from storage.infer import open_part_outputs, write_part_embedding, write_part_predictions

    rng = np.random.default_rng(args.seed)
    hidden = rng.standard_normal((args.nodes, args.hidden), dtype=np.float32)
    prob = rng.random((args.nodes, args.classes), dtype=np.float32)
    pred = prob.argmax(1)
    folder = Path(args.root) / "rank-writes"
    for r in range(args.rounds):
        shutil.rmtree(folder, ignore_errors=True)
        group = open_part_outputs(str(folder), 0)
        start = time.perf_counter()
        write_part_embedding(group, 1, hidden)
        hidden_s = time.perf_counter() - start
        start = time.perf_counter()
        write_part_predictions(group, part=0, start_gid=0, pred=pred, prob=prob, embedding_layers=[1])
        print(json.dumps({"tree": args.tree or "this", "storage": str(Path(storage.infer.__file__).resolve()),
                          "round": r, "nodes": args.nodes, "classes": args.classes, "hidden": args.hidden,
                          "hidden_write_s": round(hidden_s, 3),
                          "pred_prob_write_s": round(time.perf_counter() - start, 3), "cpus": os.cpu_count(),
                          "load1": round(os.getloadavg()[0], 2)}), flush=True)
    shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=600_000)
    ap.add_argument("--classes", type=int, default=47)
    ap.add_argument("--hidden", type=int, default=256, help="the stored hidden layer's width")
    ap.add_argument("--parts", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--root", default=str(REPO / "benchmarks" / "work" / "export"))
    ap.add_argument("--tree", default=None, help="import storage from this source tree (default: this repository)")
    ap.add_argument("--rank-writes", action="store_true",
                    help="time a rank's own writes instead (its hidden layer, then pred and prob, one part)")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(args.tree).resolve() if args.tree else REPO))
    if args.rank_writes:
        time_rank_writes(args)
        return
    import storage.infer_export
    from storage.infer_export import export_orig_order
    from storage.schema import GraphSchema

    folder = Path(args.root) / f"n{args.nodes}-c{args.classes}-h{args.hidden}-p{args.parts}-s{args.seed}"
    book = book_of(args.nodes, args.parts, args.seed)
    if not (folder / "ready").exists():
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        make_parts(folder, book, args.classes, args.hidden, args.seed)
    rng = np.random.default_rng(args.seed + 1)
    label = rng.integers(-1, args.classes, args.nodes)
    split = rng.integers(-1, 3, args.nodes).astype(np.int8)
    schema = GraphSchema.homogeneous(args.nodes, None, args.classes)
    for r in range(args.rounds):
        start = time.perf_counter()
        figures = export_orig_order(Out(str(folder)), book=book, label_of_gid=label, split_of_gid=split,  # type: ignore[arg-type]
                                    num_classes=args.classes, embedding_layers=[1], schema=schema)
        seconds = time.perf_counter() - start
        written = export_bytes(folder)
        print(json.dumps({"tree": args.tree or "this", "storage": str(Path(storage.infer_export.__file__).resolve()),
                          "round": r, "nodes": args.nodes, "parts": args.parts,
                          "classes": args.classes, "hidden": args.hidden, "export_s": round(seconds, 3),
                          "written_MB": round(written / 1e6, 1), "MB_per_s": round(written / 1e6 / seconds, 1),
                          "chunk_rows": figures["export_chunk_rows"], "cpus": os.cpu_count(),
                          "load1": round(os.getloadavg()[0], 2)}), flush=True)


if __name__ == "__main__":
    main()
