"""The train stage's parameters, importable without torch (configs validate in milliseconds)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from stages.choices import CachePolicyName, Device, ModelName
from stages.params import Fanouts, StageParams, as_list, runtime
from storage.errors import InputError


class Params(StageParams):
    model: ModelName = Field("sage", description="GraphSAGE (mean), GCN or GAT, PyG's BasicGNN models")
    hidden: int = Field(256, ge=1, description="hidden channels per layer")
    # None is filled in before validation (_layers_follow_fanouts), so the validated value is always an int; the
    # ignore lets the declared default be None while callers still see ``int``
    num_layers: int = Field(None, ge=1, description="layers; default: one per fanout (it must equal "  # type: ignore[assignment]
                                                    "len(fanouts): each layer aggregates one hop)")
    fanouts: Fanouts = Field((15, 10, 5), description="neighbours sampled per hop (-1 = all)")
    batch_size: int = Field(1024, ge=1, description="seed nodes per batch and rank")
    epochs: int = Field(10, ge=1, description="training epochs")
    lr: float = Field(0.003, gt=0, description="Adam learning rate")
    weight_decay: float = Field(0.0, ge=0, description="Adam weight decay (L2)")
    dropout: float = Field(0.5, ge=0, lt=1, description="dropout between layers")
    gat_heads: int = Field(4, ge=1, description="GAT attention heads (hidden must be a multiple)")
    seed: int = Field(0, ge=0, description="weights, shuffling, sampling and dropout streams")
    cache_policy: CachePolicyName = Field("auto", description="which rows each rank caches on its device "
                                                              "(auto: hotness on GPU, hotness-remote on CPU)")
    timeout_s: float = runtime(24 * 3600.0, gt=0, description="whole job; then every rank is stopped")
    collective_timeout_s: float = runtime(300.0, gt=0, description="a peer silent this long inside a collective "
                                                                   "fails the job")
    host_memory_budget_bytes: int | None = runtime(None, ge=0, description="feature rows in RAM per rank; null: "
                                                                           "half the available RAM; 0: read Zarr")
    threads_per_rank: int | None = runtime(None, ge=1, description="torch threads per rank; null: this node's "
                                                                   "CPUs / its ranks")
    device: Device = runtime("auto", description="auto: one GPU per rank when there are enough, else CPU")

    @model_validator(mode="before")
    @classmethod
    def _layers_follow_fanouts(cls, data: Any) -> Any:
        # one declaration: the depth is the number of sampled hops unless the user says otherwise
        if isinstance(data, dict) and data.get("num_layers") is None:
            fanouts = as_list(data.get("fanouts", cls.model_fields["fanouts"].default))
            if isinstance(fanouts, (list, tuple)):
                data = {**data, "num_layers": len(fanouts)}
        return data


    @model_validator(mode="after")
    def _check(self) -> Params:
        if self.num_layers != len(self.fanouts):
            raise InputError(f"num_layers={self.num_layers} but {len(self.fanouts)} fanouts {list(self.fanouts)}: "
                             f"each layer aggregates one sampled hop, give one fanout per layer")
        if self.model == "gat" and self.hidden % self.gat_heads:
            raise InputError(f"hidden={self.hidden} must be a multiple of gat_heads={self.gat_heads} "
                             f"(GAT concatenates its heads)")
        return self
