"""The gnnpipe CLI without a Prefect server: config files, --set, status, show, clean, and its error lines."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from flows.config import stage_keys
from flows.load import load_config
from storage import InputError
from tests._train_pipeline import build_without_prefect
from tests.conftest import GNNPIPE, REPO, TINY, cli_env


def gnnpipe(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*GNNPIPE, *args], cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=120)


def set_args(values: dict[str, Any]) -> list[str]:
    return [a for k, v in values.items() if k != "artifacts" for a in ("--set", f"{k}={json.dumps(v)}")]


@pytest.fixture
def built(tmp_path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    values = {**TINY, "artifacts": str(tmp_path / "art"), "fanouts": [5, 5], "batch_size": 64, "until": "hotness"}
    _, manifests = build_without_prefect(values)
    return values, {name: m.key for name, m in manifests.items()}


def test_status_show_and_clean(built):
    values, keys = built
    art = ["--artifacts", values["artifacts"]]
    proc = gnnpipe("status", *art, *set_args(values))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert [ln.split()[0] for ln in lines] == list(keys)
    for line, (name, key) in zip(lines, keys.items()):
        assert f"{name}" in line and key in line and " cached " in line
    assert "edge cut" in lines[1] and "expected hit rate" in lines[3]
    shown = gnnpipe("show", "partition", *art, *set_args(values))
    assert shown.returncode == 0 and "| partition | nodes | edges | train_nodes | gid_range |" in shown.stdout
    assert gnnpipe("clean", "--stage", "hotness", *art).returncode == 0
    after = gnnpipe("status", *art, *set_args(values)).stdout.strip().splitlines()
    assert " missing " in after[3] and " cached " in after[2]
    assert gnnpipe("clean", *art).returncode == 0
    assert not any((Path(values["artifacts"]) / s).exists() for s in keys)


def test_config_files_and_set_agree(tmp_path: Path):
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("num_partitions: 4\nfanouts: [10, 5]\ndataset: synthetic\n")
    toml_file = tmp_path / "c.toml"
    toml_file.write_text("num_partitions = 4\nfanouts = [10, 5]\n")
    a = load_config(yaml_file, [])
    b = load_config(toml_file, [])
    c = load_config(None, ["num_partitions=4", "fanouts=[10, 5]"])
    assert stage_keys(a) == stage_keys(b) == stage_keys(c)
    assert stage_keys(load_config(yaml_file, ["num_partitions=2"]))["partition"] != stage_keys(a)["partition"]
    assert stage_keys(a)["download"] == stage_keys(load_config(None, []))["download"]


@pytest.mark.parametrize("content, set_, message", [
    ("bogus_key: 1\n", [], "invalid parameter bogus_key: unknown name; `gnnpipe params` lists every parameter"),
    ("num_partitions: many\n", [], "invalid parameter num_partitions='many': Input should be a valid integer, "
                                    "unable to parse string as an integer; expected an integer >= 1"),
    # the file, line and column where yaml stopped (its own first line can be "while parsing a flow sequence")
    ("num_partitions: [1\n", [], "cannot parse .*c.yaml, line 2, column 1: expected ',' or ']', but got "
                                  "'<stream end>'"),
    ("epochs: 2\nmodel: sage: gcn\n", [], "cannot parse .*c.yaml, line 2, column 12: mapping values are not "
                                          "allowed here"),
    ("- a\n- b\n", [], "must hold a mapping"),
    ("", ["fanouts=[]"], "fanouts is empty"),
    ("", ["fanouts=[10, -2]"], "invalid parameter fanouts=10,-2: invalid fanout -2"),
    ("", ["num_partitions"], "--set expects key=value"),
    ("num_nodes: 100\nnum_partitions: 101\n", [], "impossible combination: 101 partitions of a 100-node graph"),
    ("", ["cache_budget_bytes=1000000", "cache_policy=none"], "impossible combination: cache_budget_bytes is set"),
    ("", ["model=gat", "hidden=30"], "hidden=30 must be a multiple of gat_heads=4"),
])
def test_config_errors_are_one_line(tmp_path: Path, content: str, set_: list[str], message: str):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(content)
    with pytest.raises(InputError, match=message.replace("[", r"\[")) as err:
        load_config(cfg, set_)
    assert "\n" not in str(err.value)


# One case of each kind through the command itself (flows.cli.main turns any InputError into the line and exit 2;
# a subprocess per case above cost ~4 CPU-seconds of start-up each, 11 of them, for the same code path)
@pytest.mark.parametrize("content, set_, message", [
    ("bogus_key: 1\n", [], "invalid parameter bogus_key: unknown name"),
    ("epochs: 2\nmodel: sage: gcn\n", [], "cannot parse .*c.yaml, line 2, column 12: mapping values"),
    ("", ["num_partitions"], "--set expects key=value"),
])
def test_the_command_prints_a_config_error_as_one_line_and_exits_2(tmp_path: Path, content: str, set_: list[str],
                                                                    message: str):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(content)
    proc = gnnpipe("status", "--config", str(cfg), *[a for s in set_ for a in ("--set", s)])
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and re.match(f"error: {message}", lines[0]), proc.stderr


# typer's own usage errors (before any command runs) go through the same one line: two cases through the command,
# one with click's context and one a parser error without it (then the command is read from argv)
@pytest.mark.parametrize("args, line", [
    (["run", "--bogus"], "error: no such option: --bogus; see `gnnpipe run --help`"),
    (["export", "infer", "--format"], "error: option '--format' requires an argument; see `gnnpipe export --help`"),
])
def test_a_usage_error_is_one_line_naming_the_help_and_exits_2(args: list[str], line: str):
    proc = gnnpipe(*args)
    assert (proc.returncode, proc.stderr.strip().splitlines(), proc.stdout) == (2, [line], "")


@pytest.mark.parametrize("args, line", [
    (["show"], "missing argument 'STAGE'; see `gnnpipe show --help`"),
    (["train", "--nnodes", "two"], "invalid value for '--nnodes': .*; see `gnnpipe train --help`"),
    (["show", "train", "abc", "extra"], r"got unexpected extra argument\(s\) \(extra\); see `gnnpipe show --help`"),
    (["--bogus"], "no such option: --bogus; see `gnnpipe --help`"),
    # an option named like a parameter: the --set that gives it, not click's guess at an option
    (["stage", "train", "--fanouts", "5"],
     r"no such option: --fanouts; fanouts is a parameter: --set fanouts=VALUE \(`gnnpipe params` lists them\)"),
    (["run", "--train-seed=3"], "no such option: --train-seed; train_seed is a parameter: --set train_seed=VALUE .*"),
    (["run", "--epochz", "3"], "no such option: --epochz; see `gnnpipe run --help`"),
])
def test_usage_errors_read_as_the_rest_of_an_error_line(args: list[str], line: str, monkeypatch):
    import typer

    from flows import cli
    monkeypatch.setattr("sys.argv", ["gnnpipe", *args])
    with pytest.raises(cli.CLICK_ERRORS.UsageError) as err:
        typer.main.get_command(cli.app).main(args, prog_name="gnnpipe", standalone_mode=False)
    assert re.fullmatch(line, cli.usage_line(err.value)), cli.usage_line(err.value)


def test_a_broken_toml_file_names_line_and_column(tmp_path: Path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("epochs = 3\nmodel = \n")
    with pytest.raises(InputError, match=r"cannot parse .*c.toml: Invalid value \(at line 2, column 9\)$"):
        load_config(cfg, [])


def test_unknown_stage_and_missing_config(tmp_path: Path):
    proc = gnnpipe("show", "nosuch")
    assert proc.returncode == 2 and "unknown stage 'nosuch'" in proc.stderr
    proc = gnnpipe("run", "--config", str(tmp_path / "missing.yaml"))
    assert proc.returncode == 2 and "config file" in proc.stderr and "not found" in proc.stderr
    proc = gnnpipe("show", "partition", "--artifacts", str(tmp_path / "empty"))
    assert proc.returncode == 2 and "is missing" in proc.stderr and "rerun the pipeline" in proc.stderr


def test_every_command_and_option_says_what_it_is_for():
    import typer

    from flows import cli

    def silent(cmd: Any, path: str) -> list[str]:
        found = [] if (cmd.help or "").strip() else [path]
        found += [f"{path} {p.name}" for p in cmd.params if p.name != "help" and not (getattr(p, "help", "") or "")]
        for name, sub in getattr(cmd, "commands", {}).items():
            found += silent(sub, f"{path} {name}")
        return found

    assert silent(typer.main.get_command(cli.app), "gnnpipe") == []


def test_the_command_loads_no_torch_until_a_stage_computes():
    """Every `gnnpipe` command imports each stage module for its Params; torch (and PyG) load only where a stage
    runs, so help, params, status and an error line answer without them (torch took 1.0 of --help's 2.2 s)."""
    probe = "import sys, flows.cli; print(sorted(m for m in ('torch', 'torch_geometric') if m in sys.modules))"
    out = subprocess.run([GNNPIPE[0], "-c", probe], cwd=REPO, env=cli_env(), capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout
