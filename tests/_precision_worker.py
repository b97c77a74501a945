"""The ranks' side of ``test_feature_precision`` (kept free of pytest: every spawned rank imports this module)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from stages.runtime.collectives import all_to_all
from stages.runtime.dist_features import DistFeatures
from stages.runtime.feature_store import open_part_store
from storage import ArtifactStore
from storage.features import FeaturesArtifact
from storage.partition import PartitionArtifact
from tests._rank import run_gloo_rank

WORLD_SIZE = 2
TIMEOUT_S = 120
# every storage dtype a feature store can hold, and int16 (which gloo refuses as float8)
WIRE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.bool,
               torch.float8_e4m3fn, torch.int16)


def wire_rows(rank: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per dtype: (rows sent, rows received) by ``all_to_all``: rank r sends rows [r*10 + k] of 3 columns, 2 to
    each rank."""
    out = {}
    for dtype in WIRE_DTYPES:
        sent = (torch.arange(12, dtype=torch.float32).view(4, 3) + 20 * rank).to(dtype)
        out[str(dtype)] = (sent, all_to_all(sent, [2, 2], [2, 2], None, torch.device("cpu")))
    return out


def run_rank(rank: int, root: str, keys: dict[str, dict[str, str]]) -> dict:
    """For each built feature artifact (by dtype): every gid's rows, gathered in reverse order (so about half are
    remote), decoded; the counters; the stored row's bytes."""
    store = ArtifactStore(root)
    out: dict = {"wire": wire_rows(rank)}
    for dtype, key in keys.items():
        partition = PartitionArtifact(store, store.load("partition", key["partition"]))
        features = FeaturesArtifact(store, store.load("features", key["features"]))
        bounds = partition.bounds()
        rows = DistFeatures(open_part_store(features, rank), bounds)
        gid = torch.arange(int(bounds[-1]) - 1, -1, -1)[rank::WORLD_SIZE]
        stored = rows.gather(gid)
        out[dtype] = {"gid": gid, "stored_dtype": stored.dtype, "decoded": rows.decode(stored),
                      "counters": rows.reset_counters().as_dict(), "row_bytes": rows.store.row_bytes}
    dist.barrier()
    return out


def worker(rank: int, init_file: str, out_dir: str, root: str, keys: dict[str, dict[str, str]]) -> None:
    run_gloo_rank(rank, init_file, out_dir, WORLD_SIZE, TIMEOUT_S, lambda: run_rank(rank, root, keys))
