"""The features stage's one code path: each node type's ``x`` streamed from ``graph.zarr`` in row chunks, coded, and
appended to the partitions' stores in whole output chunks, so that the stage holds neither x nor a part's rows.

Why it works: within a part, gids follow orig order within each node type (the partition stage's relabelling is a
stable sort), so part p's rows of type t are an ascending subsequence of the type's ids. Reading x in order, each
source chunk holds, for every part, its next rows in tlid order: they are appended to the part's one-chunk buffer,
written to Zarr whenever it fills. The stores are byte-identical to gathering each part's rows in memory (same chunk
shape, which depends only on the part's row count and row bytes, same bytes in every chunk).

Memory (``memory_budget_bytes``, counted above the process's anonymous memory when the stage starts: the
interpreter, torch and zarr hold ~0.3 GB before any row is read):

- fixed, O(N): the book (``orig_of_gid``, ``gid_of_orig``: 16 B a node), ``y`` (8 B a node) and the splits with
  their gid-mapped copies (``split_lids_of``: 24 B a split node) - 24 B a node + 24 B a split node, 0.6 GB at
  14 M nodes;
- per node type: one output chunk per part (the buffers, Σ_p chunk_rows_p × row bytes; the default chunks are
  ~16 MiB, so 8 parts cost 128 MiB), one more output chunk (Zarr's encoded copy of a chunk being written) and one
  source Zarr chunk twice (read, and decoded whole when any of its rows is read);
- per streamed row: its source bytes, float32 copies for normalising and coding (16 B a column, the int8 coder's
  temporaries) and the codes twice (coded, then ordered by part).

The fixed part plus ``MIN_STREAM_ROWS`` streamed rows is the minimum ``MemoryBudget.require`` checks before any
work; the rest of the budget sets the stream chunk, capped at ``STREAM_BYTES`` of source rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import zarr

from stages.choices import FeatureNorm
from stages.features.normalize import normalize_rows
from stages.features.schemes import encode_rows
from stages.memory import MemoryBudget
from stages.runtime.feature_codec import FeatureCodec
from storage.errors import ArtifactError
from storage.features import PartFeaturesWriter
from storage.partition import PartitionBook
from storage.progress import progress as tqdm
from storage.zarr_io import ChunkAppender, read_rows

# source bytes a streamed chunk holds at most: one Zarr chunk of the download stage's x (its 64 MiB default, so
# every chunk is decoded once); with it the stage ran 1 M nodes x 128 float32 in 5.0-5.5 s against 5.7-5.9 s for the
# whole x in memory (docs/history.md, "Features under the memory budget")
STREAM_BYTES = 64 << 20
MIN_STREAM_ROWS = 1024   # fewer rows a chunk and the per-chunk Python work (one sort, P appends) dominates
FIXED_BYTES_PER_NODE = 24         # orig_of_gid + gid_of_orig + y, int64 each
FIXED_BYTES_PER_SPLIT_NODE = 24   # the split ids, their gids and the owned lids (split_lids_of)
WORK_BYTES_PER_VALUE = 16         # float32 copies a streamed value passes through (normalised, coded)


@dataclass(frozen=True)
class TypeStream:
    """How one featured node type is streamed: its source array, storage and the chunks on both sides."""

    name: str
    index: int                 # in the schema's node types
    first_orig: int            # the type's first orig id
    source: zarr.Array         # [N_t, F_t]
    out_itemsize: int          # bytes of one stored value
    chunk_rows: list[int]      # output chunk rows of each part (as the stores are written)
    part_rows: list[int]       # rows of each part

    @property
    def num_rows(self) -> int:
        return int(self.source.shape[0])

    @property
    def num_columns(self) -> int:
        return int(self.source.shape[1])

    def buffer_bytes(self) -> int:
        """One output chunk per part, and one more in Zarr's hands while a chunk is written."""
        chunks = [min(c, max(n, 1)) * self.num_columns * self.out_itemsize
                  for c, n in zip(self.chunk_rows, self.part_rows)]
        return sum(chunks) + max(chunks, default=0)

    def source_chunk_bytes(self) -> int:
        """A source Zarr chunk twice: the bytes read and the decoded array (at 1 M nodes x 128 float32 under a
        256 MiB budget, counting it once let the stage peak 7 MiB over)."""
        return 2 * int(self.source.chunks[0]) * self.num_columns * self.source.dtype.itemsize

    def row_work_bytes(self) -> int:
        """Bytes one streamed row costs while its chunk is coded (module docstring)."""
        return self.num_columns * (self.source.dtype.itemsize + WORK_BYTES_PER_VALUE + 2 * self.out_itemsize)

    def floor_bytes(self) -> int:
        """What streaming this type needs beside the fixed part, with the smallest stream chunk."""
        return (self.buffer_bytes() + self.source_chunk_bytes()
                + min(self.num_rows, MIN_STREAM_ROWS) * self.row_work_bytes())


