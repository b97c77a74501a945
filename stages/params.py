"""The base of every stage's ``Params``: the one place a parameter is declared (docs/design.md §2).

A field's name, type, default, bounds and ``description`` are written once, on its stage's Params. The pipeline
config (flows/config.py), the flow's deployment parameters, ``--set``, YAML/TOML files and the README's parameter
table are all derived from these classes.

- ``runtime(...)`` declares a field that changes how a run executes, not what it computes (a timeout, a memory
  budget, a device): it is left out of ``key_params()``, so raising a timeout after a failed attempt resumes that
  attempt's checkpoints instead of starting a new artifact.
- List fields accept ``15,10,5`` and ``[15,10,5]`` (and a single ``15``) from text, as typed on a command line.

Kept free of torch so that configs validate in milliseconds (``gnnpipe status``).
"""

from __future__ import annotations

import types
import typing
import warnings
from typing import Annotated, Any, ClassVar, Literal, Union

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from stages import executor
from stages.memory import parse_bytes
from stages.runtime.sampling.fanouts import check_edge_fanouts, graph_fanouts, validate_fanouts
from storage.errors import InputError
from storage.schema import GraphSchema

_RUNTIME = "runtime"
FORM = "form"   # json_schema_extra key: how a value looks, in words, where the annotation cannot say (expected_form)


def _fanouts(value: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(validate_fanouts(value))   # a ValueError, which pydantic reports against the field


Fanouts = Annotated[tuple[int, ...], AfterValidator(_fanouts)]
"""Neighbours sampled per hop, outermost first (a positive count, or -1 for all)."""

EdgeFanouts = Annotated[dict[str, tuple[int, ...]], AfterValidator(check_edge_fanouts)]
"""Typed graphs: per-hop fanouts of the edge types named (``src___rel___dst`` or a unique relation name), in place
of ``fanouts`` for those types; 0 = that type is not sampled on that hop
(``stages.runtime.sampling.fanouts.hop_fanouts``)."""

def check_graph_fanouts(fanouts: tuple[int, ...], edge_fanouts: dict[str, tuple[int, ...]],
                        schema: GraphSchema) -> None:
    """A stage's check, before any work, that its ``fanouts``/``edge_fanouts`` fit its graph's edge types: the
    runtime's ValueError (``graph_fanouts``) becomes the user's InputError here, the layer storage/errors.py names."""
    try:
        graph_fanouts(fanouts, edge_fanouts, schema)
    except ValueError as err:
        raise InputError(str(err)) from None


Seed = Annotated[int, Field(ge=0)]
"""A random seed: numpy's SeedSequence (stages/runtime/seeds.py) and default_rng take only non-negative ones."""


def runtime(default: Any, *, description: str, form: str | None = None, **constraints: Any) -> Any:
    """A field that is not part of the artifact key (see the module docstring); ``form``: how a value looks, in
    words, where the annotation cannot say (``expected_form``)."""
    extra: dict[str, Any] = {_RUNTIME: True, **({FORM: form} if form else {})}
    return Field(default, description=description, json_schema_extra=extra, **constraints)


_NOTED: set[str] = set()


def renamed_note(old: str, new: str) -> None:
    """Say once per process that ``old`` is the old name of ``new``: still accepted, so that configs, deployments
    and job specs written before the rename keep working."""
    if old not in _NOTED:
        _NOTED.add(old)
        # FutureWarning: shown by default (DeprecationWarning is hidden outside __main__)
        warnings.warn(f"{old} is an old name: it is {new} now (the old name still works, for now)", FutureWarning,
                      stacklevel=3)


class StageParams(BaseModel):
    """Frozen and closed (an unknown name is an error, not silently ignored). Built directly, a bad value raises
    one-line InputError naming the field, the value and the expected form (the pipeline config does the same with
    the name the user typed).

    ``RENAMED``: a field's old names (old -> new), still accepted with a note (``renamed_note``); the pipeline
    config derives the old flat names from it (``flows.config.renamed_names``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    RENAMED: ClassVar[dict[str, str]] = {}

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as err:
            raise ParamsError(type(self), err.errors()[0]) from None

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        if not cls.RENAMED or not isinstance(data, dict) or not cls.RENAMED.keys() & data.keys():
            return data
        out = dict(data)
        for old, new in cls.RENAMED.items():
            if old in out:
                renamed_note(old, new)
                value = out.pop(old)
                out.setdefault(new, value)   # the new name wins where both are given
        return out

    @field_validator("*", mode="before")
    @classmethod
    def _list_from_text(cls, value: Any, info: ValidationInfo) -> Any:
        if info.field_name is None or not is_sequence(cls.model_fields[info.field_name]):
            return value
        return as_list(value)

    @classmethod
    def runtime_fields(cls) -> frozenset[str]:
        return frozenset(name for name, f in cls.model_fields.items()
                         if isinstance(f.json_schema_extra, dict) and f.json_schema_extra.get(_RUNTIME))

    def key_params(self) -> dict[str, Any]:
        """What defines the artifact: every field but the runtime ones, as JSON values."""
        return self.model_dump(mode="json", exclude=set(self.runtime_fields()))


class ExecutorParams(StageParams):
    """The Params of a stage whose parallel units run on an executor (``stages.executor``): the data stages'
    (``BudgetedParams``) and infer's (its exports); the pipeline's flat name ``executor`` sets it in all five."""

    executor: str = runtime(executor.LOCAL, form=executor.FORM,
                            description="where the stage's parallel units run: local (this process), dask[:N] (a "
                                        "local Dask cluster of N worker processes, default one per unit up to the "
                                        "CPUs, started and stopped by the stage) or a Dask scheduler tcp://host:port; "
                                        "units: the external sort's buckets (download, streamed), the part "
                                        "writes (partition), groups of parts (features, hotness), the exports' "
                                        "chunks (infer); each gets 1/workers of memory_budget_bytes")

    @field_validator("executor")
    @classmethod
    def _executor(cls, value: str) -> str:
        return executor.check_executor(value)


class BudgetedParams(ExecutorParams):
    """The data stages' Params (download, partition, features, hotness): their shared memory budget, declared
    here once (``stages.memory``), and where their parallel units run (``ExecutorParams``); the pipeline's flat
    name ``memory_budget_bytes`` sets it in all four."""

    memory_budget_bytes: int | None = runtime(None, ge=1 << 20, description="peak anonymous memory of the stage "
                                              "(bytes, or 4GiB, 512MiB); null: half the memory available when it "
                                              "starts; chunked, spilling to the artifact root's disk when the "
                                              "graph does not fit")

    @field_validator("memory_budget_bytes", mode="before")
    @classmethod
    def _bytes_from_text(cls, value: Any) -> Any:
        return parse_bytes(value)


class ParamsError(InputError):
    """A bad value for one field of a stage's Params; ``field`` and ``error`` (pydantic's) let a caller that knows
    the name the user typed say it in those words (flows/config.py)."""

    def __init__(self, params: type[BaseModel], error: Any) -> None:
        super().__init__(field_error(params, error))
        self.params, self.error = params, error
        self.field = str(error["loc"][0]) if error["loc"] else None


def field_error(params: type[BaseModel], error: Any, name: str | None = None, value: Any = None) -> str:
    """``invalid parameter NAME=VALUE: what is wrong; expected FORM`` for one pydantic error of ``params``;
    ``name``/``value``: as the user gave them (default: the field's name and the value pydantic saw)."""
    loc = [str(p) for p in error["loc"]]
    msg = error["msg"].removeprefix("Value error, ")
    info = params.model_fields.get(loc[0]) if loc else None
    if info is None:
        what = loc[0] if loc else "?"
        return f"invalid parameter {name or what}: {'unknown name' if loc else msg}"
    if error["type"] == "literal_error":
        msg = "unknown value"
    shown = value if name is not None else error.get("input")
    return f"invalid parameter {name or loc[0]}={show_value(shown)}: {msg}; expected {expected_form(info)}"


def as_typed(value: Any) -> str:
    """A value as a person types it after ``--set name=``: ``15,10,5``, ``true``, ``null``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return ",".join(as_typed(v) for v in value) or "[]"
    return str(value)


def show_value(value: Any) -> str:
    """``as_typed``, with text quoted: an error shows ``fanouts='15,abc'`` (text that did not parse)."""
    return repr(value) if isinstance(value, str) else as_typed(value)


def as_list(value: Any) -> Any:
    """A list field's value as typed anywhere: text (``parse_list``), a bare number (``--set fanouts=5``: one
    item), or already a list."""
    if isinstance(value, str):
        return parse_list(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [value]
    return value


def parse_list(text: str) -> Any:
    """``"15,10,5"``, ``"[15, 10, 5]"`` or ``"15"`` → ``[15, 10, 5]`` / ``[15]``; items typed as YAML scalars.
    Text that is not a list is returned as it is, for the field's own validation to reject with its message."""
    body = text.strip()
    if body.startswith("[") and body.endswith("]"):
        body = body[1:-1]
    if not body.strip():
        return []
    items = [item.strip() for item in body.split(",")]
    return [yaml.safe_load(item) if item else item for item in items]


