"""A rank's own feature rows (partition p's ``x``), served by lid from host memory or, when too big, from Zarr.

ID space: rows are **lids** of the partition (row ``lid`` is gid ``start_gid + lid``).

- ``InMemoryFeatureStore``: the whole ``x`` read once (chunk by chunk) into a host tensor, pinned when CUDA is the
  training device so host→device copies are DMA. Gathers use ``torch.index_select`` (~5× numpy fancy
  indexing, and 40-400× per-batch Zarr indexing: benchmarks/RESULTS.md, "Chunk shape and codec").
- ``ZarrFeatureStore``: for a partition above the memory budget. A gather sorts the requested lids, groups them by
  row chunk and reads each touched chunk once, as one contiguous slice (Zarr decodes whole chunks anyway, and the
  crc32c codec still checks every chunk read). Slow, but bounded memory; the device cache holds the hot rows.

Rows are held, and gathered, in the store's storage dtype, as coded by the features stage; ``codec``
(``stages.runtime.feature_codec``) says how they decode to float32, which ``DistFeatures.decode`` does on the
device. ``open_feature_store`` picks one against a byte budget (counted in stored bytes; ``open_part_store`` with
the stored codec). Mechanism only: which rows are worth caching elsewhere is decided by the cache policy
(``stages.train.rank.cache_policy``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

import numpy as np
import psutil
import torch
import zarr
from torch import Tensor

from stages.runtime.feature_codec import FeatureCodec, numpy_view, torch_dtype_of
from storage.errors import ArtifactError
from storage.features import FeaturesArtifact
from storage.zarr_io import read_into

# With no explicit budget, load x when it takes at most this share of the memory available to this rank.
AUTO_BUDGET_SHARE = 0.5


class FeatureStore(ABC):
    """Rows of one partition's ``x`` by lid, on the host (CPU tensors in the codec's ``carrier``: the storage dtype,
    float8 as uint8 bits)."""

    num_rows: int
    num_features: int
    codec: FeatureCodec
    kind: str  # "memory" or "zarr", for the metrics

    @property
    def dtype(self) -> torch.dtype:
        return self.codec.carrier

    @property
    def row_bytes(self) -> int:
        return self.num_features * self.dtype.itemsize

    @abstractmethod
    def gather(self, lid: Tensor, out: Tensor | None = None) -> Tensor:
        """``[len(lid), F]`` rows in the order of ``lid`` (int64, CPU; may repeat), into ``out`` when given."""

    def _check(self, lid: Tensor) -> None:
        if lid.numel() and (int(lid.min()) < 0 or int(lid.max()) >= self.num_rows):
            raise IndexError(f"lids must lie in [0, {self.num_rows}); got [{int(lid.min())}, {int(lid.max())}]")


class InMemoryFeatureStore(FeatureStore):
    kind = "memory"

    def __init__(self, x: Tensor, codec: FeatureCodec | None = None) -> None:
        """``x``: the rows (codes); ``codec``: how they decode (None: a cast of ``x``'s dtype)."""
        self.codec = codec or FeatureCodec.cast(x.dtype)
        if x.dtype != self.codec.carrier:
            raise ValueError(f"rows of {x.dtype} for a codec holding {self.codec.carrier}")
        self.x = x
        self.num_rows, self.num_features = int(x.shape[0]), int(x.shape[1])

    def gather(self, lid: Tensor, out: Tensor | None = None) -> Tensor:
        self._check(lid)
        if out is None:
            return torch.index_select(self.x, 0, lid)
        return torch.index_select(self.x, 0, lid, out=out)


class ZarrFeatureStore(FeatureStore):
    kind = "zarr"

    def __init__(self, array: zarr.Array, codec: FeatureCodec | None = None) -> None:
        """``array``: the codes in Zarr; ``codec``: how they decode (None: a cast of the array's dtype)."""
        self.codec = _codec_for(array, codec)
        self.array = array
        self.num_rows, self.num_features = int(array.shape[0]), int(array.shape[1])
        self.chunk_rows = int(array.chunks[0])

    def gather(self, lid: Tensor, out: Tensor | None = None) -> Tensor:
        self._check(lid)
        if out is None:
            out = torch.empty((lid.numel(), self.num_features), dtype=self.dtype)
        if lid.numel() == 0:
            return out
        sorted_lid, order_pos = torch.sort(lid)
        sorted_np = sorted_lid.numpy()
        chunk = sorted_np // self.chunk_rows
        # one contiguous read per touched chunk, from its first to its last requested row
        run_starts = np.flatnonzero(np.r_[True, chunk[1:] != chunk[:-1]])
        run_ends = np.r_[run_starts[1:], sorted_np.shape[0]]
        out_np = numpy_view(out)
        order_np = order_pos.numpy()
        for a, b in zip(run_starts.tolist(), run_ends.tolist()):
            lo, hi = int(sorted_np[a]), int(sorted_np[b - 1]) + 1
            try:
                block = np.asarray(self.array[lo:hi])
            except ValueError as err:
                if "checksum" in str(err).lower():
                    raise ArtifactError(f"corrupted chunk in the feature store ({err}); rerun the features "
                                        f"stage with --force features") from None
                raise
            out_np[order_np[a:b]] = block[sorted_np[a:b] - lo]
        return out


def _codec_for(x: zarr.Array, codec: FeatureCodec | None) -> FeatureCodec:
    """``codec``, or a cast of ``x``'s dtype where ``x`` holds plain rows; codes of another scheme or storage dtype
    need their codec (``open_part_store`` reads it), which this refuses to guess."""
    if codec is None:
        if x.attrs.get("scheme", "cast") != "cast" or x.attrs.get("storage_dtype", x.dtype.name) != x.dtype.name:
            raise ValueError(f"{x.path} holds {x.attrs['scheme']} codes of {x.attrs['storage_dtype']}: open it with "
                             "its codec (open_part_store)")
        return FeatureCodec.cast(torch_dtype_of(x.dtype))
    return codec


def _load_x(x: zarr.Array, codec: FeatureCodec, pin: bool) -> Tensor:
    """Read ``x`` chunk by chunk straight into a (pinned) torch tensor of the storage dtype: no second full-size
    copy."""
    out = torch.empty(tuple(x.shape), dtype=codec.carrier, pin_memory=pin)
    read_into(x, out=numpy_view(out))
    return out


def x_nbytes(x: zarr.Array) -> int:
    return int(np.prod(x.shape, dtype=np.int64)) * np.dtype(x.dtype).itemsize


def host_budget(memory_budget_bytes: int | None, ranks_on_host: int) -> int:
    """A rank's bytes of feature rows in RAM: ``memory_budget_bytes``, or with None ``AUTO_BUDGET_SHARE`` of the
    available memory shared by ``ranks_on_host``."""
    if memory_budget_bytes is not None:
        return memory_budget_bytes
    return int(AUTO_BUDGET_SHARE * psutil.virtual_memory().available / max(ranks_on_host, 1))


def fit_in_budget(need: Mapping[str, int], budget: int) -> set[str]:
    """Which of several stores (``need``: bytes by name) go in RAM together within ``budget``: the smallest first,
    so that one large store read from Zarr leaves every smaller one in memory."""
    chosen, left = set(), budget
    for name in sorted(need, key=lambda n: (need[n], n)):
        if need[name] <= left:
            chosen.add(name)
            left -= need[name]
    return chosen


def open_feature_store(x: zarr.Array, *, codec: FeatureCodec | None = None, memory_budget_bytes: int | None = None,
                       ranks_on_host: int = 1, pin: bool = False) -> FeatureStore:
    """Partition ``x`` (opened lazily, ``storage.features.FeaturesArtifact.x``), in RAM when it fits the budget.

    ``codec``: how its codes decode (None: plain rows, a cast; ``open_part_store`` passes the stored one).
    ``memory_budget_bytes`` None: ``AUTO_BUDGET_SHARE`` of the available memory, shared by ``ranks_on_host``.
    0 forces on-demand reads. ``pin``: page-lock the host copy (only worth it for a CUDA device).
    """
    codec = _codec_for(x, codec)
    if x_nbytes(x) <= host_budget(memory_budget_bytes, ranks_on_host):
        return InMemoryFeatureStore(_load_x(x, codec, pin), codec)
    return ZarrFeatureStore(x, codec)


def open_part_store(features: FeaturesArtifact, p: int, node_type: str | None = None, *,
                    memory_budget_bytes: int | None = None, ranks_on_host: int = 1, pin: bool = False
                    ) -> FeatureStore:
    """Partition p's rows of a node type (``None``: the one featured type) with their stored codec."""
    return open_feature_store(features.x(p, node_type), codec=FeatureCodec.of(features.scheme(p, node_type)),
                              memory_budget_bytes=memory_budget_bytes, ranks_on_host=ranks_on_host, pin=pin)
