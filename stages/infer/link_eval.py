"""A link model's official metrics, from the exact embeddings the infer stage wrote and the trained decoder.

The train stage selects its model with an MRR on sampled neighbourhoods against negatives shared by a batch
(``stages.train.tasks.link``); OGB evaluates on full-graph embeddings, which the infer build has. After the export,
the stage scores every valid and test positive of the partition's edge split (all of them, not train's
``eval_edges`` sample) with ``decoder(emb[src], emb[dst])`` (``stages.infer.score``: eval mode, float32), and its
negatives by the dataset's protocol (``PartitionArtifact.link_eval``):

- ``per-positive`` (ogbl-citation2): each positive against its own stored negatives (1 000), ranked by
  ``ogb.linkproppred.Evaluator('ogbl-citation2')``: MRR, Hits@1/3/10;
- ``shared`` (ogbl-collab): every positive against the whole stored negative set, Hits@50 by
  ``Evaluator('ogbl-collab')``;
- otherwise (synthetic-link, files, typed graphs): each positive against its own ``eval_negatives`` (train's)
  uniform destinations of the destination's node type (``stages.runtime.negatives.NegativeDraws``), drawn from one
  ``torch.Generator`` seeded with train's ``seed`` (valid's ``[E_valid, k]`` first, then test's), masked as train
  masks them with ``filter_negatives`` (real edges of the message-passing graph, and the positive's destination),
  ranked with ``stages.train.tasks.link_metrics.RankSums``: MRR, Hits@1/3/10 and the AUC of the compared pairs. Train's
  protocol, but exact embeddings and per-positive (not shared) negatives.

The uniform protocol ranks at most train's ``eval_edges`` positives a split (a fixed sample; all of them when
null): the default synthetic-link graph's 100 000 test positives against 100 negatives each are 10 M pairs, a
products-scale one's 6 M would be 600 M, and 10 000 give an MRR within ~0.004. OGB's datasets are ranked whole.

Memory: positives go ``chunk_pairs // k`` at a time; their negatives are scored block by block of the embedding
matrix (``storage.infer_artifact.EmbeddingBlocks``, one block in memory: the matrix is read once when it fits one
block, 1 GiB), ``PIECE_PAIRS`` pairs per decoder call; every chunk reads every block its negatives touch (uniform
draws: all of them), so chunks are as large as memory allows; OGB's per-positive lists and
``RankSums`` are summed chunk by chunk. Held at once: a split's positives and stored negatives (ogbl-citation2's
test: 86 000 x 1 000 int64, 0.7 GB) or drawn ones (``[E, eval_negatives]``), and a chunk's scores.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from stages.infer.score import PIECE_PAIRS, pair_scores
from stages.runtime.negatives import NegativeDraws
from stages.runtime.seeds import STREAM_INFER_EVAL_EDGES, STREAM_INFER_NEGATIVES, stream_seed
from stages.runtime.typed_rows import TypeIndex
from stages.train.params import Params as TrainParams
from stages.train.tasks.link_metrics import RankSums
from storage import ArtifactStore, Manifest
from storage.infer import OUT
from storage.infer_artifact import EmbeddingBlocks
from storage.partition import PartitionArtifact, PartitionBook
from storage.schema import EdgeType
from storage.zarr_io import open_array, open_group, open_subgroup

EVAL_SPLITS = ("valid", "test")
# negative pairs scored per chunk of positives: 32 M (~0.6 GiB of ids, block positions and scores). Every chunk
# reads every block its negatives touch: at 4 M (65 536 positives at most) ogbl-citation2's test split (86 000 x
# 1 000 negatives, 3 blocks of embeddings) took 21 chunks, ~126 block reads; at 32 M, 3 chunks
CHUNK_PAIRS = 1 << 25
OGB_EVALUATOR = {"per-positive": "ogbl-citation2", "shared": "ogbl-collab"}
OGB_METRICS = {"per-positive": ("mrr", "hits@1", "hits@3", "hits@10"), "shared": ("hits@50",)}
UNIFORM_METRICS = ("mrr", "hits@1", "hits@3", "hits@10", "auc")


@dataclass
class Split:
    """A split's positives in orig ids, and its negatives: per-positive destinations [E, K] (``mask``: those that
    count, None: all), or shared (src, dst) pairs [2, M]."""

    src: np.ndarray
    dst: np.ndarray
    neg: np.ndarray
    mask: np.ndarray | None = None


def positives_gid(partition: PartitionArtifact, split: str) -> np.ndarray:
    """int64 [2, E]: every part's ``split`` positives (src, dst gids), part after part."""
    return np.concatenate([partition.edge_split(p, split) for p in range(partition.num_partitions)], axis=1)


