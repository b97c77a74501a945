"""The small graph and the one-rank data that the block, training and graphed-step tests share: the sampler tests'
power-law graph with self loops and repeated edges (``messy_graph``), features for it, its true in-degrees, and a
``RankData`` holding a graph whole as one partition, built without artifacts (``one_rank_data``); PyG's own models
with a block model's weights (``pyg_twin``) and GCN on the whole graph (``full_graph_gcn``), the references."""

from __future__ import annotations

import numpy as np
import torch
from torch_geometric.nn.models import GAT, GCN, GraphSAGE

from stages.runtime.csr import LocalCSR
from tests._sampler_graphs import NUM_NODES, power_law_graph

SIZES = {"in_channels": 5, "hidden": 8, "out_channels": 3, "dropout": 0.5}   # tiny models
PYG = {"sage": GraphSAGE, "gcn": GCN, "gat": GAT}   # the block models' twins in PyG


def messy_graph(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The sampler tests' power-law graph plus self loops and repeated edges, which PyG's layers treat specially
    (GCN and GAT drop self loops and add their own; repeats count twice)."""
    indptr, indices = power_law_graph()
    dst_gid = np.repeat(np.arange(NUM_NODES), np.diff(indptr))
    rng = np.random.default_rng(seed)
    loops = rng.choice(NUM_NODES, 50, replace=False)
    repeats = rng.choice(indices.shape[0], 200, replace=False)
    src_gid = np.concatenate([indices, loops, indices[repeats]])
    dst_gid = np.concatenate([dst_gid, loops, dst_gid[repeats]])
    order = np.argsort(dst_gid, kind="stable")
    return np.concatenate([[0], np.cumsum(np.bincount(dst_gid, minlength=NUM_NODES))]), src_gid[order]


def features(seed: int = 0) -> torch.Tensor:
    return torch.randn(NUM_NODES, SIZES["in_channels"], generator=torch.Generator().manual_seed(seed))


def one_rank_data(graph: tuple[np.ndarray, np.ndarray] | None = None):
    """A ``RankData`` holding the whole power-law graph (or ``graph``, an incoming CSR of ``NUM_NODES`` nodes) as
    one partition, built without artifacts."""
    from stages.runtime.dist_features import DistFeatures
    from stages.runtime.feature_store import InMemoryFeatureStore
    from stages.train.rank.rank_data import RankData, degree_path
    from storage.schema import GraphSchema

    indptr, indices = power_law_graph() if graph is None else graph
    csr, bounds, cpu = LocalCSR.from_numpy(indptr, indices), np.array([0, NUM_NODES]), torch.device("cpu")
    return RankData(rank=0, world=1, device=cpu, bounds=bounds, csr=csr,
                    features=DistFeatures(InMemoryFeatureStore(features()), bounds), y_of_lid=torch.zeros(
                        NUM_NODES, dtype=torch.long), split_gid={s: torch.arange(NUM_NODES) for s in
                                                                 ("train", "valid", "test")},
                    num_features=SIZES["in_channels"], num_classes=SIZES["out_channels"], cache_policy="none",
                    schema=GraphSchema.homogeneous(NUM_NODES, SIZES["in_channels"], SIZES["out_channels"]),
                    setup={}, degrees=degree_path(csr, bounds, cpu))


def true_degrees(indptr: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.diff(indptr) + 1).float()


def pyg_twin(kind: str, model: torch.nn.Module, num_layers: int) -> torch.nn.Module:
    """PyG's own model class with the block model's weights: its state_dict keys load as they are."""
    extra = {"heads": 4} if kind == "gat" else {}
    twin = PYG[kind](SIZES["in_channels"], SIZES["hidden"], num_layers, SIZES["out_channels"],
                     dropout=model.dropout.p, **extra)
    twin.load_state_dict(model.state_dict(), strict=True)
    return twin


def graph_edge_index(indptr: np.ndarray, indices: np.ndarray) -> torch.Tensor:
    dst_gid = np.repeat(np.arange(indptr.shape[0] - 1), np.diff(indptr))
    return torch.from_numpy(np.stack([indices, dst_gid]))


def full_graph_gcn(model: torch.nn.Module, num_layers: int, x: torch.Tensor) -> torch.Tensor:
    """PyG's GCN on the whole graph (its own degrees), the block model's weights."""
    twin = pyg_twin("gcn", model, num_layers).eval()
    with torch.no_grad():
        return twin(x, graph_edge_index(*power_law_graph()))
