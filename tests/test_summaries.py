"""``storage.summaries``: each stage's summary as a typed record (round trip, older JSON, extra keys kept)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from storage.summaries import (
    DownloadSummary,
    FeaturesSummary,
    HotnessSummary,
    InferSummary,
    PartitionSummary,
    SummaryRecord,
)

# a summary of each stage as built today (trimmed), and the keys builds before a later feature lack
STORED: dict[type[SummaryRecord], tuple[dict[str, Any], tuple[str, ...]]] = {
    DownloadSummary: ({"name": "toy", "source": "synthetic", "num_nodes": 10, "num_edges": 30, "avg_degree": 3.0,
                       "num_features": 4, "num_classes": 2, "directed": False, "schema": {"node_types": []},
                       "split_sizes": {"train": 6, "valid": 2, "test": 2}, "edges_per_type": {}, "wall_s": 0.5,
                       "peak_rss_bytes": 2**20, "num_edge_features": 3, "canonical_path": "in-memory"},
                      ("num_edge_features",)),
    PartitionSummary: ({"method": "metis", "num_partitions": 2, "nodes": [5, 5], "edges": [15, 15],
                        "train_nodes": [3, 3], "bounds": [0, 5, 10], "edge_cut": 4, "edge_cut_fraction": 0.13,
                        "imbalance": {"nodes": 1.0}, "schema": {}, "link_edge_type": "a__to__a",
                        "edge_split_sizes": [{"train": 3}, {"train": 2}], "wall_s": 0.1, "peak_rss_bytes": 1,
                        "memory_path": "in-memory"}, ("link_edge_type", "edge_split_sizes")),
    FeaturesSummary: ({"num_partitions": 2, "num_classes": 2, "types": {"_N": {"num_features": 4}},
                       "normalize": "none", "compressor": "none", "parts": [{"part": 0, "chunk_rows": 5}],
                       "num_features": 4, "feature_dtype": "float16", "source_dtype": "float32",
                       "bytes_features": 160, "wall_s": 0.2, "peak_rss_bytes": 1}, ("source_dtype",)),
    HotnessSummary: ({"num_partitions": 2, "parts": [], "curves": [], "fanouts": [5, 5], "edge_fanouts": {},
                      "epochs": 1, "budget": "10 %", "memory_budget": "1 GiB", "csr": "memory",
                      "base_anon_bytes": 7, "wall_s": 0.3, "peak_rss_bytes": 1}, ("memory_budget", "csr")),
    InferSummary: ({"mode": "sampled", "fanouts": [5], "path": "layerwise", "num_nodes": 10, "num_partitions": 2,
                    "num_layers": 2, "embedding_layers": [0], "embeddings": True, "task": "link",
                    "decoder": "dot", "embedding_width": 8, "embeddings_at": "emb/out",
                    "train_test_metrics": {"mrr": 0.5}, "train_key": "abc", "scalars": {}, "exported_nodes": None,
                    "node_types": None, "link_metrics": None, "ranks": [], "files": {"nodes": "nodes.zarr"},
                    "wall_s": 1.0, "peak_rss_bytes": 1}, ("exported_nodes", "node_types")),
}


@pytest.mark.parametrize("record", list(STORED), ids=lambda r: r.__name__)
def test_round_trip_gives_the_same_json(record: type[SummaryRecord]) -> None:
    stored, _ = STORED[record]
    assert json.dumps(record.from_json(stored).to_json()) == json.dumps(stored)   # the same keys, in order
    built = record.from_json(stored)
    assert record.from_json(built.to_json()) == built


@pytest.mark.parametrize("record", list(STORED), ids=lambda r: r.__name__)
def test_an_older_summary_reads_with_defaults(record: type[SummaryRecord]) -> None:
    stored, newer = STORED[record]
    older = {k: v for k, v in stored.items() if k not in newer}
    s = record.from_json(older)
    defaults = record()
    assert all(getattr(s, k) == getattr(defaults, k) for k in newer)
    assert s.to_json() == older   # nothing added on the way back


@pytest.mark.parametrize("record", list(STORED), ids=lambda r: r.__name__)
def test_extra_keys_are_kept(record: type[SummaryRecord]) -> None:
    stored, _ = STORED[record]
    s = record.from_json({**stored, "added_later": {"x": 1}})
    assert s.extra["added_later"] == {"x": 1} and s.to_json()["added_later"] == {"x": 1}
    assert set(s.extra) == set(stored) - set(record.named()) | {"added_later"}


def test_typed_fields_read_what_readers_read() -> None:
    d = DownloadSummary.from_json(STORED[DownloadSummary][0])
    assert (d.num_nodes, d.split_sizes["train"], d.link_edge_type, d.edge_split_sizes) == (10, 6, None, {})
    f = FeaturesSummary.from_json({**STORED[FeaturesSummary][0], "source_dtype": None})
    assert f.source == "float16"   # builds before the dtype parameter: the stored dtype is the source's
    node = InferSummary.from_json({"num_classes": 3, "accuracy": {"test": 0.5}})
    assert (node.task, node.num_classes, node.embeddings_at) == (None, 3, None)


def test_a_record_built_in_code_writes_every_field() -> None:
    s = HotnessSummary(num_partitions=3, extra={"base_anon_bytes": 1})
    out = s.to_json()
    assert set(out) == set(HotnessSummary.named()) | {"base_anon_bytes"} and out["num_partitions"] == 3