def _unwrap_optional(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def is_sequence(info: FieldInfo) -> bool:
    return typing.get_origin(_unwrap_optional(info.annotation)) in (tuple, list)


def expected_form(info: FieldInfo) -> str:
    """What a value of this field looks like, in words, for error messages and the README table."""
    annotation = info.annotation
    optional = typing.get_origin(annotation) in (Union, types.UnionType) and type(None) in typing.get_args(annotation)
    inner = _unwrap_optional(annotation)
    origin, args = typing.get_origin(inner), typing.get_args(inner)
    extra = info.json_schema_extra
    if isinstance(extra, dict) and isinstance(extra.get(FORM), str):   # a field that words its own form
        form = str(extra[FORM])
    elif origin is Literal:
        form = "one of " + ", ".join(str(a) for a in args)
    elif origin in (tuple, list):
        item = args[0] if args else Any
        kind = {int: "integers", float: "numbers", str: "names"}.get(item, "values")
        if origin is tuple and args and args[-1] is not Ellipsis:
            form = f"{len(args)} {kind}, e.g. " + ",".join(_example(a) for a in args)
        else:
            form = f"a list of {kind}, e.g. 15,10,5 or [15,10,5]"
    else:
        form = {int: "an integer", float: "a number", bool: "true or false", str: "text"}.get(inner, str(inner))
    bounds = _bounds(info)
    if bounds:
        form += f" {bounds}"
    return form + (" or null" if optional else "")


def _example(item: Any) -> str:
    return {int: "1", float: "0.5", str: "a"}.get(item, "x")


def _bounds(info: FieldInfo) -> str:
    words = []
    for meta in info.metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            if getattr(meta, attr, None) is not None:
                words.append(f"{sign} {getattr(meta, attr)}")
    return ", ".join(words)
