"""The enumerations users pick from, each declared once (torch-free); tuples for run-time checks derive from them.

The stages' Params annotate their fields with these ``Literal`` types, so the config, ``--set``, the deployment
parameters and the README list the same choices as the code that acts on them.
"""

from __future__ import annotations

from typing import Literal, get_args

Dataset = Literal["synthetic", "synthetic-hetero", "synthetic-link", "ogbn-arxiv", "ogbn-products", "ogbn-papers100M",
                  "ogbn-mag", "ogbl-collab", "ogbl-citation2", "files"]
# kaminpar: parallel shared-memory multilevel (stages/partition/kaminpar_runner.py), METIS's cut in far less memory
PartitionMethod = Literal["metis", "kaminpar", "random"]
Compressor = Literal["lz4", "zstd"]
# the features stage's storage dtype; auto: float32, except float16 and 1-byte bool/int kept
# (stages/features/dtypes.py); int8 and float8_e4m3 quantise per column, bfloat16 rounds (stages/features/schemes.py)
FeatureDtype = Literal["auto", "float32", "float16", "bfloat16", "int8", "float8_e4m3"]
# the features stage's row normalisation of x (stages/features/normalize.py)
FeatureNorm = Literal["none", "l1"]
# built-in models and losses; train.model and train.loss also take an import path (stages/train/models/plugins.py)
# rgcn, rgat: relational (per edge type); hgt: per node and edge type (Heterogeneous Graph Transformer); mlp: each
# node's own row only (the no-graph baseline); auto: rgcn on a typed graph (it beats a GraphSAGE that ignores the
# types by 9 points on synthetic-hetero: tests/test_typed_train.py), sage on a homogeneous one
ModelName = Literal["auto", "sage", "gcn", "gat", "rgcn", "rgat", "hgt", "mlp"]
# auto: cross_entropy for task=node, bce (binary cross-entropy with logits of positives and negatives) for task=link
LossName = Literal["auto", "cross_entropy", "bce"]
# what is learnt: a class per node, or whether an edge of one type exists (docs/design.md §7)
TaskName = Literal["node", "link"]
# link prediction's pair scorers (stages/train/tasks/link_decoders.py); train.decoder also takes an import path
DecoderName = Literal["dot", "mlp"]
LrSchedule = Literal["none", "cosine", "step"]
# the model's matrix products (stages/train/models/model.py): float32; tf32, float32 products in TensorFloat32 on
# GPUs (matmul_precision); bfloat16, autocast (seed_logits); auto, tf32 on a CUDA rank and float32 on a CPU one
# (Params.rank_precision)
Precision = Literal["auto", "float32", "tf32", "bfloat16"]
# auto: hotness on a GPU rank, hotness-remote on a CPU rank (stages/train/rank/cache_policy.py says why)
CachePolicyName = Literal["auto", "hotness", "hotness-remote", "degree", "none"]
Device = Literal["auto", "cpu", "cuda"]
HostGather = Literal["auto", "copy", "uva"]   # how a CUDA rank's own host rows reach it (stages.runtime.uva)
# where a CUDA rank's CSR lives: device memory, or pinned host memory the GPU samples in place
# (stages.train.rank.cache_budget.graph_placement)
GraphPlacement = Literal["auto", "device", "uva"]
# whether a CUDA rank replays its training step (step), and its sampling too (auto), as captured graphs
# (stages.train.rank.graphed, graphed_sampling)
CudaGraph = Literal["off", "step", "auto"]

DATASETS: tuple[str, ...] = get_args(Dataset)
# OGB's node-property datasets (ogb's NodePropPredDataset: stages/download/ogb_source.py)
OGB_DATASETS: tuple[str, ...] = tuple(name for name in DATASETS if name.startswith("ogbn-"))
# OGB's link-property datasets (LinkPropPredDataset: stages/download/ogbl_source.py), with OGB's own edge split
OGBL_DATASETS: tuple[str, ...] = tuple(name for name in DATASETS if name.startswith("ogbl-"))
TYPED_OGB_DATASETS: tuple[str, ...] = ("ogbn-mag",)   # heterogeneous in OGB (master.csv "is hetero")
PARTITION_METHODS: tuple[str, ...] = get_args(PartitionMethod)
MODEL_CHOICES: tuple[str, ...] = get_args(ModelName)
MODELS: tuple[str, ...] = tuple(m for m in MODEL_CHOICES if m != "auto")   # the concrete built-ins
LOSSES: tuple[str, ...] = get_args(LossName)
DECODERS: tuple[str, ...] = get_args(DecoderName)
LINK_DATASETS: tuple[str, ...] = ("synthetic-link", *OGBL_DATASETS)   # graphs made for task=link
CACHE_POLICIES: tuple[str, ...] = tuple(p for p in get_args(CachePolicyName) if p != "auto")   # concrete ones
