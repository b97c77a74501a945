"""The train artifact format, and the checkpoints that live beside (never inside) it.

Artifact ``train/<key>/``:

- ``model.pt``: ``torch.save`` of the ``state_dict`` of the best-validation epoch's model (the model's own keys;
  built-ins: ``stages.train.models.model``; a plug-in: what its factory builds, with ``metrics["model"]["kwargs"]``;
  task=link: ``encoder.*`` the node model, ``decoder.*`` the pair scorer, ``stages.train.tasks.link.LinkModel``);
  on a typed graph also ``embeddings.<node type>``: each featureless type's learnt input rows, the whole table in
  the dataset's order of that type (row i: the type's node i; ``split_model_state`` parts them from the model's).
- ``metrics.json``: ``{"epochs": [per-epoch dicts], "metric_name", "test_metric" (the published model's: the best
  validation epoch's), "test_metric_last" (the last epoch's model), "best_val_metric", "best_epoch", "last_epoch"
  (0-based), "final_val_metric", "stopped_early", "task": {"name", "evaluator", "metric"}, "test_metrics" (every
  metric of the task on the published model), "recipe": {"loss", "lr", "weight_decay", "lr_schedule",
  "patience"}, "model": {"kind", "kwargs", sizes, "whole_batch", "parameters", "decoder" (task=link)},
  "world_size", "ranks", "cache_policy", ...}``; ``*_metric`` hold the task's selected metric (``metric_name``:
  accuracy, or link prediction's mrr; builds before train VERSION 6 held them under ``test_acc`` & co.: read
  either through ``storage.train_summary``); metrics are global (all ranks' sums, e.g. correct / total, OGB
  Evaluator ``acc``); per-epoch keys: ``stages.train.rank.stats.EpochStats``.
- ``curves.png`` (loss and accuracy per epoch, the best epoch marked), ``hit_rate.png`` (feature-cache hit rate
  per epoch), ``phases.png`` (where each rank's epoch time goes: its phases, ``storage.phases``; only where
  ``metrics.json`` holds them: builds before the split have none).

The job directory (``job_dir``), outside the content-addressed artifact because an artifact only exists once
complete, while checkpoints must survive a killed run so that its next attempt resumes::

    <artifacts root>/.checkpoints/train-<key>/[node-<n>/]   (a temp dir for object-store roots)
        spec.json                the job spec the ranks read (``stages.train.spec.TrainSpec``)
        ckpt-<epoch>.pt          checkpoints (atomic save, resume agreement: ``stages.train.rank.checkpoint``)
        ckpt-<epoch>.rank-<r>.pt  typed graphs: rank r's learnt embedding shards of that checkpoint (on r's node)
        result/model.pt, result/metrics.json   the job's results (``write_result``), copied into the artifact
        result/error-<rank>.json                a failed rank's one-line error, for the launcher to name it
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

from storage.store import ArtifactStore
from storage.writer import StageWriter

MODEL = "model.pt"
METRICS = "metrics.json"
EMBEDDING_PREFIX = "embeddings."   # model.pt's keys of the learnt embedding tables, ``embeddings.<node type>``


def split_model_state(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``model.pt``'s dict as (the model's ``state_dict``, ``{node type: embedding table}``)."""
    tables = {k[len(EMBEDDING_PREFIX):]: v for k, v in state.items() if k.startswith(EMBEDDING_PREFIX)}
    return {k: v for k, v in state.items() if not k.startswith(EMBEDDING_PREFIX)}, tables
CURVES_PNG = "curves.png"
HIT_RATE_PNG = "hit_rate.png"
PHASES_PNG = "phases.png"


def write_train_artifact(writer: StageWriter, model_bytes: bytes, metrics: dict[str, Any], curves_png: bytes,
                         hit_rate_png: bytes, phases_png: bytes | None = None) -> None:
    """Write the train artifact's files (``model_bytes``: a ``torch.save``d state_dict); ``phases.png`` only when
    given (metrics without phases have no figure)."""
    writer.write_bytes(MODEL, model_bytes)
    writer.write_json(METRICS, metrics)
    writer.write_bytes(CURVES_PNG, curves_png)
    writer.write_bytes(HIT_RATE_PNG, hit_rate_png)
    if phases_png is not None:
        writer.write_bytes(PHASES_PNG, phases_png)


def write_result(result_dir: str | os.PathLike[str], model_state: dict[str, Any], metrics: dict[str, Any]) -> None:
    """The job's results, each file written atomically: the trained ``state_dict`` and the metrics."""
    out = Path(result_dir)
    atomic_write_bytes(out / MODEL, torch_bytes(model_state))
    atomic_write_bytes(out / METRICS, json.dumps(metrics, indent=2, sort_keys=True).encode())


def read_result(result_dir: str | os.PathLike[str]) -> tuple[bytes, dict[str, Any]]:
    """``(model_bytes, metrics)`` as ``write_result`` left them."""
    out = Path(result_dir)
    return (out / MODEL).read_bytes(), json.loads((out / METRICS).read_text())


def checkpoint_dir(store: ArtifactStore, key: str) -> Path:
    """Where the job of train artifact ``key`` keeps its files: beside the artifacts when they are local, else in
    the local temp dir (the launcher runs the ranks on this machine; each node's local rank 0 writes)."""
    return checkpoints_root(store) / f"train-{key}"


