"""What one inference rank writes of its outputs, per task (``stages.infer.tasks`` picks one): a node classifier's
predicted classes and probabilities with its accuracy counts, or a link model's node embeddings as they are.

Imports torch: loaded by the ranks only (``stages.infer.tasks`` imports it where a rank asks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import zarr

from stages.infer.model_input import PIECE_ROWS
from storage.features import PartFeatures
from storage.graph import SPLITS
from storage.infer import write_part_link_embeddings, write_part_predictions
from storage.partition import PartitionArtifact


@dataclass(frozen=True)
class RankPart:
    """Where a rank's outputs go and what it knows of its partition: its part of the artifact being built, its
    first gid, the hidden layers it stored, and its partition and features (a classifier's figures need them)."""

    group: zarr.Group
    rank: int
    start_gid: int
    embedding_layers: Sequence[int]
    partition: PartitionArtifact
    part: PartFeatures


def write_classes(at: RankPart, out: torch.Tensor) -> dict[str, Any]:
    """A node classifier's rank: ``out`` (its logits, turned into probabilities in place) written as pred and
    prob; its class figures returned."""
    pred, prob = softmax_in_place(out)
    write_part_predictions(at.group, part=at.rank, start_gid=at.start_gid, pred=pred.numpy(), prob=prob.numpy(),
                           embedding_layers=at.embedding_layers)
    return class_figures(at.partition, at.part, at.rank, pred, int(out.shape[1]))


def write_embeddings(at: RankPart, out: torch.Tensor) -> dict[str, Any]:
    """A link model's rank: its outputs are the embeddings themselves (no softmax, no classes)."""
    write_part_link_embeddings(at.group, part=at.rank, start_gid=at.start_gid, emb=out.numpy(),
                               embedding_layers=at.embedding_layers)
    return {"embedding_width": int(out.shape[1])}


def softmax_in_place(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(argmax, probabilities)`` of ``logits`` [n, C], the probabilities written over the logits a piece of
    ``PIECE_ROWS`` rows at a time: at 14 M nodes and 172 classes a rank's logits are 4.8 GB (maybe memory-mapped),
    which a second whole-size softmax output would double."""
    pred = torch.empty(logits.shape[0], dtype=torch.long)
    for a in range(0, logits.shape[0], PIECE_ROWS):
        piece = logits[a:a + PIECE_ROWS]
        pred[a:a + PIECE_ROWS] = piece.argmax(dim=1)
        piece.copy_(torch.softmax(piece, dim=1))
    return pred, logits


def class_figures(partition: PartitionArtifact, part: PartFeatures, rank: int, pred: torch.Tensor,
                  num_classes: int) -> dict[str, Any]:
    """A node classifier's figures of rank ``rank``: correct predictions and labelled nodes per split, and the
    predicted and labelled counts per class."""
    y = torch.from_numpy(part.y)
    labelled_lid = labelled_lids(partition, rank)   # the classes predicted for the types the model was taught
    correct, total = {}, {}
    for split in SPLITS:
        lid = torch.from_numpy(part.split_lids[split])
        correct[split] = int((pred.index_select(0, lid) == y.index_select(0, lid)).sum())
        total[split] = int(lid.numel())
    return {"num_classes": num_classes, "correct": correct, "total": total,
            "pred_count": torch.bincount(pred.index_select(0, labelled_lid), minlength=num_classes).tolist(),
            "label_count": torch.bincount(y[y >= 0], minlength=num_classes).tolist()}


def labelled_lids(partition: PartitionArtifact, rank: int) -> torch.Tensor:
    """The lids of rank ``rank``'s nodes of the labelled node types (a homogeneous graph's: all of them)."""
    table = partition.range_table()
    lo = int(table.bounds[rank])
    labelled = {t.name for t in partition.schema.labelled}
    ranges = [table.type_range(rank, t) for t, node_type in enumerate(partition.schema.node_types)
              if node_type.name in labelled]
    return torch.cat([torch.arange(a - lo, b - lo, dtype=torch.long) for a, b in ranges]
                     or [torch.empty(0, dtype=torch.long)])
