"""One rank of the 2-process layer-wise inference test (tests/test_infer_layerwise.py): partition ``rank`` of a graph
split by ``bounds`` (a rank may own no node), inference of its nodes through the layer matrices and halo."""

from __future__ import annotations

import sys
import traceback
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from stages.infer.layerwise import Inference
from stages.runtime.csr import LocalCSR
from stages.runtime.dist_features import DistFeatures
from stages.runtime.feature_store import InMemoryFeatureStore
from stages.train.models.model import build_model, needs_degrees
from stages.train.rank.rank_data import degree_path

WORLD_SIZE = 2
TIMEOUT_S = 60


def worker(rank: int, init_file: str, out_dir: str, graph: tuple[np.ndarray, np.ndarray], bounds: list[int],
           kind: str, weights: dict, x: torch.Tensor, fanouts: tuple[int, ...] | None) -> None:
    try:
        torch.set_num_threads(1)   # two ranks on a 2-core box
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD_SIZE,
                                timeout=timedelta(seconds=TIMEOUT_S))
        indptr, indices = graph
        lo, hi = bounds[rank], bounds[rank + 1]
        csr = LocalCSR.from_numpy(indptr[lo:hi + 1] - indptr[lo], indices[indptr[lo]:indptr[hi]], lo)
        model = build_model(kind, in_channels=x.shape[1], hidden=16, out_channels=3, num_layers=2, dropout=0.0)
        model.load_state_dict(weights)
        model.eval()
        degrees = degree_path(csr, np.array(bounds), torch.device("cpu")) if needs_degrees(model) else None
        result = {}
        for name, from_matrices in (("matrices", True), ("gather", False)):   # the same draws on both paths
            engine = Inference(model, 2, csr, np.array(bounds), degrees, chunk_edges=200, fanouts=fanouts, seed=3)
            engine.from_matrices = from_matrices
            with torch.inference_mode():
                result[name] = engine.run(lambda: DistFeatures(InMemoryFeatureStore(x[lo:hi]), bounds), [],
                                          lambda _l, _r: None)
            if from_matrices:
                result["path"], result["halo_rows"] = engine.path, [s.remote_rows for s in engine.stats]
        torch.save(result, Path(out_dir, f"{rank}.pt"))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - any failure of a rank is written for the parent test to show
        Path(out_dir, f"{rank}.err").write_text(traceback.format_exc())
        sys.exit(1)
