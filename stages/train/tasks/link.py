"""Link prediction behind the Task seam ([6/7], docs/history.md): is there an edge ``src -> dst`` of one type?

A rank's items are its positive edges (those whose destination it owns, ``storage.partition``), numbered across
the splits (train first, then valid, then test) so that a batch of items names its edges whatever the split: these
numbers are link items (docs/design.md §4), columns of ``LinkPrediction.edge_gid``, neither egids nor elids. A
batch of B positives becomes ONE sample, as a node batch is (``stages.runtime.link_batch``: the distinct ends of
the positives and of their negatives are the seeds, one set of collectives), and the pairs become positions among
the seeds. Negatives corrupt each positive's destination with uniform draws of the destination's node type anywhere in
the graph (``stages.runtime.negatives``): ``num_negatives`` per training positive; ``eval_negatives`` per
valid/test positive, which is ranked against them (OGB's ogbl-citation2 protocol: MRR, Hits@K), drawn once per
batch and shared by its positives (uniform draws either way; sampling 2B + k seeds instead of (2 + k)B is what
makes k = 100 affordable: ~50x fewer seeds at B = 1024). With
``filter_negatives`` a draw that equals its positive's destination or is a real edge of the message-passing graph
(asked of its owner: 4 all-to-alls a batch) counts in no loss and no rank, instead of being redrawn: masking keeps
the batch's shape and every rank's collectives in step.

``LinkModel`` is the node model (its last layer outputs the embedding, ``hidden`` wide) and the decoder as one
module, so that DDP sees one forward and one backward over both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch_geometric.data import Data

from stages.runtime.link_batch import LinkSeeds, link_seeds
from stages.runtime.negatives import EdgeMembership, NegativeDraws
from stages.train.models.model import seed_logits
from stages.train.tasks.base import SeedsOf, checked_loss
from stages.train.tasks.link_metrics import RankSums
from storage.graph import SPLITS

LinkLossFn = Callable[[Tensor, Tensor], Tensor]   # (positive scores [B], negative scores [n]) -> 0-d


@dataclass(frozen=True)
class LinkTarget:
    """A batch's pairs as seed positions, and which of its negatives count (None: all)."""

    seeds: LinkSeeds
    neg_mask: Tensor | None = None   # [B, k] bool


@dataclass(frozen=True)
class LinkScores:
    pos: Tensor   # [B] logits of the positives
    neg: Tensor   # [B, k] of each positive's negatives


class LinkModel(torch.nn.Module):
    """``encoder``: a node model (any of ``stages.train.models.model``'s or a plug-in) whose outputs are the embeddings;
    ``decoder``: ``(h_src, h_dst) -> scores``."""

    def __init__(self, encoder: torch.nn.Module, decoder: torch.nn.Module, precision: str = "float32") -> None:
        super().__init__()
        self.encoder, self.decoder, self.precision = encoder, decoder, precision

    def forward(self, x: Tensor | dict[str, Tensor], batch: Data, src_pos: Tensor, dst_pos: Tensor,
                neg_dst_pos: Tensor) -> tuple[Tensor, Tensor]:
        """``(positive scores [B], negative scores [B, k])``; the positions index the batch's seeds."""
        h = seed_logits(self.encoder, x, batch, precision=self.precision)
        h_src = h.index_select(0, src_pos)
        pos = self.decoder(h_src, h.index_select(0, dst_pos))
        k = neg_dst_pos.shape[1]
        h_neg = h.index_select(0, neg_dst_pos.reshape(-1)).view(-1, k, h.shape[1])
        neg = self.decoder(h_src.unsqueeze(1).expand(-1, k, -1), h_neg)
        return pos, neg


