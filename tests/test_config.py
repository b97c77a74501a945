"""One declaration per parameter: every field of every stage's Params is reachable from ``--set`` (flat, qualified
and dotted names), YAML and TOML files (flat and nested sections) and the flow's parameters (what a deployment
takes), and the README's table is the one generated from the Params."""

from __future__ import annotations

import inspect
import json
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import pytest

from flows.config import (
    CONTROL,
    DEFAULTS,
    ORDER,
    SHARED,
    STAGES,
    flat_names,
    flow_names,
    flow_parameters,
    make_config,
    renamed_names,
    stage_keys,
)
from flows.load import load_config
from flows.params_doc import README_BEGIN, README_END, parameter_table
from storage import InputError
from tests.conftest import REPO

FIELDS = [(stage, field) for stage in ORDER for field in STAGES[stage].Params.model_fields]
# values the generic rule below cannot guess (it must be valid together with every other default)
SPECIAL: dict[tuple[str, str], Any] = {("download", "dataset"): "ogbn-arxiv", ("train", "gat_heads"): 8,
                                       ("train", "model"): "gcn", ("train", "model_kwargs"): {"aggr": "max"},
                                       ("train", "loss"): "examples.custom_model:smoothed_cross_entropy",
                                       ("infer", "fanouts"): (10, 5),
                                       ("hotness", "edge_fanouts"): {"edge": (5, 3, 2)},
                                       ("train", "edge_fanouts"): {"edge": (5, 3, 2)}, ("train", "decoder"): "dot",
                                       ("download", "link_edge_type"): "edge", ("train", "prefetch"): 2,
                                       **{(stage, "memory_budget_bytes"): 3 << 30
                                          for stage in ("download", "partition", "features", "hotness")},
                                       **{(stage, "executor"): "dask:3"
                                          for stage in ("download", "partition", "features", "hotness", "infer")}}


def _strip_optional(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return next(a for a in typing.get_args(annotation) if a is not type(None))
    return annotation


def other_value(stage: str, field: str) -> Any:
    """A valid value of the field that differs from its default."""
    if (stage, field) in SPECIAL:
        return SPECIAL[(stage, field)]
    info = STAGES[stage].Params.model_fields[field]
    default = info.get_default(call_default_factory=True)
    kind = _strip_optional(info.annotation)
    if typing.get_origin(kind) is Literal:
        return next(v for v in typing.get_args(kind) if v != default)
    if typing.get_origin(kind) is tuple:
        return tuple(reversed(default)) if len(set(default)) > 1 else tuple(v + 1 for v in default)
    if kind is bool:
        return not default
    if kind is int:
        return 1000 if default is None else default + 1
    if kind is float:
        return 0.25 if not default else default / 2
    if kind is str:
        return "/tmp/somewhere"
    raise AssertionError(f"no test value for {stage}.{field} ({info.annotation}): add one to SPECIAL")


def as_text(value: Any) -> str:
    """How a person types the value after ``--set name=``."""
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


def get(cfg: Any, stage: str, field: str) -> Any:
    return getattr(cfg.stage_params(stage), field)


def names_of(stage: str, field: str) -> list[str]:
    return [n.name for n in flat_names().values() if (stage, field) in n.targets]


@pytest.mark.parametrize("stage, field", FIELDS, ids=[f"{s}.{f}" for s, f in FIELDS])
def test_every_field_is_reachable_by_every_route(stage: str, field: str, tmp_path: Path):
    value = other_value(stage, field)
    routes = {f"--set {stage}.{field}": load_config(None, [f"{stage}.{field}={as_text(value)}"])}
    for name in names_of(stage, field):
        routes[f"--set {name}"] = load_config(None, [f"{name}={as_text(value)}"])
    yaml_value = list(value) if isinstance(value, tuple) else value
    if isinstance(value, dict):
        yaml_value = {k: list(v) if isinstance(v, tuple) else v for k, v in value.items()}
    nested = tmp_path / "nested.yaml"
    nested.write_text(f"{stage}:\n  {field}: {yaml_value!r}\n".replace("'", '"').replace("True", "true")
                      .replace("False", "false"))
    routes["yaml section"] = load_config(nested, [])
    toml = tmp_path / "c.toml"
    toml_value = str(yaml_value).lower() if isinstance(value, bool) else repr(yaml_value).replace("'", '"')
    if isinstance(value, dict):   # an inline table
        toml_value = "{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in yaml_value.items()) + "}"
    toml.write_text(f"[{stage}]\n{field} = {toml_value}\n")
    routes["toml section"] = load_config(toml, [])
    flat_yaml = tmp_path / "flat.yaml"
    flat_yaml.write_text(f"{stage}_{field}: {as_text(value)}\n")
    routes["yaml qualified"] = load_config(flat_yaml, [])
    for route, cfg in routes.items():
        assert get(cfg, stage, field) == value, route
    # the flow (a deployment's parameters): one of its names reaches the field
    in_flow = [n for n in flow_names() if (stage, field) in n.targets]
    assert in_flow, f"{stage}.{field} is not a parameter of the flow"
    params = {**flow_parameters(DEFAULTS), in_flow[-1].name: yaml_value}
    assert get(make_config(params), stage, field) == value


