"""The pipeline's parameters: one flat, validated model that maps onto each stage's own Params."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from storage import InputError
from stages.download import stage as download
from stages.features import stage as features
from stages.hotness import stage as hotness
from stages.partition import stage as partition
from stages.train import stage as train

STAGES = {"download": download, "partition": partition, "features": features, "hotness": hotness, "train": train}
ORDER = tuple(STAGES)

_DL, _PT, _FT, _HT, _TR = download.Params(), partition.Params(), features.Params(), hotness.Params(), train.Params()


class PipelineConfig(BaseModel):
    """Everything a run needs. Defaults are the embedded synthetic graph on 2 partitions."""

    model_config = ConfigDict(extra="forbid")

    artifacts: str = "./artifacts"
    # download
    dataset: str = _DL.dataset
    num_nodes: int = _DL.num_nodes
    avg_degree: float = _DL.avg_degree
    num_features: int = _DL.num_features
    num_classes: int = _DL.num_classes
    seed: int = _DL.seed
    split: tuple[float, float, float] = _DL.split
    path: str | None = None
    download_dir: str | None = None   # where OGB raw files are cached; not part of any key
    # partition
    num_partitions: int = _PT.num_partitions
    partition_method: Literal["metis", "random"] = _PT.method
    partition_seed: int = _PT.seed
    balance_train: bool = _PT.balance_train
    balance_edges: bool = _PT.balance_edges
    # features
    chunk_rows: int | None = _FT.chunk_rows
    compressor: Literal["lz4", "zstd"] | None = _FT.compressor
    # hotness (fanouts and batch_size are the training ones)
    fanouts: tuple[int, ...] = _HT.fanouts
    batch_size: int = _HT.batch_size
    hotness_epochs: int = _HT.epochs
    cache_budget_bytes: int | None = _HT.cache_budget_bytes
    cache_ratio: float = _HT.cache_ratio
    # train (one rank per partition; the model has one layer per fanout)
    model: Literal["sage", "gcn", "gat"] = _TR.model
    hidden: int = _TR.hidden
    epochs: int = _TR.epochs
    lr: float = _TR.lr
    dropout: float = _TR.dropout
    cache_policy: Literal["auto", "hotness", "hotness-remote", "degree", "none"] = _TR.cache_policy
    train_timeout_s: float = _TR.timeout_s
    host_memory_budget_bytes: int | None = _TR.host_memory_budget_bytes
    device: Literal["auto", "cpu", "cuda"] = _TR.device
    # control
    until: str = ORDER[-1]
    force: list[str] = Field(default_factory=list)

    @field_validator("num_partitions")
    @classmethod
    def _parts(cls, v: int) -> int:
        if v < 1:
            raise ValueError("num_partitions must be >= 1")
        return v

    @field_validator("until")
    @classmethod
    def _until(cls, v: str) -> str:
        if v not in ORDER:
            raise ValueError(f"unknown stage '{v}' (stages: {', '.join(ORDER)})")
        return v

    @field_validator("force")
    @classmethod
    def _force(cls, v: list[str]) -> list[str]:
        bad = [s for s in v if s not in ORDER and s != "all"]
        if bad:
            raise ValueError(f"unknown stage(s) {', '.join(bad)} in force (stages: {', '.join(ORDER)}, all)")
        return list(ORDER) if "all" in v else v

    @model_validator(mode="after")
    def _combinations(self) -> "PipelineConfig":
        # what can be told before anything runs; the partition stage re-checks against the real node count
        if self.dataset == "synthetic" and self.num_partitions > self.num_nodes:
            raise ValueError(f"{self.num_partitions} partitions of a {self.num_nodes}-node graph: one rank per "
                             f"partition needs num_partitions <= num_nodes")
        if self.cache_budget_bytes is not None and self.cache_budget_bytes > 0 and self.cache_policy == "none":
            raise ValueError("cache_budget_bytes is set but cache_policy is 'none': drop one of them")
        return self

    def stages(self) -> tuple[str, ...]:
        return ORDER[: ORDER.index(self.until) + 1]

    def stage_params(self, name: str) -> BaseModel:
        if name == "download":
            return download.Params(dataset=self.dataset, num_nodes=self.num_nodes, avg_degree=self.avg_degree,
                                   num_features=self.num_features, num_classes=self.num_classes, seed=self.seed,
                                   split=self.split, path=self.path)
        if name == "partition":
            return partition.Params(num_partitions=self.num_partitions, method=self.partition_method,
                                    seed=self.partition_seed, balance_train=self.balance_train,
                                    balance_edges=self.balance_edges)
        if name == "features":
            return features.Params(chunk_rows=self.chunk_rows, compressor=self.compressor)
        if name == "hotness":
            return hotness.Params(fanouts=self.fanouts, batch_size=self.batch_size, epochs=self.hotness_epochs,
                                  cache_budget_bytes=self.cache_budget_bytes, cache_ratio=self.cache_ratio,
                                  seed=self.seed)
        if name == "train":
            return train.Params(model=self.model, hidden=self.hidden, num_layers=len(self.fanouts),
                                fanouts=self.fanouts, batch_size=self.batch_size, epochs=self.epochs, lr=self.lr,
                                dropout=self.dropout, seed=self.seed, cache_policy=self.cache_policy,
                                timeout_s=self.train_timeout_s, host_memory_budget_bytes=self.host_memory_budget_bytes,
                                device=self.device)
        raise KeyError(name)


def make_config(**values: Any) -> PipelineConfig:
    """Validate ``values``; a bad value becomes a one-line InputError naming the field and what is expected."""
    try:
        cfg = PipelineConfig(**values)
        for name in ORDER:  # each stage's own checks, before anything runs
            cfg.stage_params(name)
        return cfg
    except ValidationError as err:
        first = err.errors()[0]
        msg = first["msg"].removeprefix("Value error, ")
        if not first["loc"]:
            raise InputError(f"impossible combination: {msg}") from None
        field = ".".join(str(p) for p in first["loc"])
        raise InputError(f"invalid parameter {field}: {msg}") from None


DEFAULTS = PipelineConfig()
