"""Tiny OGB link-property datasets (ogbl-collab, ogbl-citation2) laid out exactly as ``ogb`` 1.3.6 expects them.

There is no network in tests, so these stand in for the real downloads; the real ``ogb`` code parses them
(``ogb.linkproppred.LinkPropPredDataset``: ``ogb.io.read_graph_raw.read_csv_graph_raw`` for ``raw/``, ``torch.load``
for the split). Layout (from ``ogb/linkproppred/dataset.py`` and ``master.csv``: both csv, not binary, not
heterogeneous, split kind ``time``), for ``ogbl-collab`` under ``root``::

    <root>/ogbl_collab/RELEASE_v1.txt            version marker; without it ogb asks on stdin whether to update
    <root>/ogbl_collab/raw/edge.csv.gz           "u,v" per line, no header: the train edges (OGB's graph; collab's
                                                 add_inverse_edge=True makes ogb add each reverse)
    <root>/ogbl_collab/raw/num-node-list.csv.gz  one line: the node count
    <root>/ogbl_collab/raw/num-edge-list.csv.gz  one line: the edge count of edge.csv.gz
    <root>/ogbl_collab/raw/node-feat.csv.gz      F comma-separated floats per node
    <root>/ogbl_collab/raw/edge_weight.csv.gz    collab's 'additional edge files': one int per edge
    <root>/ogbl_collab/raw/edge_year.csv.gz      (ditto)
    <root>/ogbl_collab/split/time/train.pt       torch.save of {'edge': int64 [E, 2], 'weight': [E], 'year': [E]}
    <root>/ogbl_collab/split/time/valid.pt       ... + 'edge_neg': int64 [E_neg, 2] (shared negatives)
    <root>/ogbl_collab/split/time/test.pt        (as valid.pt)

``ogbl-citation2`` (``<root>/ogbl_citation2``) has the same raw files without the edge files and with
``raw/node_year.csv.gz`` (its 'additional node files', one int per node; add_inverse_edge=False: directed), and
splits ``{'source_node': int64 [E], 'target_node': int64 [E]}``, valid/test + ``'target_node_neg': int64 [E, 1000]``.
No download zip is needed: ogb downloads only when ``raw/edge.csv.gz`` is missing.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

NUM_NODES = 24
NUM_NEG_PER_POSITIVE = 1000   # citation2's K
SPLITS = ("train", "valid", "test")


@dataclass
class OgblFixture:
    name: str
    root: Path                        # what load_ogbl gets as root
    x: np.ndarray                     # [N, F] float32
    positives: dict[str, np.ndarray]  # split -> int64 [2, E] (src, dst), OGB's order
    negatives: dict[str, np.ndarray]  # valid/test -> collab int64 [2, E_neg]; citation2 int64 [E, K]


def features() -> np.ndarray:
    i = np.arange(NUM_NODES, dtype=np.float32)
    return np.stack([i, i / 2, -i], axis=1)  # exact in float32 and in decimal text


def collab_positives() -> dict[str, np.ndarray]:
    """A chain of collaborations i -- i+1 (written either way round), plus 0 -- 5 twice (two years) and the pair
    1 -- 2 again as (2, 1); valid and test pairs are new collaborations."""
    chain = [(i, i + 1) if i % 3 else (i + 1, i) for i in range(NUM_NODES - 1)]
    train = chain + [(0, 5), (0, 5), (2, 1)]
    return {"train": _pairs(train), "valid": _pairs([(0, 9), (4, 12), (20, 3)]),
            "test": _pairs([(1, 7), (22, 11), (6, 16), (13, 2)])}


def citation2_positives() -> dict[str, np.ndarray]:
    """Citations i -> i-1, 5 -> 0 and 7 -> 0, one duplicate (3 -> 2); valid and test cite further back."""
    train = [(i, i - 1) for i in range(1, NUM_NODES)] + [(5, 0), (7, 0), (3, 2)]
    return {"train": _pairs(train), "valid": _pairs([(20, 4), (21, 9), (23, 1)]),
            "test": _pairs([(22, 6), (19, 2), (17, 10), (23, 12)])}


def build(name: str, root: Path) -> OgblFixture:
    """Write dataset ``name`` as an already-downloaded ogb directory under ``root``."""
    rng = np.random.default_rng(0)
    if name == "ogbl-collab":
        positives = collab_positives()
        negatives = {s: rng.integers(0, NUM_NODES, (2, 7)) for s in ("valid", "test")}
    else:
        positives = citation2_positives()
        negatives = {s: rng.integers(0, NUM_NODES, (positives[s].shape[1], NUM_NEG_PER_POSITIVE))
                     for s in ("valid", "test")}
    d = root / name.replace("-", "_")
    _write_raw(name, d / "raw", positives["train"])
    (d / "RELEASE_v1.txt").write_text("tiny test fixture\n")
    split_dir = d / "split" / "time"
    split_dir.mkdir(parents=True)
    for split in SPLITS:
        torch.save(_split_dict(name, positives[split], negatives.get(split)), split_dir / f"{split}.pt")
    return OgblFixture(name, root, features(), positives, negatives)


def _split_dict(name: str, pairs: np.ndarray, negatives: np.ndarray | None) -> dict[str, torch.Tensor]:
    """One ``split/time/<split>.pt``, as OGB ships it (torch tensors)."""
    if name == "ogbl-collab":
        n = pairs.shape[1]
        out = {"edge": torch.from_numpy(pairs.T.copy()), "weight": torch.ones(n, dtype=torch.int64),
               "year": torch.full((n,), 2019, dtype=torch.int64)}
        if negatives is not None:
            out["edge_neg"] = torch.from_numpy(negatives.T.copy())
        return out
    out = {"source_node": torch.from_numpy(pairs[0].copy()), "target_node": torch.from_numpy(pairs[1].copy())}
    if negatives is not None:
        out["target_node_neg"] = torch.from_numpy(negatives.copy())
    return out


def _write_raw(name: str, raw: Path, train: np.ndarray) -> None:
    raw.mkdir(parents=True)
    _write_csv(raw / "edge.csv.gz", train.T.tolist())
    _write_csv(raw / "num-node-list.csv.gz", [[NUM_NODES]])
    _write_csv(raw / "num-edge-list.csv.gz", [[train.shape[1]]])
    _write_csv(raw / "node-feat.csv.gz", [[f"{v:.1f}" for v in row] for row in features()])
    if name == "ogbl-collab":
        _write_csv(raw / "edge_weight.csv.gz", [[1]] * train.shape[1])
        _write_csv(raw / "edge_year.csv.gz", [[2000 + i % 18] for i in range(train.shape[1])])
    else:
        _write_csv(raw / "node_year.csv.gz", [[2000 + i % 20] for i in range(NUM_NODES)])


def _pairs(edges: list[tuple[int, int]]) -> np.ndarray:
    return np.array(edges, dtype=np.int64).T.copy()


def _write_csv(path: Path, rows: list[list[object]]) -> None:
    with gzip.open(path, "wt") as f:
        f.writelines(",".join(str(v) for v in row) + "\n" for row in rows)
