"""One training epoch and one evaluation pass over sampled batches, shared by the ``Trainer`` and the benchmark.

Nothing here knows about ranks: the caller hands in the seed batches (equal counts on every rank for DDP) and the
three callables of the seam below (``stages.train.loader.NodeLoader`` holds a rank's: its distributed sampler, the
feature path of cache, store and remote owners, its labels); sums come back for it to all-reduce (``stats``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.data import Data

from stages.train.model import seed_logits

Sample = Callable[[Tensor], Data]          # seed gids -> sampled batch (n_id gids, seeds first)
GatherRows = Callable[[Tensor], Tensor]    # n_id gids -> [len, F] feature rows on the training device
LabelOf = Callable[[Tensor], Tensor]       # seed gids -> int64 labels on the training device
OnBatch = Callable[[int], None]            # called with the batch index before each batch


@dataclass
class EpochSums:
    """Sums over the real (non-padding) batches of one rank, to all-reduce across ranks."""

    loss_sum: float = 0.0
    correct: int = 0
    seeds: int = 0
    batches: int = 0          # all batches run, padding included
    sampled_edges: int = 0    # all batches
    wall_s: float = 0.0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_epoch(model: torch.nn.Module, optimizer: torch.optim.Optimizer, seed_batches: Iterable[Tensor],
                sample: Sample, gather_rows: GatherRows, label_of: LabelOf, *, num_real_batches: int,
                device: torch.device, on_batch: OnBatch | None = None) -> EpochSums:
    """Train on every batch of ``seed_batches``; loss/accuracy count only the first ``num_real_batches``.

    Padding batches (recycled seeds, or empty ones) still take an optimiser step: under DDP every rank must run
    the same number of backward passes, whose gradient all-reduces pair up across ranks. An empty batch gives a
    zero loss whose backward still reaches every parameter (zero gradients), so its rank joins each all-reduce.
    """
    model.train()
    sums = EpochSums()
    start = time.perf_counter()
    for b, seed_gid in enumerate(seed_batches):
        if on_batch is not None:
            on_batch(b)
        batch = sample(seed_gid)
        x = gather_rows(batch.n_id)
        if not x.is_floating_point():
            x = x.float()
        y = label_of(seed_gid)
        logits = seed_logits(model, x, batch)
        loss = F.cross_entropy(logits, y, reduction="sum") / max(int(y.numel()), 1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        sums.batches += 1
        sums.sampled_edges += int(batch.edge_index.shape[1])
        if b < num_real_batches:
            sums.loss_sum += float(loss.detach()) * y.numel()
            sums.correct += int((logits.detach().argmax(1) == y).sum())
            sums.seeds += int(y.numel())
    _sync(device)
    sums.wall_s = time.perf_counter() - start
    return sums


@torch.no_grad()
def predict(model: torch.nn.Module, seed_batches: Iterable[Tensor], sample: Sample, gather_rows: GatherRows,
            device: torch.device) -> tuple[Tensor, Tensor]:
    """``(seed_gid, y_pred)`` over all batches, in batch order. Empty batches still sample and gather (those are
    collectives in the distributed runtime) but skip the model, which has no collective outside DDP's backward."""
    model.eval()
    seeds, preds = [], []
    for seed_gid in seed_batches:
        batch = sample(seed_gid)
        x = gather_rows(batch.n_id)
        if seed_gid.numel() == 0:
            continue
        if not x.is_floating_point():
            x = x.float()
        seeds.append(seed_gid.to(device))
        preds.append(seed_logits(model, x, batch).argmax(1))
    if not seeds:
        empty = torch.empty(0, dtype=torch.long, device=device)
        return empty, empty
    return torch.cat(seeds), torch.cat(preds)


def ogb_accuracy_counts(input_dict: dict[str, Tensor]) -> tuple[int, int]:
    """``(correct, total)`` for the OGB node-property Evaluator's input format ``{"y_true": [n, 1], "y_pred":
    [n, 1]}``: accuracy is their ratio, and counts (unlike ratios) can be summed across ranks."""
    y_true, y_pred = input_dict["y_true"], input_dict["y_pred"]
    if y_true.shape != y_pred.shape or y_true.dim() != 2:
        raise ValueError(f"y_true {tuple(y_true.shape)} and y_pred {tuple(y_pred.shape)} must both be [n, 1]")
    return int((y_true == y_pred).sum()), int(y_true.shape[0])
