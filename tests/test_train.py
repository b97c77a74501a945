"""The train stage end to end: real stages build a small graph, torchrun runs gloo ranks on the CPU.

Thresholds come from measured runs on the 8 000-node graph of ``tests._train_pipeline`` (8 epochs, seeds 0-3):
2 ranks reach validation 0.806-0.825 and test 0.828-0.836; 1 partition test 0.825-0.832 (per-seed gap to 2
ranks 0.4-0.8 points); a features-only MLP (best validation over 200 full-batch epochs) 0.56-0.58; chance 0.25,
majority class 0.36.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

from stages.features import stage as features
from stages.hotness import stage as hotness
from stages.jobs.cluster import Cluster
from stages.jobs.errors import TrainingError
from stages.jobs.launcher import launch
from stages.train import stage as train
from stages.train.models.model import build_model
from stages.train.rank.faults import FAULT_ENV
from stages.train.spec import TrainSpec
from storage import ArtifactStore, InputError, Manifest
from storage.features import FeaturesArtifact, write_part_features
from storage.graph import GraphArtifact
from storage.manifest import builds_behind, stage_key
from storage.phases import PHASES
from storage.tracking import event_file_name
from storage.train import (
    CURVES_PNG,
    HIT_RATE_PNG,
    METRICS,
    MODEL,
    PHASES_PNG,
    checkpoint_dir,
    list_checkpoints,
    spec_path,
)
from storage.train_summary import TrainSummary
from tests._train_pipeline import BATCH_SIZE, FANOUTS, TrainRun, build_upstream, train_params, train_upstream

pytestmark = pytest.mark.slow
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def art(tmp_path_factory: pytest.TempPathFactory) -> ArtifactStore:
    return ArtifactStore(tmp_path_factory.mktemp("art"))


@pytest.fixture(scope="module")
def two(art):
    return build_upstream(art, 2)


@pytest.fixture(scope="module")
def one(art):
    return build_upstream(art, 1)


@pytest.fixture(scope="module")
def reference(art, two) -> TrainRun:
    return TrainRun(art, train_params(), train_upstream(two))


def mlp_best_val_accuracy(store: ArtifactStore, download: Manifest, seed: int = 0) -> float:
    """A features-only 2-layer MLP, full batch, 200 epochs; its best validation accuracy (generous to it)."""
    g = GraphArtifact(store, download).read()
    x, y = torch.from_numpy(g.x), torch.from_numpy(g.y)
    tr, va = torch.from_numpy(g.splits["train"]), torch.from_numpy(g.splits["valid"])
    torch.manual_seed(seed)
    mlp = torch.nn.Sequential(torch.nn.Linear(x.shape[1], 32), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                              torch.nn.Linear(32, g.num_classes))
    opt = torch.optim.Adam(mlp.parameters(), lr=0.01)
    best = 0.0
    for _ in range(200):
        mlp.train()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(mlp(x[tr]), y[tr]).backward()
        opt.step()
        mlp.eval()
        with torch.no_grad():
            best = max(best, float((mlp(x[va]).argmax(1) == y[va]).float().mean()))
    return best


def test_two_ranks_learn_far_above_chance_and_an_mlp(reference, two):
    s, m = reference.manifest.summary, reference.metrics
    mlp = mlp_best_val_accuracy(reference.store, two["download"])
    assert 0.5 < mlp < 0.65, mlp   # the graph's features alone are informative but weak
    t = TrainSummary.from_json(s)
    assert t.final_val_metric >= 0.75 and t.test_metric >= 0.75, s
    assert t.best_val_metric >= mlp + 0.15, (t.best_val_metric, mlp)
    epochs = m["epochs"]
    assert [e["epoch"] for e in epochs] == list(range(8)) and m["world_size"] == 2 and m["backend"] == "gloo"
    assert epochs[-1]["loss"] < 0.8 * epochs[0]["loss"] and epochs[-1]["train_metric"] > epochs[0]["train_metric"]
    for e in epochs:
        assert e["epoch_s"] > 0 and e["sampled_edges_per_s"] > 0
        assert 0 < e["hit_rate"] < 1 and e["remote_rows"] > 0 and e["local_rows"] > 0
        assert e["requested_rows"] == e["cached_rows"] + e["local_rows"] + e["remote_rows"]
        row_bytes = 16 * 4   # 16 float32 features
        assert e["remote_bytes"] == e["remote_rows"] * row_bytes and e["local_bytes"] == e["local_rows"] * row_bytes
        assert e["cached_bytes"] == e["cached_rows"] * row_bytes
    assert all(r["feature_store"] == "memory" and r["cache_rows"] > 0 for r in m["ranks"])
    assert [r["host_gather"] for r in m["ranks"]] == ["cpu", "cpu"]   # host_gather=auto on CPU ranks
    assert {r["host_gather_why"] for r in m["ranks"]} == {"a CPU rank reads its host rows in place"}
    assert [r["graph"] for r in m["ranks"]] == ["cpu", "cpu"]   # graph_placement=auto: a CPU rank's CSR in RAM
    assert m["phase_clock"] == "wall_clock" and m["prefetch"] == 0   # prefetch auto: 0 on CPU ranks
    assert m["precision"] == "float32" and m["cuda_graph"] == "off: a CPU rank"   # the defaults, resolved here
    for e in epochs:   # each rank's pass split into phases (tests/test_phases.py): every step of the path shows
        split = e["phases_s"]
        assert set(split) == set(PHASES) and all(len(v) == 2 for v in split.values())
        for r in range(2):
            assert 0.5 * e["epoch_s"] < sum(v[r] for v in split.values()) <= e["epoch_s"] * (1 + 1e-9)
            assert all(split[name][r] > 0 for name in PHASES if name != "other"), (r, split)
        assert e["prefetch_phases_s"] == {}


def test_artifact_files_model_and_report(reference):
    store, key = reference.store, reference.manifest.key
    # phases.png and the report's section: the ranks measured the phases (tests/test_train_phases.py: the rest)
    assert set(reference.manifest.files) == {MODEL, METRICS, CURVES_PNG, HIT_RATE_PNG, PHASES_PNG,
                                             event_file_name("train", key)}
    for png in (CURVES_PNG, HIT_RATE_PNG, PHASES_PNG):
        assert store.read_bytes("train", key, png)[:8] == PNG
    model = build_model("sage", in_channels=16, hidden=32, out_channels=4, num_layers=2, dropout=0.3)
    model.load_state_dict(reference.state)   # sizes from metadata: 16 features, 4 classes
    report = train.report(reference.manifest)
    test = TrainSummary.from_json(reference.manifest.summary).test_metric
    assert f"test accuracy {100 * test:.2f} %" in report.headline
    assert report.images == {"training curves": CURVES_PNG, "feature cache": HIT_RATE_PNG,
                             "where the time goes": PHASES_PNG}
    section = report.markdown.split("### Where the time goes")[1]
    assert "| phase | rank 0 s/epoch | rank 1 s/epoch | share of the epoch |" in section and "wall clock" in section
    assert len(report.table) == 8 and "| epoch |" in report.markdown
    assert "host_gather" in report.markdown.split("### Ranks")[1]   # each rank's pick, in the ranks' table
    assert not checkpoint_dir(store, key).exists(), "checkpoints are removed once the artifact is published"
    again = train.run(store, reference.params, reference.upstream, log=lambda line: None)
    assert again.build_id == reference.manifest.build_id, "a second run finds the artifact"


def test_one_partition_reaches_the_same_test_accuracy(art, one, reference):
    single = TrainRun(art, train_params(), train_upstream(one))
    assert single.metrics["world_size"] == 1
    assert all(e["remote_rows"] == 0 for e in single.metrics["epochs"])
    accs = [TrainSummary.from_json(r.manifest.summary).test_metric for r in (single, reference)]
    assert abs(accs[0] - accs[1]) <= 0.02, accs


def test_uneven_train_counts_finish(art):
    """3 ranks holding all / 7 / none of their train nodes: every rank runs the largest rank's batch count."""
    up = build_upstream(art, 3)
    keep = {0: None, 1: 7, 2: 0}

    def body(writer) -> None:
        for p in range(3):
            part = FeaturesArtifact(art, up["features"]).part(p)
            splits = {**part.split_lids, "train": part.split_lids["train"][:keep[p]]}
            write_part_features(writer, part=p, start_gid=part.start_gid, features=part.features, y=part.y,
                                split_lids=splits, num_classes=part.attrs["num_classes"],
                                chunk_rows={t: a["chunk_rows"] for t, a in part.attrs["types"].items()})
        writer.summary.update(up["features"].summary)

    ft = art.build("features", features.VERSION, {"test": "uneven train nodes"},
                   {"download": up["download"], "partition": up["partition"]}, body)
    ht = hotness.run(art, hotness.Params(fanouts=FANOUTS, batch_size=BATCH_SIZE), {"partition": up["partition"],
                                                                                  "features": ft}, progress=False)
    start = time.monotonic()
    run = TrainRun(art, train_params(epochs=3, timeout_s=240.0), {"partition": up["partition"], "features": ft,
                                                                  "hotness": ht})
    assert time.monotonic() - start < 240
    ranks = run.metrics["ranks"]
    assert [r["train_nodes"] for r in ranks][1:] == [7, 0] and ranks[0]["train_nodes"] > 300
    expected_batches = -(-ranks[0]["train_nodes"] // BATCH_SIZE)
    assert all(e["batches"] == expected_batches for e in run.metrics["epochs"])
    # rank 0's seeds alone still teach the shared model
    assert TrainSummary.from_json(run.manifest.summary).final_val_metric > 0.6


def _worker_pids(run_lines: list[tuple[float, str]]) -> list[int]:
    return [int(m.group(1)) for _, line in run_lines if (m := re.match(r"\[rank \d+\] pid (\d+)", line))]


def _alive(pid: int) -> bool:
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and "stages.train" in " ".join(proc.cmdline())
    except psutil.Error:
        return False


def test_killed_rank_fails_fast_and_the_rerun_resumes_to_the_same_result(reference, tmp_path, monkeypatch):
    # a second artifact root with the same upstream artifacts: same keys, no train artifact yet
    other = ArtifactStore(tmp_path / "art")
    for stage in train.UPSTREAM:
        key = reference.upstream[stage].key
        shutil.copytree(Path(reference.store.url(stage, key)), tmp_path / "art" / stage / key)
    params, upstream = reference.params, reference.upstream
    key = stage_key(train.NAME, train.VERSION, params.key_params(), {n: m.key for n, m in upstream.items()})
    lines: list[tuple[float, str]] = []
    monkeypatch.setenv(FAULT_ENV, "1:2:3")   # rank 1 SIGKILLs itself before batch 3 of epoch 2
    with pytest.raises(TrainingError, match=r"^training failed: rank 1 was killed by SIGKILL") as err:
        train.run(other, params, upstream, log=lambda line: lines.append((time.monotonic(), line)))
    failed_at = time.monotonic()
    assert "\n" not in str(err.value)
    killed_at = next(t for t, line in lines if "fault injection: rank 1" in line)
    assert failed_at - killed_at < 60, "a dead rank fails the job within 60 s"
    pids = _worker_pids(lines)
    assert len(pids) == 2 and not any(_alive(pid) for pid in pids), "no rank outlives the job"
    launcher_pid = next(int(m.group(1)) for _, line in lines if (m := re.match(r"\[launcher\] pid (\d+)", line)))
    assert not _alive(launcher_pid)
    assert [e for e, _ in list_checkpoints(checkpoint_dir(other, key))] == [0, 1]
    assert other.find(train.NAME, key) is None, "a failed run publishes nothing"

    monkeypatch.delenv(FAULT_ENV)
    resumed = TrainRun(other, params, upstream)
    assert "resuming from the checkpoint after epoch 2/8" in resumed.text()
    assert resumed.metrics["resumed_from_epoch"] == 1 and reference.metrics["resumed_from_epoch"] is None
    for got, want in zip(resumed.metrics["epochs"], reference.metrics["epochs"], strict=True):
        for field in ("loss", "train_metric", "val_metric", "requested_rows", "cached_rows", "remote_rows"):
            assert got[field] == want[field], (got["epoch"], field)
    assert resumed.metrics["test_metric"] == reference.metrics["test_metric"]
    assert resumed.state.keys() == reference.state.keys()
    assert all(torch.equal(resumed.state[k], reference.state[k]) for k in reference.state)
    assert not checkpoint_dir(other, key).exists()


def test_checkpoints_taken_on_another_partition_build_are_not_resumed(art, two, tmp_path, monkeypatch):
    """A killed attempt's checkpoints rest on the partition it trained on. If that partition was not reproducible
    (KaMinPar on several threads) and was rebuilt, under the same key, the next attempt starts afresh; so does one
    after a spec cut short by a kill. Driven through the job's launch, the ranks' start stubbed."""
    import stages.jobs.launcher

    lines: list[str] = []
    job = train._Job(art, train_params(), two, Cluster(), lines.append)
    at_launch: list[tuple[bool, dict[str, str]]] = []   # (the checkpoint still there, the spec's upstream_builds)
    monkeypatch.setattr(stages.jobs.launcher, "launch", lambda spec, *a, **k: at_launch.append(
        ((job.ckpt_dir / "ckpt-00000.pt").exists(), TrainSpec.load(spec).upstream_builds)))

    def attempt_after(spec_text: str | None) -> bool:
        """An attempt after one that left a checkpoint and ``spec_text`` as its spec: was the checkpoint kept?"""
        shutil.rmtree(job.ckpt_dir, ignore_errors=True)
        job.ckpt_dir.mkdir(parents=True)
        if spec_text is not None:
            spec_path(job.ckpt_dir).write_text(spec_text)
        (job.ckpt_dir / "ckpt-00000.pt").write_bytes(b"x")
        job.launch()
        return at_launch[-1][0]

    def spec_on(builds: dict[str, str]) -> str:
        TrainSpec(artifacts=art.root, key=job.key, partition_key="p", features_key="f", hotness_key="h", params={},
                  checkpoint_dir=str(job.ckpt_dir), result_dir=str(tmp_path), upstream_builds=builds
                  ).save(tmp_path / "spec.json")
        return (tmp_path / "spec.json").read_text()

    assert builds_behind(two) == {}   # the fixture's partition is reproducible
    assert attempt_after(spec_on({})) and attempt_after(None) and lines == []   # the same builds: resumed
    assert not attempt_after(spec_on({"partition": "0" * 32}))
    assert lines == [f"train/{job.key}: the checkpoints in {job.ckpt_dir} were taken on other builds of the inputs: "
                     f"starting afresh"]
    assert not attempt_after('{"artifacts": ')   # cut short
    assert [builds for _, builds in at_launch] == [{}] * 4   # each attempt's own spec records its builds


def test_cache_plan_of_another_partitioning_is_an_input_error(art, two, one):
    mixed = {"partition": two["partition"], "features": two["features"], "hotness": one["hotness"]}
    with pytest.raises(InputError, match=r"hotness artifact .* was built on partition .* not on the partition"):
        train.run(art, train_params(), mixed, log=lambda line: None)


def test_world_size_other_than_partitions_is_an_input_error(art, two, tmp_path):
    """A rank started into a 1-rank world for a 2-partition graph says so, and the launcher repeats it."""
    spec = TrainSpec(artifacts=art.root, key="manual", partition_key=two["partition"].key,
                     features_key=two["features"].key, hotness_key=two["hotness"].key,
                     params=train_params().model_dump(mode="json"), checkpoint_dir=str(tmp_path / "ckpt"),
                     result_dir=str(tmp_path / "result"))
    spec.save(tmp_path / "spec.json")
    lines: list[str] = []
    with pytest.raises(InputError, match=r"^rank 0: world size 1 != 2 partitions"):
        launch(str(tmp_path / "spec.json"), 1, result_dir=spec.result_dir, log=lines.append, timeout_s=180)
    assert any(line.startswith("[rank 0] error: world size 1 != 2 partitions") for line in lines)


def test_runtime_settings_travel_outside_the_key(art, two):
    params = train_params(timeout_s=123.0, device="cpu")
    assert params.key_params() == train_params().key_params()
    assert set(params.key_params()).isdisjoint(train.Params.runtime_fields())
    fresh = train_params(epochs=2, timeout_s=0.5)   # a key with no artifact yet: the job starts, and is stopped
    with pytest.raises(TrainingError, match=r"timed out after 0.5 s"):
        train.run(art, fresh, train_upstream(two), log=lambda line: None)


def test_params_validation_and_key():
    with pytest.raises(InputError, match="invalid parameter num_layers: unknown name"):   # derived: len(fanouts)
        train.Params(num_layers=3, fanouts=(10, 5))
    with pytest.raises(InputError, match="multiple of gat_heads"):
        train.Params(model="gat", hidden=30, gat_heads=4)
    with pytest.raises(InputError, match="fanout"):
        train.Params(fanouts=(10, 0))
    # runtime settings do not re-key: a rerun with a longer timeout resumes the same checkpoints
    assert train.Params(timeout_s=5, threads_per_rank=3).key_params() == train.Params().key_params()
    assert train.Params(cache_policy="degree").key_params() != train.Params().key_params()
    assert not train.Params.runtime_fields() & set(train.Params().key_params())
    assert train.Params.runtime_fields() == {"timeout_s", "peer_timeout_s", "host_memory_budget_bytes",
                                             "threads_per_rank", "device", "prefetch", "host_gather",
                                             "device_cache_bytes", "device_cache_ratio", "ranks_per_gpu",
                                             "graph_placement", "cuda_graph"}
    assert train.Params(fanouts="10,5").num_layers == 2   # the depth is the number of fanouts
    assert np.isclose(train.Params().lr, 0.003) and train.Params().hidden == 256 and train.Params().num_layers == 3