def stored_negatives_gid(partition: PartitionArtifact, split: str) -> np.ndarray:
    """The dataset's negatives in gids, aligned with ``positives_gid``: per-positive [E, K], shared [2, M]."""
    axis = 0 if partition.link_eval == "per-positive" else 1
    return np.concatenate([partition.edge_split_negatives(p, split) for p in range(partition.num_partitions)],
                          axis=axis)


def uniform_negatives_gid(partition: PartitionArtifact, sizes: dict[str, int], k: int,
                          seed: int) -> dict[str, np.ndarray]:
    """int64 [E_s, k] destination gids per split: valid's then test's, from one generator of ``seed``'s
    ``STREAM_INFER_NEGATIVES``."""
    generator = torch.Generator().manual_seed(stream_seed(seed, 0, 0, STREAM_INFER_NEGATIVES))
    key = partition.link_edge_type
    assert key is not None
    draws = NegativeDraws.for_link(partition.schema, key, TypeIndex(partition.range_table()))
    return {s: draws.draw((sizes[s], k), generator).numpy() for s in EVAL_SPLITS}


def real_edges(partition: PartitionArtifact, book: PartitionBook, src_gid: np.ndarray, neg_gid: np.ndarray
               ) -> np.ndarray:
    """bool [E, K]: whether ``src_gid[i] -> neg_gid[i, j]`` is an edge of link prediction's type in the
    message-passing graph, asked of each destination's part (one part's CSR in memory at a time)."""
    from stages.runtime.csr import LocalCSR
    from stages.runtime.negatives import has_local_edge

    key = partition.link_edge_type
    assert key is not None
    edge_type = partition.schema.edge_type_id(EdgeType.from_key(key))
    out = np.zeros(neg_gid.shape, dtype=bool)
    src = np.broadcast_to(src_gid[:, None], neg_gid.shape)
    owner = book.owner(neg_gid)
    for p in np.unique(owner).tolist():
        at = owner == p
        csr = LocalCSR.from_part(partition.csr(p, native=True))
        out[at] = has_local_edge(csr, torch.from_numpy(np.ascontiguousarray(src[at])),
                                 torch.from_numpy(neg_gid[at] - int(book.bounds[p])), edge_type).numpy()
    return out


def sample_columns(pairs: np.ndarray, limit: int, seed: int, split: int) -> np.ndarray:
    """At most ``limit`` of the columns of ``pairs``, a fixed random sample in their order."""
    if pairs.shape[1] <= limit:
        return pairs
    stream = stream_seed(seed, 0, split, STREAM_INFER_EVAL_EDGES)
    keep = np.sort(np.random.default_rng(stream).choice(pairs.shape[1], limit, replace=False))
    return pairs[:, keep]


