"""Typed graphs under the download stage's memory budget: the external sort builds the typed CSR (one row per node
and edge type) the in-memory path builds, a streamed typed build (typed ``files``, ``synthetic-hetero``; task=link
included: the held-out split of one edge type, its reverse type taken along) writes the same bytes under the same
key, and a too-small budget or a full disk leaves nothing behind."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stages.download import stage as download
from stages.download.canonical import Relation, check_num_nodes, typed_csr_incoming
from stages.download.edge_split import split_edges
from stages.download.edge_split_stream import HELD_PAIR_BYTES, split_edges_streamed
from stages.download.streamed import choose
from stages.download.synthetic_hetero import _Drawer, generate_synthetic_hetero
from stages.external_sort import EdgeStream, array_chunks, count_rows, external_typed_csr
from stages.memory import MemoryBudget
from storage import ArtifactStore, InputError, Manifest
from storage.graph import index_dtype
from storage.write_errors import StoreWriteError
from tests._download_cases import HETERO, chunk_files, disk_full_after, leftovers, streaming_minimum

LINK = {"task": "link", "link_split": (0.8, 0.05, 0.15), "seed": 4}


def _typed_dir(d: Path, edges: int = 20_000, twin: bool = False) -> Path:
    """A typed files dataset: ``paper`` (float32 x, labels), featureless ``author``, ``venue`` (float64 x); a
    same-type relation with self-loops and duplicates, and cross-type ones with int32 and uint64 ids; ``twin``: a
    second relation between papers (``extends``) sharing half of ``cites``'s pairs, which a split of ``cites``
    must leave whole."""
    rng = np.random.default_rng(2)
    counts = {"paper": 3000, "author": 2000, "venue": 50}
    (d / "nodes" / "author").mkdir(parents=True)
    (d / "schema.json").write_text(json.dumps({"node_types": counts, "num_classes": {"paper": 3}}))
    paper, venue = d / "nodes" / "paper", d / "nodes" / "venue"
    paper.mkdir()
    venue.mkdir()
    np.save(paper / "x.npy", rng.standard_normal((counts["paper"], 5)).astype(np.float32))
    np.save(venue / "x.npy", rng.standard_normal((counts["venue"], 3)))
    y = rng.integers(0, 3, counts["paper"])
    y[:100] = -1
    np.save(paper / "y.npy", y)
    order = rng.permutation(np.arange(100, counts["paper"]))
    for name, part in zip(("train", "valid", "test"), np.split(order, [len(order) // 2, 3 * len(order) // 4])):
        np.save(paper / f"{name}_idx.npy", part)
    cites = rng.integers(0, counts["paper"], (2, edges))
    cites[0, :40] = cites[1, :40]            # self-loops
    cites[:, 40:80] = cites[:, 80:120]       # duplicates
    ends = {"author___writes___paper": (np.int32, counts["author"], counts["paper"], edges),
            "paper___published_in___venue": (np.uint64, counts["paper"], counts["venue"], edges // 4)}
    arrays = {key: np.stack([rng.integers(0, a, e), rng.integers(0, b, e)]).astype(dtype)
              for key, (dtype, a, b, e) in ends.items()} | {"paper___cites___paper": cites}
    if twin:
        arrays["paper___extends___paper"] = np.concatenate([cites[:, ::2], cites[::-1, 1::4]], axis=1)
    for key, edge_index in arrays.items():
        (d / "edges" / key).mkdir(parents=True)
        np.save(d / "edges" / key / "edge_index.npy", edge_index)
    return d


def _params(kind: str, tmp_path: Path) -> dict[str, Any]:
    """``files``, ``synthetic-hetero``, or ``files-link``: typed files with task=link on ``writes``."""
    if kind == "synthetic-hetero":
        return dict(HETERO)
    link = LINK | {"link_edge_type": "writes"} if kind == "files-link" else {}
    return {"dataset": "files", "path": str(_typed_dir(tmp_path / "data"))} | link


def test_the_typed_external_sort_matches_the_in_memory_typed_csr(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    base, n = {"a": 0, "b": 300, "c": 700}, 760
    size = {"a": 300, "b": 400, "c": 60}
    # (src type, dst type, symmetrise, id dtype): a symmetrised same-type relation, a directed one, two across types
    types = [("a", "a", True, np.int32), ("b", "b", False, np.int64), ("a", "b", False, np.uint64),
             ("b", "c", False, np.int16)]
    relations, streams = [], []
    for src_type, dst_type, symmetrise, dtype in types:
        src = rng.integers(0, size[src_type], 3000).astype(dtype)
        dst = rng.integers(0, size[dst_type], 3000).astype(dtype)
        if src_type == dst_type:
            src[:30] = dst[:30]   # self-loops
        src[30:60], dst[30:60] = src[60:90], dst[60:90]   # duplicates
        relations.append(Relation(src.astype(np.int64) + base[src_type], dst.astype(np.int64) + base[dst_type],
                                  symmetrise=symmetrise))
        streams.append(EdgeStream(array_chunks(src, dst, 777), symmetrise=symmetrise, src_base=base[src_type],
                                  dst_base=base[dst_type]))
    indptr, indices = typed_csr_incoming(relations, n)
    # the count pass bounds each row's keys (duplicates still in), which sizes the buckets to the budget
    counts = count_rows(streams, n)
    keys = sum(int(np.count_nonzero(r.src != r.dst)) * (2 if r.symmetrise else 1) for r in relations)
    assert (counts >= np.diff(indptr)).all() and counts.sum() == keys
    csr = external_typed_csr(streams, n, budget_bytes=40_000, scratch=str(tmp_path))
    assert csr.buckets > 1 and csr.indptr.shape == (n * len(types) + 1,)   # the budget really splits it
    assert np.array_equal(csr.indptr, indptr) and np.array_equal(np.asarray(csr.indices), indices)
    assert sorted(os.listdir(tmp_path)) == ["indices.raw"]


def test_typed_keys_refuse_a_node_count_that_would_overflow_int64() -> None:
    # keys (v * R + e) * N + u < N * N * R must stay below 2**63: N <= 3.04e9 / sqrt(R)
    check_num_nodes(1_147_000_000, 7)
    with pytest.raises(InputError, match=r"num_nodes=1148000000 is out of range.* <= 1147\d+ with 7 edge types"):
        check_num_nodes(1_148_000_000, 7)
    with pytest.raises(InputError, match="out of range"):   # before the O(N * R) row counts are allocated
        external_typed_csr([EdgeStream(array_chunks(np.zeros(0), np.zeros(0), 1))] * 7, 2_000_000_000,
                           budget_bytes=1, scratch="/nonexistent")


def test_a_relation_drawn_in_blocks_is_the_relation_drawn_whole() -> None:
    rng = np.random.default_rng(4)
    home = {"paper": rng.integers(0, 3, 500), "author": rng.integers(0, 3, 800)}
    weight = {t: rng.pareto(2.2, h.shape[0]) + 1.0 for t, h in home.items()}
    whole, blocked = (_Drawer(np.random.default_rng(9), home, weight, 3) for _ in range(2))
    (want,) = whole.relation("author", "paper", 6.0, 0.8, from_target=True)
    blocks = list(blocked.relation("author", "paper", 6.0, 0.8, from_target=True, block_edges=100))
    assert len(blocks) > 10
    for got, expected in zip((np.concatenate(ends) for ends in zip(*blocks)), want):
        assert np.array_equal(got, expected)
    # and the edge stream goes on to the next relation where it would have
    assert whole.rng.random() == blocked.rng.random()


@pytest.mark.parametrize("add_reverse", [True, False])
def test_the_streamed_split_of_every_edge_type_is_split_edges(tmp_path: Path, add_reverse: bool) -> None:
    graph = generate_synthetic_hetero(3000, 10.0, 4, 3, seed=1, add_reverse=add_reverse)
    for edge_type in range(graph.schema.num_edge_types):
        want, splits = split_edges(graph, edge_type, (0.7, 0.1, 0.2), seed=5)
        # as the external sort leaves it: indices in the index dtype (the spill's), indptr the split's to rewrite
        streamed = replace(graph, indptr=graph.indptr.copy(), indices=graph.indices.astype(index_dtype(3000)))
        got, info = split_edges_streamed(streamed, edge_type, (0.7, 0.1, 0.2), 5, budget_bytes=1,
                                         scratch=str(tmp_path))
        assert info["link_split_chunks"] > 1 and got.link_edge_type == want.link_edge_type
        assert np.array_equal(got.indptr, want.indptr) and np.array_equal(got.indices, want.indices)
        assert all(np.array_equal(got.edge_splits[s], splits[s]) for s in splits)
        del got, streamed
        for name in os.listdir(tmp_path):   # the spills the stage's scratch directory would take away
            os.remove(tmp_path / name)


def _streamed_equals_in_memory(tmp_path: Path, params: dict[str, Any]) -> Manifest:
    """Built in memory and streamed just above the streaming minimum (many buckets): the same key and bytes; returns
    the streamed build's manifest."""
    budget = streaming_minimum(params) + (256 << 10)
    built = {}
    for name, limit in (("memory", None), ("stream", budget)):
        store = ArtifactStore(tmp_path / name)
        built[name] = download.run(store, download.Params(**params, memory_budget_bytes=limit), {}, progress=False)
        assert not leftovers(tmp_path / name)
    memory, stream = built["memory"], built["stream"]
    assert memory.summary["canonical_path"] == "in-memory"
    assert stream.summary["canonical_path"] == "external sort" and stream.summary["sort_buckets"] > 1
    assert stream.summary["in_memory_estimate_bytes"] > budget and stream.summary["spill_bytes"] > 0
    assert stream.key == memory.key
    assert chunk_files(tmp_path / "memory") == chunk_files(tmp_path / "stream")
    return stream


