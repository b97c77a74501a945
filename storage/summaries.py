"""The download, partition, features, hotness and infer stages' summaries as typed records.

A stage writes its summary as a plain dict (the manifest's ``summary``; its bytes are what the stage always wrote);
code that reads another stage's summary goes through the record instead of string keys, so a key's name, type and
default for builds that predate it live in one place. The train stage's record is ``storage.train_summary``.

Every record is read with ``from_json`` (an absent key: the field's default, which is what readers assumed of
older builds; an unknown key kept in ``extra``) and written back with ``to_json`` (the stored keys, in their
stored order: a round trip gives the same JSON). A record names the keys some other code reads; the rest of a
summary (figures only its own report shows, or nobody reads) stays in ``extra``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

R = TypeVar("R", bound="SummaryRecord")


@dataclass(frozen=True, kw_only=True)
class SummaryRecord:
    """Fields every stage's summary has (``stages.meter.measure``'s cost), the keys no field names, and the
    stored key order."""

    wall_s: float = 0.0
    peak_rss_bytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    # the keys as they were stored, in order: to_json writes exactly those back (a record built in code: every field)
    stored_keys: tuple[str, ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def named(cls) -> tuple[str, ...]:
        """The summary keys this record has a field for."""
        return tuple(f.name for f in fields(cls) if f.name not in ("extra", "stored_keys"))

    @classmethod
    def from_json(cls: type[R], data: Mapping[str, Any]) -> R:
        """The record of a stored summary; absent keys take the field's default, unknown ones go to ``extra``."""
        named = set(cls.named())
        return cls(**{k: v for k, v in data.items() if k in named},
                   extra={k: v for k, v in data.items() if k not in named}, stored_keys=tuple(data))

    def to_json(self) -> dict[str, Any]:
        """The stored form: the keys read (in their order), or every field and extra key for a record built here."""
        keys = self.stored_keys or (*self.named(), *self.extra)
        return {k: self.extra[k] if k in self.extra else getattr(self, k) for k in keys}


@dataclass(frozen=True, kw_only=True)
class DownloadSummary(SummaryRecord):
    """The canonical graph's figures (``storage.graph.write_graph``'s attributes and the download stage's own)."""

    name: str = ""
    source: str = ""
    num_nodes: int = 0
    num_edges: int = 0
    avg_degree: float = 0.0
    num_features: int = 0
    num_classes: int = 0
    directed: bool = False
    schema: dict[str, Any] = field(default_factory=dict)            # ``storage.schema.GraphSchema.to_dict``
    split_sizes: dict[str, int] = field(default_factory=dict)       # nodes per split
    edges_per_type: dict[str, int] = field(default_factory=dict)
    num_edge_features: int = 0                                      # builds before edge features: none
    link_edge_type: str | None = None                               # task=link only
    link_eval: str | None = None                                    # how fixed negatives rank, where there are
    edge_split_sizes: dict[str, int] = field(default_factory=dict)  # positives per split; task=link only
    edge_split_neg_shapes: dict[str, list[int]] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class PartitionSummary(SummaryRecord):
    """The partition's figures (``stages.partition.report`` and the stage's own); per-part lists by part."""

    method: str = ""
    num_partitions: int = 0
    nodes: list[int] = field(default_factory=list)
    edges: list[int] = field(default_factory=list)
    train_nodes: list[int] = field(default_factory=list)
    bounds: list[int] = field(default_factory=list)          # part p owns gids [bounds[p], bounds[p + 1])
    edge_cut: int = 0
    edge_cut_fraction: float = 0.0
    imbalance: dict[str, float] = field(default_factory=dict)
    schema: dict[str, Any] = field(default_factory=dict)
    typed: dict[str, Any] | None = None                      # typed graphs only
    num_edge_features: int = 0
    link_edge_type: str | None = None                        # task=link only, as the download's
    link_eval: str | None = None                             # fixed evaluation negatives, where the source has them
    # task=link: each part's positives per split (one dict per part) and fixed negatives' shapes
    edge_split_sizes: list[dict[str, int]] = field(default_factory=list)
    edge_split_neg_shapes: list[dict[str, list[int]]] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class FeaturesSummary(SummaryRecord):
    """The feature stores' figures; ``types``: per node type its width, dtypes and scheme."""

    num_partitions: int = 0
    num_classes: int = 0
    num_features: int = 0
    types: dict[str, dict[str, Any]] = field(default_factory=dict)
    feature_dtype: str = ""
    source_dtype: str | None = None       # builds before the dtype parameter: as ``feature_dtype``
    normalize: str = "none"
    compressor: str = "none"
    parts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def source(self) -> str:
        """The features' dtype before the stage encoded them."""
        return self.source_dtype or self.feature_dtype


@dataclass(frozen=True, kw_only=True)
class HotnessSummary(SummaryRecord):
    """The cache plan's figures: a row and a hit-rate curve per part."""

    num_partitions: int = 0
    parts: list[dict[str, Any]] = field(default_factory=list)
    curves: list[dict[str, Any]] = field(default_factory=list)
    fanouts: list[int] = field(default_factory=list)
    edge_fanouts: dict[str, Any] = field(default_factory=dict)
    epochs: int = 0
    budget: str = ""
    memory_budget: str | None = None      # builds before the memory budget: none,
    csr: str | None = None                # nor where their CSR lived


@dataclass(frozen=True, kw_only=True)
class InferSummary(SummaryRecord):
    """An infer build's figures: those of every build, then a node classifier's, then a link model's (``task``
    "link"; a node build records no task)."""

    mode: str = "exact"                   # or "sampled", with ``fanouts``
    fanouts: list[int] | None = None
    path: str = ""
    num_nodes: int = 0
    num_partitions: int = 0
    num_layers: int = 0
    embedding_layers: list[int] = field(default_factory=list)
    embeddings: bool = False
    train_key: str = ""
    scalars: dict[str, float] = field(default_factory=dict)
    exported_nodes: int | None = None
    node_types: list[dict[str, Any]] | None = None
    ranks: list[dict[str, Any]] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    # a node classifier's
    num_classes: int | None = None
    accuracy: dict[str, float | None] = field(default_factory=dict)
    sampled_accuracy: dict[str, float | None] = field(default_factory=dict)
    correct: dict[str, int] = field(default_factory=dict)
    total: dict[str, int] = field(default_factory=dict)
    pred_count: list[int] = field(default_factory=list)
    label_count: list[int] = field(default_factory=list)
    # a link model's
    task: str | None = None
    decoder: str | None = None
    embedding_width: int | None = None
    embeddings_at: str | None = None
    train_test_metrics: dict[str, float | None] = field(default_factory=dict)
    link_metrics: dict[str, Any] | None = None
