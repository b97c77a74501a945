"""The built-in ``TaskDef`` s: ``NODE`` (a class per node, ``stages.train.tasks.node``) and ``LINK`` (whether an edge
of one type exists, ``stages.train.tasks.link``). Torch and the tasks' modules are imported where they are used: the
parameters read these objects without torch (``stages.train.tasks.base``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stages.train.tasks.base import HotnessItems, Task, TaskDef
from storage.errors import InputError

if TYPE_CHECKING:
    import torch

    from stages.train.params import Params
    from stages.train.rank.rank_data import RankData
    from storage.features import FeaturesArtifact
    from storage.partition import PartitionArtifact

LINK_NEEDS_SPLIT = ("task=link needs a graph split for it: the download stage must run with task=link too (set "
                    "task=link for the whole pipeline, not train.task alone)")


class NodeDef(TaskDef):
    """Node classification: the ``TaskDef`` defaults."""

    name = "node"

    def build(self, params: Params, data: RankData, generator: torch.Generator) -> Task:
        from stages.train.models.plugins import make_loss
        from stages.train.tasks.node import NodeClassification

        loss = params.resolved_loss
        return NodeClassification(data.label_of, data.split_gid, loss_fn=make_loss(loss), loss_name=loss,
                                  precision=params.precision)


class LinkDef(TaskDef):
    """Link prediction: the encoder outputs embeddings (``hidden`` wide) for a decoder; items are positive edges."""

    name = "link"
    default_loss = "bce"
    key_fields = ("task", "decoder", "num_negatives", "eval_negatives", "filter_negatives", "edges_per_epoch",
                  "eval_edges")
    hotness_key_fields = ("task", "num_negatives", "edges_per_epoch")
    reseeds_validation = True   # validation's negatives are drawn from a stream of their own

    def output_width(self, hidden: int, num_classes: int) -> int:
        return hidden

    def wrap_model(self, encoder: torch.nn.Module, params: Params) -> torch.nn.Module:
        from stages.train.models.plugins import make_decoder
        from stages.train.tasks.link import LinkModel

        return LinkModel(encoder, make_decoder(params.decoder, params.hidden, params.dropout), params.precision)

    def plugin_refs(self, params: Params) -> list[str]:
        return [params.decoder]

    def epoch_items(self, params: Params) -> int | None:
        return params.edges_per_epoch

    def batch_seeds(self, params: Params) -> int:
        # a positive's two ends and its negatives: (2 + k) a positive in training, 2 a positive plus the batch's
        # shared eval_negatives in evaluation (stages.train.tasks.link), whichever is more
        return max(params.batch_size * (2 + params.num_negatives), 2 * params.batch_size + params.eval_negatives)

    def summary_model(self, params: Params) -> dict[str, Any]:
        return {"decoder": params.decoder}

    def seed_types(self, partition: PartitionArtifact) -> tuple[str, ...]:
        # a positive's two ends; its negatives are nodes of the destination's type (NegativeDraws.for_link)
        from storage.schema import EdgeType

        if partition.link_edge_type is None:
            raise InputError(LINK_NEEDS_SPLIT)
        edge = EdgeType.from_key(partition.link_edge_type)
        return tuple(dict.fromkeys((edge.src, edge.dst)))

    def check_partition(self, partition: PartitionArtifact) -> None:
        if partition.link_edge_type is None:
            raise InputError(LINK_NEEDS_SPLIT)

    def build(self, params: Params, data: RankData, generator: torch.Generator) -> Task:
        import torch

        from stages.runtime.negatives import EdgeMembership, NegativeDraws
        from stages.runtime.seeds import STREAM_LINK_EVAL_EDGES, stream_seed
        from stages.runtime.typed_rows import TypedRows
        from stages.train.models.plugins import make_loss
        from stages.train.tasks.link import LinkPrediction
        from storage.graph import SPLITS

        link = data.link
        if link is None:
            raise InputError(LINK_NEEDS_SPLIT)
        typed = data.features if isinstance(data.features, TypedRows) else None
        draws = NegativeDraws.for_link(data.schema, data.schema.edge_types[link.edge_type].key,
                                       None if typed is None else typed.index)
        membership = (EdgeMembership(data.csr, data.bounds, link.edge_type, group=data.group)   # asked in task.batch
                      if params.filter_negatives else None)
        edge_gid = dict(link.edge_gid)
        if params.eval_edges is not None:   # a fixed sample (the same every epoch), each rank its share
            for split in ("valid", "test"):
                edges = edge_gid[split]
                stream = stream_seed(params.seed, data.rank, SPLITS.index(split), STREAM_LINK_EVAL_EDGES)
                keep = torch.randperm(edges.shape[1], generator=torch.Generator().manual_seed(stream))
                edge_gid[split] = edges[:, keep[:rank_share(params.eval_edges, edges.shape[1])].sort().values.to(
                    edges.device)]
        loss = params.resolved_loss
        return LinkPrediction(edge_gid, draws, generator, num_negatives=params.num_negatives,
                              eval_negatives=params.eval_negatives, membership=membership, loss_fn=make_loss(loss),
                              loss_name=loss)

    def hotness_items(self, params: Any, partition: PartitionArtifact, features: FeaturesArtifact, p: int
                      ) -> HotnessItems:
        """The positions of partition p's train positives (``link_seeds_of``) and its share of ``edges_per_epoch``
        (as the trainer's ``rank_share``)."""
        import torch

        from stages.runtime.negatives import NegativeDraws
        from stages.runtime.sampling.dist_sampler import proportional_share
        from stages.runtime.typed_rows import TypeIndex
        from stages.train.tasks.link import link_seeds_of

        key = partition.link_edge_type
        if key is None:
            raise InputError("hotness task=link needs a graph split for it: run the download stage with task=link "
                             "too (set task=link for the whole pipeline)")
        draws = NegativeDraws.for_link(partition.schema, key, TypeIndex(partition.range_table()))
        edge_gid = torch.from_numpy(partition.edge_split(p, "train"))
        limit = None
        if params.edges_per_epoch is not None:
            total = sum(sizes["train"] for sizes in partition.summary.edge_split_sizes)
            limit = proportional_share(params.edges_per_epoch, int(edge_gid.shape[1]), total)
        return torch.arange(edge_gid.shape[1]), link_seeds_of(edge_gid, draws, params.num_negatives), limit


def rank_share(total: int, mine: int) -> int:
    """This rank's part of ``total`` items, in proportion to its ``mine`` (a collective: one all-reduce)."""
    from stages.runtime.collectives import all_reduce_f64
    from stages.runtime.sampling.dist_sampler import proportional_share

    return proportional_share(total, mine, int(all_reduce_f64([float(mine)])[0]))


NODE, LINK = NodeDef(), LinkDef()