@pytest.mark.parametrize("add_reverse", [True, False])
def test_streamed_typed_files_write_the_same_bytes_under_the_same_key(tmp_path: Path, add_reverse: bool) -> None:
    path = _typed_dir(tmp_path / "data")
    _streamed_equals_in_memory(tmp_path, {"dataset": "files", "path": str(path), "add_reverse": add_reverse})
    summary = next((tmp_path / "stream").glob("download/*/manifest.json")).read_text()
    edge_types = json.loads(summary)["summary"]["edges_per_type"]
    assert len(edge_types) == (5 if add_reverse else 3)   # rev_writes and rev_published_in with add_reverse


@pytest.mark.parametrize("add_reverse", [True, False])
def test_streamed_synthetic_hetero_writes_the_same_bytes_under_the_same_key(tmp_path: Path,
                                                                            add_reverse: bool) -> None:
    _streamed_equals_in_memory(tmp_path, HETERO | {"add_reverse": add_reverse})


# (target, add_reverse): a forward type whose reverse (rev_writes) must lose the held-out edges, a reverse type
# whose forward type must, the same without reverse types, a symmetrised same-type relation (held pairs u < v leave
# in both directions) and the same relation directed
@pytest.mark.parametrize(("target", "add_reverse"), [("writes", True), ("rev_writes", True), ("writes", False),
                                                     ("cites", True), ("cites", False)])