def eval_splits(partition: PartitionArtifact, book: PartitionBook, train: TrainParams) -> dict[str, Split]:
    """The valid and test positives and negatives of the protocol (module docstring), in orig ids."""
    orig = book.orig_of_gid
    pos = {s: positives_gid(partition, s) for s in EVAL_SPLITS}
    if partition.link_eval is not None:
        return {s: Split(orig[pos[s][0]], orig[pos[s][1]], orig[stored_negatives_gid(partition, s)])
                for s in EVAL_SPLITS}
    if train.eval_edges is not None:   # a fixed sample (module docstring)
        pos = {s: sample_columns(p, train.eval_edges, train.seed, EVAL_SPLITS.index(s)) for s, p in pos.items()}
    sizes = {s: int(pos[s].shape[1]) for s in EVAL_SPLITS}
    negs = uniform_negatives_gid(partition, sizes, train.eval_negatives, train.seed)
    out = {}
    for s in EVAL_SPLITS:
        mask = None
        if train.filter_negatives:   # as train filters: neither a real edge nor the positive's own destination
            mask = ~real_edges(partition, book, pos[s][0], negs[s]) & (negs[s] != pos[s][1][:, None])
        out[s] = Split(orig[pos[s][0]], orig[pos[s][1]], orig[negs[s]], mask)
    return out


