"""``benchmarks/bench_train.py``'s variants (issue [4/5] item 3): the step's settings listed, every combination
timed on one load of the rank data, the first under every policy and each other on the first policy's cache."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = [sys.executable, str(REPO / "benchmarks" / "bench_train.py")]
SMALL = ["--nodes", "3000", "--avg-degree", "8", "--features", "8", "--classes", "4", "--parts", "1", "--device",
         "cpu", "--skip-single", "--batch-size", "64", "--hidden", "16", "--max-batches", "2", "--threads-per-rank",
         "1"]


def test_every_combination_of_the_listed_settings_is_timed_on_one_load(tmp_path: Path):
    done = subprocess.run([*BENCH, *SMALL, "--root", str(tmp_path / "art"), "--policies", "runtime,degree",
                           "--cuda-graph", "off,step", "--precision", "float32,tf32", "--profile", "1",
                           "--rounds", "2"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    dist = json.loads(done.stdout.strip().splitlines()[-1])["dist"]
    # the first combination: every policy, and the run's own settings at the top
    assert list(dist["policies"]) == ["runtime", "degree"]
    # each run's own cache: a lone CPU rank's own (none: its rows are all in its RAM), then the degree plan's
    runtime, degree = dist["policies"]["runtime"], dist["policies"]["degree"]
    assert runtime["cache_rows_per_rank"] == 0 and runtime["hit_rate"] == 0
    assert degree["cache_rows_per_rank"] > 0 and degree["hit_rate"] > 0
    # an epoch is the timed batch's time times the epoch's batches (of --batch-size 64, not the default 1024)
    assert dist["batches_per_epoch"] > 1
    for f in [*dist["policies"].values(), *dist["variants"].values()]:
        assert abs(f["epoch_s"] - f["s_per_batch"] * dist["batches_per_epoch"]) <= 0.05 + 1e-9
    assert (dist["cuda_graph"], dist["matmul_precision"], dist["precision"]) == \
        ("off: cuda_graph=off", "highest", "float32")
    # the others on the first policy's cache, named by their settings, each as it ran
    assert list(dist["variants"]) == ["off/tf32", "step/float32", "step/tf32"]
    for name, figures in dist["variants"].items():
        graph, precision = name.split("/")
        # tf32: the trainer sets the process's float32 GEMMs to "high", and float32 back to "highest"
        assert (figures["matmul_precision"], figures["precision"]) == \
            ({"float32": "highest", "tf32": "high"}[precision], precision)
        # a CPU rank trains eagerly whatever is asked, and says why
        assert figures["cuda_graph"] == ("off: cuda_graph=off" if graph == "off" else "off: a CPU rank")
        assert figures["cache_rows_per_rank"] == dist["policies"]["runtime"]["cache_rows_per_rank"]
        assert figures["s_per_batch"] > 0 and "profile" in figures
        # two rounds, forward then backward, summed: each round's ms a batch beside the mean
        assert len(figures["rounds_ms_per_batch"]) == 2
        assert abs(sum(figures["rounds_ms_per_batch"]) / 2e3 - figures["s_per_batch"]) < 1e-3
    assert len(degree["rounds_ms_per_batch"]) == 1, "the other policies run once"
    # the profile: the first policy under each combination, not the other policies
    assert "profile" in runtime and "profile" not in degree
    assert (degree["precision"], degree["matmul_precision"]) == ("float32", "highest"), "the others run the first"
    _check_tables(json.loads(done.stdout.strip().splitlines()[-1]))


def _tables():
    sys.path.insert(0, str(REPO / "benchmarks"))
    import _gpu_tables

    return _gpu_tables


def _check_tables(result: dict) -> None:
    """gpu-check's tables of this result (``_gpu_tables``): a row per timed run, each by its cache and setting."""
    summary = {"what": "cpu", "status": "ok", "seconds": 12.0,
               "steps": {"train": [{"status": "ok", "seconds": 9.5, "log": "train-float32.log", "figures": result}]}}
    text = _tables().markdown(summary)
    dist = result["dist"]
    runtime = dist["policies"]["runtime"]
    assert "| train-float32 | ok | 9.5 |" in text
    row = (f"| train-float32 | runtime | off/float32 | {round(runtime['s_per_batch'] * 1e3, 2)} | "
           f"{' / '.join(map(str, runtime['rounds_ms_per_batch']))} | {runtime['epoch_s']} |")
    assert row in text, text
    for variant in dist["variants"]:
        assert f"| train-float32 | runtime | {variant} |" in text
    assert "| train-float32 | degree | off/float32 |" in text
    # a profile row for each setting of the first cache; the phases of every run
    profiles = text.split("### Profiles")[1].split("###")[0]
    assert profiles.count("| train-float32 |") == 1 + len(dist["variants"])
    phases = text.split("### Where a batch's time goes")[1]
    assert phases.count("| train-float32 |") == 2 + len(dist["variants"])


