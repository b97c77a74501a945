"""Feature rows of any gids for a batch's ``n_id``: device cache → own partition's store → remote owners.

ID spaces: ``gid`` global; the store is indexed by ``lid = gid - bounds[rank]``; ``*_pos`` are positions in the
requested gid tensor (``n_id``) and in the output rows.

Remote rows come from their owners with collectives only (no RPC), in lockstep like the distributed sampler::

    1. all_to_all_single  row counts   requester -> owner
    2. all_to_all_single  gids         requester -> owner   (variable splits)
       owner: rows = own store[gid - bounds[owner]]
    3. all_to_all_single  rows         owner -> requester   (variable splits, count * F values each)

Every rank issues these 3 collectives on every ``gather``/``fetch_rows`` call, also when it needs no remote row:
collectives match by call order, so a rank that skipped one would hang its peers. Rows are cached and travel in the
store's storage dtype (float8 as its uint8 bits, ``FeatureCodec.carrier``); ``decode`` turns them into float32 on
the device, the one place every reader of rows (loader, typed rows, infer) calls; the counters count stored bytes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from stages.runtime.collectives import Owners, all_to_all, comm_device, max_over_ranks, route_to_owners
from stages.runtime.feature_cache import FeatureCache
from stages.runtime.feature_store import FeatureStore, InMemoryFeatureStore
from stages.runtime.phases import phase
from stages.runtime.sums import FieldSums
from stages.runtime.uva import UvaRows, UvaUnavailableError, choose_host_gather


class HostGatherError(ValueError):
    """``host_gather=uva`` cannot read this rank's rows in place: a setting the rank's caller turns into the user's
    one-line error (``stages.train.rank.rank_data``; storage/errors.py: the runtime raises ValueError)."""


@dataclass
class FeatureCounters(FieldSums):
    """Where the rows a rank asked for came from (one epoch, usually)."""

    requested_rows: int = 0
    cache_hits: int = 0
    local_rows: int = 0
    remote_rows: int = 0
    cached_bytes: int = 0
    local_bytes: int = 0
    remote_bytes: int = 0

    @property
    def hit_rate(self) -> float:
        return self.cache_hits / self.requested_rows if self.requested_rows else 0.0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class DistFeatures:
    """``gather(n_id) -> [len(n_id), F]`` rows on ``device`` for rank ``rank`` of a graph split by ``bounds``.

    Without an initialised process group (or with one rank) every gid must be local and no collective runs.
    """

    def __init__(self, store: FeatureStore, bounds: np.ndarray | list[int], *, device: torch.device | str = "cpu",
                 cache: FeatureCache | None = None, group: dist.ProcessGroup | None = None,
                 host_gather: str = "auto") -> None:
        """``host_gather`` (CUDA only): ``copy`` gathers own rows on the CPU into a pinned buffer and copies it over;
        ``uva`` has the device read the pinned store in place (``stages.runtime.uva``; needs rows in pinned RAM);
        ``auto`` picks one (``choose_host_gather``). ``host_gather_mode`` and ``host_gather_why`` say which ran."""
        self.store = store
        self.group = group
        self.device = torch.device(device)
        owners = Owners.of(bounds, group, self.device)
        self.distributed, self.rank, self.world_size, self.bounds_gid = (owners.distributed, owners.rank,
                                                                         owners.world_size, owners.bounds)
        self.lo = owners.lo
        if owners.hi - self.lo != store.num_rows:
            raise ValueError(f"rank {self.rank} owns {int(self.bounds_gid[self.rank + 1]) - self.lo} gids but its "
                             f"feature store has {store.num_rows} rows")
        self._comm_device = comm_device(group) if self.distributed else torch.device("cpu")
        self.num_nodes = int(self.bounds_gid[-1])   # of the whole graph
        # gids travel as int32 when they fit: half the bytes of int64 (as in the sampler)
        self._wire_dtype = torch.int32 if self.num_nodes < 2**31 else torch.long
        self.cache = cache or FeatureCache.empty(store.num_features, store.dtype, self.device)
        self.codec = store.codec.to(self.device)   # per-column scale/offset where rows are decoded
        self.counters = FeatureCounters()
        # CUDA: host rows are gathered into a reused pinned buffer and copied asynchronously; the event says when
        # the previous copy out of it is done, so the buffer is not overwritten while the DMA still reads it
        self._staging: Tensor | None = None
        self._staging_free: torch.cuda.Event | None = None
        self.host_gather_mode, self.host_gather_why = choose_host_gather(
            host_gather, device_type=self.device.type, itemsize=store.dtype.itemsize,
            rows_in_ram=isinstance(store, InMemoryFeatureStore))
        self._uva = self._uva_rows(store, fall_back=host_gather == "auto") if self.host_gather_mode == "uva" else None

    @property
    def num_features(self) -> int:
        return self.store.num_features

    def reset_counters(self) -> FeatureCounters:
        """The counters so far; counting restarts from zero."""
        done, self.counters = self.counters, FeatureCounters()
        return done

    def build_cache(self, gid: Tensor, chunk_rows: int = 1 << 16) -> FeatureCache:
        """Load the rows of ``gid`` into the device cache, chunk by chunk (bounded temporaries), and use it.

        A collective: every rank calls it; ranks with shorter lists join the remaining exchanges with empty ones.
        """
        gid_sorted = torch.unique(gid.to(device=self.device, dtype=torch.long))
        rows = torch.empty((gid_sorted.numel(), self.num_features), dtype=self.store.dtype, device=self.device)
        self.fetch_rows_into(gid_sorted, rows, chunk_rows)
        self.cache = FeatureCache(gid_sorted, rows)
        return self.cache

    @property
    def holds_every_row(self) -> bool:
        """A lone rank whose device cache holds every row: a gather is one ``index_select``, with no host read."""
        return self.world_size == 1 and self.cache.num_rows == self.num_nodes

    def uncount_cached(self, rows: int) -> None:
        """Take ``rows`` cache hits back out of the counters: rows a gather read that the batch did not need (a
        static batch's fake slots, ``stages.train.rank.graphed_sampling``)."""
        c = self.counters
        c.requested_rows -= rows
        c.cache_hits -= rows
        c.cached_bytes -= rows * self.store.row_bytes

    def gather(self, n_id: Tensor) -> Tensor:
        """Rows of ``n_id`` (gids, any owner, may repeat) in order, as ``[len, F]`` on the device. Collective."""
        n_id = n_id.to(device=self.device, dtype=torch.long)
        n = n_id.numel()
        if self.holds_every_row:
            # every row cached (the device budget's aim on one GPU: [4/5] item 1) and no peer to serve: the gid is
            # the cache slot, one gather with no lookup and no host synchronisation
            with phase("gather_cache"):
                out = self.cache.rows.index_select(0, n_id)
            hits, local, remote = n, 0, 0
        else:
            hits, local, remote, out = self._gather_cached_and_stored(n_id)
        c = self.counters
        c.requested_rows += n
        c.cache_hits += hits
        c.local_rows += local
        c.remote_rows += remote
        c.cached_bytes += hits * self.store.row_bytes
        c.local_bytes += local * self.store.row_bytes
        c.remote_bytes += remote * self.store.row_bytes
        return out

    def _gather_cached_and_stored(self, n_id: Tensor) -> tuple[int, int, int, Tensor]:
        """``gather``'s rows from the cache, the own store and the owners: (hits, own rows, remote rows, rows)."""
        n = n_id.numel()
        out = torch.empty((n, self.num_features), dtype=self.store.dtype, device=self.device)
        with phase("gather_cache"):
            hit, slot = self.cache.lookup(n_id)
            hit_pos = torch.nonzero(hit).squeeze(1)   # the one host synchronisation: the misses are the rest
            out.index_copy_(0, hit_pos, self.cache.rows.index_select(0, slot.index_select(0, hit_pos)))
            miss_pos = torch.nonzero_static(~hit, size=n - hit_pos.numel()).squeeze(1)
        if miss_pos.numel() == 0 and self.world_size == 1:   # nothing to fetch, and no peer waits on an exchange
            return n, 0, 0, out
        local, remote = self._fill(n_id.index_select(0, miss_pos), miss_pos, out)
        return hit_pos.numel(), local, remote, out

    def decode(self, rows: Tensor) -> Tensor:
        """Rows in the storage dtype (from ``gather``, ``fetch_rows`` or the store) -> float32, on their device."""
        return self.codec.to(rows.device).decode(rows) if rows.device != self.device else self.codec.decode(rows)

    def fetch_rows(self, gid: Tensor) -> Tensor:
        """Rows of ``gid`` from the stores (own and remote), bypassing the cache and the counters. Collective."""
        gid = gid.to(device=self.device, dtype=torch.long)
        out = torch.empty((gid.numel(), self.num_features), dtype=self.store.dtype, device=self.device)
        self._fill(gid, torch.arange(gid.numel(), device=self.device), out)
        return out

    def fetch_rows_into(self, gid: Tensor, out: Tensor, piece_rows: int) -> None:
        """``out[i] = row of gid[i]`` (any owner), fetched ``piece_rows`` at a time, which bounds the exchange's
        buffers: stored rows into an ``out`` of the storage dtype, else decoded. Collective: every rank runs the
        largest rank's piece count, ranks with fewer joining with empty pieces."""
        n = gid.numel()
        stored = out.dtype == self.store.dtype
        for k in range(max_over_ranks(-(-n // piece_rows), self.group)):
            start, stop = min(k * piece_rows, n), min((k + 1) * piece_rows, n)
            rows = self.fetch_rows(gid[start:stop])
            out[start:stop] = rows if stored else self.decode(rows)

    def _fill(self, gid: Tensor, out_pos: Tensor, out: Tensor) -> tuple[int, int]:
        """``out[out_pos] = rows of gid``: own rows from the store, others from their owners. Returns the counts."""
        # counts travel as int64, gids as _wire_dtype, rows in the store's dtype; answers land on self.device
        with phase("gather_remote"):   # routing: which rows are whose (its exchanges charge ``exchange``)
            req = route_to_owners(gid, self.bounds_gid, self.rank, self.world_size, self.group, self._comm_device,
                                  self._wire_dtype, ("gids", "store"))
        with phase("gather_local"):
            local_lid = gid.index_select(0, req.local_pos) - self.lo
            out.index_copy_(0, out_pos.index_select(0, req.local_pos), self._host_rows(local_lid))
        if self.world_size > 1:
            with phase("gather_remote"):   # serving the peers' requests, placing their answers
                answer = self._host_rows(req.got_id - self.lo)
                rows = all_to_all(answer, req.got_split, req.req_split, self.group, self._comm_device)
                out.index_copy_(0, out_pos.index_select(0, req.req_pos), rows)
        return int(req.local_pos.numel()), int(req.req_pos.numel())

    def _uva_rows(self, store: FeatureStore, *, fall_back: bool) -> UvaRows | None:
        if not isinstance(store, InMemoryFeatureStore):
            raise HostGatherError("host_gather=uva reads the feature rows in place, but this rank's rows stay in "
                                  "Zarr (over host_memory_budget_bytes): raise the budget or set host_gather=copy")
        try:
            return UvaRows(store.x, self.device)
        except UvaUnavailableError as err:
            if fall_back:   # auto falls back to copy; uva asked for by name fails
                self.host_gather_mode, self.host_gather_why = "copy", f"auto: UVA unavailable ({err})"
                return None
            raise HostGatherError(f"host_gather=uva: {err}; set host_gather=copy") from None

    def _host_rows(self, lid: Tensor) -> Tensor:
        """Own rows of ``lid`` from the host store, on the training device."""
        if self._uva is not None:
            return self._uva.gather(lid.to(self.device))
        lid_cpu = lid.to("cpu")
        if self.device.type != "cuda":
            return self.store.gather(lid_cpu)
        n = lid_cpu.numel()
        if self._staging_free is not None:
            self._staging_free.synchronize()
        if self._staging is None or self._staging.shape[0] < n:
            self._staging = torch.empty((max(n, 1024), self.num_features), dtype=self.store.dtype, pin_memory=True)
        staged = self.store.gather(lid_cpu, out=self._staging[:n])
        rows = staged.to(self.device, non_blocking=True)
        self._staging_free = torch.cuda.Event()
        self._staging_free.record()
        return rows
