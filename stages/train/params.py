"""The train stage's parameters, importable without torch (configs validate in milliseconds)."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, field_validator, model_validator

from stages.choices import (
    DECODERS,
    LOSSES,
    MODEL_CHOICES,
    CachePolicyName,
    CudaGraph,
    Device,
    GraphPlacement,
    HostGather,
    LrSchedule,
    Precision,
    TaskName,
)
from stages.params import FORM, EdgeFanouts, Fanouts, Seed, StageParams, runtime
from stages.train.models.plugin_code import source_digest
from stages.train.models.plugins import check_ref, is_import_path
from stages.train.tasks import TASKS, task_def
from stages.train.tasks.base import key_without
from storage.errors import InputError


class Params(StageParams):
    # one name per runtime setting across stages: infer's was peer_timeout_s already ([5/5]); configs, deployments
    # and job specs written before still work
    RENAMED: ClassVar[dict[str, str]] = {"collective_timeout_s": "peer_timeout_s"}

    model: str = Field("auto", description="auto (rgcn on a typed graph, else sage), sage (GraphSAGE, mean), gcn, "
                                           "gat, rgcn, rgat (relational: per edge type), hgt (per node and edge "
                                           "type), mlp (no graph), or a "
                                           "factory package.module:name called with in_channels, hidden, "
                                           "out_channels, num_layers, dropout and model_kwargs (README: plug-in "
                                           "models and losses)",
                       json_schema_extra={FORM: f"{', '.join(MODEL_CHOICES)}, or an import path "
                                                "package.module:factory"})
    model_kwargs: dict[str, Any] = Field(default_factory=dict, description="more keyword arguments for the model's "
                                                                           "factory or built-in constructor",
                                         json_schema_extra={FORM: "a mapping, e.g. {aggr: max}"})
    task: TaskName = Field("node", description="node: a class per node; link: whether an edge of link_edge_type "
                                               "exists (the download stage holds out its valid/test edges)")
    loss: str = Field("auto", description="auto (cross_entropy for task=node, bce for task=link), or a function "
                                          "package.module:name (logits, y) -> the batch's mean loss; task=link: "
                                          "(positive scores [B], negative scores [n]) -> it",
                      json_schema_extra={FORM: f"{', '.join(LOSSES)}, or an import path package.module:function"})
    # mlp, not dot: a dot product of all-zero embeddings has zero gradient, a saddle that a 3-layer SAGE (hidden
    # 256, dropout 0.5) fell into on synthetic-link (test MRR 0.07, AUC 0.66; mlp 0.37, AUC 0.87, 4 epochs)
    decoder: str = Field("mlp", description="task=link: a pair's score from its two embeddings: mlp (on their "
                                            "Hadamard product, OGB's LinkPredictor), dot, or a factory "
                                            "package.module:name called with channels, returning a module "
                                            "(h_src, h_dst) -> scores",
                         json_schema_extra={FORM: f"{', '.join(DECODERS)}, or an import path package.module:factory"})
    num_negatives: int = Field(1, ge=1, description="task=link: uniform negative destinations drawn per training "
                                                    "positive")
    eval_negatives: int = Field(100, ge=1, description="task=link: uniform negatives each valid/test positive is "
                                                       "ranked against (MRR, Hits@K; ogbl-citation2 uses 1000), "
                                                       "shared by the positives of a batch")
    # 65 536 took 63 s an epoch (2 ranks on 2 cores, the default 3-layer SAGE, synthetic-link's 100 000 nodes)
    edges_per_epoch: int | None = Field(16_384, ge=1, description="task=link: positive edges an epoch trains on, "
                                        "over all ranks: a fresh shuffled share of each rank's every epoch (null: "
                                        "all; the default synthetic-link graph has ~850 000)")
    eval_edges: int | None = Field(10_000, ge=1, description="task=link: valid and test positives evaluated, "
                                   "over all ranks: a fixed random sample of each rank's (null: all; MRR over 10 000 "
                                   "positives has a standard error of ~0.004)")
    filter_negatives: bool = Field(False, description="task=link: negatives that are real edges of the "
                                                      "message-passing graph (or equal their positive) count in "
                                                      "no loss or rank (one exchange more per batch)")
    hidden: int = Field(256, ge=1, description="hidden channels per layer")
    fanouts: Fanouts = Field((15, 10, 5), description="neighbours sampled per hop (-1 = all); the model has one "
                                                      "layer per hop")
    edge_fanouts: EdgeFanouts = Field(default_factory=dict, description="typed graphs: per-hop fanouts of some "
                                      "edge types (key src___rel___dst or a unique relation name; 0 = none) in "
                                      "place of fanouts, e.g. {\"cites\": [10, 5]}",
                                      json_schema_extra={FORM: 'a JSON object {"edge type": [fanout per hop]}'})
    batch_size: int = Field(1024, ge=1, description="seed nodes per batch and rank")
    epochs: int = Field(10, ge=1, description="training epochs")
    lr: float = Field(0.003, gt=0, description="Adam learning rate")
    weight_decay: float = Field(0.0, ge=0, description="Adam weight decay (L2)")
    embedding_lr: float = Field(0.01, gt=0, description="typed graphs: SparseAdam learning rate of the learnt "
                                                        "embeddings of featureless node types (hidden wide)")
    lr_schedule: LrSchedule = Field("none", description="per epoch: none, cosine (from lr to 0 over epochs), step "
                                                        "(lr times lr_gamma every lr_step_epochs)")
    lr_step_epochs: int = Field(30, ge=1, description="step schedule: epochs between two decays")
    lr_gamma: float = Field(0.1, gt=0, le=1, description="step schedule: the factor of each decay")
    patience: int | None = Field(None, ge=1, description="early stopping: stop after this many epochs without a "
                                                         "better validation accuracy; null: train every epoch")
    dropout: float = Field(0.5, ge=0, lt=1, description="dropout between layers")
    # auto: tf32 measured 17 % faster a products batch on an H200 under cuda_graph=auto (5.8 against 7.0 ms) and
    # trains to the CPU accuracy (tests/test_gpu_graphed.py); on this project's CPU it was 4-8 % slower
    precision: Precision = Field("auto", description="the model's matrix products: auto is tf32 on a CUDA rank "
                                                     "and float32 on a CPU one; tf32 computes float32 ones in "
                                                     "TensorFloat32 on GPUs (10-bit mantissas, float32 "
                                                     "accumulation; Ampere and later; no faster on a CPU); "
                                                     "bfloat16 autocasts them (faster on CPUs with AVX512-BF16 or "
                                                     "AMX and on GPUs, same accuracy on the default graph); "
                                                     "weights stay float32, and the infer stage computes in "
                                                     "float32 whatever this is")
    edge_features: bool = Field(True, description="use the graph's edge features when it has them and the model "
                                                   "takes them (gat, or a plug-in factory with an edge_dim "
                                                   "parameter); false: ignore them")
    edge_weight: int | None = Field(None, ge=0, description="sample in-neighbours with probability proportional to "
                                    "this column of the graph's edge features (values >= 0; an edge of weight 0 is "
                                    "never sampled); null: uniformly")
    gat_heads: int = Field(4, ge=1, description="attention heads of gat, rgat and hgt (hidden must be a "
                                                   "multiple)")
    seed: Seed = Field(0, description="weights, shuffling, sampling and dropout streams")
    cache_policy: CachePolicyName = Field("auto", description="which rows each rank caches on its device "
                                                              "(auto: hotness on GPU, hotness-remote on CPU)")
    # the cache's size is decided where the rank runs (stages.train.rank.cache_budget): a GPU's free memory, so
    # neither cap is in the key and another GPU does not rebuild the hotness plan. Not hotness's cache_ratio and
    # cache_budget_bytes, which size the plan that the hotness report evaluates (a shared name would set both)
    device_cache_bytes: int | None = runtime(None, ge=0, description="cap on each rank's device cache, in bytes of "
                                                                     "rows (a CPU rank's never above the hotness "
                                                                     "plan's rows); null: no cap (a GPU rank caches "
                                                                     "what its free memory leaves after the model, "
                                                                     "the largest batch and what else the rank puts "
                                                                     "there, a CPU rank the plan's rows)")
    device_cache_ratio: float | None = runtime(None, ge=0, description="cap on each rank's device cache, as a "
                                                                       "fraction of its partition's feature bytes; "
                                                                       "null: no cap")
    timeout_s: float = runtime(24 * 3600.0, gt=0, description="whole job; then every rank is stopped")
    peer_timeout_s: float = runtime(300.0, gt=0, description="a peer silent this long inside a collective fails "
                                                             "the job")
    host_memory_budget_bytes: int | None = runtime(None, ge=0, description="feature rows in RAM per rank; null: "
                                                                           "half the available RAM; 0: read Zarr")
    threads_per_rank: int | None = runtime(None, ge=1, description="torch threads per rank; null: this node's "
                                                                   "CPUs / its ranks")
    # auto (null): 1 on a lone GPU rank, where it measured 1.23x at products scale on an H100 (23.1 -> 18.8 ms a
    # batch, benchmarks/RESULTS.md "[4/5] One GPU"); 0 on CPU ranks: on 2 shared cores the ranks' own threads fill
    # every core and a producer has none to run on (0.97-0.99x, "[7/7] Prefetch"); 0 on several GPU ranks too, not
    # measured yet: beside NCCL the producer's exchanges travel through the host over gloo (producer_group)
    prefetch: int | None = runtime(None, ge=0, le=8, description="batches a producer thread samples and gathers "
                                                                  "ahead of the model (0: none; null: 1 on a lone "
                                                                  "GPU rank, else 0); the same batches and results "
                                                                  "either way")
    device: Device = runtime("auto", description="auto: one GPU per rank when there are enough, else CPU")
    # NCCL refuses two ranks on one GPU ("Duplicate GPU detected", seen on the H200); gloo moves CUDA tensors, so N
    # ranks on one GPU run the multi-rank GPU path (remote rows, distributed sampling, per-rank caches) on one card
    ranks_per_gpu: int = runtime(1, ge=1, le=8, description="ranks sharing each GPU, over gloo (NCCL refuses two "
                                                            "ranks on one device): for tests and benchmarks of the "
                                                            "multi-rank GPU path on one card; slower than NCCL")
    # auto from the H200's gather table (stages.runtime.uva.choose_host_gather); the report names each rank's pick
    host_gather: HostGather = runtime("auto", description="CUDA ranks: copy gathers own host rows on the CPU into "
                                                          "pinned memory and copies them over; uva lets the GPU read "
                                                          "the pinned rows in place (zero-copy); auto: uva for 2- "
                                                          "and 4-byte elements in RAM, else copy")

    # auto by the device budget (stages.train.rank.cache_budget.graph_placement); the report names each rank's pick
    graph_placement: GraphPlacement = runtime("auto", description="CUDA ranks: where the rank's graph (its CSR) "
                                                                  "lives: device memory; uva: pinned host memory "
                                                                  "that the GPU samples in place; auto: the device "
                                                                  "when it fits the budget of free device memory "
                                                                  "less the model's and the largest batch's "
                                                                  "reserve, else uva")
    # auto: a products batch on an H200 took 7.0 ms against 8.5 eager (float32), 5.8 against 8.8 in tf32
    # (benchmarks/RESULTS.md, session 31); the report names each rank's choice, or why its step
    # (stages.train.rank.graphed) or sampling (graphed_sampling) cannot be a graph
    cuda_graph: CudaGraph = runtime("auto", description="CUDA ranks: step replays each training step as one "
                                                       "captured CUDA graph on batches padded to a static shape, "
                                                       "where the step allows it (a lone rank, task=node, "
                                                       "cross_entropy, the built-in sage, float32 or tf32, positive "
                                                       "fanouts); auto also samples each batch by one graph "
                                                       "(static shapes, no host read) where every feature row is "
                                                       "on the device and the sampler is uniform; off: every op "
                                                       "launched from Python")

    @property
    def num_layers(self) -> int:
        """The model's depth: each layer aggregates one sampled hop, so it is the number of fanouts (a parameter of
        its own could only ever take this value)."""
        return len(self.fanouts)

    @field_validator("cuda_graph", mode="before")
    @classmethod
    def _off_is_off(cls, value: Any) -> Any:
        # YAML 1.1 (config files and --set alike) reads a bare `off` as false: cuda_graph=off is what the error
        # lines of a broken capture tell users to set
        return "off" if value is False else value

    @field_validator("model")
    @classmethod
    def _model_is_known(cls, value: str) -> str:
        return check_ref(value, MODEL_CHOICES, "model")

    @field_validator("loss")
    @classmethod
    def _loss_is_known(cls, value: str) -> str:
        return check_ref(value, LOSSES, "loss")

    @field_validator("decoder")
    @classmethod
    def _decoder_is_known(cls, value: str) -> str:
        return check_ref(value, DECODERS, "decoder")

    def prefetch_depth(self, device_type: str, world_size: int) -> int:
        """``prefetch``, or where it is null (auto) 1 on a lone CUDA rank and 0 otherwise (see the field)."""
        if self.prefetch is not None:
            return self.prefetch
        return 1 if device_type == "cuda" and world_size == 1 else 0

    def rank_precision(self, device_type: str) -> str:
        """``precision``, or where it is auto, tf32 on a CUDA rank and float32 on any other (see the field)."""
        if self.precision != "auto":
            return self.precision
        return "tf32" if device_type == "cuda" else "float32"

    @property
    def resolved_loss(self) -> str:
        """``loss`` with ``auto`` as the task's built-in (cross_entropy, bce)."""
        if self.loss != "auto":
            return self.loss
        return task_def(self.task).default_loss

    def key_params(self) -> dict[str, Any]:
        """The fields that define the artifact, plus a digest of plug-in code (an edit retrains,
        ``stages.train.models.plugin_code``); the step schedule's settings only when that schedule is used."""
        out = super().key_params()
        if self.lr_schedule != "step":
            del out["lr_step_epochs"], out["lr_gamma"]
        out["loss"] = self.resolved_loss   # auto and its built-in are one artifact (node keys as before auto)
        for field, default in (("edge_features", True), ("edge_weight", None)):
            if out[field] == default:   # keys as before edge features existed
                del out[field]
        # another task's settings do not touch this task's model (and node keys stay as they were before link)
        key_without(out, self.task, list(TASKS.values()))
        for field in ("model", "loss", "decoder"):
            if field not in out:
                continue
            if is_import_path(out[field]):
                out[f"{field}_code"] = source_digest(out[field])
        return out

    @model_validator(mode="after")
    def _check(self) -> Params:
        default_loss = task_def(self.task).default_loss
        if self.resolved_loss in LOSSES and self.resolved_loss != default_loss:
            raise InputError(f"loss={self.loss} is not a task={self.task} loss: use auto (or {default_loss})")
        if self.model in ("gat", "rgat", "hgt") and self.hidden % self.gat_heads:
            raise InputError(f"hidden={self.hidden} must be a multiple of gat_heads={self.gat_heads} "
                             f"({self.model} splits hidden among its heads)")
        return self
