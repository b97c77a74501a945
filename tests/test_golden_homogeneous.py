"""A homogeneous graph is the one-type case of the typed code ([5/7]): its artifacts' contents must not move.

The digests below were recorded on the code before typed graphs (commit dd701db) and are of the *contents* read
through the storage handles (arrays by id space), not of file layouts, so a new layout that keeps every value
passes and any changed node order, edge, feature row, split or cache plan fails. (The cache plans' digest is from
hotness VERSION 3, whose draws follow the stage's seed: this test found that they did not.) Update them only for a
change that is meant to alter homogeneous results, and say so in the commit.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from storage.features import FeaturesArtifact
from storage.graph import SPLITS, GraphArtifact
from storage.hotness import HotnessArtifact
from storage.partition import PartitionArtifact
from tests._train_pipeline import build_without_prefect

GOLDEN = {
    "graph": "bd14d3efec10c5af",
    "book": "9bc7080fcf609553",
    "parts": "ba9815e487631312",
    "features": "09c3443d335b9573",
    "hotness": "58633dbf7f1c7430",
}


def _digest(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape};".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


@pytest.fixture(scope="module")
def contents(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    store, m = build_without_prefect({"artifacts": str(tmp_path_factory.mktemp("golden")), "num_nodes": 1200,
                                      "avg_degree": 6, "num_features": 5, "num_classes": 3, "seed": 7,
                                      "num_partitions": 3, "chunk_rows": 100, "fanouts": (4, 3), "batch_size": 32,
                                      "cache_ratio": 0.3, "until": "hotness"})
    g = GraphArtifact(store, m["download"]).read()
    assert g.x is not None
    part = PartitionArtifact(store, m["partition"])
    book = part.book()
    feats = FeaturesArtifact(store, m["features"])
    hot = HotnessArtifact(store, m["hotness"])
    parts, stores, plans = [], [], []
    for p in range(book.num_partitions):
        csr = part.csr(p)
        parts += [csr.indptr, csr.indices]
        f = feats.part(p)
        stores += [f.x, f.y, *(f.split_lids[s] for s in SPLITS)]
        plan = hot.plan(p)
        plans += [plan.plan_gid, plan.ranked_gid, plan.ranked_count]
    return {
        "graph": _digest(g.indptr, g.indices, g.x, g.y, *(g.splits[s] for s in SPLITS)),
        "book": _digest(book.bounds, book.orig_of_gid, book.gid_of_orig),
        "parts": _digest(*parts),
        "features": _digest(*stores),
        "hotness": _digest(*plans),
    }


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_homogeneous_contents_unchanged(contents: dict[str, str], name: str) -> None:
    assert contents[name] == GOLDEN[name], f"the homogeneous {name} changed"