def test_the_flow_signature_and_deployment_schema_list_every_flow_name():
    from prefect.utilities.callables import parameter_schema

    from flows.pipeline import pipeline

    # then the old short names of renamed fields, None by default (unset), so a deployment's old parameters bind
    old = [n.name for n in renamed_names().values() if n.rank == 1]
    expected = [*CONTROL, *(n.name for n in flow_names()), *old]
    assert list(inspect.signature(pipeline).parameters) == expected
    schema = parameter_schema(pipeline)
    assert set(schema.properties) == set(expected)
    assert "neighbours sampled per hop" in schema.properties["train_fanouts"]["description"]
    # the flow's defaults are the stages' defaults
    defaults = {k: p.default for k, p in inspect.signature(pipeline).parameters.items()}
    assert make_config(defaults) == DEFAULTS
    assert make_config(flow_parameters(DEFAULTS)) == DEFAULTS


def test_shared_names_set_every_stage_and_a_qualified_name_overrides_one():
    cfg = make_config(seed=3, fanouts="10,5", batch_size=64, hotness_seed=9)
    assert (cfg.download.seed, cfg.hotness.seed, cfg.train.seed, cfg.partition.seed) == (3, 9, 3, 0)
    assert cfg.hotness.fanouts == cfg.train.fanouts == (10, 5) and cfg.train.num_layers == 2
    assert cfg.hotness.batch_size == cfg.train.batch_size == 64
    for name, stages in SHARED.items():
        defaults = [getattr(STAGES[s].Params(), name) for s in stages]
        assert all(d == defaults[0] for d in defaults), f"shared name {name} has different defaults in {stages}"
    # flow-style None for a qualified override means "follow the shared value"
    assert make_config(seed=5, train_seed=None).train.seed == 5
    # epochs means the training epochs; the hotness stage's is hotness_epochs
    assert make_config(epochs=2, hotness_epochs=3).train.epochs == 2
    assert make_config(epochs=2, hotness_epochs=3).hotness.epochs == 3


@pytest.mark.parametrize("text", ["15,10,5", "[15,10,5]", "[15, 10, 5]", " 15, 10,5 "])
def test_lists_accept_commas_with_or_without_brackets(text: str):
    assert load_config(None, [f"fanouts={text}"]).train.fanouts == (15, 10, 5)
    assert load_config(None, ["split=0.5,0.25,0.25"]).download.split == (0.5, 0.25, 0.25)
    assert load_config(None, ["fanouts=5"]).train.fanouts == (5,)


