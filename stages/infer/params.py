"""The infer stage's parameters, importable without torch (configs validate in milliseconds).

A runtime setting the train stage has too has train's name (``timeout_s``, ``threads_per_rank``; the old
``job_timeout_s`` and ``rank_threads`` still work, with a note: ``RENAMED``), and ``peer_timeout_s`` is one SHARED name
for both (train's was ``collective_timeout_s``). A field name another stage declares too loses its short name
(docs/design.md §2): the flat ``timeout_s`` and ``threads_per_rank`` are train's (``flows.config.ALIASES``), this
stage's are ``infer.timeout_s``/``infer_timeout_s``. ``fanouts`` and ``seed`` are SHARED names that do not reach this
stage: ``infer.fanouts``.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from stages.choices import Device
from stages.params import ExecutorParams, Seed, runtime
from stages.runtime.sampling.fanouts import validate_fanouts
from stages.train.params import Params as TrainParams
from storage import Manifest

EmbeddingLayers = Literal["last", "all"]


class Params(ExecutorParams):
    """``executor``: where the exports in orig-id order are written (``stages.infer.export_units``); the ranks
    are torchrun's."""

    # train's names since [5/5]; configs, deployments and job specs written before still work
    RENAMED: ClassVar[dict[str, str]] = {"job_timeout_s": "timeout_s", "rank_threads": "threads_per_rank"}

    fanouts: tuple[int, ...] | None = Field(
        None, description="null: exact inference over every in-neighbour; a list: sampled inference, one fanout "
                          "per model layer as in training (the output layer samples fanouts[0]; -1 = all)")
    embeddings: EmbeddingLayers = Field("last", description="last: the last hidden layer's rows (the output "
                                                            "layer's input); all: every hidden layer's")
    seed: Seed = Field(0, description="sampled inference only: the sampling streams")
    chunk_edges: int = runtime(1 << 18, ge=1, description="nodes per chunk as in-edges + 1 each: a rank computes a "
                                                          "layer for its nodes in chunks of at most this many; "
                                                          "it bounds a chunk's temporaries and the rows per halo "
                                                          "piece (SAGE, GCN) or the gathered neighbour rows "
                                                          "(other models); exact inference on one edge type "
                                                          "takes chunks as large as device memory allows in a GPU "
                                                          "layer whose matrix is there")
    timeout_s: float = runtime(6 * 3600.0, gt=0, description="whole inference job; then every rank is stopped")
    peer_timeout_s: float = runtime(300.0, gt=0, description="a peer silent this long inside a collective fails "
                                                             "the job")
    threads_per_rank: int | None = runtime(None, ge=1, description="torch threads per inference rank; null: "
                                                                   "this node's CPUs / its ranks")
    # a rank's exact inference holds x and two layer matrices (own + halo rows): 10.8-11.8 GiB a rank at 14 M nodes
    # x 128 features on 2 ranks, which the OOM killer ended on a 24 GiB host (benchmarks/RESULTS.md "[2/5]
    # Growth"); past this budget x stays in Zarr and the matrices are memory-mapped (stages.infer.matrices)
    host_memory_budget_bytes: int | None = runtime(None, ge=0, description="feature rows and layer matrices in "
                                                   "RAM per rank; null: half the available RAM shared by the "
                                                   "host's ranks; 0: none (x read from Zarr, the layer matrices "
                                                   "memory-mapped files in the job's scratch directory)")

    # the layer steps on a GPU (issue [4/5] item 4); the matrices' source of truth and the halo exchange stay in host
    # memory (gloo), bounded by host_memory_budget_bytes as on a CPU rank
    device: Device = runtime("auto", description="where the layer steps run: auto: one GPU per rank when there are "
                                                 "enough, else CPU; the layer matrices go to the GPU when they fit "
                                                 "its free memory, else each chunk's rows")

    @field_validator("fanouts")
    @classmethod
    def _fanouts(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        return None if value is None else tuple(validate_fanouts(value))

    @property
    def exact(self) -> bool:
        return self.fanouts is None

    def key_params(self) -> dict[str, Any]:
        """The fields that define the artifact; the sampling seed only when sampling."""
        out = super().key_params()
        if self.fanouts is None:
            del out["seed"]
        return out


def train_params(train: Manifest) -> TrainParams:
    """The train stage's Params from its manifest (which records the key params, plus plug-in code digests)."""
    return TrainParams(**{k: v for k, v in train.params.items() if k in TrainParams.model_fields})
