"""Inference on a typed graph: exact distributed inference of a trained typed model equals the model's forward pass
on the whole graph (same weights, the learnt embeddings of ``model.pt``, float reassociation apart), on the
relational bodies' layer matrices and on a homogeneous body's per-chunk gather; exports name every node's type;
and the typed chunk edges, exact and sampled, in one process."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from stages.infer import stage as infer
from stages.infer.chunks import SAMPLE_BLOCK, chunk_edges_of
from stages.infer.params import Params
from stages.runtime.csr import LocalCSR
from stages.runtime.typed_rows import TypeIndex
from stages.train.rank.typed_data import embeddings_in_dataset_order
from storage import ArtifactStore, Manifest
from storage.infer_artifact import InferArtifact
from storage.partition import PartitionArtifact
from storage.train import EMBEDDING_PREFIX
from tests._infer_pipeline import Reference, build_to_train, typed_full_graph_reference

ATOL = 1e-5
GRAPH: dict[str, Any] = {"dataset": "synthetic-hetero", "num_nodes": 3000, "avg_degree": 10.0, "num_features": 16,
                         "num_classes": 4, "seed": 1, "split": (0.3, 0.1, 0.6)}


def _case(root: str, model: str, chunk_edges: int) -> tuple[ArtifactStore, dict[str, Manifest], Manifest]:
    store, manifests = build_to_train(root, 2, model=model, graph=GRAPH)
    params = Params(threads_per_rank=1, timeout_s=300.0, peer_timeout_s=60.0, chunk_edges=chunk_edges)
    return store, manifests, infer.run(store, params, {u: manifests[u] for u in infer.UPSTREAM}, log=lambda _: None)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One artifact root for every model: the data stages are built once, each model trains and infers on them."""
    return str(tmp_path_factory.mktemp("typed-infer"))


@pytest.mark.slow
@pytest.mark.parametrize("model, path", [("rgcn", "layer matrices and halo"), ("rgat", "per-chunk gather"),
                                         ("hgt", "per-chunk gather"), ("gat", "per-chunk gather"),
                                         ("examples.hetero_model:build", "whole model per chunk")])
def test_typed_inference_equals_the_whole_graph_forward(root: str, model: str, path: str):
    store, manifests, manifest = _case(root, model, chunk_edges=4000)
    ref: Reference = typed_full_graph_reference(store, manifests)
    art = InferArtifact(store, manifest)
    s = manifest.summary
    assert path in s["path"] and all(r["chunks"] > 1 for r in s["ranks"])
    table = art.predictions()
    n = ref.y.shape[0]
    np.testing.assert_array_equal(table["orig_id"].to_numpy(), np.arange(n))
    prob = np.stack([table[f"prob_{c}"].to_numpy() for c in range(art.num_classes)], axis=1)
    np.testing.assert_allclose(prob, ref.prob, rtol=0, atol=ATOL)
    np.testing.assert_array_equal(table["label"].to_numpy(), ref.y)
    for layer, rows in ref.hidden.items():
        np.testing.assert_allclose(np.asarray(art.embeddings(layer)[:]), rows, rtol=1e-5, atol=ATOL)

    # every node's type and its id within the type, in the Parquet table and in nodes.zarr
    types = {t["node_type"]: t for t in s["node_types"]}
    assert set(types) == {"author", "field_of_study", "institution", "paper"} and types["paper"]["labelled"]
    names = table["node_type"].to_pylist()
    type_ids = table["type_orig_id"].to_numpy()
    start = 0
    for t in ("author", "field_of_study", "institution", "paper"):   # orig ids number the types one after another
        count = types[t]["nodes"]
        assert names[start:start + count] == [t] * count
        np.testing.assert_array_equal(type_ids[start:start + count], np.arange(count))
        start += count
    codes = np.asarray(art.node_array("node_type")[:])
    type_names: Any = art.nodes().attrs["node_types"]
    assert [type_names[c] for c in codes[[0, n - 1]]] == ["author", "paper"]
    # the classes counted are the labelled type's predictions
    assert sum(s["pred_count"]) == types["paper"]["nodes"]
    check_embedding_order(PartitionArtifact(store, manifests["partition"]))


def check_embedding_order(partition: PartitionArtifact) -> None:
    """model.pt's tables are in the dataset's order of each type: row i of author's is author i, whatever tgid
    (part by part numbering) the ranks kept it under; checked against the book's other direction (gid_of_orig)."""
    book, schema = partition.book(), partition.schema
    index = TypeIndex(partition.range_table())
    for t, node_type in enumerate(schema.node_types):
        tgid_rows = torch.arange(node_type.num_nodes, dtype=torch.float32)[:, None]   # row j holds j: its tgid
        key = f"{EMBEDDING_PREFIX}{node_type.name}"
        published = embeddings_in_dataset_order({key: tgid_rows, "w": torch.ones(1)}, partition)
        gid = torch.from_numpy(book.gid_of_orig[schema.orig_offsets()[t]:schema.orig_offsets()[t + 1]])
        located_type, tgid = index.locate(gid)
        assert bool((located_type == t).all())
        assert torch.equal(published[key][:, 0].long(), tgid) and torch.equal(published["w"], torch.ones(1))


def _typed_csr(n: int, num_types: int, edges: int, seed: int = 0) -> LocalCSR:
    rng = np.random.default_rng(seed)
    dst, etype, src = rng.integers(0, n, edges), rng.integers(0, num_types, edges), rng.integers(0, n, edges)
    row = dst * num_types + etype
    order = np.lexsort((src, row))
    indptr = np.concatenate([[0], np.cumsum(np.bincount(row, minlength=n * num_types))])
    return LocalCSR.from_numpy(indptr, src[order], num_edge_types=num_types)


def test_typed_chunk_edges_keep_every_typed_edge_and_sample_per_edge_type():
    csr = _typed_csr(2 * SAMPLE_BLOCK + 100, 3, 40000)
    n, r = csr.num_nodes, csr.num_edge_types
    row_pos, nbr_gid, edge_type = chunk_edges_of(csr, 0, n, -1)
    assert edge_type is not None
    got = sorted(zip((row_pos * r + edge_type).tolist(), nbr_gid.tolist()))
    rows = np.repeat(np.arange(n * r), np.diff(csr.indptr.numpy()))
    assert got == sorted(zip(rows.tolist(), csr.indices.tolist()))   # every (target, type, source) once
    assert bool((row_pos[1:] >= row_pos[:-1]).all())                  # grouped by target

    def gen(block: int) -> torch.Generator:
        return torch.Generator().manual_seed(block)
    row_pos, nbr_gid, edge_type = chunk_edges_of(csr, 0, n, 2, gen)
    assert edge_type is not None
    per_row = torch.bincount(row_pos * r + edge_type, minlength=n * r)
    assert torch.equal(per_row, torch.diff(csr.indptr).clamp(max=2))  # up to 2 of each edge type
    # the draws are per sampling block: a chunk of the second block alone gets the same edges
    a, b = SAMPLE_BLOCK, 2 * SAMPLE_BLOCK
    sub = chunk_edges_of(csr, a, b, 2, gen)
    inside = (row_pos >= a) & (row_pos < b)
    assert torch.equal(sub[0] + a, row_pos[inside]) and torch.equal(sub[1], nbr_gid[inside])
    empty = chunk_edges_of(csr, n, n, 2, gen)
    assert empty[0].numel() == 0 and empty[2] is not None and empty[2].numel() == 0
