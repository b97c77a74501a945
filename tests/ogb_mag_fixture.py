"""A tiny ``ogbn-mag`` laid out exactly as ``ogb`` 1.3.6 reads a heterogeneous node dataset (its
``read_csv_heterograph_raw``, ``read_node_label_hetero`` and ``read_nodesplitidx_split_hetero``); no network.

Layout under ``<root>/ogbn_mag/`` (``master.csv``: version 2, split ``time``, additional files ``node_year`` and
``edge_reltype``)::

    RELEASE_v2.txt
    raw/num-node-dict.csv.gz            a header of node types, one row of their counts
    raw/triplet-type-list.csv.gz        "src_type,relation,dst_type" per edge type, no header
    raw/relations/<src>___<rel>___<dst>/{edge.csv.gz ("u,v" per edge), num-edge-list.csv.gz, edge_reltype.csv.gz}
    raw/node-feat/paper/{node-feat.csv.gz, node_year.csv.gz}
    raw/nodetype-has-label.csv.gz       a header of node types, one row True/False
    raw/node-label/paper/node-label.csv.gz
    split/time/nodetype-has-split.csv.gz, split/time/paper/{train,valid,test}.csv.gz   per-type ids
"""

from __future__ import annotations

import gzip
from collections.abc import Sequence
from pathlib import Path

import numpy as np

NUM_NODES = {"author": 8, "field_of_study": 4, "institution": 3, "paper": 12}
EDGES = {   # per-type ids (src row 0, dst row 1)
    ("author", "affiliated_with", "institution"): np.array([[0, 1, 2, 3, 7], [0, 0, 1, 2, 2]]),
    ("author", "writes", "paper"): np.array([[0, 0, 1, 2, 3, 4, 5, 6, 7, 7], [0, 1, 2, 3, 4, 5, 6, 7, 8, 11]]),
    ("paper", "cites", "paper"): np.array([[1, 2, 3, 5, 9, 10], [0, 0, 1, 4, 8, 9]]),
    ("paper", "has_topic", "field_of_study"): np.array([[0, 1, 2, 3, 6, 11], [0, 0, 1, 2, 3, 3]]),
}
SPLIT = {"train": np.arange(0, 8), "valid": np.arange(8, 10), "test": np.arange(10, 12)}


def paper_features() -> np.ndarray:
    i = np.arange(NUM_NODES["paper"], dtype=np.float32)
    return np.stack([i, i / 2, -i], axis=1)   # exact in float32 and in decimal text


def paper_labels() -> np.ndarray:
    return np.arange(NUM_NODES["paper"]) % 5


def build(root: Path) -> Path:
    """Write the dataset as an already-downloaded ogb directory under ``root``; returns that directory."""
    d = root / "ogbn_mag"
    raw = d / "raw"
    raw.mkdir(parents=True)
    (d / "RELEASE_v2.txt").write_text("tiny test fixture\n")
    types = list(NUM_NODES)
    _write_csv(raw / "num-node-dict.csv.gz", [list(types), [NUM_NODES[t] for t in types]])
    _write_csv(raw / "triplet-type-list.csv.gz", [list(t) for t in EDGES])
    for triplet, edges in EDGES.items():
        rel = raw / "relations" / "___".join(triplet)
        rel.mkdir(parents=True)
        _write_csv(rel / "edge.csv.gz", edges.T.tolist())
        _write_csv(rel / "num-edge-list.csv.gz", [[edges.shape[1]]])
        _write_csv(rel / "edge_reltype.csv.gz", [[list(EDGES).index(triplet)]] * edges.shape[1])
    feat = raw / "node-feat" / "paper"
    feat.mkdir(parents=True)
    _write_csv(feat / "node-feat.csv.gz", [[f"{v:.1f}" for v in row] for row in paper_features()])
    _write_csv(feat / "node_year.csv.gz", [[2010 + i % 10] for i in range(NUM_NODES["paper"])])
    has: list[list[object]] = [list(types), [t == "paper" for t in types]]
    _write_csv(raw / "nodetype-has-label.csv.gz", has)
    (raw / "node-label" / "paper").mkdir(parents=True)
    _write_csv(raw / "node-label" / "paper" / "node-label.csv.gz", [[int(v)] for v in paper_labels()])
    split = d / "split" / "time"
    (split / "paper").mkdir(parents=True)
    _write_csv(split / "nodetype-has-split.csv.gz", has)
    for name, idx in SPLIT.items():
        _write_csv(split / "paper" / f"{name}.csv.gz", [[int(i)] for i in idx])
    return d


def _write_csv(path: Path, rows: Sequence[Sequence[object]]) -> None:
    with gzip.open(path, "wt") as f:
        f.writelines(",".join(str(v) for v in row) + "\n" for row in rows)
