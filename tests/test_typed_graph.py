"""Typed graphs ([5/7]) through download, partition and features: every typed edge, feature row, label and split
survives exactly; the partition balances every node type; ``synthetic-hetero`` is MAG-like and its labels need the
typed neighbourhood.

ID spaces: per-type ids (``*_t``), the graph's orig ids (types numbered one after another), gids, tlids.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from stages.download import stage as download
from stages.download.canonical import Relation, typed_csr_incoming
from stages.download.synthetic_hetero import (
    CITES,
    HAS_TOPIC,
    MAG_NODES,
    WRITES,
    generate_synthetic_hetero,
    type_counts,
)
from stages.download.typed import TypedSource, build_graph
from stages.hotness import stage as hotness
from storage import ArtifactStore, InputError
from storage.features import FeaturesArtifact
from storage.graph import SPLITS, Graph, GraphArtifact
from storage.partition import PartitionArtifact
from storage.schema import EdgeType
from tests._train_pipeline import build_without_prefect


def typed_triples(g: Graph) -> set[tuple[int, int, int]]:
    """(dst orig, edge type id, src orig) of every stored edge."""
    r = g.schema.num_edge_types
    row = np.repeat(np.arange(g.indptr.shape[0] - 1), np.diff(g.indptr))
    return set(zip((row // r).tolist(), (row % r).tolist(), g.indices.tolist()))


def test_typed_csr_keeps_every_typed_edge_once() -> None:
    rng = np.random.default_rng(0)
    n = 40
    rels = [Relation(rng.integers(0, n, 300), rng.integers(0, n, 300), symmetrise=e == 1, name=f"r{e}")
            for e in range(3)]
    indptr, indices = typed_csr_incoming(rels, n)
    assert indptr.shape == (n * 3 + 1,)
    expect = set()
    for e, rel in enumerate(rels):
        pairs = list(zip(rel.src.tolist(), rel.dst.tolist()))
        if rel.symmetrise:
            pairs += [(d, s) for s, d in pairs]
        expect |= {(d, e, s) for s, d in pairs if s != d}
    row = np.repeat(np.arange(n * 3), np.diff(indptr))
    got = list(zip((row // 3).tolist(), (row % 3).tolist(), indices.tolist()))
    assert len(got) == len(set(got)) and set(got) == expect
    assert all(np.all(np.diff(indices[indptr[i]:indptr[i + 1]]) > 0) for i in range(n * 3)), "rows are sorted"


def _two_type_source() -> TypedSource:
    # a: 3 nodes (features, labels), b: 2 nodes (featureless); a -r-> b, a -s-> a
    r, s = EdgeType("a", "r", "b"), EdgeType("a", "s", "a")
    return TypedSource(num_nodes={"a": 3, "b": 2},
                       edges={r: (np.array([0, 2, 2]), np.array([0, 1, 1])), s: (np.array([0, 1]), np.array([1, 1]))},
                       features={"a": np.arange(6, dtype=np.float32).reshape(3, 2)},
                       labels={"a": (np.array([0, 1, 0]), 2)},
                       splits={"a": {"train": np.array([0, 1]), "valid": np.array([2]), "test": np.array([], int)}})


def test_add_reverse_as_pyg_to_undirected() -> None:
    g = build_graph(_two_type_source(), add_reverse=True)
    keys = [e.key for e in g.schema.edge_types]
    assert keys == ["a___r___b", "a___s___a", "b___rev_r___a"]
    # orig ids: a = 0..2, b = 3..4; the duplicate (2 -> 1 of r) and the self-loop (1 -> 1 of s) are gone
    assert typed_triples(g) == {(3, 0, 0), (4, 0, 2),            # a -r-> b
                                (1, 1, 0), (0, 1, 1),            # a -s-> a, symmetrised
                                (0, 2, 3), (2, 2, 4)}            # b -rev_r-> a
    assert g.y.tolist() == [0, 1, 0, -1, -1] and g.splits["valid"].tolist() == [2] and not g.directed
    assert g.schema.node_type("b").num_features is None and g.features["a"].shape == (3, 2)
    directed = build_graph(_two_type_source(), add_reverse=False)
    assert [e.key for e in directed.schema.edge_types] == ["a___r___b", "a___s___a"] and directed.directed
    assert typed_triples(directed) == {(3, 0, 0), (4, 0, 2), (1, 1, 0)}


def test_bad_typed_input_is_one_line_naming_the_type() -> None:
    src = _two_type_source()
    src.edges[EdgeType("a", "r", "b")] = (np.array([0]), np.array([2]))
    with pytest.raises(InputError, match=r"edge type a___r___b: target ids span \[2, 2\] but node type b has 2") as e:
        build_graph(src, add_reverse=True)
    assert "\n" not in str(e.value)
    src = _two_type_source()
    src.features["a"] = np.full((3, 2), np.nan, dtype=np.float32)
    with pytest.raises(InputError, match="node type a has NaN at row 0"):
        build_graph(src, add_reverse=True)


def _digest(g: Graph) -> str:
    h = hashlib.sha256()
    for a in (g.indptr, g.indices, g.y, g.features["paper"], *(g.splits[s] for s in SPLITS)):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def mag_like() -> Graph:
    return generate_synthetic_hetero(20_000, 20.0, 32, 8, 0)


def test_synthetic_hetero_is_mag_like(mag_like: Graph) -> None:
    g, counts = mag_like, type_counts(20_000, 8)
    assert {t.name: t.num_nodes for t in g.schema.node_types} == counts
    assert counts["author"] > counts["paper"] > counts["field_of_study"] > counts["institution"] > 0
    assert set(g.features) == {"paper"} and g.features["paper"].shape == (counts["paper"], 32)
    paper = g.schema.type_id("paper")
    offsets = g.schema.orig_offsets()
    is_paper = g.schema.node_type_of_orig() == paper
    assert np.all((g.y >= 0) == is_paper) and g.num_classes == 8
    assert all(np.all(is_paper[g.splits[s]]) for s in SPLITS)
    edges = g.edges_per_type()
    assert len(edges) == 7 and edges[WRITES.key] == edges[WRITES.reverse().key] > 0
    assert g.edges_per_type()[CITES.key] > 0 and not g.directed
    # power-law: the most cited paper has far more citations than the mean
    e = g.schema.edge_type_id(CITES)
    cites = np.diff(g.indptr)[e::7][offsets[paper]:offsets[paper + 1]]
    assert cites.max() > 10 * cites.mean()
    assert _digest(g) == _digest(generate_synthetic_hetero(20_000, 20.0, 32, 8, 0))
    assert _digest(g) != _digest(generate_synthetic_hetero(20_000, 20.0, 32, 8, 1))


def test_synthetic_hetero_has_exactly_num_nodes(tmp_path) -> None:
    """Each type's share was rounded on its own: num_nodes=5000 reported 5,001 nodes."""
    for n in (100, 1000, 3000, 5000, 12_345, 1_939_743):
        assert sum(type_counts(n, 4).values()) == n, n
    assert type_counts(1_939_743, 349) == MAG_NODES, "ogbn-mag's own counts at its size"
    assert type_counts(20_000, 8) == {"paper": 7593, "author": 11699, "institution": 90, "field_of_study": 618}
    params = download.Params(dataset="synthetic-hetero", num_nodes=5000, num_classes=4, num_features=4)
    assert params.key_params()["type_counts"] == type_counts(5000, 4), "builds under the old rule are not found"
    manifest = download.run(ArtifactStore(tmp_path), params, {}, progress=False)
    assert download.report(manifest).headline.startswith("synthetic-hetero: 5,000 nodes, ")


