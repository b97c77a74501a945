"""What the infer stage's tests share: an end-to-end case (the stages up to train on a small graph, then the infer
stage, and the single-process full-graph reference) and its check against that reference; a small random graph and
layer-wise inference of it in one process (no torchrun). Used by tests/test_infer.py, tests/test_infer_layerwise.py
and the CUDA tests of tests/test_gpu_infer.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from stages.infer import stage as infer
from stages.infer.layerwise import Inference
from stages.infer.params import Params
from stages.runtime.csr import LocalCSR
from stages.runtime.dist_features import DistFeatures
from stages.runtime.feature_store import InMemoryFeatureStore
from stages.train.models.model import needs_degrees
from stages.train.rank.rank_data import degree_path
from storage import ArtifactStore, Manifest
from storage.graph import SPLITS
from storage.infer_artifact import InferArtifact
from tests._infer_pipeline import Reference, build_to_train, full_graph_reference

ATOL = 1e-5   # float reassociation: chunked CSR sums and GEMMs against PyG's scatter on the whole graph


@dataclass
class Case:
    store: ArtifactStore
    manifests: dict[str, Manifest]
    manifest: Manifest
    reference: Reference
    lines: list[str]

    @property
    def artifact(self) -> InferArtifact:
        return InferArtifact(self.store, self.manifest)


def run_case(root: str, num_partitions: int, infer_params: dict[str, Any], **train: Any) -> Case:
    store, manifests = build_to_train(root, num_partitions, **train)
    lines: list[str] = []
    params = Params(threads_per_rank=1, timeout_s=300.0, peer_timeout_s=60.0, **infer_params)
    manifest = infer.run(store, params, {u: manifests[u] for u in infer.UPSTREAM}, log=lines.append)
    return Case(store, manifests, manifest, full_graph_reference(store, manifests), lines)


def check_against_reference(case: Case, layers: list[int]) -> None:
    art, ref = case.artifact, case.reference
    n = ref.y.shape[0]
    table = art.predictions()
    orig_id = table["orig_id"].to_numpy()
    np.testing.assert_array_equal(orig_id, np.arange(n))   # every orig id once, in order
    prob = np.stack([table[f"prob_{c}"].to_numpy() for c in range(art.num_classes)], axis=1)
    np.testing.assert_allclose(prob, ref.prob, rtol=0, atol=ATOL)
    pred = table["pred"].to_numpy()
    top2 = np.sort(ref.logits, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1e-4   # a near-tie may flip under reassociation
    assert clear.mean() > 0.99
    np.testing.assert_array_equal(pred[clear], ref.logits.argmax(1)[clear])
    np.testing.assert_array_equal(table["label"].to_numpy(), ref.y)
    split = table["split"].to_pylist()
    for name in SPLITS:
        assert sorted(np.flatnonzero([s == name for s in split]).tolist()) == sorted(ref.splits[name].tolist())
    assert split.count(None) == n - sum(len(ref.splits[s]) for s in SPLITS)

    np.testing.assert_array_equal(np.asarray(art.node_array("pred")[:]), pred)
    np.testing.assert_allclose(np.asarray(art.node_array("prob")[:]), prob, atol=0)
    np.testing.assert_array_equal(np.asarray(art.node_array("label")[:]), ref.y)
    assert art.embedding_layers == layers
    for layer in layers:
        np.testing.assert_allclose(np.asarray(art.embeddings(layer)[:]), ref.hidden[layer], rtol=1e-5, atol=ATOL)

    # the parts: rows by lid, with their orig ids; together every node once
    parts = list(art.parts())
    assert len(parts) == art.num_partitions
    all_orig = np.concatenate([p.orig_id for p in parts if p.orig_id is not None])
    np.testing.assert_array_equal(np.sort(all_orig), np.arange(n))
    for p in parts:
        assert p.orig_id is not None
        np.testing.assert_array_equal(p.pred, pred[p.orig_id])
        for layer in layers:
            np.testing.assert_allclose(p.embeddings[layer], ref.hidden[layer][p.orig_id], rtol=1e-5, atol=ATOL)

    s = case.manifest.summary
    for name in SPLITS:
        ids = ref.splits[name]
        assert s["correct"][name] == int((pred[ids] == ref.y[ids]).sum()) and s["total"][name] == len(ids)
    assert s["num_nodes"] == n and sum(s["pred_count"]) == n
    assert s["pred_count"] == np.bincount(pred, minlength=art.num_classes).tolist()


def random_graph(n: int = 400, edges: int = 2500, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A symmetric graph without self loops or duplicates: ``(indptr, indices, edge_index)``, incoming CSR."""
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, edges), rng.integers(0, n, edges)
    keep = src != dst
    e = np.unique(np.stack([np.r_[src[keep], dst[keep]], np.r_[dst[keep], src[keep]]]), axis=1)
    e = e[:, np.lexsort((e[0], e[1]))]
    return np.r_[0, np.cumsum(np.bincount(e[1], minlength=n))], e[0], e


def run_one_process(model: torch.nn.Module, num_layers: int, x: torch.Tensor, indptr: np.ndarray,
                    indices: np.ndarray, **kwargs: Any) -> tuple[torch.Tensor, dict[int, torch.Tensor], Inference]:
    n = x.shape[0]
    csr = LocalCSR.from_numpy(indptr, indices)
    deg = degree_path(csr, np.array([0, n]), torch.device("cpu")) if needs_degrees(model) else None
    engine = Inference(model, num_layers, csr, np.array([0, n]), deg, **kwargs)
    hidden: dict[int, torch.Tensor] = {}
    with torch.inference_mode():
        out = engine.run(lambda: DistFeatures(InMemoryFeatureStore(x), [0, n]), list(range(num_layers - 1)),
                         lambda layer, rows: hidden.__setitem__(layer, rows.clone()))
    return out, hidden, engine
