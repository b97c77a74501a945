"""What the graphed-step and static-sampler tests share: a stand-in for a captured CUDA graph (``Rerun``), a lone CPU
rank's trainer on a small graph (``lone_trainer``), and a graph whose every degree is under the fanouts, so that
sampling draws nothing (``low_degree_graph``). Used by tests/test_graphed.py, tests/test_graphed_sampling.py,
tests/test_static_sampler.py and the CUDA tests of tests/test_gpu_graphed.py."""

from __future__ import annotations

import numpy as np
import torch

from tests._block_graphs import one_rank_data


class Rerun:
    """A stand-in for a captured graph: each replay runs the step again on the buffers as they are now, which is
    what a CUDA graph's replay computes; counts its replays."""

    replays = 0

    def __init__(self, step, stream=None):
        assert stream is None, "a CPU rank has no capture stream"
        self.step = step

    def replay(self):
        type(self).replays += 1
        return self.step()


def lone_trainer(tmp_path, name, graph=None, **params):
    """A lone CPU rank's trainer on the power-law graph (or ``graph``), SAGE, fanouts (3, 2) unless ``params``
    say otherwise."""
    from stages.train.params import Params
    from stages.train.rank.prefetch import producer_group
    from stages.train.rank.trainer import Trainer
    from stages.train.spec import TrainSpec

    data = one_rank_data(graph)
    data.group = producer_group(params.get("prefetch", 0))
    # labels that a model can get wrong: a step that kept an earlier batch's labels changes the correct count
    data.y_of_lid = torch.randint(0, 3, (data.csr.num_nodes,), generator=torch.Generator().manual_seed(5))
    spec = TrainSpec(artifacts=str(tmp_path), key=name, partition_key="p", features_key="f", hotness_key="h",
                     params={}, checkpoint_dir=str(tmp_path / name / "ckpt"), result_dir=str(tmp_path / name))
    params = {"fanouts": (3, 2), **params}
    return Trainer(spec, Params(model="sage", hidden=8, batch_size=64, seed=3, dropout=0.0, **params), data)


def low_degree_graph(num_nodes: int = 1500, max_degree: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Each node gets 0..max_degree distinct in-neighbours (no self loop): fanouts of max_degree draw nothing."""
    rng = np.random.default_rng(seed)
    deg = rng.integers(0, max_degree + 1, num_nodes)
    indices = [np.setdiff1d(rng.choice(num_nodes, d + 1, replace=False), [v])[:d] for v, d in enumerate(deg)]
    indptr = np.concatenate([[0], np.cumsum([len(i) for i in indices])]).astype(np.int64)
    return indptr, np.concatenate(indices).astype(np.int64)
