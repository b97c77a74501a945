"""The train stage's parameters, importable without torch (configs validate in milliseconds)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from storage.errors import InputError
from stages.runtime.fanouts import validate_fanouts

# Settings that change how a run executes, not what it computes: left out of the artifact key, so that raising
# a timeout or lowering the memory budget after a failed attempt resumes that attempt's checkpoints.
RUNTIME_FIELDS = ("timeout_s", "collective_timeout_s", "host_memory_budget_bytes", "threads_per_rank", "device")


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: Literal["sage", "gcn", "gat"] = "sage"
    hidden: int = Field(256, ge=1)
    num_layers: int = Field(3, ge=1)
    fanouts: tuple[int, ...] = (15, 10, 5)    # one per layer: the model has as many layers as sampled hops
    batch_size: int = Field(1024, ge=1)
    epochs: int = Field(10, ge=1)
    lr: float = Field(0.003, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    dropout: float = Field(0.5, ge=0, lt=1)
    gat_heads: int = Field(4, ge=1)
    seed: int = Field(0, ge=0)
    use_cache: bool = True                     # False is cache_policy "none"
    # auto: hotness on a GPU, hotness-remote on a CPU rank (stages.train.cache_policy)
    cache_policy: Literal["auto", "hotness", "hotness-remote", "degree", "none"] = "auto"
    # runtime only (RUNTIME_FIELDS)
    timeout_s: float = Field(24 * 3600.0, gt=0)        # whole job; then every rank is stopped
    collective_timeout_s: float = Field(300.0, gt=0)   # a peer silent this long inside a collective fails the job
    host_memory_budget_bytes: int | None = Field(None, ge=0)  # per rank; None: half the available RAM; 0: Zarr
    threads_per_rank: int | None = Field(None, ge=1)   # None: the CPUs this node may use / its ranks
    device: Literal["auto", "cpu", "cuda"] = "auto"

    @model_validator(mode="before")
    @classmethod
    def _cache_switch(cls, data: Any) -> Any:
        # one meaning, one key: use_cache=False and cache_policy="none" are the same run
        if isinstance(data, dict):
            data = dict(data)
            if data.get("use_cache") is False:
                data["cache_policy"] = "none"
            elif data.get("cache_policy") == "none":
                data["use_cache"] = False
        return data

    @field_validator("fanouts")
    @classmethod
    def _fanouts(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(validate_fanouts(v))

    @model_validator(mode="after")
    def _check(self) -> Params:
        if self.num_layers != len(self.fanouts):
            raise InputError(f"num_layers={self.num_layers} but {len(self.fanouts)} fanouts {list(self.fanouts)}: "
                             f"each layer aggregates one sampled hop, give one fanout per layer")
        if self.model == "gat" and self.hidden % self.gat_heads:
            raise InputError(f"hidden={self.hidden} must be a multiple of gat_heads={self.gat_heads} "
                             f"(GAT concatenates its heads)")
        return self

    def key_params(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude=set(RUNTIME_FIELDS))
