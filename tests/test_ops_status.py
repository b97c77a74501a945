"""``gnnpipe status|show|clean`` tell the truth about the artifact root (issue 12, item 6), without a Prefect server.

Before: ``status``/``show`` computed the keys of the flags given and called every other build ``missing``; a root that
is a file was ``missing`` too; ``clean`` (also ``--stage train``) left ``.checkpoints/train-*``, which a later run
resumes from.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from flows.config import STAGES
from storage import ArtifactStore, Manifest
from storage import inventory as inv
from storage.train import checkpoint_dir, checkpoint_dirs
from tests._cli_runs import cli, gnnpipe
from tests._train_pipeline import build_without_prefect
from tests.conftest import TINY

# TINY's download parameters that differ from the defaults, as `status` shows them
TINY_SHORT = "num_nodes=3000"


def fake_build(store: ArtifactStore, stage: str, upstream: dict[str, Manifest] | None = None,
               **params: Any) -> Manifest:
    """A build of ``stage`` with these Params (the others default) and one small file: listing needs no more."""
    key_params = STAGES[stage].Params(**params).key_params()
    return store.build(stage, STAGES[stage].VERSION, key_params, upstream or {},
                       lambda w: w.write_json("data.json", {"rows": list(range(100))}))


def fake_checkpoints(store: ArtifactStore, key: str, epochs: int = 2) -> Path:
    job = checkpoint_dir(store, key)
    job.mkdir(parents=True)
    (job / "spec.json").write_text(json.dumps({"artifacts": store.root, "key": key}))
    for epoch in range(epochs):
        (job / f"ckpt-{epoch:05d}.pt").write_bytes(b"x" * 1000)
    return job


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Manifest]]:
    """download → partition (3 parts, not the default 2) of the tiny graph, through the real stages (~1 s)."""
    root = str(tmp_path_factory.mktemp("real") / "art")
    _, manifests = build_without_prefect({**TINY, "num_partitions": 3, "artifacts": root, "until": "partition"})
    return root, manifests


def _stage_table(out: str, stage: str) -> list[str]:
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"{stage}: "))
    table = []
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        table.append(line)
    return table


def test_status_without_flags_lists_every_build(real):
    """Was: every stage `missing` (the default config's keys), though the root holds a 3-partition build."""
    root, manifests = real
    out = cli("status", "--artifacts", root).stdout
    assert out.splitlines()[0].startswith(f"artifact root {root}: 2 builds, ")
    header, row = _stage_table(out, "partition")
    key = manifests["partition"].key
    assert row.split()[0] == key and "num_partitions=3" in row
    assert f"download {manifests['download'].key[:8]}" in row          # which download it was built on
    for column in ("SIZE", "CREATED", "LAST USED", "PARAMS", "ORIGIN"):   # aligned under the header
        assert row[header.index(column)] != " " and row[header.index(column) - 1] == " "
    assert TINY_SHORT in _stage_table(out, "download")[1]
    assert _stage_table(out, "train") == [] and "train: 0 builds" in out
    assert "missing" not in out


def test_status_with_a_config_says_cached_or_missing(real):
    """Was `built`; now the run's own word, `cached`, and a line per stage of that config."""
    root, manifests = real
    out = cli("status", "--artifacts", root, *[a for k, v in TINY.items() for a in ("--set", f"{k}={v}")],
              "--set", "num_partitions=3").stdout.splitlines()
    assert [ln.split()[0] for ln in out] == list(STAGES)
    assert out[0].split()[1:3] == [manifests["download"].key, "cached"]
    assert out[1].split()[1:3] == [manifests["partition"].key, "cached"]
    assert [ln.split()[2] for ln in out[2:]] == ["missing"] * (len(STAGES) - 2)


def test_status_of_a_file_root_is_one_error_line(tmp_path: Path):
    """Was: every stage `missing`, exit 0."""
    (tmp_path / "file").write_text("not a directory")
    proc = gnnpipe("status", "--artifacts", str(tmp_path / "file"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [f"error: artifact root {tmp_path / 'file'} is a file, not a directory; "
                                                f"pass the directory that holds the artifacts with --artifacts or "
                                                f"ARTIFACTS"]


def test_status_of_an_absent_root(tmp_path: Path):
    """Was: five `missing` lines, as if something were expected there."""
    out = cli("status", "--artifacts", str(tmp_path / "nothing")).stdout
    assert out.strip() == f"artifact root {tmp_path / 'nothing'} does not exist: nothing built yet (`gnnpipe run` " \
                          f"builds the pipeline)"
    assert not (tmp_path / "nothing").exists()


def test_status_shows_origin_last_use_and_checkpoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Which run built a build, when a run last used it, and the unfinished train jobs a run would resume."""
    monkeypatch.delenv(inv.ORIGIN_ENV, raising=False)
    store = ArtifactStore(tmp_path / "art")
    with inv.building_for("gnnpipe run --config big.yaml --set epochs=5"):
        used = fake_build(store, "download", num_nodes=5000)
        inv.mark_used(store, "download", used.key)
    unused = fake_build(store, "download", num_nodes=7000)
    fake_checkpoints(store, "0123456789abcdef", epochs=3)
    out = cli("status", "--artifacts", str(store.root)).stdout
    header, *rows = _stage_table(out, "download")
    row = {r.split()[0]: r for r in rows}
    assert row[used.key].endswith("num_nodes=5000  gnnpipe run --config big.yaml --set epochs=5")
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d  ", row[used.key][header.index("LAST USED"):])
    assert row[unused.key][header.index("LAST USED"):].startswith("- ") and row[unused.key].endswith("  -")
    train = _stage_table(out, "train")
    assert "resumes" in train[0] and train[1].split()[:4] == ["0123456789abcdef", "3", "epochs", "done,"]


def test_a_deployment_run_records_its_deployment_not_the_worker_command(monkeypatch: pytest.MonkeyPatch):
    """A process worker runs a deployment's flow in a child that inherits the worker's environment, whose
    GNNPIPE_ORIGIN was `gnnpipe worker up`: the builds recorded that command instead of the flow run."""
    from types import SimpleNamespace

    from flows import pipeline

    monkeypatch.setattr(pipeline, "flow_run", SimpleNamespace(name="brisk-otter", flow_name="gnnpipe"))
    monkeypatch.setattr(pipeline, "deployment", SimpleNamespace(name="default"))
    monkeypatch.setenv(inv.ORIGIN_ENV, "gnnpipe worker up")            # claimed by the worker's process,
    monkeypatch.setenv(inv.ORIGIN_PID_ENV, str(os.getpid() + 1))         # not this one
    assert pipeline._origin() == "deployment gnnpipe/default, flow run brisk-otter"
    monkeypatch.delenv(inv.ORIGIN_ENV)
    inv.claim_origin("gnnpipe run --set epochs=5")   # the CLI runs the flow in its own process
    assert pipeline._origin() == "gnnpipe run --set epochs=5"
    monkeypatch.setattr(pipeline, "deployment", SimpleNamespace(name=None))
    monkeypatch.delenv(inv.ORIGIN_PID_ENV)   # a flow called from Python, without the CLI
    assert pipeline._origin() == "flow run brisk-otter"


def test_last_use_record_never_touches_a_build(tmp_path: Path):
    """The record lives outside the build (a manifest lists every file of its directory): a build stays valid, byte
    for byte, however often it is marked, and marking fails silently where the root cannot be written."""
    store = ArtifactStore(tmp_path / "art")
    built = fake_build(store, "download")
    digest = store.manifest_digest("download", built.key)
    for _ in range(3):
        inv.mark_used(store, "download", built.key)
    assert store.find("download", built.key) == built and store.manifest_digest("download", built.key) == digest
    assert sorted(p.name for p in (tmp_path / "art" / "download").iterdir()) == [built.key]
    assert inv.last_used(store, "download", built.key) is not None
    (tmp_path / "file").write_text("")
    inv.mark_used(ArtifactStore(tmp_path / "file" / "art"), "download", built.key)   # no exception
    old = built.model_dump()
    del old["origin"]
    assert Manifest.model_validate(old).origin == ""      # manifests written before `origin` still load


def test_object_store_root_lists_builds_and_last_use():
    """An fsspec root (memory://, as s3://): the same listing and last-use record."""
    store = ArtifactStore("memory://gnnpipe-status-test/art")
    built = fake_build(store, "partition", num_partitions=4)
    inv.mark_used(store, "partition", built.key)
    assert inv.root_kind(store) == "directory" and inv.root_kind(ArtifactStore("memory://nowhere")) == "absent"
    [found] = inv.builds(store, "partition")
    assert found.manifest == built and found.last_used is not None
    store.fs.rm(store.base, recursive=True)


def test_clean_removes_train_checkpoints(tmp_path: Path):
    """Was: `gnnpipe clean` left .checkpoints/train-*, and the next run resumed from them."""
    store = ArtifactStore(tmp_path / "art")
    fake_build(store, "download")
    job = fake_checkpoints(store, "0123456789abcdef")
    out = cli("clean", "--artifacts", store.root).stdout
    assert not job.exists() and not (tmp_path / "art" / ".checkpoints").exists()
    assert not (tmp_path / "art" / "download").exists()
    assert f"removed {job} (train checkpoints)" in out and f"removed {store.url('download')} (1 build, " in out
    assert cli("clean", "--artifacts", store.root).stdout.strip() == f"nothing to remove in {store.root}"


def test_clean_stage_removes_that_stage_only(tmp_path: Path):
    """Was: `clean --stage train` left the checkpoints; `--stage X` removes X alone (and its cache records)."""
    store = ArtifactStore(tmp_path / "art")
    download = fake_build(store, "download")
    partition = fake_build(store, "partition", {"download": download})
    job = fake_checkpoints(store, "0123456789abcdef")
    records = tmp_path / "art" / ".prefect" / "cache-keys"
    records.mkdir(parents=True)
    (records / f"partition-{partition.key}").write_text("{}")
    (records / f"download-{download.key}").write_text("{}")
    out = cli("clean", "--stage", "train", "--artifacts", store.root).stdout
    assert out.strip() == f"removed {job} (train checkpoints)" and not job.exists()
    job = fake_checkpoints(store, "0123456789abcdef")
    out = cli("clean", "--stage", "partition", "--artifacts", store.root).stdout
    assert out.startswith(f"removed {store.url('partition')} (1 build, ")
    assert not (tmp_path / "art" / "partition").exists() and job.exists()
    assert store.find("download", download.key) == download
    assert [p.name for p in records.iterdir()] == [f"download-{download.key}"]
    assert checkpoint_dirs(store) == {"0123456789abcdef": job}


def test_show_without_flags_shows_the_only_build_or_one_by_key(real):
    """Was: `show partition` looked for the default config's build only, and said it was missing."""
    root, manifests = real
    key = manifests["partition"].key
    for args in ([], [key[:6]]):
        result = cli("show", "partition", *args, "--artifacts", root)
        assert result.stdout.startswith(f"## partition `{key}`"), result.output
    assert "metis into 3" in result.stdout


def test_show_of_a_stage_not_built_names_the_command(real):
    """Was: `artifact ... is missing ...; rerun the pipeline to rebuild it`, not saying with which flags."""
    root, _ = real
    proc = gnnpipe("show", "train", "--artifacts", root, "--set", "epochs=3")
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("error: train ") and "is missing" in line
    assert line.endswith(f"rerun the pipeline to build it: gnnpipe run --until train --set epochs=3 --artifacts "
                         f"{root}")


def test_a_cached_run_removes_what_a_killed_attempt_left(tmp_path: Path):
    """A killed run's work directory (and, for train, a failed forced rebuild's checkpoints) beside a valid build is
    removed by the next run that finds the build, even one that computes nothing (``flows.locks.tidy``)."""
    root = str(tmp_path / "art")
    _, manifests = build_without_prefect({**TINY, "artifacts": root, "until": "partition"})
    work = Path(root) / "partition" / f".tmp-{manifests['partition'].key}-0badc0de"
    work.mkdir()
    (work / "half-written").write_bytes(b"x")
    proc = gnnpipe("run", "--until", "partition", "--artifacts", root,
                   *[a for k, v in TINY.items() for a in ("--set", f"{k}={v}")])
    assert proc.returncode == 0, proc.stderr
    assert f"note: partition: removed {work}, left by an earlier attempt at this build" in proc.stderr
    assert not work.exists() and (Path(root) / "partition" / manifests["partition"].key).is_dir()


def test_config_status_says_whether_a_run_would_resume_the_checkpoints(tmp_path: Path):
    """An unfinished train job of the config's key is resumed only if it trained on the builds the run would use:
    a spec recording another build of a partition that is not reproducible, or one cut short, starts afresh."""
    from flows.cli_store import config_status
    from flows.config import make_config, stage_keys
    from stages.train.spec import TrainSpec
    from storage.train import spec_path

    store = ArtifactStore(tmp_path / "art")
    cfg = make_config(TINY, artifacts=store.root)
    key = stage_keys(cfg)["train"]
    job = fake_checkpoints(store, key, epochs=2)

    def note(upstream_builds: dict[str, str]) -> str:
        TrainSpec(artifacts=store.root, key=key, partition_key="p", features_key="f", hotness_key="h", params={},
                  checkpoint_dir=str(job), result_dir=str(job / "results"), upstream_builds=upstream_builds
                  ).save(spec_path(job))
        [line] = [line for line in config_status(store, cfg) if line.startswith("train ")]
        return line[line.index("(checkpoints: "):]

    assert note({}).endswith("; a run resumes)")   # nothing built yet: the run's builds will record none
    assert note({"partition": "0" * 32}).endswith("; a run starts afresh: they were taken on other builds)")
    spec_path(job).write_text('{"artifacts": ')
    [line] = [line for line in config_status(store, cfg) if line.startswith("train ")]
    assert line.endswith("a run starts afresh: they were taken on other builds)")