def test_a_streamed_typed_link_split_writes_the_same_bytes_under_the_same_key(tmp_path: Path, target: str,
                                                                               add_reverse: bool) -> None:
    data = _typed_dir(tmp_path / "data", twin=target == "cites")
    params = {"dataset": "files", "path": str(data), "add_reverse": add_reverse, "link_edge_type": target} | LINK
    stream = _streamed_equals_in_memory(tmp_path, params)
    _check_link_summary(stream.summary, target, add_reverse)


@pytest.mark.parametrize("target", ["writes", "cites"])
def test_a_streamed_synthetic_hetero_link_split_writes_the_same_bytes_under_the_same_key(tmp_path: Path,
                                                                                         target: str) -> None:
    stream = _streamed_equals_in_memory(tmp_path, HETERO | LINK | {"link_edge_type": target})
    _check_link_summary(stream.summary, target, True)


def _check_link_summary(summary: dict[str, Any], target: str, add_reverse: bool) -> None:
    """The split streamed in more than one row chunk, held edges out; a forward type and its reverse (when the
    graph has one) both keep exactly the train pairs."""
    assert summary["link_split_chunks"] > 1 and summary["link_spill_bytes"] > 0
    sizes, edges = summary["edge_split_sizes"], summary["edges_per_type"]
    assert sizes["valid"] > 0 and sizes["test"] > 0
    key = summary["link_edge_type"]
    assert key.split("___")[1] == target
    if target.endswith("writes"):
        assert edges[key] == sizes["train"]
        assert edges.get("paper___rev_writes___author", sizes["train"]) == sizes["train"]
        assert edges.get("author___writes___paper") == sizes["train"]
    else:   # cites: a symmetrised type keeps each train pair in both directions
        assert edges[key] == sizes["train"] * (2 if add_reverse else 1)