def test_synthetic_hetero_labels_need_the_typed_neighbourhood(mag_like: Graph) -> None:
    """A vote of each test paper's fields of study (each field labelled by the majority class of its train papers)
    beats the best classifier on paper features by a wide margin: the signal is in the typed neighbourhood."""
    g = mag_like
    paper, field = g.schema.type_id("paper"), g.schema.type_id("field_of_study")
    offsets, r = g.schema.orig_offsets(), g.schema.num_edge_types
    x, k = g.features["paper"], g.num_classes
    train, test = g.splits["train"] - offsets[paper], g.splits["test"] - offsets[paper]
    y = g.y[offsets[paper]:offsets[paper + 1]]
    centre = np.stack([x[train][y[train] == c].mean(axis=0) for c in range(k)])
    by_features = np.mean(np.argmin(((x[test, None, :] - centre) ** 2).sum(-1), axis=1) == y[test])
    # rev_has_topic rows of papers list their fields
    e = g.schema.edge_type_id(HAS_TOPIC.reverse())
    rows = np.arange(g.schema.num_nodes * r).reshape(-1, r)[offsets[paper]:offsets[paper + 1], e]
    lo, hi = g.indptr[rows], g.indptr[rows + 1]
    votes_of_field = np.zeros((g.schema.node_types[field].num_nodes, k))
    for p in train:
        np.add.at(votes_of_field, g.indices[lo[p]:hi[p]] - offsets[field], np.eye(k)[y[p]])
    field_class = votes_of_field.argmax(axis=1)
    vote = np.array([np.bincount(field_class[g.indices[lo[p]:hi[p]] - offsets[field]], minlength=k).argmax()
                     for p in test])
    by_fields = np.mean(vote == y[test])
    assert by_fields > by_features + 0.15, (by_fields, by_features)


