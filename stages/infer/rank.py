"""One inference rank's work: open partition r's data, rebuild the trained model, run ``layerwise.Inference`` over
its nodes, write its outputs (``storage.infer``) and return its figures (rank 0 gathers them for the stage).

Reads through the typed handles of ``storage`` only, like ``stages.train.rank_data``. ID spaces: ``gid`` global,
``lid = gid - lo`` with ``lo = bounds[rank]``.
"""

from __future__ import annotations

import io
from typing import Any

import torch

from stages.infer.layerwise import Inference
from stages.infer.params import Params
from stages.infer.spec import InferSpec
from stages.meter import measure
from stages.runtime.dist_features import DistFeatures
from stages.runtime.feature_store import open_feature_store
from stages.runtime.sampler import LocalCSR
from stages.train.model import needs_degrees
from stages.train.params import Params as TrainParams
from stages.train.plugins import make_model
from stages.train.rank_data import degree_path
from stages.train.spec import check_world_size
from storage import ArtifactStore, Manifest
from storage.features import FeaturesArtifact
from storage.graph import SPLITS
from storage.infer import open_part_outputs, write_part_embedding, write_part_predictions
from storage.partition import PartitionArtifact
from storage.train import MODEL


def train_params(train: Manifest) -> TrainParams:
    """The train stage's Params from its manifest (which records the key params, plus plug-in code digests)."""
    return TrainParams(**{k: v for k, v in train.params.items() if k in TrainParams.model_fields})


def load_model(store: ArtifactStore, train: Manifest, num_features: int, num_classes: int) -> torch.nn.Module:
    """The trained model (the published, best-validation weights) in eval mode, built as the trainer built it."""
    params = train_params(train)
    model = make_model(params.model, params.model_kwargs, in_channels=num_features, hidden=params.hidden,
                       out_channels=num_classes, num_layers=params.num_layers, dropout=params.dropout,
                       heads=params.gat_heads)
    state = torch.load(io.BytesIO(store.read_bytes("train", train.key, MODEL)), map_location="cpu",
                       weights_only=True)
    model.load_state_dict(state)
    return model.eval()


def hidden_layers_to_keep(num_layers: int, which: str) -> list[int]:
    """The hidden layers whose rows are stored: the last (``L - 2``) or all; none for a 1-layer model."""
    hidden = list(range(num_layers - 1))
    return hidden if which == "all" else hidden[-1:]


def feature_path(features: FeaturesArtifact, rank: int, bounds: Any, local_world: int,
                 setup: dict[str, Any]) -> DistFeatures:
    """Rank ``rank``'s feature rows of any gid (its ``x`` in RAM within the host's memory budget, else read from
    Zarr chunk-wise; no cache: each row is read once per layer-0 chunk that needs it); ``setup`` records the kind."""
    x_store = open_feature_store(features.x(rank), ranks_on_host=local_world)
    setup["feature_store"] = x_store.kind
    return DistFeatures(x_store, bounds)


def infer_rank(spec: InferSpec, rank: int, world: int, local_world: int) -> dict[str, Any]:
    """Rank ``rank``'s share of the job: its outputs written, its figures returned. Collective (every rank)."""
    params = Params(**spec.params)
    store = ArtifactStore(spec.artifacts)
    partition = PartitionArtifact(store, store.load("partition", spec.partition_key))
    features = FeaturesArtifact(store, store.load("features", spec.features_key))
    trained = store.load("train", spec.train_key)
    bounds = partition.bounds()
    check_world_size(world, int(bounds.shape[0]) - 1)
    lo = int(bounds[rank])
    with measure() as cost:
        csr = LocalCSR.from_part(partition.csr(rank))
        part = features.part(rank, load_x=False)
        model = load_model(store, trained, features.num_features, features.num_classes)
        num_layers = train_params(trained).num_layers
        degrees = degree_path(csr, bounds, torch.device("cpu")) if needs_degrees(model) else None
        engine = Inference(model, num_layers, csr, bounds, degrees, params.chunk_edges, params.fanouts, params.seed)
        group = open_part_outputs(spec.out_url, rank)

        def write_hidden(layer: int, rows: torch.Tensor) -> None:
            write_part_embedding(group, layer, rows.numpy())

        setup: dict[str, Any] = {}
        with torch.inference_mode():   # the feature path is opened in the engine: nothing here keeps x alive
            logits = engine.run(lambda: feature_path(features, rank, bounds, local_world, setup),
                                hidden_layers_to_keep(num_layers, params.embeddings), write_hidden)
            prob = torch.softmax(logits, dim=1)
            pred = logits.argmax(dim=1)
        write_part_predictions(group, part=rank, start_gid=lo, pred=pred.numpy(), prob=prob.numpy(),
                               embedding_layers=engine.observed_layers)
    y = torch.from_numpy(part.y)
    num_classes = int(prob.shape[1])
    correct, total = {}, {}
    for split in SPLITS:
        lid = torch.from_numpy(part.split_lids[split])
        correct[split] = int((pred.index_select(0, lid) == y.index_select(0, lid)).sum())
        total[split] = int(lid.numel())
    return {"rank": rank, "nodes": csr.num_nodes, "edges": int(csr.indices.numel()),
            "feature_store": setup["feature_store"], "path": engine.path, "chunks": len(engine.chunks),
            "chunk_rounds": engine.num_chunks, "embedding_layers": engine.observed_layers, "num_classes": num_classes,
            "layers": [vars(s) for s in engine.stats], "correct": correct, "total": total,
            "pred_count": torch.bincount(pred, minlength=num_classes).tolist(),
            "label_count": torch.bincount(y[y >= 0], minlength=num_classes).tolist(),
            "wall_s": cost["wall_s"], "peak_rss_bytes": cost["peak_rss_bytes"],
            "start_rss_bytes": cost["start_rss_bytes"], "peak_rss_source": cost["peak_rss_source"]}