def test_the_tables_read_an_older_trees_result_and_leave_out_what_did_not_run():
    """An older bench_train (the baseline step) states its settings once, with no variants or rounds; a failed step
    shows in the steps' table only."""
    older = {"dist": {"cuda_graph": "off: cuda_graph=off", "graphed_sampling": None, "policies": {"runtime": {
        "s_per_batch": 0.0123, "epoch_s": 2.3, "hit_rate": 1.0, "uncached_MiB_per_epoch": 0.0,
        "sampled_edges_per_s": 68_400_000, "phases_ms_per_batch": {"sample": 1.5, "forward_backward": 7.6},
        "prefetch_phases_ms_per_batch": {"sample": 11.1}}}}}
    summary = {"what": "NVIDIA H200", "status": "failed: infer", "seconds": 470.0, "steps": {
        "baseline": {"status": "ok", "seconds": 40.0, "log": "baseline.log", "figures": older},
        "infer": {"status": "failed (exit 1)", "seconds": 3.0, "log": "infer.log"}}}
    text = _tables().markdown(summary)
    assert "Status: failed: infer, 470 s in all" in text and "| infer | failed (exit 1) | 3.0 |" in text
    assert ("| baseline | runtime | as run | 12.3 |  | 2.3 | 100.0% | 0.0 | 68.4 | off: cuda_graph=off |  |"
            in text), text
    assert "| baseline | runtime | as run | 1.5 |" in text and text.rstrip().endswith("| 11.1 |")
    assert "### Inference" not in text and "### Profiles" not in text


