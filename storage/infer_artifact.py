"""Reading the infer artifact (``storage.infer`` describes its format and writes it): ``InferArtifact`` through its
manifest, ``InferPart`` (one partition's outputs by lid), and ``EmbeddingBlocks``, a link model's node embeddings
read a block of rows at a time (the stage's link metrics score millions of pairs from them in bounded memory)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr

from storage.errors import ArtifactError
from storage.infer import LINK_EMBEDDINGS, METRICS, NODES, OUT, PREDICTIONS, layer_name, part_name, read_rows
from storage.store import ArtifactHandle
from storage.summaries import InferSummary
from storage.zarr_io import attr_int, open_array, open_group, open_subgroup, read_array

if TYPE_CHECKING:
    import pyarrow

CLASS_ARRAYS = ("pred", "prob", "label", "split")   # nodes.zarr's arrays of a build with classes
BLOCK_BYTES = 1 << 30   # EmbeddingBlocks: rows read at a time (1 GiB: 1 048 576 rows of 256 floats)


@dataclass
class InferPart:
    """Partition p's outputs, rows by lid (a link model's: ``out``, no pred or prob)."""

    part: int
    start_gid: int
    pred: np.ndarray | None          # int64 [n_p]
    prob: np.ndarray | None          # float32 [n_p, C]
    embeddings: dict[int, np.ndarray]   # hidden layer -> float32 [n_p, H]
    orig_id: np.ndarray | None       # int64 [n_p]; None before the export added it
    out: np.ndarray | None = None    # a link model's node embeddings, float32 [n_p, D]


def read_part(url: str) -> InferPart:
    g = open_group(url)
    attrs = dict(g.attrs)
    if "part" not in attrs:
        raise ArtifactError(f"{url} is not a gnnpipe inference part (no attrs); rerun the infer stage")
    emb = open_subgroup(g, "emb")
    layers = attrs.get("embedding_layers", [])
    if not isinstance(layers, list):
        raise ArtifactError(f"attr 'embedding_layers' of {url} is {layers!r}, not a list; rerun the infer stage")
    return InferPart(part=attr_int(attrs, "part", url), start_gid=attr_int(attrs, "start_gid", url),
                     pred=_optional(g, "pred"), prob=_optional(g, "prob"),
                     embeddings={int(str(layer)): read_array(emb, layer_name(int(str(layer)))) for layer in layers},
                     orig_id=_optional(g, "orig_id"), out=_optional(emb, OUT))


def _optional(group: zarr.Group, name: str) -> np.ndarray | None:
    return read_array(group, name) if name in group else None




class InferArtifact(ArtifactHandle):
    """The infer stage's artifact, read through its manifest."""

    STAGE = "infer"

    @cached_property
    def summary(self) -> InferSummary:
        return InferSummary.from_json(self.manifest.summary)

    @property
    def num_partitions(self) -> int:
        return int(self.summary.num_partitions)

    @property
    def num_nodes(self) -> int:
        return int(self.summary.num_nodes)

    @property
    def task(self) -> str:
        """The train task whose outputs these are (``node``, ``link``): a label for exports and messages; what the
        build holds is ``has_classes`` / ``has_output_embeddings``."""
        return self.summary.task or "node"   # a node build records none (nor builds before link prediction)

    # What the build holds, read from its manifest's summary (never from the task's name): a node classifier's
    # summary records its classes, a link model's where its output embeddings are (``embeddings_at``).
    @property
    def has_classes(self) -> bool:
        """pred, prob, label and split per node, and ``predictions.parquet`` (builds before link prediction too)."""
        return self.summary.num_classes is not None

    @property
    def has_output_embeddings(self) -> bool:
        """The output layer's rows as node embeddings (``emb/out``: a link model's)."""
        return self.summary.embeddings_at is not None

    @property
    def class_arrays(self) -> tuple[str, ...]:
        """The per-node class arrays of ``nodes.zarr`` (``node_array``); none without classes."""
        return CLASS_ARRAYS if self.has_classes else ()

    @property
    def num_classes(self) -> int:
        return int(self.summary.num_classes or 0)

    def _no_classes(self, what: str) -> ArtifactError:
        return ArtifactError(f"infer/{self.manifest.key} holds a link prediction model's node embeddings "
                             f"({LINK_EMBEDDINGS}), no {what}; score pairs with `gnnpipe score`")

    @property
    def embedding_layers(self) -> list[int]:
        return [int(layer) for layer in self.summary.embedding_layers]

    @property
    def predictions_url(self) -> str:
        """``predictions.parquet``: open it with pandas/pyarrow/polars (column ``orig_id`` is the join key)."""
        if not self.has_classes:
            raise self._no_classes(PREDICTIONS)
        return self._url(PREDICTIONS)

    @property
    def nodes_url(self) -> str:
        """``nodes.zarr``, every output in orig-id order."""
        return self._url(NODES)

    def part(self, p: int) -> InferPart:
        """Partition p's outputs, rows by lid."""
        return read_part(self._url(part_name(p)))

    def parts(self) -> Iterator[InferPart]:
        for p in range(self.num_partitions):
            yield self.part(p)

    def nodes(self) -> zarr.Group:
        """``nodes.zarr`` opened lazily."""
        return open_group(self.nodes_url)

    def node_array(self, name: str) -> zarr.Array:
        """``pred``, ``prob``, ``label`` or ``split`` of ``nodes.zarr`` (orig-id order), opened lazily."""
        if not self.has_classes:
            raise self._no_classes(name)
        return open_array(self.nodes(), name)

    def embeddings(self, layer: int | None = None) -> zarr.Array:
        """Hidden layer ``layer``'s rows in orig-id order, opened lazily; default: a link model's node embeddings
        (``emb/out``, its output layer), else the last hidden layer stored."""
        if layer is None and self.has_output_embeddings:
            return open_array(open_subgroup(self.nodes(), "emb"), OUT)
        layers = self.embedding_layers
        if not layers:
            raise ArtifactError(f"infer/{self.manifest.key} holds no embeddings (a model with no hidden layer, or "
                                f"one whose layers could not be observed)")
        chosen = layers[-1] if layer is None else layer
        if chosen not in layers:
            raise ArtifactError(f"infer/{self.manifest.key} holds hidden layers {layers}, not {chosen}; "
                                f"set infer.embeddings=all for every hidden layer")
        return open_array(open_subgroup(self.nodes(), "emb"), layer_name(chosen))

    def embedding_blocks(self, block_bytes: int = BLOCK_BYTES) -> EmbeddingBlocks:
        """A link model's node embeddings (``embeddings()``) read a block of rows at a time."""
        return EmbeddingBlocks(self.embeddings(), block_bytes)

    def embedding_rows(self, orig_id: np.ndarray) -> np.ndarray:
        """``embeddings()[orig_id]`` for sorted distinct orig ids: only the chunks they touch are read."""
        return read_rows(self.embeddings(), orig_id)

    def predictions(self) -> pyarrow.Table:
        """``predictions.parquet`` as a pyarrow Table (``.to_pandas()`` for a DataFrame)."""
        import fsspec
        import pyarrow.parquet as pq

        with fsspec.open(self.predictions_url, "rb") as f:
            return pq.read_table(f)

    def metrics(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.store.read_bytes(self.STAGE, self.manifest.key, METRICS))
        return data