@pytest.fixture(scope="module", params=["metis", "kaminpar", "random"])
def typed_build(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    # 400 nodes: 2 institutions for 3 parts, so a part owns no node of that type
    store, m = build_without_prefect({"artifacts": str(tmp_path_factory.mktemp("typed")),
                                      "dataset": "synthetic-hetero", "num_nodes": 400, "num_features": 6,
                                      "num_classes": 4, "num_partitions": 3, "method": request.param,
                                      "chunk_rows": 64, "until": "features"})
    return store, m


def test_typed_partition_keeps_every_typed_edge(typed_build) -> None:
    store, m = typed_build
    g = GraphArtifact(store, m["download"]).read()
    art = PartitionArtifact(store, m["partition"])
    book, r = art.book(), g.schema.num_edge_types
    got = set()
    for p in range(art.num_partitions):
        csr = art.csr(p)
        assert csr.num_edge_types == r and csr.indptr.shape == (csr.num_nodes * r + 1,)
        row = np.repeat(np.arange(csr.num_nodes * r), np.diff(csr.indptr))
        dst_orig = book.orig_of_gid[csr.start_gid + row // r]
        got |= set(zip(dst_orig.tolist(), (row % r).tolist(), book.orig_of_gid[csr.indices].tolist()))
    assert got == typed_triples(g) and sum(m["partition"].summary["edges"]) == g.num_edges
    in_degree = np.concatenate([np.diff(art.csr(p).node_indptr) for p in range(3)])
    assert np.array_equal(art.in_degree(), in_degree)


def test_typed_ranges_and_balance(typed_build) -> None:
    store, m = typed_build
    art = PartitionArtifact(store, m["partition"])
    book, schema = art.book(), art.schema
    table = art.range_table()
    gid = np.arange(book.num_nodes)
    owner, node_type = table.locate(gid)
    assert np.array_equal(node_type, schema.node_type_of_orig()[book.orig_of_gid])
    assert np.array_equal(owner, book.owner(gid)) and np.array_equal(table.bounds, book.bounds)
    typed = m["partition"].summary["typed"]
    for name, figures in typed["node_types"].items():
        counts = figures["nodes"]
        assert sum(counts) == schema.node_type(name).num_nodes
        mean = sum(counts) / 3   # the repair's tolerance, 1.03 (stages.partition.balance)
        assert max(counts) <= max(np.ceil(mean), np.floor(mean * 1.03)), (name, counts)
    assert typed["node_types"]["institution"]["nodes"].count(0) == 1   # a type a part lacks
    assert set(typed["edge_types"]) == {e.key for e in schema.edge_types}


def test_typed_features_follow_the_relabelling(typed_build) -> None:
    store, m = typed_build
    g = GraphArtifact(store, m["download"]).read()
    book = PartitionArtifact(store, m["partition"]).book()
    table, offsets = book.range_table(), g.schema.orig_offsets()
    feats = FeaturesArtifact(store, m["features"])
    paper = g.schema.type_id("paper")
    assert feats.featured_types == ("paper",) and feats.num_features_of("paper") == 6
    for p in range(book.num_partitions):
        part = feats.part(p)
        lo, hi = table.type_range(p, paper)
        assert np.array_equal(part.features["paper"], g.features["paper"][book.orig_of_gid[lo:hi] - offsets[paper]])
        assert np.array_equal(np.asarray(feats.x(p, "paper")[:]), part.features["paper"])
        assert np.array_equal(part.y, g.y[book.orig_of_gid[book.bounds[p]:book.bounds[p + 1]]])
        for name in SPLITS:
            got = book.orig_of_gid[part.split_lids[name] + part.start_gid]
            assert np.array_equal(np.sort(got), np.intersect1d(g.splits[name], book.orig_of_gid[
                book.bounds[p]:book.bounds[p + 1]]))


def test_typed_hotness_plans_featured_rows_in_one_byte_budget(typed_build) -> None:
    """Requests are counted for every type; the plan holds only featured (paper) rows, within the byte budget."""
    from storage.hotness import HotnessArtifact

    store, m = typed_build
    budget = 3000
    built = hotness.run(store, hotness.Params(fanouts=(5, 5), batch_size=64, cache_budget_bytes=budget),
                        {"partition": m["partition"], "features": m["features"]}, progress=False)
    plans, partition = HotnessArtifact(store, built), PartitionArtifact(store, m["partition"])
    row_bytes = FeaturesArtifact(store, m["features"]).row_bytes_of("paper")
    paper = partition.schema.type_id("paper")
    for p, row in enumerate(built.summary["parts"]):
        plan = plans.plan(p).plan_gid
        _, node_type = partition.range_table().locate(plan)
        assert plan.size == budget // row_bytes and (node_type == paper).all()
        assert row["plan_bytes"] == plan.size * row_bytes <= budget
        assert set(row["requests_by_type"]) == {"author", "field_of_study", "institution", "paper"}
        assert all(v > 0 for v in row["requests_by_type"].values())
        assert row["plan_rows_by_type"] == {"author": 0, "field_of_study": 0, "institution": 0, "paper": plan.size}


def test_typed_reports_name_every_type(typed_build) -> None:
    from stages.download import stage as download
    from stages.partition import stage as partition

    _, m = typed_build
    dl, pt = download.report(m["download"]), partition.report(m["partition"])
    assert "(4 node types, 7 edge types)" in dl.headline
    for text in (dl.markdown, pt.markdown):
        assert all(name in text for name in ("author", "field_of_study", "institution", "paper"))
        assert "paper___rev_writes___author" in text
    assert "Per edge type" in pt.markdown and "none (embeddings)" in dl.markdown


def test_an_endpoint_of_a_class_the_type_lacks_is_drawn_anywhere() -> None:
    from stages.download.synthetic_hetero import _Drawer

    # type "t" has nodes of classes 0 and 1 only; a request "in class 3" must fall back to any node, not to the
    # nearest class that exists
    drawer = _Drawer(np.random.default_rng(0), {"t": np.array([0, 0, 1])}, {"t": np.ones(3)}, num_classes=4)
    drawn = drawer.pick("t", np.full(300, 3), np.ones(300, dtype=bool))
    assert set(drawn.tolist()) == {0, 1, 2}
    in_class_1 = drawer.pick("t", np.full(50, 1), np.ones(50, dtype=bool))
    assert set(in_class_1.tolist()) == {2}
