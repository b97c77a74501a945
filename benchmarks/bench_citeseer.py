"""Real data: GCN, GraphSAGE and GAT on CiteSeer (Planetoid split) with the published GCN recipe, through the real
stages (download → partition → features → hotness → train), on 1 and 2 partitions and several seeds.

The recipe is ``tests/_citeseer_recipe.py``'s (Kipf & Welling 2017: 2 layers, 16 hidden, dropout 0.5, L2 5e-4, Adam
lr 0.01, 200 epochs, the model selected on validation, l1-normalised rows, every neighbour). SAGE and GAT take the
same hidden/dropout/wd/lr/epochs; GAT is Veličković et al.'s 8 heads × 8 channels (``--gat-hidden 64``, 8 heads).
Prints one JSON line per run (and appends it to ``--out``), then a markdown table: mean and range over seeds of the
test accuracy at the best-validation epoch and at the last epoch, the best epoch, seconds per epoch (training and
the per-epoch validation pass) and the train stage's wall time. The load average is recorded beside each run: the
box is shared. 20-50 s a run on the shared 2-core box (the 24 runs of the first two lines: 15 min)::

    python benchmarks/bench_citeseer.py --models gcn,sage,gat --parts 1,2 --seeds 0,1,2 --root /tmp/bench-citeseer
    python benchmarks/bench_citeseer.py --models gcn --parts 1,2 --seeds 0,1,2 --normalize none   # raw 0/1 words
    python benchmarks/bench_citeseer.py --pyg-reference --seeds 0,1,2,3,4   # PyG full-batch GCN, each ingredient
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from storage.train_summary import TrainSummary  # noqa: E402
from tests._citeseer_recipe import CITESEER, PUBLISHED_GCN, citeseer_config  # noqa: E402
from tests._train_pipeline import build_without_prefect  # noqa: E402 - after the repo is on sys.path

GAT_HEADS = 8


def run_one(model: str, parts: int, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One training run of the recipe (cached in ``args.root``: a second call with the same values is a lookup)."""
    extra: dict[str, Any] = {"model": model, "seed": seed, "normalize": args.normalize}
    if model == "gat":
        extra.update(hidden=args.gat_hidden, gat_heads=GAT_HEADS)
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    _, manifests = build_without_prefect(citeseer_config(parts, args.root, **extra))
    wall = time.perf_counter() - start
    s = manifests["train"].summary
    t = TrainSummary.from_json(s)   # the results keep their accuracy names (test_acc & co.), as the earlier rows
    epochs = t.epochs
    return {"dataset": "citeseer", "model": model, "parts": parts, "seed": seed, "normalize": args.normalize,
            "hidden": extra.get("hidden", 16), "heads": GAT_HEADS if model == "gat" else None,
            "test_acc": t.test_metric, "test_acc_last": t.test_metric_last, "best_epoch": t.best_epoch + 1,
            "best_val_acc": t.best_val_metric, "epochs": len(epochs),
            "train_s_per_epoch": sum(e["epoch_s"] for e in epochs) / len(epochs),
            "eval_s_per_epoch": sum(e["eval_s"] for e in epochs) / len(epochs),
            "train_stage_wall_s": s["wall_s"], "wall_s": round(wall, 1),
            "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)], "cpus": os.cpu_count()}


def emit(row: dict[str, Any], out: str) -> None:
    """Print ``row`` as a JSON line and append it to ``out``."""
    line = json.dumps(row)
    print(line, flush=True)
    with open(out, "a") as f:
        f.write(line + "\n")


def stat(values: list[float], scale: float = 100.0, digits: int = 1) -> str:
    """``mean [min-max]`` of ``values`` times ``scale``."""
    v = [x * scale for x in values]
    mean = sum(v) / len(v)
    return f"{mean:.{digits}f}" if len(v) == 1 else f"{mean:.{digits}f} [{min(v):.{digits}f}-{max(v):.{digits}f}]"


def pyg_reference(seeds: list[int], out: str) -> list[dict[str, Any]]:
    """PyG's full-batch ``GCNConv`` GCN on the same files, in one process, for the recipe's ingredients: raw or
    l1-normalised rows, dropout on the input features too (Kipf & Welling's model has it), weight decay on every
    parameter or on the first layer only (theirs). Same recipe otherwise; test accuracy at the best validation
    epoch (the first, on a tie) and at the last."""
    import numpy as np
    import torch
    import torch.nn.functional as F  # noqa: N812 - PyTorch's own alias
    from torch_geometric.nn import GCNConv

    torch.set_num_threads(1)
    load = {name: torch.from_numpy(np.load(CITESEER / f"{name}.npy"))
            for name in ("x", "y", "edge_index", "train_idx", "valid_idx", "test_idx")}
    raw, y, edge_index = load["x"].float(), load["y"], load["edge_index"]
    idx = {split: load[f"{split}_idx"] for split in ("train", "valid", "test")}
    rows = []
    for features, x in (("none", raw), ("l1", raw / raw.abs().sum(1, keepdim=True).clamp(min=1))):
        for input_dropout, wd_first_only in itertools.product((False, True), (False, True)):
            for seed in seeds:
                torch.manual_seed(seed)
                convs = torch.nn.ModuleList([GCNConv(x.shape[1], 16), GCNConv(16, int(y.max()) + 1)])
                groups: list[dict[str, Any]] = [{"params": convs[0].parameters()},
                                                 {"params": convs[1].parameters(),
                                                  "weight_decay": 0.0 if wd_first_only else 5e-4}]
                opt = torch.optim.Adam(groups, lr=0.01, weight_decay=5e-4)

                def forward(training: bool, x: torch.Tensor = x, convs: torch.nn.ModuleList = convs,
                            input_dropout: bool = input_dropout) -> torch.Tensor:
                    h = F.dropout(x, 0.5, training) if input_dropout else x
                    h = F.dropout(F.relu(convs[0](h, edge_index)), 0.5, training)
                    return convs[1](h, edge_index)

                best_val, test_at_best, best_epoch = -1.0, 0.0, 0
                for epoch in range(200):
                    opt.zero_grad()
                    F.cross_entropy(forward(True)[idx["train"]], y[idx["train"]]).backward()
                    opt.step()
                    with torch.no_grad():
                        pred = forward(False).argmax(1)
                    val, test = ((pred[idx[s]] == y[idx[s]]).float().mean().item() for s in ("valid", "test"))
                    if val > best_val:
                        best_val, test_at_best, best_epoch = val, test, epoch + 1
                rows.append({"dataset": "citeseer", "model": "pyg-gcn-full-batch", "seed": seed, "normalize": features,
                             "input_dropout": input_dropout, "weight_decay_first_layer_only": wd_first_only,
                             "test_acc": round(test_at_best, 4), "test_acc_last": round(test, 4),
                             "best_epoch": best_epoch})
                emit(rows[-1], out)
    return rows


def reference_table(rows: list[dict[str, Any]]) -> str:
    out = ["| features | input dropout | weight decay | seeds | test % (best val) | test % (last epoch) |",
           "|---|---|---|---|---|---|"]
    groups: dict[tuple[str, bool, bool], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["normalize"], r["input_dropout"], r["weight_decay_first_layer_only"]), []).append(r)
    for (features, input_dropout, first_only), rs in groups.items():
        out.append(f"| {'l1 rows' if features == 'l1' else 'raw 0/1'} | {'yes' if input_dropout else 'no'} | "
                   f"{'first layer' if first_only else 'all'} | {len(rs)} | {stat([r['test_acc'] for r in rs])} | "
                   f"{stat([r['test_acc_last'] for r in rs])} |")
    return "\n".join(out)


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: one line per (model, parts), mean [min-max] over the seeds."""
    out = ["| model | parts | features | seeds | test % (best val) | test % (last epoch) | best epoch | "
           "train s/epoch | val s/epoch | train stage s | paper |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["parts"], r["normalize"]), []).append(r)
    for (model, parts, norm), rs in groups.items():
        name = {"gcn": "GCN 2×16", "sage": "GraphSAGE (mean) 2×16", "gat": f"GAT 2×{rs[0]['hidden']} "
                f"({GAT_HEADS} heads)"}[model]
        paper = f"{100 * PUBLISHED_GCN:.1f}" if model == "gcn" else "-"
        out.append(f"| {name} | {parts} | {'l1 rows' if norm == 'l1' else 'raw 0/1'} | {len(rs)} | "
                   f"{stat([r['test_acc'] for r in rs])} | {stat([r['test_acc_last'] for r in rs])} | "
                   f"{stat([r['best_epoch'] for r in rs], 1, 0)} | "
                   f"{stat([r['train_s_per_epoch'] for r in rs], 1, 3)} | "
                   f"{stat([r['eval_s_per_epoch'] for r in rs], 1, 3)} | "
                   f"{stat([r['train_stage_wall_s'] for r in rs], 1, 0)} | {paper} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="gcn,sage,gat")
    ap.add_argument("--parts", default="1,2")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--normalize", default="l1", choices=("l1", "none"), help="features.normalize")
    ap.add_argument("--gat-hidden", type=int, default=64, help="GAT: 8 heads of hidden/8 channels")
    ap.add_argument("--root", default="/tmp/bench-citeseer", help="artifact root (runs are cached there)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results_citeseer.jsonl"))
    ap.add_argument("--pyg-reference", action="store_true", help="instead: PyG's full-batch GCN on the same "
                                                                   "files, with and without each ingredient")
    args = ap.parse_args()
    if not (CITESEER / "x.npy").exists():
        sys.exit(f"CiteSeer not found: {CITESEER} (../shared/data is absent in a user's clone)")
    if args.pyg_reference:
        print(reference_table(pyg_reference([int(s) for s in args.seeds.split(",")], args.out)))
        return
    rows = []
    for model in args.models.split(","):
        for parts in (int(p) for p in args.parts.split(",")):
            for seed in (int(s) for s in args.seeds.split(",")):
                row = run_one(model, parts, seed, args)
                rows.append(row)
                emit(row, args.out)
    print(table(rows))


if __name__ == "__main__":
    main()