def test_the_typed_link_minimum_holds_the_target_types_held_out_pairs(tmp_path: Path) -> None:
    path = str(_typed_dir(tmp_path / "data"))
    node, link = ({"dataset": "files", "path": path} | extra for extra in ({}, LINK | {"link_edge_type": "writes"}))
    # writes lists 20 000 edges, of which valid + test hold out at most 20 %
    assert streaming_minimum(link) - streaming_minimum(node) >= 0.2 * 20_000 * HELD_PAIR_BYTES
    # a reverse type's pairs are its forward type's: the same minimum
    assert streaming_minimum(link | {"link_edge_type": "rev_writes"}) == streaming_minimum(link)
    with pytest.raises(InputError, match=r"held-out valid/test edges.* raise memory_budget_bytes to"):
        choose(download.Params(**link), MemoryBudget(streaming_minimum(link) - 1, "download", "memory_budget_bytes"))


def test_a_wrong_typed_link_edge_type_fails_before_the_sort(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spilled = disk_full_after(1 << 30, monkeypatch)   # records every spill, fails none
    params = download.Params(dataset="files", path=str(_typed_dir(tmp_path / "data")), link_edge_type="likes",
                             memory_budget_bytes=2 << 20, **LINK)
    with pytest.raises(InputError, match=r"link_edge_type names 'likes'") as err:
        download.run(ArtifactStore(tmp_path / "root"), params, {}, progress=False)
    assert "\n" not in str(err.value) and spilled == [] and not (tmp_path / "root" / "download").exists()


@pytest.mark.parametrize("kind", ["files", "synthetic-hetero", "files-link"])
def test_a_budget_below_the_typed_minimum_is_one_line_and_writes_nothing(tmp_path: Path, kind: str) -> None:
    params = _params(kind, tmp_path)
    minimum = streaming_minimum(params)
    with pytest.raises(InputError) as err:
        download.run(ArtifactStore(tmp_path / "root"), download.Params(**params, memory_budget_bytes=minimum - 1),
                     {}, progress=False)
    msg = str(err.value)
    assert "\n" not in msg and "at least" in msg and f"raise memory_budget_bytes to {minimum} or more" in msg
    assert not (tmp_path / "root" / "download").exists()
    # the minimum holds the typed rows: 24 B for each of a node's R - 1 rows beyond its first (R = 5 and 7 here)
    assert minimum > 24 * 4 * (HETERO["num_nodes"] if kind == "synthetic-hetero" else 5050)


@pytest.mark.parametrize("kind", ["files", "synthetic-hetero"])
def test_a_full_disk_during_a_typed_spill_leaves_nothing_half_written(tmp_path: Path, kind: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    params = _params(kind, tmp_path)
    budget = streaming_minimum(params) + (256 << 10)
    calls = disk_full_after(3, monkeypatch)
    root = tmp_path / "root"
    with pytest.raises(StoreWriteError, match=r"^download stage: cannot write to .*No space left on device"):
        download.run(ArtifactStore(root), download.Params(**params, memory_budget_bytes=budget), {}, progress=False)
    assert len(calls) == 4 and not leftovers(root) and not (root / "download").exists()


def test_a_full_disk_during_a_typed_link_split_leaves_nothing_half_written(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    params = _params("files-link", tmp_path)
    budget = streaming_minimum(params) + (256 << 10)
    calls = disk_full_after(3, monkeypatch, "link-")   # the split's spills only: the sort before it completes
    root = tmp_path / "root"
    with pytest.raises(StoreWriteError, match=r"^download stage: cannot write to .*No space left on device"):
        download.run(ArtifactStore(root), download.Params(**params, memory_budget_bytes=budget), {}, progress=False)
    assert len(calls) == 4 and not leftovers(root) and not (root / "download").exists()
