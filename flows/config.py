"""The pipeline's configuration, derived from the stages' own ``Params`` (each parameter is declared once, there).

A config is one section per stage (``download``, ``partition``, ``features``, ``hotness``, ``train``, ``infer``),
each that stage's Params, plus ``artifacts``, ``until``, ``force`` and ``wait``. Values reach a field by any of
these names:

- nested: ``{"train": {"epochs": 3}}`` (YAML/TOML sections) or dotted: ``train.epochs=3``;
- qualified flat: ``train_epochs=3`` (``<stage>_<field>``; any field);
- short flat: ``epochs=3``, where the name is unambiguous: a field only one stage declares, a name in
  ``ALIASES``, or a name in ``SHARED``, which sets that field in each of its stages;
- an old name of a renamed field (its stage's ``Params.RENAMED``: ``job_timeout_s`` is ``infer.timeout_s`` now),
  flat, qualified, dotted or nested, with one note per name (``renamed_names``).

Layers (a config file, then ``--set``, then options) override each other whatever names they use; within one, a
more specific name wins: shared < short < qualified < dotted/nested/old. The flow's parameters (``flow_names``) are
each field under the short name that reaches it alone, else its qualified one, plus the qualified name of a field a
SHARED name sets (None: follow the shared value); the old short names are parameters too (None: unset).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo

from stages.download import stage as download_stage
from stages.features import stage as features_stage
from stages.hotness import stage as hotness_stage
from stages.infer import stage as infer_stage
from stages.params import ParamsError, StageParams, field_error, is_sequence, renamed_note, show_value
from stages.partition import stage as partition_stage
from stages.protocol import Stage
from stages.train import stage as train_stage
from storage import InputError
from storage.manifest import stage_key

STAGES: dict[str, Stage] = {"download": download_stage, "partition": partition_stage,
                             "features": features_stage, "hotness": hotness_stage, "train": train_stage,
                             "infer": infer_stage}
ORDER: tuple[str, ...] = tuple(STAGES)
# one name for one setting that several stages must agree on (the hotness stage pre-samples the training batches)
SHARED: dict[str, tuple[str, ...]] = {"seed": ("download", "hotness", "train"), "fanouts": ("hotness", "train"),
                                      "edge_fanouts": ("hotness", "train"), "batch_size": ("hotness", "train"),
                                      # the download stage holds the valid/test edges out of what trains on them
                                      "task": ("download", "hotness", "train"),
                                      "num_negatives": ("hotness", "train"), "edges_per_epoch": ("hotness", "train"),
                                      # one budget for preprocessing (stages.memory)
                                      "memory_budget_bytes": ("download", "partition", "features", "hotness"),
                                      # where their parallel units run (stages.executor)
                                      "executor": ("download", "partition", "features", "hotness", "infer"),
                                      # the feature rows a training or inference rank holds in RAM
                                      "host_memory_budget_bytes": ("train", "infer"),
                                      # a peer silent this long inside a collective fails the job (train's was
                                      # collective_timeout_s; the flat name was infer's alone, so it still reaches it)
                                      "peer_timeout_s": ("train", "infer"),
                                      # where the ranks compute: a user who says cpu means both jobs
                                      "device": ("train", "infer")}
# a short name two stages declare, given to the stage a user means by it (infer's runtime settings have train's
# names: ``infer.timeout_s``, ``infer_timeout_s``)
ALIASES: dict[str, tuple[str, str]] = {"epochs": ("train", "epochs"), "timeout_s": ("train", "timeout_s"),
                                       "threads_per_rank": ("train", "threads_per_rank")}
CONTROL = ("artifacts", "until", "force", "wait")


class PipelineConfig(BaseModel):
    """Everything a run needs. Defaults: the embedded synthetic graph on 2 partitions."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    artifacts: str = Field("./artifacts", description="artifact root: a path or an fsspec URL (s3://...)")
    until: str = Field(ORDER[-1], description=f"last stage to run ({', '.join(ORDER)})")
    force: tuple[str, ...] = Field((), description="stages to rerun even if cached (or all)")
    wait: bool = Field(True, description="wait for a stage that another live run is building, saying which run "
                                         "(false, `--no-wait`: fail at once naming it)")
    download: download_stage.Params = Field(default_factory=download_stage.Params)
    partition: partition_stage.Params = Field(default_factory=partition_stage.Params)
    features: features_stage.Params = Field(default_factory=features_stage.Params)
    hotness: hotness_stage.Params = Field(default_factory=hotness_stage.Params)
    train: train_stage.Params = Field(default_factory=train_stage.Params)
    infer: infer_stage.Params = Field(default_factory=infer_stage.Params)

    @field_validator("until")
    @classmethod
    def _until(cls, v: str) -> str:
        if v not in ORDER:
            raise ValueError(f"unknown stage '{v}' (stages: {', '.join(ORDER)})")
        return v

    @field_validator("force", mode="before")
    @classmethod
    def _force(cls, v: Any) -> tuple[str, ...]:
        names = [v] if isinstance(v, str) else list(v or [])
        bad = [s for s in names if s not in ORDER and s != "all"]
        if bad:
            raise ValueError(f"unknown stage(s) {', '.join(bad)} in force (stages: {', '.join(ORDER)}, all)")
        return ORDER if "all" in names else tuple(names)

    @model_validator(mode="after")
    def _combinations(self) -> PipelineConfig:
        # what can be told before anything runs; the partition stage re-checks against the real node count
        dl, pt = self.download, self.partition
        if dl.dataset == "synthetic" and pt.num_partitions > dl.num_nodes:
            raise ValueError(f"{pt.num_partitions} partitions of a {dl.num_nodes}-node graph: one rank per "
                             f"partition needs num_partitions <= num_nodes")
        if self.hotness.cache_budget_bytes and self.train.cache_policy == "none":
            raise ValueError("cache_budget_bytes is set but cache_policy is 'none': drop one of them")
        return self

    def stages(self) -> tuple[str, ...]:
        return ORDER[: ORDER.index(self.until) + 1]

    def notes(self) -> list[str]:
        """Settings that are valid but probably not meant: a SHARED field set apart in one of its stages (say, the
        hotness plan fitted to other fanouts than training draws)."""
        out = []
        for name, stages in SHARED.items():
            values = {stage: getattr(self.stage_params(stage), name) for stage in stages}
            first = next(iter(values.values()))
            if any(v != first for v in values.values()):   # by equality: a dict value (edge_fanouts) is unhashable
                per_stage = ", ".join(f"{s}: {show_value(v)}" for s, v in values.items())
                out.append(f"{name} differs between stages ({per_stage}); set `{name}` once unless that is meant")
        return out

    def stage_params(self, name: str) -> StageParams:
        params = getattr(self, name)
        assert isinstance(params, StageParams)
        return params


# ---- names ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Name:
    """One flat name and the fields it sets; ``rank`` orders precedence (higher wins)."""

    name: str
    targets: tuple[tuple[str, str], ...]
    rank: int

    @property
    def info(self) -> FieldInfo:
        stage, field = self.targets[0]
        return STAGES[stage].Params.model_fields[field]


def _declared() -> Iterator[tuple[str, str, FieldInfo]]:
    for stage, module in STAGES.items():
        for field, info in module.Params.model_fields.items():
            yield stage, field, info


def flat_names() -> dict[str, Name]:
    """Every flat name a config, ``--set`` or the flow accepts, and the fields it sets."""
    owners: dict[str, list[str]] = {}
    for stage, field, _ in _declared():
        owners.setdefault(field, []).append(stage)
    names: dict[str, Name] = {}
    for name, stages in SHARED.items():
        names[name] = Name(name, tuple((s, name) for s in stages), 0)
    for name, target in ALIASES.items():
        names[name] = Name(name, (target,), 1)
    for field, declaring in owners.items():
        if len(declaring) == 1 and field not in names:
            names[field] = Name(field, ((declaring[0], field),), 1)
    for stage, field, _ in _declared():
        qualified = f"{stage}_{field}"
        names.setdefault(qualified, Name(qualified, ((stage, field),), 2))
    return names


def renamed_names() -> dict[str, Name]:
    """The old flat names of renamed fields (each stage's ``Params.RENAMED``), still accepted with a note: the old
    short name where the old field name was its stage's alone, and the old qualified one. Not flow parameters of
    their own beyond ``flow_signature_defaults``'s (None: unset), nor in the parameter table's names."""
    declared = [field for _, field, _ in _declared()]
    names: dict[str, Name] = {}
    for stage, module in STAGES.items():
        for old, new in module.Params.RENAMED.items():
            if old not in declared and old not in SHARED and old not in ALIASES:
                names[old] = Name(old, ((stage, new),), 1)
            names[f"{stage}_{old}"] = Name(f"{stage}_{old}", ((stage, new),), 2)
    return names


def flow_names() -> list[Name]:
    """The flow's parameters: each field once, by the short name that reaches it alone; a field a SHARED name sets
    also gets its qualified name (``train_seed``; default None: follow the shared value), and a field with no short
    name only its qualified one (``hotness_epochs``)."""
    names = flat_names()
    alone = {n.targets[0]: n for n in names.values() if n.rank == 1}
    chosen: dict[str, Name] = {}
    for stage, field, _ in _declared():
        if (stage, field) in alone:
            chosen.setdefault(alone[(stage, field)].name, alone[(stage, field)])
            continue
        shared = [names[s] for s in SHARED if (stage, field) in names[s].targets]
        for name in shared:
            chosen.setdefault(name.name, name)
        chosen[f"{stage}_{field}"] = names[f"{stage}_{field}"]
    return list(chosen.values())


def follows_shared(name: str) -> bool:
    """Whether flat ``name`` is the qualified name of a field that a SHARED name also sets."""
    return any(name == f"{stage}_{shared}" for shared, stages in SHARED.items() for stage in stages)


# ---- building a config -------------------------------------------------------------------------------------------
def make_config(*layers: Mapping[str, Any], **more: Any) -> PipelineConfig:
    """Validate the values of ``layers`` (flat, dotted or nested names, see the module docstring), each overriding
    the ones before it whatever names they use (a config file, then ``--set``, then options), and ``more`` last.
    A bad value becomes a one-line InputError naming the parameter, the value given and the expected form."""
    layers = (*layers, more)
    given = {k: v for layer in layers for k, v in layer.items() if k in CONTROL}
    sections, named = _resolve(layers)
    built: dict[str, StageParams] = {}
    for stage, values in sections.items():
        try:
            built[stage] = STAGES[stage].Params(**values)
        except ParamsError as err:   # said again with the name and the value the user gave
            if err.field not in err.params.model_fields:
                raise InputError(f"invalid parameter {stage}.{err.field}: unknown name; {_suggest(str(err.field))}"
                                 ) from None
            # a field the user did not name is said as stage.field
            name, value = named.get((stage, err.field), (f"{stage}.{err.field}", err.error.get("input")))
            raise InputError(field_error(err.params, err.error, name, value)) from None
    try:
        return PipelineConfig(**{k: v for k, v in given.items() if k in CONTROL and v is not None}, **built)
    except ValidationError as err:
        first = err.errors()[0]
        msg = first["msg"].removeprefix("Value error, ")
        if not first["loc"]:
            raise InputError(f"impossible combination: {msg}") from None
        raise InputError(f"invalid parameter {'.'.join(str(p) for p in first['loc'])}: {msg}") from None


def _resolve(layers: Sequence[Mapping[str, Any]]
             ) -> tuple[dict[str, dict[str, Any]], dict[tuple[str, str], tuple[str, Any]]]:
    """Per-stage field values, and the name and value the user gave each field (for error messages). A later layer
    wins; within a layer, the more specific name."""
    flat, renamed = flat_names(), renamed_names()
    ranked: dict[tuple[str, str], tuple[tuple[int, int], Any, str]] = {}

    def put(stage: str, field: str, value: Any, rank: tuple[int, int], name: str) -> None:
        if (new := STAGES[stage].Params.RENAMED.get(field)) is not None:   # an old field name, dotted or nested
            renamed_note(f"{stage}.{field}", f"{stage}.{new}")
            field = new
        if (stage, field) not in ranked or ranked[(stage, field)][0] <= rank:
            ranked[(stage, field)] = (rank, value, name)

    for layer, given in enumerate(layers):
        for key, value in given.items():
            if key in CONTROL:
                continue
            if key in STAGES and isinstance(value, Mapping):
                for field, inner in value.items():
                    put(key, str(field), inner, (layer, 3), f"{key}.{field}")
            elif "." in key and key.split(".", 1)[0] in STAGES:
                stage, field = key.split(".", 1)
                put(stage, field, value, (layer, 3), key)
            elif key in flat:
                if value is None and follows_shared(key):
                    continue   # a flow's "follow the shared value"
                for stage, field in flat[key].targets:
                    put(stage, field, value, (layer, flat[key].rank), key)
            elif key in renamed:
                if value is None:
                    continue   # the flow's default for an old name: not given
                (stage, field), = renamed[key].targets
                renamed_note(key, f"{stage}_{field} ({stage}.{field})")
                # given only on purpose, so it wins in its layer: the flow passes the new name too, at its default
                put(stage, field, value, (layer, 3), key)
            else:
                raise InputError(f"invalid parameter {key}: unknown name; {_suggest(key)}")
    sections: dict[str, dict[str, Any]] = {}
    for (stage, field), (_, value, _) in ranked.items():
        sections.setdefault(stage, {})[field] = value
    return sections, {target: (name, value) for target, (_, value, name) in ranked.items()}


def _suggest(key: str) -> str:
    import difflib

    close = difflib.get_close_matches(key, [*flat_names(), *CONTROL], n=3)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    return f"{hint}`gnnpipe params` lists every parameter"


# ---- derived views ----------------------------------------------------------------------------------------------
def stage_keys(cfg: PipelineConfig) -> dict[str, str]:
    """Each stage's artifact key for ``cfg``, computed without running anything (``artifact_key``, as the flow's
    cache policy does)."""
    keys: dict[str, str] = {}
    for name in cfg.stages():
        keys[name] = artifact_key(STAGES[name], cfg.stage_params(name), {u: keys[u] for u in STAGES[name].UPSTREAM})
    return keys


def artifact_key(module: Stage, params: StageParams, upstream_keys: Mapping[str, str]) -> str:
    """``storage.store.stage_key`` of a stage module and its Params: what ``ArtifactStore.build`` computes when the
    stage runs, and what Prefect's cache policy and ``gnnpipe status`` compute beforehand."""
    return stage_key(module.NAME, module.VERSION, params.key_params(), upstream_keys)


def flow_parameters(cfg: PipelineConfig) -> dict[str, Any]:
    """``cfg`` as the flow's keyword arguments (``flow_names``); JSON-able, as Prefect stores them."""
    out: dict[str, Any] = {"artifacts": cfg.artifacts, "until": cfg.until, "force": list(cfg.force),
                           "wait": cfg.wait}
    dumped = {stage: cfg.stage_params(stage).model_dump(mode="json") for stage in ORDER}
    for name in flow_names():
        stage, field = name.targets[0]
        out[name.name] = dumped[stage][field]
    return out


def flow_signature_defaults() -> dict[str, tuple[Any, Any, str]]:
    """``name -> (annotation, default, description)`` for the flow's parameters, from the stages' Params."""
    out: dict[str, tuple[Any, Any, str]] = {}
    for field in CONTROL:
        info = PipelineConfig.model_fields[field]
        default = info.get_default(call_default_factory=True)
        annotation = _nullable(list[str]) if field == "force" else info.annotation
        out[field] = (annotation, list(default) if field == "force" else default, info.description or "")
    for name in flow_names():
        info = name.info
        description = info.description or ""
        if follows_shared(name.name):
            out[name.name] = (_nullable(info.annotation), None, f"{description} (default: the value of "
                                                                f"{name.targets[0][1]})")
        else:
            default = info.get_default(call_default_factory=True)
            # a None default (chunk_rows: chosen by the stage) must be a valid flow value too
            annotation = _nullable(info.annotation) if default is None else info.annotation
            if is_sequence(info):   # `prefect deployment run -p fanouts=15,10,5`, as on the command line
                annotation = annotation | str
            out[name.name] = (annotation, list(default) if isinstance(default, tuple) else default, description)
    for old in renamed_names().values():   # a deployment's parameters written before the rename still bind
        if old.rank == 1:
            (stage, field), = old.targets
            out[old.name] = (_nullable(old.info.annotation), None, f"old name of {stage}_{field}, still accepted "
                                                                   f"(default None: unset)")
    return out


def _nullable(annotation: Any) -> Any:
    """``annotation | None``, for an annotation computed at run time."""
    return annotation | None


DEFAULTS = PipelineConfig()
