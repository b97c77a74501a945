"""``benchmarks/bench_train.py``'s variants (issue [4/5] item 3): the step's settings listed, every combination
timed on one load of the rank data, the first under every policy and each other on the first policy's cache."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = [sys.executable, str(REPO / "benchmarks" / "bench_train.py")]
SMALL = ["--nodes", "3000", "--avg-degree", "8", "--features", "8", "--classes", "4", "--parts", "1", "--device",
         "cpu", "--skip-single", "--batch-size", "64", "--hidden", "16", "--max-batches", "2", "--threads-per-rank",
         "1"]


def test_every_combination_of_the_listed_settings_is_timed_on_one_load(tmp_path: Path):
    done = subprocess.run([*BENCH, *SMALL, "--root", str(tmp_path / "art"), "--policies", "runtime,degree",
                           "--cuda-graph", "off,step", "--matmul-precision", "highest,high", "--profile", "1",
                           "--rounds", "2"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    dist = json.loads(done.stdout.strip().splitlines()[-1])["dist"]
    # the first combination: every policy, and the run's own settings at the top
    assert list(dist["policies"]) == ["runtime", "degree"]
    assert (dist["cuda_graph"], dist["matmul_precision"], dist["precision"]) == \
        ("off: cuda_graph=off", "highest", "float32")
    # the others on the first policy's cache, named by their settings, each as it ran
    assert list(dist["variants"]) == ["off/float32/high", "step/float32/highest", "step/float32/high"]
    for name, figures in dist["variants"].items():
        graph, precision, matmul = name.split("/")
        assert (figures["matmul_precision"], figures["precision"]) == (matmul, precision)
        # a CPU rank trains eagerly whatever is asked, and says why
        assert figures["cuda_graph"] == ("off: cuda_graph=off" if graph == "off" else "off: a CPU rank")
        assert figures["cache_rows_per_rank"] == dist["policies"]["runtime"]["cache_rows_per_rank"]
        assert figures["s_per_batch"] > 0 and "profile" in figures
        # two rounds, forward then backward, summed: each round's ms a batch beside the mean
        assert len(figures["rounds_ms_per_batch"]) == 2
        assert abs(sum(figures["rounds_ms_per_batch"]) / 2e3 - figures["s_per_batch"]) < 1e-3
    assert len(dist["policies"]["degree"]["rounds_ms_per_batch"]) == 1, "the other policies run once"
    # the profile: the first policy under each combination, not the other policies
    assert "profile" in dist["policies"]["runtime"] and "profile" not in dist["policies"]["degree"]
    assert dist["policies"]["degree"]["matmul_precision"] == "highest", "the other policies run the first"


def test_a_setting_outside_its_choices_is_refused(tmp_path: Path):
    done = subprocess.run([*BENCH, *SMALL, "--root", str(tmp_path / "art"), "--cuda-graph", "off,sometimes"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and not (tmp_path / "art").exists()
    assert done.stderr.strip().splitlines()[-1].endswith(
        "argument --cuda-graph: 'sometimes' is not one of off, step, auto")
