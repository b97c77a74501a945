"""The typed graph model (storage/schema.py): names, keys, sorted type ids, and the range table's owner, type and
tlid of every gid against a brute-force table, empty (part, type) ranges included."""

from __future__ import annotations

import json

import numpy as np
import pytest

from storage.schema import EdgeType, GraphSchema, NodeType, RangeTable


def test_edge_type_keys_round_trip_and_reverse():
    writes = EdgeType("author", "writes", "paper")
    assert writes.key == "author___writes___paper"
    assert EdgeType.from_key(writes.key) == writes
    assert writes.reverse() == EdgeType("paper", "rev_writes", "author")
    for bad in ("a___b", "a___b___c___d"):
        with pytest.raises(ValueError, match="is not src"):
            EdgeType.from_key(bad)
    for name in ("", "a/b", "a___b", " a", "paper_", "_cites"):
        with pytest.raises(ValueError, match="name"):
            EdgeType(name, "r", "paper")


def test_schema_sorts_types_so_ids_do_not_depend_on_the_order_given():
    nodes = [NodeType("paper", 10, 8, 4), NodeType("author", 7), NodeType("field_of_study", 3)]
    edges = [EdgeType("paper", "cites", "paper"), EdgeType("author", "writes", "paper"),
             EdgeType("paper", "has_topic", "field_of_study")]
    a = GraphSchema(tuple(nodes), tuple(edges))
    b = GraphSchema(tuple(reversed(nodes)), tuple(reversed(edges)))
    assert a == b
    assert [t.name for t in a.node_types] == ["author", "field_of_study", "paper"]
    assert a.type_id("paper") == 2 and a.node_type("author").num_features is None
    assert [e.key for e in a.edge_types_into("paper")] == ["author___writes___paper", "paper___cites___paper"]
    assert [t.name for t in a.labelled] == ["paper"] and not a.is_homogeneous
    assert GraphSchema.from_dict(json.loads(json.dumps(a.to_dict()))) == a
    with pytest.raises(KeyError, match="no node type 'venue'"):
        a.type_id("venue")


def test_schema_refuses_unknown_and_repeated_types():
    with pytest.raises(ValueError, match="names a node type"):
        GraphSchema((NodeType("paper", 3),), (EdgeType("author", "writes", "paper"),))
    with pytest.raises(ValueError, match="distinct"):
        GraphSchema((NodeType("paper", 3), NodeType("paper", 4)), ())
    with pytest.raises(ValueError, match="non-negative"):
        NodeType("paper", 3, num_features=0)


def test_the_homogeneous_graph_is_the_one_type_case():
    schema = GraphSchema.homogeneous(100, 16, 5)
    assert schema.is_homogeneous and schema.edge_types_into("node") == (EdgeType("node", "edge", "node"),)
    table = RangeTable.from_counts(np.array([[40], [35], [25]]))
    np.testing.assert_array_equal(table.bounds, table.type_bounds)
    np.testing.assert_array_equal(table.bounds, [0, 40, 75, 100])
    owner, node_type = table.locate(np.arange(100))
    np.testing.assert_array_equal(owner, np.repeat([0, 1, 2], [40, 35, 25]))
    assert not node_type.any()


def test_range_table_owner_type_and_tlid_equal_a_brute_force_table():
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 6, (4, 3))
    counts[1, 2] = 0              # a part with no node of a type
    counts[:, 0] = 0              # a type with no node anywhere
    counts[2] = 0                 # a part with no node at all
    counts[3] = 0                 # ... and the last one too
    table = RangeTable.from_counts(counts)
    owner_of, type_of, tlid_of = [], [], []
    for p in range(4):
        for t in range(3):
            owner_of += [p] * counts[p, t]
            type_of += [t] * counts[p, t]
            tlid_of += list(range(counts[p, t]))
    gid = np.arange(int(counts.sum()))
    owner, node_type = table.locate(gid)
    np.testing.assert_array_equal(owner, owner_of)
    np.testing.assert_array_equal(node_type, type_of)
    np.testing.assert_array_equal(table.tlid(gid), tlid_of)
    np.testing.assert_array_equal(np.diff(table.bounds), counts.sum(axis=1))
    start, stop = table.ranges_of_type(2)
    np.testing.assert_array_equal(stop - start, counts[:, 2])
    for p in range(4):
        assert table.type_range(p, 2) == (start[p], stop[p])
    assert table.num_parts == 4
    for outside in (int(counts.sum()), -1):
        with pytest.raises(IndexError):
            table.locate([outside])
        with pytest.raises(IndexError):
            table.tlid([outside])
    with pytest.raises(ValueError, match="at least one node type"):
        RangeTable(np.array([0]), 0)
    with pytest.raises(ValueError, match="non-decreasing"):
        RangeTable(np.array([0, 3, 2]), 1)
