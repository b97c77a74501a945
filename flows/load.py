"""Where a run's values come from: built-in defaults ← ``--config FILE`` (YAML or TOML) ← ``--set key=value``.

Names are those of ``flows.config`` (flat, dotted or nested sections); ``--set`` values are YAML scalars, and list
parameters also take ``15,10,5``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from flows.config import PipelineConfig, make_config
from storage import InputError


def load_config(config: Path | None, sets: Sequence[str], **overrides: Any) -> PipelineConfig:
    """The config of ``config`` (a file, optional), then ``sets``, then ``overrides`` that are not None/empty."""
    from_file = read_config_file(config) if config is not None else {}
    from_sets: dict[str, Any] = {}
    for item in sets:
        if "=" not in item:
            raise InputError(f"--set expects key=value, got '{item}'")
        key, raw = item.split("=", 1)
        from_sets[key.strip()] = yaml.safe_load(raw) if raw.strip() else None
    # each source overrides the one before, whatever names the two use (train_epochs in the file, epochs in --set)
    return make_config(from_file, from_sets, {k: v for k, v in overrides.items() if v not in (None, [], ())})


def read_config_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise InputError(f"config file {path} not found; pass an existing YAML or TOML file")
    text = path.read_text()
    try:
        if path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        else:
            data = yaml.safe_load(text) or {}
    except yaml.MarkedYAMLError as err:
        raise InputError(f"cannot parse {path}, {_yaml_problem(err)}") from None
    except (yaml.YAMLError, ValueError) as err:   # tomllib's message ends "(at line L, column C)"
        raise InputError(f"cannot parse {path}: {str(err).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path} must hold a mapping of parameter: value")
    return data


def _yaml_problem(err: yaml.MarkedYAMLError) -> str:
    """``line L, column C: <problem> (<context> at line ...)``: yaml's own first line is often only the context
    ("while parsing a flow sequence"), and its marks are on lines of their own with 0-based numbers inside."""
    mark = err.problem_mark or err.context_mark
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "somewhere"
    what = err.problem or err.context or "invalid YAML"
    if err.context and err.problem and err.context_mark is not None:
        what += f" ({err.context} started at line {err.context_mark.line + 1}, column {err.context_mark.column + 1})"
    return f"{where}: {what}"
