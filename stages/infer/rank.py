"""One inference rank's work: open partition r's data, rebuild the trained model, run ``layerwise.Inference`` over
its nodes, write its outputs (``storage.infer``) and return its figures (rank 0 gathers them for the stage).

Reads through the typed handles of ``storage`` only, like ``stages.train.rank.rank_data``. ID spaces: ``gid`` global,
``lid = gid - lo`` with ``lo = bounds[rank]``. What the model is and what the rank writes of its outputs is the
task's (``stages.infer.tasks``): a node classifier's classes, or a link model's encoder and its node embeddings.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from stages.infer.layerwise import Inference
from stages.infer.matrices import MatrixSpace
from stages.infer.model_input import model_input
from stages.infer.params import Params, train_params
from stages.infer.rank_outputs import RankPart
from stages.infer.spec import InferSpec
from stages.infer.tasks import infer_task
from stages.meter import measure
from stages.runtime.csr import LocalCSR
from stages.runtime.feature_store import host_budget
from stages.runtime.typed_rows import TypeIndex
from stages.train.models.encoder import build_encoder, encoder_edge_dim
from stages.train.models.model import needs_degrees
from stages.train.rank.cache_budget import FIXED_RESERVE_BYTES, FREE_MARGIN, free_device_bytes
from stages.train.rank.rank_data import degree_path
from stages.train.rank.typed_data import typed_in_channels
from stages.train.spec import check_world_size
from storage import ArtifactStore, Manifest
from storage.features import FeaturesArtifact
from storage.infer import open_part_outputs, write_part_embedding
from storage.partition import PartitionArtifact
from storage.train import MODEL, split_model_state


def load_model(store: ArtifactStore, train: Manifest, *, partition: PartitionArtifact, features: FeaturesArtifact
               ) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The trained model (the published, best-validation weights) in eval mode, built as the trainer built it, and
    on a typed graph the learnt embedding tables of its featureless node types (``storage.train``). Of a link
    prediction model, the encoder: ``hidden`` outputs, the nodes' embeddings (the decoder is not needed)."""
    in_channels: int | dict[str, int | None] = (
        features.num_features if partition.schema.is_homogeneous else typed_in_channels(partition, features))
    model = build_encoder(train_params(train), in_channels=in_channels, num_classes=features.num_classes,
                          schema=partition.schema, num_edge_features=partition.num_edge_features).module
    state, tables = split_model_state(torch.load(io.BytesIO(store.read_bytes("train", train.key, MODEL)),
                                                 map_location="cpu", weights_only=True))
    model.load_state_dict(infer_task(train).model_state(state))
    return model.eval(), tables


def model_edge_dim(partition: PartitionArtifact, train: Manifest) -> int:
    """The edge feature width the trained model takes (0: none), decided as the trainer decided it."""
    return encoder_edge_dim(train_params(train), typed=not partition.schema.is_homogeneous,
                            num_edge_features=partition.num_edge_features)


def hidden_layers_to_keep(num_layers: int, which: str) -> list[int]:
    """The hidden layers whose rows are stored: the last (``L - 2``) or all; none for a 1-layer model."""
    hidden = list(range(num_layers - 1))
    return hidden if which == "all" else hidden[-1:]


def node_type_of(partition: PartitionArtifact) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """gid -> node type on a typed graph (by the range table); None on a homogeneous one."""
    if partition.schema.is_homogeneous:
        return None
    index = TypeIndex(partition.range_table())
    return lambda gid: index.locate(gid)[0]


def device_budget(device: torch.device, local_world: int,
                  free_bytes: Callable[[torch.device], int] = free_device_bytes) -> int | None:
    """What the layer steps may place on a CUDA ``device``: this rank's share of the free memory's margin, less the
    fixed reserve for CUDA's own workspaces (both as the train stage's cache takes them); None on a CPU rank, whose
    steps read the host matrices in place."""
    if device.type != "cuda":
        return None
    sharing = -(-local_world // max(1, torch.cuda.device_count()))   # ranks on this GPU (infer_device)
    return max(0, int(FREE_MARGIN * free_bytes(device) / sharing) - FIXED_RESERVE_BYTES)


def infer_rank(spec: InferSpec, rank: int, world: int, local_world: int,
               device: torch.device | None = None) -> dict[str, Any]:
    """Rank ``rank``'s share of the job on ``device`` (the CPU by default): its outputs written, its figures
    returned. Collective (every rank)."""
    device = device or torch.device("cpu")
    params = Params(**spec.params)
    store = ArtifactStore(spec.artifacts)
    partition = PartitionArtifact(store, store.load("partition", spec.partition_key))
    features = FeaturesArtifact(store, store.load("features", spec.features_key))
    trained = store.load("train", spec.train_key)
    bounds = partition.bounds()
    check_world_size(world, int(bounds.shape[0]) - 1)
    lo = int(bounds[rank])
    task = infer_task(trained)
    write_s = 0.0   # the outputs' writes (hidden layers, then the task's): where a rank's time goes besides its layers
    with measure() as cost:
        opened = time.perf_counter()
        # indices as stored (int32 below 2^31 nodes); start_egid: the batches' e_id
        csr = LocalCSR.from_part(partition.csr(rank, native=True), start_egid=int(partition.edge_bounds()[rank]))
        part = features.part(rank, load_x=False)
        model, tables = load_model(store, trained, partition=partition, features=features)
        setup: dict[str, Any] = {}
        run = model_input(model, tables, partition=partition, features=features, rank=rank,
                          local_world=local_world, setup=setup, host_budget=params.host_memory_budget_bytes)
        del model, tables   # the run holds what it needs (a typed model's tables only until layer 0 is encoded)
        run.model.to(device)   # after model_input: a typed model's tables encode layer 0's rows on the host
        num_layers = train_params(trained).num_layers
        degrees = degree_path(csr, bounds, torch.device("cpu")) if needs_degrees(run.model) else None
        edge_attr = torch.from_numpy(partition.edge_attr(rank)).float() if model_edge_dim(partition, trained) else None
        space = MatrixSpace(host_budget(params.host_memory_budget_bytes, local_world), spec.scratch_dir)
        engine = Inference(run.model, num_layers, csr, bounds, degrees, params.chunk_edges, params.fanouts,
                           params.seed, node_type_of=node_type_of(partition), edge_attr=edge_attr, space=space,
                           device=device, device_budget=device_budget(device, local_world))
        group = open_part_outputs(spec.out_url, rank)
        open_s = time.perf_counter() - opened

        def write(layer: int, rows: torch.Tensor) -> None:
            nonlocal write_s
            start = time.perf_counter()
            write_part_embedding(group, layer, rows.numpy())
            write_s += time.perf_counter() - start

        def write_hidden(layer: int, rows: torch.Tensor) -> Callable[[], Any]:
            # in the background, beside the next layer, which reads these rows too; the engine waits before it
            # releases them (zarr encodes on one thread: products' 2.4 M x 256 rows are 2.5 GB to write)
            return writer.submit(write, layer, rows).result

        def open_rows() -> Any:   # called once by the engine, which then holds x alone: its opening is open_s's
            nonlocal open_s
            start = time.perf_counter()
            rows = run.open_rows()
            open_s += time.perf_counter() - start
            return rows

        with torch.inference_mode(), ThreadPoolExecutor(1, thread_name_prefix="infer-write") as writer:
            # the input rows are opened in the engine: nothing here keeps x alive
            out = engine.run(open_rows, hidden_layers_to_keep(num_layers, params.embeddings), write_hidden)
            start = time.perf_counter()
            figures = task.write_rank(RankPart(group, rank, lo, engine.observed_layers, partition, part), out)
            write_s += time.perf_counter() - start
    record = {"rank": rank, "device": str(device), "nodes": csr.num_nodes, "edges": int(csr.indices.numel()),
              "feature_store": setup["feature_store"], "path": engine.path,
              # the most any layer ran (a device-placed layer takes larger chunks than the plan's)
              "chunks": max((s.chunks for s in engine.stats), default=len(engine.chunks)),
              "chunk_rounds": engine.num_chunks, "embedding_layers": engine.observed_layers,
              "layers": [vars(s) for s in engine.stats], "wall_s": cost["wall_s"],
              "open_s": round(open_s, 3), "write_s": round(write_s, 3),
              "peak_rss_bytes": cost["peak_rss_bytes"], "start_rss_bytes": cost["start_rss_bytes"],
              "peak_rss_source": cost["peak_rss_source"], "matrices": space.figures()}
    return {**record, **figures}