@pytest.mark.parametrize(("args", "error"), [
    (["--cuda-graph", "off,sometimes"], "argument --cuda-graph: 'sometimes' is not one of off, step, auto"),
    (["--cuda-graph", "off,off"], "--cuda-graph lists a value twice: off,off"),
    (["--policies", "runtime,none,none"], "--policies lists a value twice: runtime,none,none"),
    (["--rounds", "0"], "--rounds must be at least 1, got 0"),
])
def test_bad_settings_are_refused_before_anything_is_built(tmp_path: Path, args: list[str], error: str):
    done = subprocess.run([*BENCH, *SMALL, "--root", str(tmp_path / "art"), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and not (tmp_path / "art").exists()
    assert done.stderr.strip().splitlines()[-1].endswith(error), done.stderr


def test_two_ranks_time_every_setting_in_step():
    """Every rank makes the same collectives in the same order (a rank 0 alone in one hangs the job): two ranks,
    two settings in two rounds, two caches."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        args = [a if a != "1" or i != SMALL.index("--parts") + 1 else "2" for i, a in enumerate(SMALL)]
        args[args.index("--nodes") + 1] = "8000"
        done = subprocess.run([*BENCH, *args, "--root", tmp, "--policies", "runtime,none", "--cuda-graph",
                               "off,step", "--rounds", "2", "--warmup", "1"],
                              cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    dist = json.loads(done.stdout.strip().splitlines()[-1])["dist"]
    # named as asked: precision=auto (the default) resolves on each rank (float32 on these CPU ranks)
    assert dist["world_size"] == 2 and list(dist["variants"]) == ["step/auto"]
    assert dist["variants"]["step/auto"]["precision"] == "float32"
    assert dist["policies"]["none"]["remote_rows_per_epoch"] > 0, "rows crossed between the ranks"


def test_a_graphed_step_warms_up_past_its_capture():
    """The capture (after the graphed step's eager warm-up steps) falls in the untimed batches: a one-time cost of
    the pass, not of a batch."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from types import SimpleNamespace

    from _train_timing import warmup_batches

    assert warmup_batches(SimpleNamespace(capture_batches=3), 2) == 3
    assert warmup_batches(SimpleNamespace(capture_batches=3), 9) == 9
    assert warmup_batches(SimpleNamespace(capture_batches=0), 2) == 2


class _Timer:
    """``RankTimer``'s face: each measure a batch of ``ms`` ms; a profile that crashes, as a profiler session over
    CUDA graphs has under some CUDA versions."""

    batches_per_epoch = 10

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def measure(self, policy, settings):
        self.calls.append(("measure", policy))
        raw = {"wall_s": 0.004, "batches": 2, "counted": 4, "round_ms": [2.0], "requested_rows": 10,
               "cache_hits": 5, "remote_rows": 0, "remote_bytes": 0, "local_bytes": 40, "sampled_edges": 100,
               "phases_s": {"sample": 0.001}, "prefetch_phases_s": {}}
        return {"raw": raw, "settings": dict(settings)}

    def profile(self, policy, settings):
        self.calls.append(("profile", policy))
        raise RuntimeError("CUPTI_ERROR_INVALID_PARAMETER")


def test_the_timed_figures_are_handed_over_before_the_profiles():
    """A profile that crashes loses no timing: ``on_timed`` has the first policy's figures by then."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from _train_timing import time_runs

    runs = [("runtime", {"cuda_graph": "off"}), ("runtime", {"cuda_graph": "step"}), ("degree", {"cuda_graph": "off"})]
    timer, handed = _Timer(), []
    with pytest.raises(RuntimeError, match="CUPTI"):
        time_runs(runs, timer, rounds=2, profile=True, on_timed=lambda ran, figures: handed.append((ran, figures)))
    (ran, figures), = handed
    assert ran == runs[:2] and [f["cuda_graph"] for f in figures] == ["off", "step"]
    assert all(f["rounds_ms_per_batch"] == [2.0, 2.0] and "profile" not in f for f in figures)
    # the first policy's rounds, forward then backward, then its profiles; the other policy after them (its
    # cache replaces the first one's for good)
    assert timer.calls == [("measure", "runtime")] * 4 + [("profile", "runtime")]
    timer.profile = lambda policy, settings: {"ms": 1}
    done = time_runs(runs, timer, rounds=1, profile=True)
    assert [("profile" in f) for f in done] == [True, True, False] and done[2]["cuda_graph"] == "off"


def test_ranks_that_fail_after_writing_their_figures_hand_them_over(tmp_path: Path, monkeypatch, capsys):
    """bench_train prints what rank 0 wrote before the failure, or before gpu_check stopped it at the step's limit,
    with the failure, and exits 1 (gpu_check keeps a failed step's last JSON line)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from types import SimpleNamespace

    from _train_bench import RanksFailedError, dist_result, run_ranks

    from stages.jobs import launcher
    from stages.jobs.errors import TrainingError
    from stages.train.params import Params
    from storage import InputError

    def launch(spec_path, ranks, *, result_dir, **_):
        if wrote:
            Path(result_dir, "bench.json").write_text(json.dumps({"policies": {"runtime": {"s_per_batch": 0.1}}}))
        raise TrainingError("training failed: rank 0 died (SIGSEGV)\nits log: ...")
    monkeypatch.setattr(launcher, "launch", launch)
    args = SimpleNamespace(root=str(tmp_path), timeout_s=60, threads_per_rank=1)
    manifests = {name: SimpleNamespace(key="k") for name in ("partition", "features", "hotness")}
    wrote = True
    with pytest.raises(RanksFailedError) as failed:
        run_ranks(str(REPO / "benchmarks" / "bench_train.py"), args, manifests, Params(), 1, [])
    assert failed.value.written == {"policies": {"runtime": {"s_per_batch": 0.1}}}
    assert str(failed.value) == "training failed: rank 0 died (SIGSEGV)"
    wrote = False
    with pytest.raises(TrainingError):   # nothing written: the failure as it was
        run_ranks(str(REPO / "benchmarks" / "bench_train.py"), args, manifests, Params(), 1, [])

    def refused(spec_path, ranks, *, result_dir, **_):   # a rank's user error, as launch repeats it: one line
        Path(result_dir, "bench.json").write_text(json.dumps({"policies": {"runtime": {"s_per_batch": 0.1}}}))
        raise InputError("rank 0: cuda_graph=step: the capture failed: set cuda_graph=off and rerun")
    monkeypatch.setattr(launcher, "launch", refused)
    with pytest.raises(RanksFailedError) as failed:   # the figures the earlier variants wrote are kept
        run_ranks(str(REPO / "benchmarks" / "bench_train.py"), args, manifests, Params(), 1, [])
    assert failed.value.written == {"policies": {"runtime": {"s_per_batch": 0.1}}}
    assert str(failed.value).endswith("set cuda_graph=off and rerun")

    def stopped(spec_path, ranks, *, result_dir, **_):   # gpu_check's SIGINT at the step's limit, in a profile
        Path(result_dir, "bench.json").write_text(json.dumps({"policies": {"runtime": {"s_per_batch": 0.1}}}))
        raise KeyboardInterrupt
    monkeypatch.setattr(launcher, "launch", stopped)
    result = {"nodes": 3000}
    with pytest.raises(SystemExit) as exited:
        dist_result(result, lambda: run_ranks(str(REPO / "benchmarks" / "bench_train.py"), args, manifests,
                                              Params(), 1, []))
    assert exited.value.code == 1
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed == {"nodes": 3000, "dist": {"policies": {"runtime": {"s_per_batch": 0.1}},
                                               "failed": "stopped (SIGINT)"}}
