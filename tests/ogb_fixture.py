"""Tiny OGB node-property datasets laid out exactly as ``ogb`` 1.3.6 expects them on disk.

There is no network in tests, so these stand in for the real downloads; the real ``ogb`` code still parses them
(``ogb.io.read_graph_raw``) and, for :func:`build_zip`, downloads and extracts them from a local HTTP server.

Layout (from ``ogb/nodeproppred/dataset.py`` and ``master.csv``), for ``ogbn-arxiv`` under ``root``::

    <root>/ogbn_arxiv/RELEASE_v1.txt            version marker; without it ogb asks on stdin whether to update
    <root>/ogbn_arxiv/raw/edge.csv.gz           "u,v" per line, no header (arxiv: u cites v)
    <root>/ogbn_arxiv/raw/num-node-list.csv.gz  one line per graph: its node count
    <root>/ogbn_arxiv/raw/num-edge-list.csv.gz  one line per graph: its edge count
    <root>/ogbn_arxiv/raw/node-feat.csv.gz      F comma-separated floats per node
    <root>/ogbn_arxiv/raw/node-label.csv.gz     one label per node
    <root>/ogbn_arxiv/raw/edge-feat.csv.gz      optional (``edge_feat=True``): D floats per edge, as edge.csv lists
                                                them (ogbn-proteins has 8; ogb copies them to the inverse edges)
    <root>/ogbn_arxiv/raw/node_year.csv.gz      'additional node files' in master.csv (arxiv, papers100M)
    <root>/ogbn_arxiv/split/time/{train,valid,test}.csv.gz   node ids; the split kind comes from master.csv

``ogbn-products`` is the same without node_year and with ``split/sales_ranking``; ogb adds the inverse of every
edge (``add_inverse_edge``). ``ogbn-papers100M`` is "binary": ``raw/data.npz`` (edge_index, num_nodes_list,
num_edges_list, node_feat, node_year) and ``raw/node-label.npz`` (node_label, float with NaN = unlabelled).
The download zip (``<download_name>.zip``, e.g. ``arxiv.zip``) holds one folder ``<download_name>/`` with the
same content, which ogb renames to ``ogbn_arxiv`` after extracting.
"""

from __future__ import annotations

import gzip
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

NUM_NODES = 30
# A citation chain i -> i-1 plus: 5 -> 0, 7 -> 0, 3 -> 10, a duplicate 2 -> 1 and a self-loop 6 -> 6.
EDGES = np.array([[*range(1, NUM_NODES), 5, 7, 3, 2, 6],
                  [*range(NUM_NODES - 1), 0, 0, 10, 1, 6]], dtype=np.int64)
SPLIT = {"train": np.arange(0, 20), "valid": np.arange(20, 25), "test": np.arange(25, 30)}
SPLIT_KIND = {"ogbn-arxiv": "time", "ogbn-products": "sales_ranking", "ogbn-papers100M": "time"}
DOWNLOAD_NAME = {"ogbn-arxiv": "arxiv", "ogbn-products": "products", "ogbn-papers100M": "papers100M-bin"}


@dataclass
class OgbFixture:
    name: str
    root: Path          # what load_ogb gets as root
    edges: np.ndarray   # [2, E] as written to disk
    x: np.ndarray       # [N, F] float32
    y: np.ndarray       # int64 [N], -1 where OGB has no label
    split: dict[str, np.ndarray]


def features() -> np.ndarray:
    i = np.arange(NUM_NODES, dtype=np.float32)
    return np.stack([i, i / 2, -i], axis=1)  # exact in float32 and in decimal text


def labels(name: str) -> np.ndarray:
    y = np.arange(NUM_NODES) % 7
    if name == "ogbn-papers100M":
        y[[3, 28]] = -1  # papers100M labels only a small subset of nodes (NaN on disk)
    return y


def edge_features() -> np.ndarray:
    """[E, 2] float32 per edge of ``EDGES``: (i, -i / 2) for edge i, exact in float32 and in decimal text."""
    i = np.arange(EDGES.shape[1], dtype=np.float32)
    return np.stack([i, -i / 2], axis=1)


def build(name: str, root: Path, edge_feat: bool = False) -> OgbFixture:
    """Write dataset ``name`` as an already-downloaded ogb directory under ``root`` (``edge_feat``: with
    ``edge_features()``; CSV datasets only)."""
    _write_dataset(name, root / name.replace("-", "_"))
    if edge_feat:
        _write_csv(root / name.replace("-", "_") / "raw" / "edge-feat.csv.gz",
                   [[f"{v:.1f}" for v in row] for row in edge_features()])
    return OgbFixture(name, root, EDGES, features(), labels(name), SPLIT)


def build_zip(name: str, serve_dir: Path) -> Path:
    """Write the download archive ogb would fetch (``<serve_dir>/<download_name>.zip``); returns its path."""
    stage = serve_dir / "stage"
    folder = stage / DOWNLOAD_NAME[name]
    _write_dataset(name, folder)
    archive = serve_dir / f"{DOWNLOAD_NAME[name]}.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in sorted(folder.rglob("*")):
            zf.write(path, path.relative_to(stage))
    shutil.rmtree(stage)
    return archive


def _write_dataset(name: str, d: Path) -> None:
    (d / "raw").mkdir(parents=True)
    (d / "RELEASE_v1.txt").write_text("tiny test fixture\n")
    if name == "ogbn-papers100M":
        _write_binary_raw(d / "raw")
    else:
        _write_csv_raw(name, d / "raw")
    split_dir = d / "split" / SPLIT_KIND[name]
    split_dir.mkdir(parents=True)
    for part, idx in SPLIT.items():
        _write_csv(split_dir / f"{part}.csv.gz", [[int(i)] for i in idx])


def _write_csv_raw(name: str, raw: Path) -> None:
    _write_csv(raw / "edge.csv.gz", EDGES.T.tolist())
    _write_csv(raw / "num-node-list.csv.gz", [[NUM_NODES]])
    _write_csv(raw / "num-edge-list.csv.gz", [[EDGES.shape[1]]])
    _write_csv(raw / "node-feat.csv.gz", [[f"{v:.1f}" for v in row] for row in features()])
    _write_csv(raw / "node-label.csv.gz", [[int(v)] for v in labels(name)])
    if name == "ogbn-arxiv":
        _write_csv(raw / "node_year.csv.gz", [[2000 + i % 20] for i in range(NUM_NODES)])


def _write_binary_raw(raw: Path) -> None:
    np.savez(raw / "data.npz", edge_index=EDGES, num_nodes_list=np.array([NUM_NODES]),
             num_edges_list=np.array([EDGES.shape[1]]), node_feat=features(),
             node_year=(2000 + np.arange(NUM_NODES) % 20).reshape(-1, 1))
    y = labels("ogbn-papers100M").astype(np.float64)
    y[y < 0] = np.nan
    np.savez(raw / "node-label.npz", node_label=y.reshape(-1, 1))


def _write_csv(path: Path, rows: list[list[object]]) -> None:
    with gzip.open(path, "wt") as f:
        f.writelines(",".join(str(v) for v in row) + "\n" for row in rows)