class EmbeddingBlocks:
    """The rows of a row-chunked float32 [N, D] array (a link model's ``nodes.zarr/emb/out``, row i = orig id i) read
    ``block_rows`` contiguous rows at a time (whole Zarr chunks, about ``block_bytes``), the last block kept: a
    matrix of one block is read once however often it is asked, a larger one once per pass over its blocks.
    Callers go block by block (``block_of``, ``block``) or ``gather`` any rows. Memory: one block."""

    def __init__(self, array: zarr.Array, block_bytes: int = BLOCK_BYTES) -> None:
        self.array = array
        self.num_rows, self.width = int(array.shape[0]), int(array.shape[1])
        chunk = max(1, int(array.chunks[0]))
        rows = max(1, block_bytes // max(1, 4 * self.width))
        self.block_rows = max(chunk, rows // chunk * chunk)
        self.reads = 0   # blocks read (a figure of the metrics)
        self._kept: tuple[int, np.ndarray] | None = None

    @property
    def num_blocks(self) -> int:
        return -(-self.num_rows // self.block_rows)

    def block_of(self, ids: np.ndarray) -> np.ndarray:
        """Each id's block."""
        return ids // self.block_rows

    def block(self, b: int) -> np.ndarray:
        """float32 [<= block_rows, D]: rows ``[b * block_rows, (b + 1) * block_rows)``."""
        if self._kept is None or self._kept[0] != b:
            self._kept = None   # freed before the next block is read
            lo = b * self.block_rows
            self._kept = (b, np.asarray(self.array[lo:min(lo + self.block_rows, self.num_rows)], dtype=np.float32))
            self.reads += 1
        return self._kept[1]

    def gather(self, ids: np.ndarray) -> np.ndarray:
        """float32 [len(ids), D]: the rows of ``ids`` (any order, repeats too), each block they touch read once."""
        out = np.empty((ids.shape[0], self.width), dtype=np.float32)
        which = self.block_of(ids)
        for b in np.unique(which).tolist():
            pos = np.flatnonzero(which == b)
            out[pos] = self.block(b)[ids[pos] - b * self.block_rows]
        return out
