"""Small graphs built through the real stages up to train, and the single-process full-graph reference the infer
stage's outputs are checked against (kept free of pytest: the benchmark imports it too)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from stages.infer.rank import train_params
from stages.train.models.plugins import edge_dim_for, make_model, resolve_model
from storage import ArtifactStore, Manifest
from storage.features import FeaturesArtifact
from storage.graph import GraphArtifact
from storage.train import MODEL
from tests._train_pipeline import build_without_prefect

# 3 000 nodes, 4 classes: a training epoch and an inference job take a second or two on one core per rank
GRAPH: dict[str, Any] = {"num_nodes": 3000, "avg_degree": 10.0, "num_features": 16, "num_classes": 4, "seed": 1,
                         "split": (0.3, 0.1, 0.6)}


def build_to_train(root: str, num_partitions: int, *, model: str = "sage", fanouts: tuple[int, ...] = (5, 5),
                   graph: dict[str, Any] | None = None, **train: Any) -> tuple[ArtifactStore, dict[str, Manifest]]:
    """download → partition → features → hotness → train (2 short epochs, one thread per rank)."""
    values = {f"download.{k}": v for k, v in (graph or GRAPH).items()}
    values.update({"artifacts": root, "num_partitions": num_partitions, "fanouts": fanouts, "batch_size": 256,
                   "model": model, "hidden": 16, "epochs": 2, "lr": 0.01, "threads_per_rank": 1,
                   "timeout_s": 300.0, "peer_timeout_s": 60.0, "until": "train",
                   **{f"train.{k}": v for k, v in train.items()}})
    return build_without_prefect(values)


@dataclass
class Reference:
    """The trained model run once on the whole graph, in orig ids, in eval mode (PyG's own forward)."""

    prob: np.ndarray                   # [N, C]
    logits: np.ndarray                 # [N, C]
    hidden: dict[int, np.ndarray]      # hidden layer l -> the input of convs[l + 1], [N, H]
    y: np.ndarray
    splits: dict[str, np.ndarray]


def full_graph_reference(store: ArtifactStore, manifests: dict[str, Manifest]) -> Reference:
    graph = GraphArtifact(store, manifests["download"]).read()
    features = FeaturesArtifact(store, manifests["features"])
    trained = manifests["train"]
    params = train_params(trained)
    # an edge-aware model on a graph with edge features runs with them (PyG's edge_attr, aligned with edge_index)
    edge_dim = edge_dim_for(resolve_model(params.model, typed=False), graph.num_edge_features, params.edge_features)
    model = make_model(params.model, params.model_kwargs, in_channels=features.num_features, hidden=params.hidden,
                       out_channels=features.num_classes, num_layers=params.num_layers, dropout=params.dropout,
                       heads=params.gat_heads, edge_dim=edge_dim)
    model.load_state_dict(torch.load(io.BytesIO(store.read_bytes("train", trained.key, MODEL)), weights_only=True))
    model.eval()
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(graph.indptr))
    edge_index = torch.from_numpy(np.stack([graph.indices, dst]).astype(np.int64))
    hidden: dict[int, np.ndarray] = {}
    convs: Any = model.convs

    def capture(layer: int) -> Any:
        def pre(_module: Any, args: tuple[Any, ...]) -> None:
            hidden[layer] = args[0].detach().numpy().copy()
        return pre

    handles = [convs[layer + 1].register_forward_pre_hook(capture(layer)) for layer in range(len(convs) - 1)]
    assert graph.x is not None
    with torch.no_grad():
        edges = {"edge_attr": torch.from_numpy(graph.edge_attr)} if edge_dim and graph.edge_attr is not None else {}
        logits = model(torch.from_numpy(graph.x).float(), edge_index, **edges)
    for handle in handles:
        handle.remove()
    return Reference(prob=torch.softmax(logits, 1).numpy(), logits=logits.numpy(), hidden=hidden, y=graph.y,
                     splits=graph.splits)


def typed_full_graph_reference(store: ArtifactStore, manifests: dict[str, Manifest]) -> Reference:
    """A typed graph's reference: the trained ``HeteroModel`` on the whole graph in PyG's ``to_homogeneous`` layout
    (orig ids, node types type after type, each edge's type), featureless types fed ``model.pt``'s embedding
    tables as they are stored (the dataset's order of each type). ``hidden``: layer 0 of bodies with ``convs``."""
    from stages.infer.rank import load_model
    from storage.partition import PartitionArtifact

    graph = GraphArtifact(store, manifests["download"]).read()
    partition = PartitionArtifact(store, manifests["partition"])
    model, tables = load_model(store, manifests["train"], partition=partition,
                               features=FeaturesArtifact(store, manifests["features"]))
    schema = graph.schema
    r = schema.num_edge_types
    row = np.repeat(np.arange(graph.num_nodes * r), np.diff(graph.indptr))
    edge_index = torch.from_numpy(np.stack([graph.indices, row // r]).astype(np.int64))
    node_type = torch.from_numpy(np.repeat(np.arange(len(schema.node_types)), np.diff(schema.orig_offsets())))
    x_dict = {t.name: torch.from_numpy(graph.features[t.name]).float() if t.name in graph.features
              else tables[t.name] for t in schema.node_types}
    hidden: dict[int, np.ndarray] = {}
    body: Any = model.body
    handles = []
    if isinstance(getattr(body, "convs", None), torch.nn.ModuleList) and isinstance(body.convs[1], torch.nn.Module) \
            and not isinstance(body.convs[1], torch.nn.ModuleList):
        def pre(_module: Any, args: tuple[Any, ...]) -> None:
            hidden[0] = args[0].detach().numpy().copy()
        handles.append(body.convs[1].register_forward_pre_hook(pre))
    with torch.no_grad():
        logits = model(x_dict, node_type=node_type, edge_index=edge_index,
                       edge_type=torch.from_numpy((row % r).astype(np.int64)))
    for handle in handles:
        handle.remove()
    return Reference(prob=torch.softmax(logits, 1).numpy(), logits=logits.numpy(), hidden=hidden, y=graph.y,
                     splits=graph.splits)