class LinkPrediction:
    name: str = "link prediction"
    metric_name: str = "mrr"
    sum_names: tuple[str, ...] = RankSums.names()
    pads_labels: bool = False   # the target is edges and their negatives, not a label per seed
    seeds_are_items: bool = False   # a batch's seeds are its edges' endpoints and negatives

    def __init__(self, edge_gid: Mapping[str, Tensor], draws: NegativeDraws, generator: torch.Generator, *,
                 num_negatives: int, eval_negatives: int, membership: EdgeMembership | None = None,
                 loss_fn: LinkLossFn, loss_name: str = "bce") -> None:
        """``edge_gid``: this rank's positives per split, int64 [2, E] (src, dst) gids on the training device;
        ``generator``: the stream negatives are drawn from (the sampler's: reseeded every epoch and for the test
        pass); ``membership``: set to filter negatives that are real edges."""
        self.edge_gid = torch.cat([edge_gid[s] for s in SPLITS], dim=1)
        sizes = [int(edge_gid[s].shape[1]) for s in SPLITS]
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        self.item_range = {s: (a, a + n) for s, a, n in zip(SPLITS, starts, sizes)}
        self.draws, self.generator, self.membership = draws, generator, membership
        self.num_negatives, self.eval_negatives = num_negatives, eval_negatives
        self.loss_fn, self.loss_name = loss_fn, loss_name
        self.evaluator = (f"MRR of each positive against {eval_negatives} uniform negatives (OGB's ogbl-citation2 "
                          f"rank, ties half; shared in a batch){', filtered' if membership is not None else ''}")

    def seeds(self, split: str) -> Tensor:
        """The split's link items: its columns of ``edge_gid``."""
        a, b = self.item_range[split]
        return torch.arange(a, b, device=self.edge_gid.device)

    def batch(self, item: Tensor, *, training: bool) -> tuple[Tensor, LinkTarget]:
        src_gid, dst_gid = self.edge_gid[:, item]
        b = int(item.numel())
        if training:   # k per positive: 3B seeds to sample at the default k = 1
            k = self.num_negatives
            neg_dst_gid = self.draws.draw((b, k), self.generator).to(src_gid.device)
        else:   # one set shared by the batch: 2B + k seeds rather than (2 + k)B, each positive still against k
            k = self.eval_negatives
            neg_dst_gid = self.draws.draw((k,), self.generator).to(src_gid.device).expand(b, k)
        mask = None
        if self.membership is not None:   # every rank asks, empty batches too: a collective
            real = self.membership.contains(src_gid.repeat_interleave(k), neg_dst_gid.reshape(-1)).view(-1, k)
            mask = ~real & (neg_dst_gid != dst_gid.unsqueeze(1))
        seeds = link_seeds(src_gid, dst_gid, neg_dst_gid)
        return seeds.seed_gid, LinkTarget(seeds, mask)

    def size(self, target: LinkTarget) -> int:
        return int(target.seeds.src_pos.numel())

    def forward(self, model: torch.nn.Module, x: Tensor | dict[str, Tensor], batch: Data,
                target: LinkTarget) -> LinkScores:
        s = target.seeds
        pos, neg = model(x, batch, s.src_pos, s.dst_pos, s.neg_dst_pos)
        return LinkScores(pos, neg)

    def loss(self, out: LinkScores, target: LinkTarget) -> Tensor:
        if out.pos.numel() == 0:   # a padding rank's empty batch: 0 that still reaches every parameter (DDP)
            return (out.pos.sum() + out.neg.sum()) * 0.0
        neg = out.neg if target.neg_mask is None else out.neg[target.neg_mask]
        return checked_loss(self.loss_fn(out.pos, neg.reshape(-1)), self.loss_name)

    def metric_sums(self, out: LinkScores, target: LinkTarget) -> list[float]:
        return RankSums.of(out.pos, out.neg, target.neg_mask).values()

    def metric(self, sums: Sequence[float]) -> float:
        mrr = self.metrics(sums)["mrr"]
        return float("nan") if mrr is None else mrr

    def metrics(self, sums: Sequence[float]) -> dict[str, float | None]:
        return RankSums.from_values(sums).means()


def link_seeds_of(edge_gid: Tensor, draws: NegativeDraws, num_negatives: int) -> SeedsOf:
    """The ``SeedsOf`` of link prediction's training batches: items are positions in ``edge_gid`` ([2, E] (src,
    dst) positives); each batch samples around its positives' ends and ``num_negatives`` uniform negative
    destinations per positive (drawn as ``LinkPrediction`` draws them): what hotness pre-samples under task=link."""
    def seeds_of(item: Tensor, generator: torch.Generator) -> Tensor:
        src_gid, dst_gid = edge_gid[:, item]
        return link_seeds(src_gid, dst_gid, draws.draw((int(item.numel()), num_negatives), generator)).seed_gid
    return seeds_of
