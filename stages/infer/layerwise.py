"""Layer-wise inference of a rank's own nodes: every layer for all of them, in bounded chunks (docs/design.md §6).

For each layer l = 0..L-1 of the model, every rank computes layer l's output for all of its nodes, chunk by chunk.
Models whose per-layer step takes its targets anywhere among the sources (``supports_offset_targets``: the built-in
GraphSAGE and GCN) read every chunk's sources straight from the layer's whole matrix, the rank's rows then its halo
fetched once per layer (``stages.infer.halo``: half the time at 300 k nodes, no per-chunk exchange). Any other block
model (GAT, whose conv adds self loops by position; plug-ins) gathers each chunk's sources::

    chunk   consecutive own lids [a, b) whose in-edges + 1 each add up to at most ``chunk_edges`` (a node above
            that is a chunk of its own)
    n_id    the chunk's gids, then its distinct in-neighbours outside it: the block's sources, targets first
    rows    the previous layer's rows of n_id: own ones from memory, remote ones from their owners with the feature
            exchange (``DistFeatures.fetch_rows``: 3 ``all_to_all_single``; layer 0 reads the feature store, layer
            l + 1 an ``InMemoryFeatureStore`` over layer l's rows of this rank's nodes)
    out     the model's own step for one layer on that block (``block_step``: GraphSAGE, GCN with the true degrees,
            GAT, as in training), then its activation and norm in eval mode (no dropout)

Every fetch is a collective, so each rank runs the same number of chunks per layer (the largest rank's count,
agreed once; a rank past its last chunk runs empty ones). Exact inference takes every in-edge; with ``fanouts`` a
layer takes a uniform sample of each node's in-neighbours instead (layer l samples ``fanouts[L-1-l]``: the output
layer ``fanouts[0]``, as the seeds' first hop in training), drawn once per node and layer, per block of
``SAMPLE_BLOCK`` lids from the block's own stream: the same draws whatever ``chunk_edges``.

Memory of a rank on the gather path (n_p own nodes, widths C_0 = F features, C_1 .. C_L = classes, P ranks,
E = ``chunk_edges``; the matrices path's in ``stages.infer.halo``):

- ``x``: n_p * F * itemsize during layer 0 (the feature store: in RAM, or read chunk-wise from Zarr past the memory
  budget), released after it;
- the layers: n_p * (C_l + C_{l+1}) * 4 bytes, the previous layer's rows and the one being computed;
- a chunk: at most E source rows, n_id <= E (E * C_l * 4 bytes, twice with the exchange's wire copy), the answers to
  the peers' requests (each asks at most E rows: (P - 1) * E * C_l * 4), and the block's CSR (~40 * E bytes);
- the outputs (probabilities, stored embeddings) go to Zarr as each layer completes.

Products-scale example, 2 ranks (n_p = 1.2 M, F = 100 float32, hidden 256, 47 classes), E = 2^18: x 0.48 GB,
layers 2 * 1.2 GB, a chunk at most 3 * 0.27 GB + 10 MB: bounded by E, not by the graph.

Plain models (``forward(x, edge_index)``, no per-layer step): ``Inference._run_whole`` computes each chunk's outputs
on its full L-hop in-neighbourhood (``DistNeighborSampler`` with fanout -1 on every hop, or ``fanouts``), the whole
model at once. Exact for message passing along in-edges (every node within L-1 hops of the chunk has all its
in-edges; the L-hop frontier only gives features), but the neighbourhood, not the chunk, bounds its memory: give a
model the block protocol (``stages.train.models.model``) for bounded memory. Embeddings come from the input of the
model's ``convs[l + 1]`` (a forward pre-hook), when it has such a list.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from stages.infer.chunks import (
    SAMPLE_BLOCK,
    ChunkEdges,
    chunk_edge_ids,
    chunk_edges_of,
    chunk_sources,
    equal_chunk_count,
    node_indptr,
    plan_chunks,
)
from stages.infer.halo import Halo, chunk_rows, device_chunk_edges, extended_degrees, layer0_matrix, placement
from stages.infer.layer_steps import LayerDone, LayerStats, has_layer_steps, layer_step, layer_width
from stages.infer.matrices import MatrixSpace
from stages.runtime.csr import LocalCSR
from stages.runtime.dist_features import DistFeatures
from stages.runtime.feature_store import InMemoryFeatureStore
from stages.runtime.sampling.dist_sampler import DistNeighborSampler
from stages.runtime.seeds import STREAM_INFER_SAMPLER, stream_seed
from stages.runtime.typed_batch import set_types
from stages.train.models.blocks import BatchGraph, Block
from stages.train.models.model import needs_degrees, seed_logits
from stages.train.models.model_contract import capabilities
from stages.train.rank.loader import with_degrees

# rows per halo piece at most this many bytes: the exchange holds a few copies of a piece (the owner's answer, the
# wire, the received rows), ~256 MiB a rank; at 14 M nodes a piece of chunk_edges = 2^22 rows x 64 columns was
# 1 GiB and pushed a rank to 11.8 GiB (benchmarks/RESULTS.md "[2/5] Growth")
HALO_PIECE_BYTES = 64 << 20
_CPU = torch.device("cpu")

@dataclass
class Inference:
    """One rank's inference of all its nodes (module docstring). ``degrees``: in-degree + 1 of any gid (GCN's
    normalisation, ``stages.train.rank.rank_data.degree_path``); ``fanouts``: None for exact; ``node_type_of``: the
    node types of gids on a typed graph (the per-chunk gather's blocks carry them)."""

    model: torch.nn.Module
    num_layers: int
    csr: LocalCSR
    bounds: np.ndarray
    degrees: DistFeatures | None
    chunk_edges: int
    fanouts: Sequence[int] | None = None
    seed: int = 0
    node_type_of: Callable[[Tensor], Tensor] | None = None   # a typed graph's gid -> node type (HGT's blocks)
    # an edge-aware model's edge features: float32 [e_p, D], the rank's own edges' rows by elid; a target's in-edges
    # are all its owner's, so every layer reads them locally
    edge_attr: Tensor | None = None
    space: MatrixSpace = field(default_factory=MatrixSpace)   # RAM or memory-mapped layer matrices
    # where the layer steps run (the model is there); the matrices and the exchange stay in host memory
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    # bytes the matrices path may place on ``device`` (a CUDA rank: the free memory's margin); None: the steps read
    # the host matrix itself (a CPU rank). Tests set it on the CPU to run both placements there.
    device_budget: int | None = None
    stats: list[LayerStats] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        if self.device.type != "cpu" and self.device_budget is None:
            raise ValueError(f"inference on {self.device} needs a device_budget (the host matrices cannot be read "
                             f"there in place)")
        if self.fanouts is not None and len(self.fanouts) != self.num_layers:
            raise ValueError(f"{len(self.fanouts)} fanouts for a {self.num_layers}-layer model")
        self.observed_layers: list[int] = []   # the hidden layers handed to on_hidden
        self._writing: list[Callable[[], Any]] = []   # on_hidden's writes still under way
        self.chunks = plan_chunks(node_indptr(self.csr), self.chunk_edges, 1 if self.fanouts is None else SAMPLE_BLOCK)
        self.num_chunks = equal_chunk_count(len(self.chunks))
        self.layerwise = has_layer_steps(self.model)
        # from whole layer matrices (stages.infer.halo) when the model's steps take targets anywhere in them
        self.from_matrices = self.layerwise and capabilities(self.model).supports_offset_targets

    @property
    def path(self) -> str:
        if self.from_matrices:
            return "layer-wise (layer matrices and halo)"
        return "layer-wise (per-chunk gather)" if self.layerwise else "whole model per chunk (L-hop neighbourhood)"

    def _chunk(self, c: int) -> tuple[int, int]:
        n = self.csr.num_nodes
        return self.chunks[c] if c < len(self.chunks) else (n, n)

    def _generator(self, layer: int, block: int = 0) -> torch.Generator:
        """The generator of one sampling block of one layer: its draws are the same whatever the chunking."""
        return torch.Generator().manual_seed(stream_seed(self.seed, self.rank, (layer << 32) + block,
                                                         STREAM_INFER_SAMPLER))

    def _fanout(self, layer: int) -> int:
        return -1 if self.fanouts is None else int(self.fanouts[self.num_layers - 1 - layer])

    def _chunk_edges(self, layer: int, a: int, b: int, on: torch.device = _CPU
                     ) -> tuple[ChunkEdges, Tensor | None]:
        """The chunk's in-edges (``chunk_edges_of``, on ``on``) and, for an edge-aware model, their features (on
        the host)."""
        def block_generator(block: int) -> torch.Generator:
            return self._generator(layer, block)
        if self.edge_attr is None:
            return chunk_edges_of(self.csr, a, b, self._fanout(layer), block_generator, on), None
        row_pos, edge_idx, edge_type = chunk_edge_ids(self.csr, a, b, self._fanout(layer), block_generator)
        return ((row_pos.to(on), self.csr.gids(edge_idx).to(on), None if edge_type is None else edge_type.to(on)),
                self.edge_attr.index_select(0, edge_idx))

    def run(self, open_features: Callable[[], DistFeatures], keep: Sequence[int], on_hidden: LayerDone) -> Tensor:
        """The logits of every own node [n_p, C]. ``open_features()``: the feature rows of any gid (the rank's
        feature path; called once, so that the layer-wise paths release it after layer 0); ``on_hidden(l, rows)``
        receives each hidden layer in ``keep`` when it is complete (to be written; ``LayerDone``); every write it
        began is done when this returns."""
        try:
            if self.from_matrices:
                return self._run_from_matrices(open_features, keep, on_hidden)
            if self.layerwise:
                return self._run_layerwise(open_features(), keep, on_hidden)
            return self._run_whole(open_features(), keep, on_hidden)
        finally:
            self._written()

    def _hidden_done(self, layer: int, rows: Tensor, keep: Sequence[int], on_hidden: LayerDone) -> None:
        if layer < self.num_layers - 1 and layer in keep:
            self._hand(on_hidden, layer, rows)
            self.observed_layers.append(layer)

    def _hand(self, on_hidden: LayerDone, layer: int, rows: Tensor) -> None:
        """``rows`` to ``on_hidden``, keeping the wait of a write it began (``_written``)."""
        if (writing := on_hidden(layer, rows)) is not None:
            self._writing.append(writing)

    def _written(self) -> None:
        """Wait for on_hidden's writes (raising a write's error): before the rows they read are released."""
        while self._writing:
            self._writing.pop(0)()

    # ---- the layer-wise path from whole layer matrices (stages.infer.halo) ----------------------------------------
    def _run_from_matrices(self, open_features: Callable[[], DistFeatures], keep: Sequence[int],
                           on_hidden: LayerDone) -> Tensor:
        model: Any = self.model
        halo = Halo.of(self.csr)
        # one float a matrix row: small beside the matrix, so it goes to the device whole
        deg = extended_degrees(self.degrees, halo).to(self.device) if self.degrees is not None else None
        features = open_features()   # only here: x is released once layer 0's matrix holds its rows
        start = time.perf_counter()
        # x in RAM counts against the rank's budget until the matrix has copied it; x kept in Zarr (past the
        # budget) is read in row pieces, and its halo rows are the peers' sorted gathers from their Zarr stores
        x_bytes = features.store.num_rows * features.store.row_bytes if features.store.kind == "memory" else 0
        self.space.charge(x_bytes)
        matrix, first_remote = layer0_matrix(features, halo, self._piece_rows(features.store.row_bytes),
                                             self.space)
        del features
        self.space.free(x_bytes)
        for layer in range(self.num_layers):
            stats = LayerStats(layer, remote_bytes=first_remote)
            if layer > 0:
                start = time.perf_counter()
                stats.remote_bytes = halo.fill(matrix, halo.own_source(matrix, self.bounds),
                                               self._piece_rows(matrix.shape[1] * matrix.element_size()))
            stats.remote_rows, stats.source_rows = halo.size, halo.rows
            out = self._matrix_layer(model, layer, matrix, halo, deg, stats)
            self._written()
            self.space.release(matrix)
            matrix = out
            stats.seconds = round(time.perf_counter() - start, 3)
            self.stats.append(stats)
            self._hidden_done(layer, matrix[:halo.n], keep, on_hidden)
        return matrix

    def _piece_rows(self, row_bytes: int) -> int:
        """Rows per halo piece: ``chunk_edges``, and at most ``HALO_PIECE_BYTES`` of rows."""
        return max(1, min(self.chunk_edges, HALO_PIECE_BYTES // max(row_bytes, 1)))

    def _placement(self, model: Any, layer: int, matrix: Tensor, halo: Halo) -> str:
        """Where layer ``layer``'s steps read their rows (``halo.placement``)."""
        if self.device_budget is None:
            return "host"
        return placement(matrix, halo, layer_width(model, layer), self.chunk_edges, self.device_budget)

    def _matrix_layer(self, model: Any, layer: int, matrix: Tensor, halo: Halo, deg: Tensor | None,
                      stats: LayerStats) -> Tensor:
        """Layer ``layer`` of every own node from ``matrix`` (own rows, then the halo's): the next layer's matrix,
        its halo rows still to fetch (none for the last layer). No collective."""
        last = layer == self.num_layers - 1
        rows = halo.n if last else halo.rows
        stats.placement = self._placement(model, layer, matrix, halo)
        whole = (matrix if stats.placement == "host" else      # None: chunk by chunk
                 matrix.to(self.device) if stats.placement == "device" else None)
        out: Tensor | None = None
        staged: Tensor | None = None   # the outputs where they are computed, before they reach ``out``
        # the matrix on the device: each chunk's edge positions are computed there too (chunk_edges_of); else on
        # the host, where the chunks placement gathers the rows they name
        on = self.device if stats.placement == "device" else _CPU
        columns = Halo(halo.lo, halo.n, halo.gid.to(on))
        for a, b in self._layer_chunks(model, layer, matrix, halo, stats.placement):
            (row_pos, nbr_gid, edge_type), edge_attr = self._chunk_edges(layer, a, b, on)
            src_pos, chunk_deg, dst_start = columns.columns(nbr_gid), deg, a
            if whole is None:
                src_rows, src_pos, chunk_deg = chunk_rows(matrix, src_pos, a, b, deg, self.device)
                dst_start = 0
            else:
                src_rows = whole
            edge_index = torch.stack([src_pos, row_pos.to(torch.long)]).to(self.device)
            # chunk_edges_of's edges come grouped by target: BatchGraph skips its check, a host synchronisation
            graph = BatchGraph(edge_index, src_rows.shape[0], b - a, chunk_deg, dst_start=dst_start,
                               edge_type=self._on_device(edge_type), num_edge_types=self.csr.num_edge_types,
                               edge_attr=self._on_device(edge_attr), by_target=True)
            block = Block(num_src=src_rows.shape[0], num_dst=b - a, num_edges=int(src_pos.numel()), graph=graph)
            h = layer_step(model, layer, src_rows, block, last)
            if out is None:
                out = self.space.empty(rows, h.shape[1], h.dtype)
                staged = out if stats.placement != "device" else torch.empty((halo.n, h.shape[1]), dtype=h.dtype,
                                                                             device=self.device)
            assert staged is not None
            staged[a:b] = h
            stats.chunks += 1
            stats.edges += int(src_pos.numel())
        if out is None:   # a rank without nodes: it still joins the peers' halo exchanges, rows of the same dtype
            return self.space.empty(rows, layer_width(model, layer), matrix.dtype)
        if staged is not out:
            assert staged is not None
            out[:halo.n].copy_(staged)   # one copy back a layer; the halo rows come from the peers
        return out

    def _layer_chunks(self, model: Any, layer: int, matrix: Tensor, halo: Halo, where: str
                      ) -> list[tuple[int, int]]:
        """The rank's chunks for one layer from the matrices: a ``device``-placed layer's as large as the device
        budget allows (``halo.device_chunk_edges``; no collective on this path, so ranks may differ) where its
        edges are a slice of the CSR computed on the device (exact, one edge type, no edge features:
        ``chunk_edges_of``); else the planned ones of ``chunk_edges``, which also bounds the host's temporaries of
        edges drawn there."""
        on_device = self.fanouts is None and self.csr.num_edge_types == 1 and self.edge_attr is None
        if where != "device" or not on_device:
            return self.chunks
        assert self.device_budget is not None
        bound = device_chunk_edges(matrix, halo, layer_width(model, layer), self.chunk_edges, self.device_budget)
        return plan_chunks(node_indptr(self.csr), bound)

    @property
    def _gathered(self) -> str:
        """The placement of the paths that gather each chunk's rows on the host: in place on a CPU rank."""
        return "host" if self.device.type == "cpu" else "chunks"

    def _on_device(self, t: Tensor | None) -> Tensor | None:
        return None if t is None else t.to(self.device)
    # ---- the layer-wise path with a per-chunk gather of the sources' rows (any block model) ------------------------
    def _run_layerwise(self, features: DistFeatures, keep: Sequence[int], on_hidden: LayerDone) -> Tensor:
        model: Any = self.model
        source = features
        del features   # layer 0's source only
        h = torch.empty(0)
        for layer in range(self.num_layers):
            previous, h = h, self._layer(model, layer, source)
            self._written()
            self.space.release(previous)   # after the layer that read it: the two are held at once
            self._hidden_done(layer, h, keep, on_hidden)
            if layer < self.num_layers - 1:
                source = DistFeatures(InMemoryFeatureStore(h), self.bounds)   # the next layer reads these rows
        return h

    def _layer(self, model: Any, layer: int, source: DistFeatures) -> Tensor:
        stats = LayerStats(layer)
        start = time.perf_counter()
        lo, last = self.csr.start_gid, layer == self.num_layers - 1
        row_bytes = source.store.row_bytes
        out: Tensor | None = None
        for c in range(self.num_chunks):
            a, b = self._chunk(c)
            (row_pos, nbr_gid, edge_type), edge_attr = self._chunk_edges(layer, a, b)
            n_id, edge_index = chunk_sources(lo + a, b - a, row_pos, nbr_gid)
            rows = source.decode(source.fetch_rows(n_id)).to(self.device)                  # collective
            deg = self.degrees.fetch_rows(n_id).view(-1) if self.degrees is not None else None   # collective
            graph = BatchGraph(edge_index.to(self.device), n_id.numel(), b - a, self._on_device(deg),
                               edge_type=self._on_device(edge_type), num_edge_types=self.csr.num_edge_types,
                               node_type=None if self.node_type_of is None else self._on_device(
                                   self.node_type_of(n_id)),
                               edge_attr=self._on_device(edge_attr))
            block = Block(num_src=n_id.numel(), num_dst=b - a, num_edges=int(nbr_gid.numel()), graph=graph)
            h = layer_step(model, layer, rows, block, last)
            if out is None:
                out = self.space.empty(self.csr.num_nodes, h.shape[1], h.dtype)
            out[a:b] = h
            remote = int(((n_id[b - a:] < lo) | (n_id[b - a:] >= lo + self.csr.num_nodes)).sum())
            stats.chunks += int(b > a)
            stats.edges += int(nbr_gid.numel())
            stats.source_rows += int(n_id.numel())
            stats.remote_rows += remote
            stats.remote_bytes += remote * row_bytes
        assert out is not None   # num_chunks >= 1
        stats.placement = self._gathered
        stats.seconds = round(time.perf_counter() - start, 3)
        self.stats.append(stats)
        return out

    # ---- plain models: the whole model on each chunk's L-hop neighbourhood ----------------------------------------
    def _run_whole(self, features: DistFeatures, keep: Sequence[int], on_hidden: LayerDone) -> Tensor:
        model: Any = self.model
        fanouts = [-1] * self.num_layers if self.fanouts is None else list(self.fanouts)
        sampler = DistNeighborSampler(self.csr, self.bounds, fanouts, generator=self._generator(0))
        if self.edge_attr is not None:   # batches carry the edges' features, as in training
            sampler.with_edges, sampler.edge_attr = True, self.edge_attr
        attach = needs_degrees(model)
        convs = getattr(model, "convs", None)
        hooked = [layer for layer in keep if isinstance(convs, torch.nn.ModuleList) and layer + 1 < len(convs)]
        captured: dict[int, Tensor] = {}
        targets = [0]

        def hook(layer: int) -> Callable[..., None]:
            def pre(_module: Any, args: tuple[Any, ...]) -> None:
                x = args[0][1] if isinstance(args[0], tuple) else args[0]
                captured[layer] = x[:targets[0]].detach()
            return pre

        handles = [convs[layer + 1].register_forward_pre_hook(hook(layer)) for layer in hooked] if convs else []
        stats = LayerStats(-1, placement=self._gathered)
        start = time.perf_counter()
        lo, n = self.csr.start_gid, self.csr.num_nodes
        logits: Tensor | None = None
        hidden: dict[int, Tensor] = {}
        try:
            for c in range(self.num_chunks):
                a, b = self._chunk(c)
                batch = sampler.sample(torch.arange(lo + a, lo + b, dtype=torch.long))   # collective
                if self.node_type_of is not None:   # as the training loader types a batch
                    set_types(batch, self.node_type_of(batch.n_id), self.csr.num_edge_types)
                if attach and self.degrees is not None:
                    with_degrees(batch, self.degrees)                                    # collective
                x = features.decode(features.fetch_rows(batch.n_id)).to(self.device)   # collective
                batch = batch.to(self.device)
                targets[0] = b - a
                captured.clear()
                out = seed_logits(model, x, batch)
                if logits is None:
                    logits = torch.empty((n, out.shape[1]), dtype=out.dtype)
                logits[a:b] = out
                for layer, rows in captured.items():
                    if layer not in hidden:
                        hidden[layer] = torch.empty((n, rows.shape[1]), dtype=rows.dtype)
                    hidden[layer][a:b] = rows
                remote = int(((batch.n_id < lo) | (batch.n_id >= lo + n)).sum())
                stats.chunks += int(b > a)
                stats.edges += int(batch.edge_index.shape[1])
                stats.source_rows += int(batch.n_id.numel())
                stats.remote_rows += remote
                stats.remote_bytes += remote * features.store.row_bytes
        finally:
            for handle in handles:
                handle.remove()
        stats.seconds = round(time.perf_counter() - start, 3)
        self.stats.append(stats)
        for layer in sorted(hidden):
            self._hand(on_hidden, layer, hidden[layer])
        self.observed_layers = sorted(hidden)
        assert logits is not None
        return logits
