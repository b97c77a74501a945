"""Edge splits for link prediction: the held-out edges are out of the message-passing graph in every direction that
could reach them, the splits partition the target type's edges, and the rest of the graph is untouched."""

from __future__ import annotations

import numpy as np
import pytest

from stages.download.edge_split import edge_entries, reverse_type, split_edges
from stages.download.synthetic import generate_synthetic
from stages.download.synthetic_hetero import generate_synthetic_hetero
from stages.partition import stage as partition
from storage import ArtifactStore
from storage.errors import InputError
from storage.graph import SPLITS, Graph, GraphArtifact, write_graph
from storage.partition import PartitionArtifact, concat_parts

FRACTIONS = (0.8, 0.1, 0.1)


def typed_edges(graph: Graph) -> set[tuple[int, int, int]]:
    out = set()
    for e in range(graph.schema.num_edge_types):
        _, src, dst = edge_entries(graph, e)
        out.update(zip(src.tolist(), dst.tolist(), [e] * src.shape[0]))
    return out


@pytest.fixture(scope="module")
def hetero() -> Graph:
    return generate_synthetic_hetero(num_nodes=3000, avg_degree=10.0, num_features=8, num_classes=4, seed=0)


def test_a_symmetrised_type_splits_undirected_pairs_and_drops_both_directions(hetero):
    cites = hetero.schema.edge_types.index(next(e for e in hetero.schema.edge_types if e.rel == "cites"))
    mp, splits = split_edges(hetero, cites, FRACTIONS, seed=3)
    before, after = typed_edges(hetero), typed_edges(mp)
    pairs = {(u, v) for u, v, e in before if e == cites and u < v}
    got = [set(zip(*splits[s].tolist())) for s in SPLITS]
    assert set().union(*got) == pairs and sum(map(len, got)) == len(pairs)   # a partition of the pairs
    assert abs(len(got[1]) - 0.1 * len(pairs)) <= 1 and abs(len(got[2]) - 0.1 * len(pairs)) <= 1
    held = got[1] | got[2]
    assert not any((u, v, cites) in after or (v, u, cites) in after for u, v in held)
    assert before - after == {(u, v, cites) for u, v in held} | {(v, u, cites) for u, v in held}
    assert all((u, v, cites) in after and (v, u, cites) in after for u, v in got[0])
    assert mp.indptr.shape == hetero.indptr.shape and mp.num_edges == hetero.num_edges - 2 * len(held)


def test_a_directed_type_takes_its_reverse_type_along(hetero):
    writes = hetero.schema.edge_types.index(next(e for e in hetero.schema.edge_types if e.rel == "writes"))
    rev = reverse_type(hetero, writes)
    assert rev is not None and hetero.schema.edge_types[rev].rel == "rev_writes"
    mp, splits = split_edges(hetero, writes, FRACTIONS, seed=3)
    before, after = typed_edges(hetero), typed_edges(mp)
    held = set(zip(*splits["valid"].tolist())) | set(zip(*splits["test"].tolist()))
    assert before - after == {(u, v, writes) for u, v in held} | {(v, u, rev) for u, v in held}
    assert sum(splits[s].shape[1] for s in SPLITS) == sum(1 for *_, e in before if e == writes)


def test_splits_are_deterministic_by_seed_and_homogeneous_graphs_split_alike():
    graph = generate_synthetic(num_nodes=2000, avg_degree=8.0, num_features=4, num_classes=3, seed=1)
    a, b = split_edges(graph, 0, FRACTIONS, seed=5)[1], split_edges(graph, 0, FRACTIONS, seed=5)[1]
    c = split_edges(graph, 0, FRACTIONS, seed=6)[1]
    assert all(np.array_equal(a[s], b[s]) for s in SPLITS) and not np.array_equal(a["test"], c["test"])
    mp = split_edges(graph, 0, FRACTIONS, seed=5)[0]
    rows = np.diff(mp.indptr)
    for v in range(0, 2000, 97):   # rows stay sorted by source
        nbrs = mp.indices[mp.indptr[v]:mp.indptr[v] + rows[v]]
        assert np.all(nbrs[1:] > nbrs[:-1])
    with pytest.raises(InputError, match=r"link_split=0.5,0.1,0.1: give train, valid, test fractions"):
        split_edges(graph, 0, (0.5, 0.1, 0.1), seed=0)