def scores_against(blocks: EmbeddingBlocks, decoder: torch.nn.Module, h_src: Tensor, neg: np.ndarray,
                   piece: int = PIECE_PAIRS) -> Tensor:
    """float32 [C, K]: ``decoder(h_src[i], emb[neg[i, j]])``, block by block of the embeddings."""
    k = neg.shape[1]
    flat = neg.reshape(-1)
    out = torch.empty(flat.shape[0], dtype=torch.float32)
    which = blocks.block_of(flat)
    for b in np.unique(which).tolist():
        at = np.flatnonzero(which == b)
        rows, lo = blocks.block(b), b * blocks.block_rows
        for a in range(0, at.size, piece):
            pos = at[a:a + piece]
            h_dst = torch.from_numpy(rows[flat[pos] - lo])
            with torch.inference_mode():
                out[torch.from_numpy(pos)] = decoder(h_src.index_select(0, torch.from_numpy(pos // k)),
                                                     h_dst).to(torch.float32)
    return out.view(neg.shape)


def per_positive_scores(blocks: EmbeddingBlocks, decoder: torch.nn.Module, split: Split,
                        chunk_pairs: int = CHUNK_PAIRS) -> Iterator[tuple[slice, Tensor, Tensor]]:
    """``(positives' slice, their scores [C], their negatives' [C, K])``, a chunk of positives at a time."""
    e, k = split.neg.shape
    step = max(1, chunk_pairs // max(k, 1))
    for a in range(0, e, step):
        b = min(a + step, e)
        h = torch.from_numpy(blocks.gather(np.concatenate([split.src[a:b], split.dst[a:b]])))
        with torch.inference_mode():
            pos = decoder(h[:b - a], h[b - a:]).to(torch.float32)
        yield slice(a, b), pos, scores_against(blocks, decoder, h[:b - a], split.neg[a:b])


def _ogb_per_positive(blocks: EmbeddingBlocks, decoder: torch.nn.Module, split: Split,
                      chunk_pairs: int) -> dict[str, float | None]:
    from ogb.linkproppred import Evaluator

    evaluator = Evaluator(OGB_EVALUATOR["per-positive"])
    sums, count = dict.fromkeys(OGB_METRICS["per-positive"], 0.0), 0
    for _, pos, neg in per_positive_scores(blocks, decoder, split, chunk_pairs):
        # torch tensors: ogb 1.3.6's numpy MRR path is broken
        got = evaluator.eval({"y_pred_pos": pos, "y_pred_neg": neg})
        for name in sums:
            sums[name] += float(got[f"{name}_list"].double().sum())
        count += int(pos.numel())
    return {name: (v / count if count else None) for name, v in sums.items()}


def _ogb_shared(blocks: EmbeddingBlocks, decoder: torch.nn.Module, split: Split) -> dict[str, float | None]:
    from ogb.linkproppred import Evaluator

    if split.src.size == 0:
        return dict.fromkeys(OGB_METRICS["shared"])
    pos = pair_scores(blocks.gather, decoder, split.src, split.dst)
    neg = pair_scores(blocks.gather, decoder, split.neg[0], split.neg[1])
    got = Evaluator(OGB_EVALUATOR["shared"]).eval({"y_pred_pos": torch.from_numpy(pos),
                                                   "y_pred_neg": torch.from_numpy(neg)})
    return {name: float(got[name]) for name in OGB_METRICS["shared"]}


def _uniform(blocks: EmbeddingBlocks, decoder: torch.nn.Module, split: Split,
             chunk_pairs: int) -> dict[str, float | None]:
    sums = RankSums()
    for at, pos, neg in per_positive_scores(blocks, decoder, split, chunk_pairs):
        mask = None if split.mask is None else torch.from_numpy(split.mask[at])
        sums = sums + RankSums.of(pos, neg, mask)
    return sums.means()


def protocol(link_eval: str | None, train: TrainParams) -> str:
    if link_eval == "per-positive":
        return "each positive against its own stored negatives (OGB's), Evaluator('ogbl-citation2')"
    if link_eval == "shared":
        return "every positive against the shared stored negatives (OGB's), Evaluator('ogbl-collab')"
    filtered = ", filtered (no real edge, not the positive's destination)" if train.filter_negatives else ""
    sample = "" if train.eval_edges is None else f" (at most {train.eval_edges:,} positives a split, a fixed sample)"
    return (f"each positive{sample} against its own {train.eval_negatives} uniform negatives of the destination's "
            f"node type (seed {train.seed}){filtered}, OGB's rank (ties half)")


def headline_metric(link_eval: str | None) -> str:
    return "hits@50" if link_eval == "shared" else "mrr"


def link_eval_metrics(partition: PartitionArtifact, book: PartitionBook, blocks: EmbeddingBlocks,
                      decoder: torch.nn.Module, train: TrainParams, chunk_pairs: int = CHUNK_PAIRS) -> dict[str, Any]:
    """``{"valid": {metric: value, "positives": E, "negatives": N}, "test": {...}, "protocol", "evaluator",
    "negatives", "headline", "seconds", "block_reads"}`` of the link model whose embeddings ``blocks`` holds
    (``negatives`` of a split: the negative pairs scored that count, over all its positives)."""
    start = time.perf_counter()
    link_eval = partition.link_eval
    out: dict[str, Any] = {"protocol": protocol(link_eval, train),
                           "evaluator": OGB_EVALUATOR.get(link_eval or "", "RankSums"),
                           "negatives": link_eval or "uniform", "headline": headline_metric(link_eval)}
    for name, split in eval_splits(partition, book, train).items():
        if link_eval == "shared":
            values = _ogb_shared(blocks, decoder, split)
        elif link_eval == "per-positive":
            values = _ogb_per_positive(blocks, decoder, split, chunk_pairs)
        else:
            values = _uniform(blocks, decoder, split, chunk_pairs)
        negatives = (int(split.mask.sum()) if split.mask is not None else
                     int(split.neg.shape[1]) if link_eval == "shared" else int(split.neg.size))
        out[name] = {**values, "positives": int(split.src.shape[0]), "negatives": negatives}
    out["seconds"] = round(time.perf_counter() - start, 3)
    out["block_reads"] = blocks.reads
    return out


def evaluate(store: ArtifactStore, trained: Manifest, partition: PartitionArtifact, book: PartitionBook,
             nodes_url: str) -> dict[str, Any]:
    """The stage's link metrics of the build being written (``nodes_url``: its ``nodes.zarr``, exported)."""
    from stages.infer.params import train_params
    from stages.infer.score import load_decoder

    blocks = EmbeddingBlocks(open_array(open_subgroup(open_group(nodes_url), "emb"), OUT))
    return link_eval_metrics(partition, book, blocks, load_decoder(store, trained), train_params(trained))


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The flat tracker scalars of ``link_eval_metrics``: ``infer/link_<split>_<metric>`` (``@`` spelt ``_at_``)."""
    return {f"infer/link_{s}_{name.replace('@', '_at_')}": float(v) for s in EVAL_SPLITS
            for name, v in metrics[s].items() if name not in ("positives", "negatives") and v is not None}
