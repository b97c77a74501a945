"""The ranks' side of ``test_link_train``'s uneven-edges run (kept free of pytest: every spawned rank imports it).

Rank 0 holds all of its partition's positive edges, rank 1 none: the epoch's batches, the filtered negatives'
exchange (a collective inside ``LinkPrediction.batch``), the sampling, the feature exchange and DDP's all-reduces
must still pair up, or the run hangs (``spawn_ranks`` fails it on its time limit).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from stages.runtime.csr import LocalCSR
from stages.runtime.dist_features import DistFeatures
from stages.runtime.feature_store import open_feature_store
from stages.runtime.negatives import EdgeMembership, NegativeDraws
from stages.runtime.sampling.dist_sampler import DistNeighborSampler, equal_batch_count, iter_equal_seed_batches
from stages.train.models.plugins import make_decoder, make_model
from stages.train.rank.loop import eval_sums, train_epoch
from stages.train.tasks.link import LinkModel, LinkPrediction
from stages.train.tasks.link_decoders import link_loss
from storage import ArtifactStore
from storage.features import FeaturesArtifact
from storage.graph import SPLITS
from storage.partition import PartitionArtifact
from tests._rank import run_gloo_rank

WORLD_SIZE = 2
TIMEOUT_S = 120
BATCH_SIZE = 64


def run_rank(rank: int, root: str, keys: dict[str, str]) -> dict:
    store = ArtifactStore(root)
    partition = PartitionArtifact(store, store.load("partition", keys["partition"]))
    features = FeaturesArtifact(store, store.load("features", keys["features"]))
    bounds = partition.bounds()
    csr = LocalCSR.from_part(partition.csr(rank))
    rows = DistFeatures(open_feature_store(features.x(rank)), bounds)
    gen = torch.Generator().manual_seed(rank)
    sampler = DistNeighborSampler(csr, bounds, [5, 5], generator=gen)
    edges = {s: torch.from_numpy(partition.edge_split(rank, s)) for s in SPLITS}
    if rank == 1:   # uneven: this rank owns no positive at all
        edges = {s: e[:, :0] for s, e in edges.items()}
    task = LinkPrediction(edges, NegativeDraws(int(bounds[-1])), gen, num_negatives=2, eval_negatives=20,
                          membership=EdgeMembership(csr, bounds), loss_fn=link_loss)
    torch.manual_seed(0)
    encoder = make_model("sage", {}, in_channels=features.num_features, hidden=16, out_channels=16, num_layers=2,
                         dropout=0.0, heads=1)
    model = LinkModel(encoder, make_decoder("mlp", 16, 0.0))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=0.01)
    batches = iter_equal_seed_batches(task.seeds("train"), BATCH_SIZE, generator=gen)
    num_real = -(-int(task.seeds("train").numel()) // BATCH_SIZE)
    sums = train_epoch(ddp, optimizer, batches, sampler.sample, rows.gather, task, num_real_batches=num_real,
                       device=torch.device("cpu"))
    valid = task.seeds("valid")
    count = equal_batch_count(int(valid.numel()), BATCH_SIZE)   # rank 1 runs rank 0's count of empty batches
    eval_batches = [valid[i * BATCH_SIZE:(i + 1) * BATCH_SIZE] for i in range(count)]
    valid_sums = eval_sums(model, eval_batches, sampler.sample, rows.gather, task)
    dist.barrier()
    return {"sums": sums, "valid": valid_sums, "weights": [p.detach().clone() for p in model.parameters()]}


def worker(rank: int, init_file: str, out_dir: str, root: str, keys: dict[str, str]) -> None:
    run_gloo_rank(rank, init_file, out_dir, WORLD_SIZE, TIMEOUT_S, lambda: run_rank(rank, root, keys))