@pytest.mark.parametrize("setting, message", [
    ("fanouts=15,abc", "invalid parameter fanouts='15,abc': Input should be a valid integer, unable to parse "
                       "string as an integer; expected a list of integers, e.g. 15,10,5 or [15,10,5]"),
    ("fanouts=0", "invalid parameter fanouts=0: invalid fanout 0: each hop needs a positive number of neighbours, "
                  "or -1 for all of them; expected a list of integers"),
    ("fanouts=-2", "invalid parameter fanouts=-2: invalid fanout -2"),
    ("train.fanouts=10,0", "invalid parameter train.fanouts='10,0': invalid fanout 0"),
    ("model=gnn", "invalid parameter model='gnn': unknown model; expected auto, sage, gcn, gat, rgcn, rgat, hgt, "
                  "mlp, or an import path package.module:factory"),
    ("weight_decay=-1", "invalid parameter weight_decay=-1: Input should be greater than or equal to 0; expected "
                        "a number >= 0"),
    ("train.epoch=3", "invalid parameter train.epoch: unknown name; did you mean epochs?"),
    ("epoch=3", "invalid parameter epoch: unknown name; did you mean epochs"),
])
def test_a_bad_value_names_the_parameter_the_value_and_the_expected_form(setting: str, message: str):
    with pytest.raises(InputError) as err:
        load_config(None, [setting])
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_enumerations_are_declared_once():
    from stages import choices
    from stages.partition import assign
    from stages.train.models import model
    from stages.train.rank import cache_policy

    assert ("auto", *model.MODELS) == typing.get_args(choices.ModelName)
    assert assign.PARTITION_METHODS == typing.get_args(choices.PartitionMethod)
    assert set(cache_policy.CACHE_POLICIES) | {"auto"} == set(typing.get_args(choices.CachePolicyName))
    assert STAGES["download"].Params.model_fields["dataset"].annotation is choices.Dataset


def test_readme_parameter_table_is_generated_from_the_params():
    readme = (REPO / "README.md").read_text()
    assert README_BEGIN in readme and README_END in readme, "README lost its parameter table markers"
    table = readme.split(README_BEGIN, 1)[1].split(README_END, 1)[0].strip()
    assert table == parameter_table(markdown=True).strip(), (
        "README's parameter table is stale: paste the output of `gnnpipe params --markdown` between the markers")
    for stage, field in FIELDS:
        assert f"`{stage}.{field}`" in table