def fixed_bytes(num_nodes: int, num_split_nodes: int) -> int:
    """The O(N) arrays the stage holds whatever the chunking (module docstring)."""
    return FIXED_BYTES_PER_NODE * num_nodes + FIXED_BYTES_PER_SPLIT_NODE * num_split_nodes


def stream_rows(t: TypeStream, budget: MemoryBudget, fixed: int) -> int:
    """Rows a streamed chunk of ``t`` holds: what the budget leaves after the fixed part, the buffers and a source
    chunk, at most ``STREAM_BYTES`` of source rows, in whole source chunks when it holds one or more."""
    spare = budget.bytes - fixed - t.buffer_bytes() - t.source_chunk_bytes()
    rows = min(spare // t.row_work_bytes(), STREAM_BYTES // max(t.num_columns * t.source.dtype.itemsize, 1))
    source_rows = int(t.source.chunks[0])
    if rows >= source_rows:
        rows -= rows % source_rows
    return int(max(1, min(max(rows, MIN_STREAM_ROWS), t.num_rows)))


def row_chunks(source: zarr.Array, rows: int) -> Iterator[tuple[int, np.ndarray]]:
    """``(first row, rows)`` of ``source`` in consecutive chunks of ``rows`` rows."""
    for lo in range(0, int(source.shape[0]), rows):
        yield lo, read_rows(source, lo, lo + rows)


class _PartBuffers:
    """One appender per part written (``storage.zarr_io.ChunkAppender``: at most one output chunk held each): rows
    come in tlid order and go to the part's ``x`` in whole chunks, the last one as long as the part's rows leave
    it."""

    def __init__(self, arrays: Mapping[int, zarr.Array], t: TypeStream) -> None:
        self.t = t
        self.appenders = {p: ChunkAppender(a) for p, a in arrays.items()}

    def next_tlid(self, p: int) -> int:
        return self.appenders[p].count

    def append(self, p: int, rows: np.ndarray) -> None:
        self.appenders[p].append(rows)

    def close(self) -> None:
        for p, appender in self.appenders.items():
            if appender.count != self.t.part_rows[p]:
                raise ArtifactError(f"part {p} got {appender.count} rows of {self.t.name}, its book says "
                                    f"{self.t.part_rows[p]}; rerun the partition stage")
            appender.close()


def stream_type(t: TypeStream, codec: FeatureCodec, rows: int, book: PartitionBook, type_starts: list[int],
                writers: Mapping[int, PartFeaturesWriter], normalize: FeatureNorm, *, progress: bool = False) -> None:
    """Write the rows of ``t`` (coded with ``codec``) of each part in ``writers`` (part -> its store) into its
    store, streaming the source in chunks of ``rows`` rows; ``type_starts[p]``: part p's first gid of the type.
    Rows of other parts are read and dropped (their stores are another unit's: ``stages.features.units``)."""
    num_parts = book.num_partitions
    out = _PartBuffers({p: w.x[t.name] for p, w in writers.items()}, t)
    order_dtype = np.int16 if num_parts < 1 << 15 else np.int64   # a stable argsort of int16 is a radix sort
    steps = -(-t.num_rows // rows)
    for lo, block in tqdm(row_chunks(t.source, rows), total=steps, desc=f"features: stream {t.name}",
                          disable=not progress or steps < 4, leave=False):
        hi = lo + block.shape[0]
        gids = book.gid_of_orig[t.first_orig + lo:t.first_orig + hi]
        owner = book.owner(gids).astype(order_dtype)
        codes = encode_rows(normalize_rows(block, normalize), codec, np.arange(lo, hi))
        del block
        order = np.argsort(owner, kind="stable")
        codes, gids = codes[order], gids[order]
        counts = np.bincount(owner, minlength=num_parts)
        del order, owner
        start = 0
        for p in np.flatnonzero(counts).tolist():
            n = int(counts[p])
            if p not in writers:
                start += n
                continue
            first, last = int(gids[start]) - type_starts[p], int(gids[start + n - 1]) - type_starts[p]
            if first != out.next_tlid(p) or last != first + n - 1:   # the relabelling's stable order, checked
                raise ArtifactError(f"part {p}'s {t.name} rows are not in orig order in the partition book "
                                    f"(tlid {first}, expected {out.next_tlid(p)}); rerun the partition stage")
            out.append(p, codes[start:start + n])
            start += n
    out.close()