def checkpoints_root(store: ArtifactStore) -> Path:
    """The directory of the train job directories: ``<root>/.checkpoints``, or the local temp dir's
    ``gnnpipe-checkpoints`` for an object-store root."""
    if store.is_local:
        return Path(store.base) / ".checkpoints"
    return Path(tempfile.gettempdir()) / "gnnpipe-checkpoints"


def job_dir(store: ArtifactStore, key: str, node_rank: int | None = None) -> Path:
    """This node's job directory: ``checkpoint_dir``, and a ``node-<n>`` below it for a multi-node job (a shared
    file system must not mix nodes' files)."""
    base = checkpoint_dir(store, key)
    return base if node_rank is None else base / f"node-{node_rank}"


def checkpoint_dirs(store: ArtifactStore) -> dict[str, Path]:
    """Every train job directory of this root that a run would resume from: train key -> ``checkpoint_dir``.

    For an object-store root they lie in the local temp dir, shared by every such root: only those whose job spec
    names this root are its own."""
    base = checkpoints_root(store)
    if not base.is_dir():
        return {}
    found = {}
    for path in sorted(base.glob("train-*")):
        if path.is_dir() and (store.is_local or store.root in _spec_roots(path)):
            found[path.name.removeprefix("train-")] = path
    return found


def _spec_roots(job: Path) -> set[str]:
    roots = set()
    for spec in [spec_path(job), *map(spec_path, job.glob("node-*"))]:
        try:
            roots.add(str(json.loads(spec.read_text())["artifacts"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue   # a job killed before it wrote its spec, or a foreign file: not provably this root's
    return roots


def job_checkpoints(job: Path) -> list[tuple[int, Path]]:
    """The complete checkpoints of one job directory, all nodes' (``node-<n>/``) included."""
    return sorted(c for d in [job, *sorted(job.glob("node-*"))] for c in list_checkpoints(d))


def remove_checkpoints(store: ArtifactStore, key: str | None = None) -> list[Path]:
    """Delete the train job directories of this root (or of train artifact ``key``) so that no later run resumes
    from them; returns those removed. The ``.checkpoints`` directory of a local root goes too once empty."""
    removed = []
    for found_key, path in checkpoint_dirs(store).items():
        if key is None or found_key == key:
            shutil.rmtree(path)
            removed.append(path)
    if store.is_local:
        try:
            checkpoints_root(store).rmdir()
        except OSError:
            pass   # absent, or holds another job's directory
    return removed


def spec_path(job: Path) -> Path:
    return job / "spec.json"


def result_dir(job: Path) -> Path:
    return job / "result"


def error_path(results: str | os.PathLike[str], rank: int) -> Path:
    return Path(results) / f"error-{rank}.json"


def torchrun_log_dir(results: str | os.PathLike[str]) -> Path:
    """torchrun's folder of a job's attempts (``--log-dir``). Left to itself torchrun makes a new
    ``$TMPDIR/torchelastic_*`` a job and never removes it (916 of them piled up in this box's /tmp over two days of
    tests); here the launcher removes it with the job, and the next attempt, which starts its results afresh,
    whatever a killed job left."""
    return Path(results) / "torchrun"


def error_paths(results: str | os.PathLike[str]) -> list[Path]:
    return sorted(Path(results).glob("error-*.json"))


_CKPT = re.compile(r"^ckpt-(\d+)\.pt$")


def checkpoint_path(directory: str | os.PathLike[str], epoch: int) -> Path:
    """The checkpoint taken after ``epoch`` (0-based, completed)."""
    return Path(directory) / f"ckpt-{epoch:05d}.pt"


_SHARD = re.compile(r"^ckpt-(\d+)\.rank-(\d+)\.pt$")


def shard_path(directory: str | os.PathLike[str], epoch: int, rank: int) -> Path:
    """Global rank ``rank``'s part of the checkpoint after ``epoch``."""
    return Path(directory) / f"ckpt-{epoch:05d}.rank-{rank:05d}.pt"


def list_shards(directory: str | os.PathLike[str]) -> list[tuple[int, int, Path]]:
    """``(epoch, rank, path)`` of the complete rank parts in ``directory``, oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted((int(m.group(1)), int(m.group(2)), directory / name) for name in os.listdir(directory)
                  if (m := _SHARD.match(name)))


def list_checkpoints(directory: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """``(epoch, path)`` of the complete checkpoints in ``directory``, oldest first (a file being written has a
    temporary name, see ``atomic_write_bytes``)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), directory / name) for name in os.listdir(directory) if (m := _CKPT.match(name))]
    return sorted(found)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to a temporary sibling, fsync, then rename over ``path``: readers see all of it or nothing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def remove_partial_writes(directory: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporaries ``atomic_write_bytes`` leaves under ``directory`` when its process is killed between
    the write and the rename (a rank SIGKILLed by torchrun's teardown while it wrote its error record: the CI saw
    ``.error-1.json.tmp-<id>`` left by a job whose other rank had failed first); returns what it removed. Only
    when no process of the job is left to finish one."""
    found = [path for path in Path(directory).rglob(".*.tmp-*") if _PARTIAL.fullmatch(path.name) and path.is_file()]
    for path in found:
        path.unlink(missing_ok=True)
    return found


_PARTIAL = re.compile(r"\..+\.tmp-[0-9a-f]{8}")


def torch_bytes(obj: Any) -> bytes:
    import io

    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()