def test_edge_splits_round_trip_through_the_graph_artifact(hetero, tmp_path):
    writes = hetero.schema.edge_types.index(next(e for e in hetero.schema.edge_types if e.rel == "writes"))
    mp, splits = split_edges(hetero, writes, FRACTIONS, seed=3)
    store = ArtifactStore(tmp_path)
    manifest = store.build("download", 1, {"test": "edge splits"}, {},
                           lambda writer: writer.summary.update(write_graph(writer, mp)))
    back = GraphArtifact(store, manifest).read(features=False)
    assert back.link_edge_type == "author___writes___paper" and manifest.summary["edge_split_sizes"] == {
        s: int(splits[s].shape[1]) for s in SPLITS}
    assert all(np.array_equal(back.edge_splits[s], splits[s]) for s in SPLITS)
    assert np.array_equal(back.indices, mp.indices) and "edge_split_sizes" not in back.extra
    plain = store.build("download", 1, {"test": "no edge splits"}, {},
                        lambda writer: writer.summary.update(write_graph(writer, hetero)))
    assert GraphArtifact(store, plain).read(features=False).edge_splits == {}


def test_the_partition_keeps_each_split_edge_with_its_dst_owner(hetero, tmp_path):
    """Relabelled to gids, each split edge is in exactly one part, the one owning its dst, and the part's CSR (the
    message-passing graph) holds no valid or test edge."""
    writes = hetero.schema.edge_types.index(next(e for e in hetero.schema.edge_types if e.rel == "writes"))
    mp, splits = split_edges(hetero, writes, FRACTIONS, seed=3)
    store = ArtifactStore(tmp_path)
    graph = store.build("download", 1, {"test": "edge splits"}, {},
                        lambda writer: writer.summary.update(write_graph(writer, mp)))
    manifest = partition.run(store, partition.Params(num_partitions=2), {"download": graph}, progress=False)
    art = PartitionArtifact(store, manifest)
    book = art.book()
    assert manifest.summary["link_edge_type"] == "author___writes___paper"
    whole = concat_parts([art.csr(p) for p in range(2)])
    in_mp = set(zip(whole[1].tolist(), np.repeat(np.arange(whole[0].shape[0] - 1) // mp.schema.num_edge_types,
                                                 np.diff(whole[0])).tolist()))
    for name in SPLITS:
        parts = [art.edge_split(p, name) for p in range(2)]
        for p, pairs in enumerate(parts):
            assert np.all(book.owner(pairs[1]) == p) and np.all(np.diff(pairs[1]) >= 0)
        got = np.concatenate(parts, axis=1)
        orig = book.orig_of_gid[got]
        assert sorted(zip(*orig.tolist())) == sorted(zip(*splits[name].tolist()))
        held = {(int(u), int(v)) for u, v in zip(*got.tolist())}
        # train edges pass messages; no valid or test edge does
        assert held <= in_mp if name == "train" else not held & in_mp, name
    assert [sum(sizes.values()) for sizes in manifest.summary["edge_split_sizes"]] == [
        sum(art.edge_split(p, s).shape[1] for s in SPLITS) for p in range(2)]


def test_a_reverse_type_target_takes_its_forward_type_along(hetero):
    rev = hetero.schema.edge_types.index(next(e for e in hetero.schema.edge_types if e.rel == "rev_writes"))
    writes = reverse_type(hetero, rev)
    assert writes is not None and hetero.schema.edge_types[writes].rel == "writes"
    mp, splits = split_edges(hetero, rev, FRACTIONS, seed=3)
    held = set(zip(*splits["valid"].tolist())) | set(zip(*splits["test"].tolist()))
    assert typed_edges(hetero) - typed_edges(mp) == {(u, v, rev) for u, v in held} | {(v, u, writes) for u, v in held}