def test_set_overrides_the_config_file_whatever_names_either_uses(tmp_path: Path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("train_epochs: 3\ntrain:\n  seed: 7\nhotness:\n  epochs: 2\n")
    cfg = load_config(cfg_file, ["epochs=5", "seed=2"])
    assert (cfg.train.epochs, cfg.train.seed, cfg.download.seed) == (5, 2, 2)
    assert cfg.hotness.epochs == 2   # nothing in --set names it
    assert load_config(cfg_file, []).train.epochs == 3
    # within one source the more specific name wins, in any order
    assert make_config({"train.seed": 4, "seed": 1}).train.seed == 4


@pytest.mark.parametrize("setting, message", [
    ("train.fanouts=[]", "invalid parameter train.fanouts=[]: fanouts is empty"),
    ("train_fanouts=[]", "invalid parameter train_fanouts=[]: fanouts is empty"),
    ("seed=-1", "invalid parameter seed=-1: Input should be greater than or equal to 0"),
    ("hotness_seed=-3", "invalid parameter hotness_seed=-3: Input should be greater than or equal to 0"),
    ("partition.seed=-1", "invalid parameter partition.seed=-1"),
])
def test_bad_values_the_old_config_let_through_are_one_line_errors(setting: str, message: str):
    with pytest.raises(InputError) as err:
        load_config(None, [setting])
    assert str(err.value).startswith(message), str(err.value)


def test_a_shared_name_set_apart_in_one_stage_is_noted():
    assert make_config().notes() == []
    notes = make_config(train_fanouts="10,5").notes()
    assert notes == ["fanouts differs between stages (hotness: 15,10,5, train: 10,5); set `fanouts` once unless that "
                     "is meant"]


# The flow's parameter names are what deployments and scripts pass (`prefect deployment run -p NAME=...`): a new
# stage field must not silently rename one (a short name that two stages declare is no longer short).
FLOW_NAMES = {
    "artifacts", "until", "force", "dataset", "num_nodes", "avg_degree", "num_features", "num_classes", "seed",
    "download_seed", "split", "path", "fingerprint", "download_dir", "num_partitions", "method", "partition_seed",
    "balance_train", "balance_edges", "chunk_rows", "compressor", "fanouts", "hotness_fanouts", "batch_size",
    "hotness_batch_size", "hotness_epochs", "cache_budget_bytes", "cache_ratio", "hotness_seed", "model", "hidden",
    "train_fanouts", "train_batch_size", "epochs", "lr", "weight_decay", "dropout", "gat_heads", "train_seed",
    "cache_policy", "timeout_s", "collective_timeout_s", "peer_timeout_s", "host_memory_budget_bytes",
    "threads_per_rank", "device",
}


def test_an_old_name_of_a_renamed_field_still_works_and_maps_to_the_new_one(tmp_path: Path):
    """infer's job_timeout_s and rank_threads are train's timeout_s and threads_per_rank now ([5/5]): every old
    route still reaches the renamed field, with one note; the flat short names stay train's."""
    import warnings

    from stages.infer.params import Params as InferParams
    from stages.params import _NOTED

    _NOTED.clear()
    with pytest.warns(FutureWarning, match=r"job_timeout_s is an old name: it is timeout_s now"):
        direct = InferParams(job_timeout_s=5.0, rank_threads=2)   # a job spec or a test written before
    assert (direct.timeout_s, direct.threads_per_rank) == (5.0, 2)
    assert InferParams(job_timeout_s=5.0, timeout_s=7.0).timeout_s == 7.0   # the new name wins
    toml = tmp_path / "old.toml"
    toml.write_text("[infer]\njob_timeout_s = 9.0\n")
    routes = [make_config(job_timeout_s=9.0, rank_threads=3), make_config({"infer.job_timeout_s": 9.0}),
              make_config(infer_job_timeout_s=9.0), load_config(None, ["job_timeout_s=9", "rank_threads=3"]),
              load_config(toml, [])]
    for cfg in routes:
        assert cfg.infer.timeout_s == 9.0 and cfg.train.timeout_s == DEFAULTS.train.timeout_s
    assert routes[0].infer.threads_per_rank == 3 and routes[0].train.threads_per_rank is None
    # the short names are train's, as before; infer's new ones are qualified
    cfg = make_config(timeout_s=11.0, threads_per_rank=4, infer_timeout_s=12.0)
    assert (cfg.train.timeout_s, cfg.train.threads_per_rank, cfg.infer.timeout_s) == (11.0, 4, 12.0)
    assert cfg.infer.threads_per_rank is None
    # a later layer wins whichever name each uses; a renamed field does not re-key the artifact (runtime)
    assert make_config({"job_timeout_s": 1.0}, {"infer.timeout_s": 2.0}).infer.timeout_s == 2.0
    assert make_config({"infer_timeout_s": 1.0}, {"job_timeout_s": 2.0}).infer.timeout_s == 2.0
    assert stage_keys(routes[0]) == stage_keys(DEFAULTS)
    # a deployment's old parameter binds; None (the flow's default for it) sets nothing
    from flows.pipeline import pipeline

    assert make_config(pipeline.validate_parameters({"job_timeout_s": 9.0})).infer.timeout_s == 9.0
    assert make_config(pipeline.validate_parameters({"job_timeout_s": None})) == DEFAULTS
    # the note is said once per name
    _NOTED.clear()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        make_config(job_timeout_s=1.0)
        make_config(job_timeout_s=2.0)
    assert [str(w.message) for w in seen if issubclass(w.category, FutureWarning)] == [
        "job_timeout_s is an old name: it is infer_timeout_s (infer.timeout_s) now (the old name still works, for "
        "now)"]



def test_peer_timeout_is_one_name_for_train_and_infer(tmp_path: Path):
    """train's collective_timeout_s is peer_timeout_s now, infer's name for the same setting ([5/5]): the flat name
    sets both stages, and every old route still reaches train's field, with a note, without re-keying it."""
    from stages.params import _NOTED
    from stages.train.params import Params as TrainParams

    cfg = make_config(peer_timeout_s=42.0)
    assert (cfg.train.peer_timeout_s, cfg.infer.peer_timeout_s) == (42.0, 42.0)
    _NOTED.clear()
    with pytest.warns(FutureWarning, match=r"collective_timeout_s is an old name: it is peer_timeout_s now"):
        assert TrainParams(collective_timeout_s=5.0).peer_timeout_s == 5.0   # a job spec written before
    assert TrainParams(collective_timeout_s=5.0, peer_timeout_s=7.0).peer_timeout_s == 7.0   # the new name wins
    toml = tmp_path / "old.toml"
    toml.write_text("[train]\ncollective_timeout_s = 9.0\n")
    routes = [make_config(collective_timeout_s=9.0), make_config({"train.collective_timeout_s": 9.0}),
              make_config(train_collective_timeout_s=9.0), load_config(None, ["collective_timeout_s=9"]),
              load_config(toml, [])]
    for cfg in routes:
        assert cfg.train.peer_timeout_s == 9.0 and cfg.infer.peer_timeout_s == DEFAULTS.infer.peer_timeout_s
    assert stage_keys(routes[0]) == stage_keys(DEFAULTS)
    from flows.pipeline import pipeline

    assert make_config(pipeline.validate_parameters({"collective_timeout_s": 9.0})).train.peer_timeout_s == 9.0
    assert make_config(pipeline.validate_parameters({"collective_timeout_s": None})) == DEFAULTS

def test_flow_parameter_names_stay_stable():
    from flows.pipeline import pipeline

    names = set(inspect.signature(pipeline).parameters)
    assert FLOW_NAMES <= names, f"flow parameters renamed or gone: {sorted(FLOW_NAMES - names)}"


def test_deployment_parameters_take_lists_as_text():
    from flows.pipeline import pipeline

    checked = pipeline.validate_parameters({"fanouts": "15,10,5", "split": "0.5,0.25,0.25", "train_fanouts": None})
    cfg = make_config(checked)
    assert cfg.train.fanouts == cfg.hotness.fanouts == (15, 10, 5) and cfg.download.split == (0.5, 0.25, 0.25)


def test_memory_budget_takes_sizes_as_people_write_them():
    """``memory_budget_bytes`` is one shared runtime name: it reaches the four data stages, never re-keys them, and
    takes 4GiB / 512MiB / plain bytes; a size below 1 MiB or a word is one error line."""
    cfg = make_config({"memory_budget_bytes": "4GiB"})
    for stage in ("download", "partition", "features", "hotness"):
        assert cfg.stage_params(stage).memory_budget_bytes == 4 << 30   # type: ignore[attr-defined]
    assert stage_keys(cfg) == stage_keys(make_config({}))
    hotness = make_config({"memory_budget_bytes": "512MiB"}).stage_params("hotness")
    assert hotness.memory_budget_bytes == 512 << 20   # type: ignore[attr-defined]
    assert make_config({"partition.memory_budget_bytes": 5_000_000}).stage_params(
        "partition").memory_budget_bytes == 5_000_000   # type: ignore[attr-defined]
    for bad in ("lots", "100"):
        with pytest.raises(InputError, match=r"invalid parameter memory_budget_bytes="):
            make_config({"memory_budget_bytes": bad})

