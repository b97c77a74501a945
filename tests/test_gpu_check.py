"""``make gpu-check`` (issue [7/7] item 5): a clean skip without a GPU, the command's own steps on the CPU, and the
zero-copy (UVA) gather against the host rows where CUDA exists."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from stages.runtime.uva import UvaRows, UvaUnavailableError

REPO = Path(__file__).resolve().parents[1]
CHECK = [sys.executable, str(REPO / "benchmarks" / "gpu_check.py")]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the skip is for machines without a GPU")
def test_make_gpu_check_skips_cleanly_without_a_gpu(tmp_path: Path):
    done = subprocess.run(["make", "-s", "gpu-check", f"GPU_OUT={tmp_path / 'out'}", f"GPU_PYTHON={sys.executable}"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "no GPU on this machine" in done.stdout
    summary = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert summary["status"] == "skipped" and summary["cuda"] is False and summary["steps"] == {}


def test_gpu_check_runs_its_steps_and_records_them(tmp_path: Path):
    """The orchestration itself, on the CPU: every step's figures land in --out as it ends."""
    out = tmp_path / "out"
    done = subprocess.run([*CHECK, "--out", str(out), "--steps", "env,gather", "--scale", "small", "--allow-cpu",
                           "--work", str(tmp_path / "work")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((out / "gpu_check.json").read_text())
    assert summary["status"] == "ok" and set(summary["steps"]) == {"env", "gather"}
    gather = json.loads((out / "gather.json").read_text())
    assert set(gather["dtypes"]) == {"float32", "float16", "int8"}
    assert gather["dtypes"]["float32"]["row_bytes"] == 4 * gather["cols"]
    assert json.loads((out / "env.json").read_text())["torch"] == torch.__version__
    # the same figures as the tables RESULTS.md cites
    tables = (out / "gpu_check.md").read_text()
    assert "| env | ok |" in tables and "| gather | ok |" in tables
    assert f"| float32 | 400 | {gather['dtypes']['float32']['GB_per_s']['copy']} |" in tables


def test_a_step_stopped_at_its_limit_keeps_what_pytest_ran(tmp_path: Path, monkeypatch):
    """At ``--step-timeout-s`` a step gets SIGINT first: pytest then writes its junit XML of the tests that ran
    (a SIGTERM'd pytest writes none, and the CUDA tests' counts were lost with it)."""
    check = _gpu_check()
    monkeypatch.setattr(check, "STOP_GRACE_S", 20)
    (tmp_path / "test_slow.py").write_text("import time\n\ndef test_quick():\n    pass\n\n"
                                           "def test_slow():\n    time.sleep(120)\n")
    xml = tmp_path / "tests.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
           str(tmp_path / "test_slow.py")]
    result = check.run_step("tests", cmd, tmp_path, dict(os.environ), timeout_s=8, cwd=tmp_path)
    assert result["status"] == "failed: stopped at the step limit (8 s, --step-timeout-s)"
    assert result["seconds"] < 8 + 20, "pytest ended at the SIGINT"
    counts = check.junit_counts(xml)
    assert counts["tests"] >= 1 and counts["failures"] == 0, counts
    assert "KeyboardInterrupt" in (tmp_path / "tests.log").read_text()


def test_the_slowest_cuda_tests_are_named_in_the_figures_and_the_table(tmp_path: Path):
    check = _gpu_check()
    xml = tmp_path / "tests.xml"
    xml.write_text('<testsuites><testsuite tests="4" failures="1" errors="0" skipped="1">'
                   '<testcase classname="tests.test_a" name="test_fast" time="0.2"/>'
                   '<testcase classname="tests.test_b" name="test_slow[hotness-0.2-uva]" time="41.26">'
                   '<failure/></testcase>'
                   '<testcase classname="tests.test_a" name="test_mid" time="7"/>'
                   '<testcase classname="tests.test_c" name="test_skipped" time="9"><skipped/></testcase>'
                   '</testsuite></testsuites>')
    counts = check.junit_counts(xml)
    assert counts == {"tests": 4, "failures": 1, "errors": 0, "skipped": 1,
                      "slowest": [["tests.test_b::test_slow[hotness-0.2-uva]", 41.3], ["tests.test_a::test_mid", 7.0],
                                  ["tests.test_a::test_fast", 0.2]]}
    sys.path.insert(0, str(REPO / "benchmarks"))
    import _gpu_tables

    text = _gpu_tables.markdown({"steps": {"tests": {"status": "ok", "log": "tests.log", "figures": counts}}})
    assert "CUDA tests: **2 passed**, 1 failed" in text
    assert ("Slowest: test_b::test_slow[hotness-0.2-uva] 41.3 s; test_a::test_mid 7.0 s; test_a::test_fast 0.2 s."
            in text)


def test_gpu_check_refuses_an_unknown_step(tmp_path: Path):
    done = subprocess.run([*CHECK, "--out", str(tmp_path), "--steps", "env,warp"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["error: unknown step 'warp'; choose from env, tests, gather, "
                                                "sampler, train, baseline, prefetch, infer, spmm"]


def test_uva_needs_cuda_and_pinned_rows():
    with pytest.raises(UvaUnavailableError, match="CUDA device"):
        UvaRows(torch.zeros(4, 3), torch.device("cpu"))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int8])
def test_uva_gather_reads_the_pinned_host_rows(dtype: torch.dtype):
    host = (torch.arange(5000 * 7, dtype=torch.float32).view(5000, 7) % 101).to(dtype).pin_memory()
    lid = torch.randint(0, 5000, (3000,), generator=torch.Generator().manual_seed(0))
    rows = UvaRows(host, torch.device("cuda")).gather(lid.cuda())
    assert rows.device.type == "cuda" and rows.dtype == dtype
    assert torch.equal(rows.cpu(), host.index_select(0, lid))
    with pytest.raises(UvaUnavailableError, match="pinned"):
        UvaRows(host.clone(), torch.device("cuda"))   # a pageable copy


def _features(x: torch.Tensor, device: str, host_gather: str):
    from stages.runtime.dist_features import DistFeatures
    from stages.runtime.feature_store import InMemoryFeatureStore

    return DistFeatures(InMemoryFeatureStore(x), [0, x.shape[0]], device=device, host_gather=host_gather)


def test_host_gather_is_a_cuda_setting():
    """A CPU rank's rows are in its own RAM already: ``uva`` changes nothing there."""
    x = torch.arange(40, dtype=torch.float32).view(10, 4)
    n_id = torch.tensor([3, 9, 3, 0])
    for choice in ("auto", "copy", "uva"):
        features = _features(x, "cpu", choice)
        assert torch.equal(features.gather(n_id), x[n_id]) and features.host_gather_mode == "cpu"


@pytest.mark.parametrize("choice, itemsize, in_ram, mode", [
    ("auto", 4, True, "uva"), ("auto", 2, True, "uva"), ("auto", 1, True, "copy"),   # float32, float16, int8
    ("auto", 4, False, "copy"),   # rows over the host budget stay in Zarr: UVA reads pinned RAM only
    ("copy", 4, True, "copy"), ("uva", 1, True, "uva"), ("uva", 4, False, "uva"),   # a named choice is kept
])
def test_auto_host_gather_picks_by_the_element_width(choice: str, itemsize: int, in_ram: bool, mode: str):
    from stages.runtime.uva import choose_host_gather

    got, why = choose_host_gather(choice, device_type="cuda", itemsize=itemsize, rows_in_ram=in_ram)
    assert got == mode and why.startswith("auto" if choice == "auto" else "set by host_gather"), why
    assert choose_host_gather(choice, device_type="cpu", itemsize=itemsize, rows_in_ram=in_ram)[0] == "cpu"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_uva_and_copy_deliver_the_same_rows_through_dist_features():
    import zarr

    from stages.runtime.dist_features import DistFeatures, HostGatherError
    from stages.runtime.feature_store import ZarrFeatureStore

    x = torch.randn(20000, 12).to(torch.float16).pin_memory()
    copy, uva = _features(x, "cuda", "copy"), _features(x, "cuda", "uva")
    uva.build_cache(torch.arange(0, 20000, 5))
    for seed in range(3):
        n_id = torch.randint(0, 20000, (7000,), generator=torch.Generator().manual_seed(seed))
        assert torch.equal(copy.gather(n_id), uva.gather(n_id))
    assert uva.counters.local_rows > 0 and uva.counters.cache_hits > 0
    # the runtime's ValueError, which the train rank reports as the user's one line (RankData.open)
    with pytest.raises(HostGatherError, match="host_gather=copy"):
        _features(x.clone(), "cuda", "uva")   # pageable rows cannot be read in place
    in_zarr = ZarrFeatureStore(zarr.array(x.numpy(), chunks=(1000, 12)))
    with pytest.raises(HostGatherError, match="host_memory_budget_bytes"):   # rows past the budget stay in Zarr
        DistFeatures(in_zarr, [0, 20000], device="cuda", host_gather="uva")
    # auto: UVA for these 2-byte rows, copy where it cannot read them in place (pageable, or in Zarr)
    assert _features(x, "cuda", "auto").host_gather_mode == "uva"
    pageable = _features(x.clone(), "cuda", "auto")
    assert (pageable.host_gather_mode, pageable.host_gather_why.startswith("auto: UVA unavailable")) == ("copy", True)
    assert DistFeatures(in_zarr, [0, 20000], device="cuda", host_gather="auto").host_gather_mode == "copy"


def _gpu_check():
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_check

    return gpu_check


def _args(tmp_path: Path, **kw):
    import argparse

    return argparse.Namespace(**{"scale": "small", "dtypes": "float32,int8", "work": tmp_path, "allow_cpu": True,
                                 "baseline": None, "compare": False, **kw})


def test_the_timed_steps_inputs_are_what_the_preparation_builds(tmp_path: Path):
    """``prepare``: each train dtype's command with --prepare-only (the same artifact keys), and the sampler's
    graph cache at the path the sampler step reads."""
    check = _gpu_check()
    commands = check.step_commands(_args(tmp_path), tmp_path)
    prepare = dict(commands["prepare"])
    assert list(prepare) == ["prepare-float32", "prepare-int8", "prepare-sampler"]
    train = dict(commands["train"])
    assert prepare["prepare-float32"] == [*train["train-float32"][:-2], "--prepare-only"]   # less --profile 10
    assert prepare["prepare-int8"] == [*train["train-int8"], "--prepare-only"]
    assert list(train) == ["train-float32", "train-int8", "train-float32-cap0.2"]
    assert commands["baseline"] == [], "no older tree given"
    # --compare: the first dtype's run times the step's other settings on the same load (item 3), each profiled
    compared = dict(check.step_commands(_args(tmp_path, compare=True), tmp_path)["train"])["train-float32"]
    assert compared == [*train["train-float32"][:-2], "--cuda-graph", "auto,step,off", "--precision",
                        "tf32,float32", "--rounds", "2", "--profile", "10"]
    sampler = dict(commands["sampler"])["sampler"]
    graph = sampler[sampler.index("--graph") + 1]
    assert graph in prepare["prepare-sampler"] and "--prepare-only" in prepare["prepare-sampler"]
    spmm = dict(commands["spmm"])["spmm"]   # item 3's diagnosis reads the sampler's graph too
    assert spmm[spmm.index("--graph") + 1] == graph and spmm[-4:] == ["--aggregate", "cusparse,index_add",
                                                                     "--precision", "tf32"]


@pytest.mark.parametrize("dtypes", ["float32,int8", "int8"])
def test_the_prefetch_and_infer_steps_read_the_stages_the_preparation_builds(tmp_path: Path, dtypes: str):
    """One build of the graph's stages up to hotness serves the first dtype's train run, the prefetch step and the
    infer step (a rebuild of the products features and hotness costs the 8-minute check about a minute): their
    pipeline values, parsed from the check's own command lines by each script, give the same artifact keys."""
    import importlib

    from flows.config import make_config, stage_keys

    check = _gpu_check()
    commands = check.step_commands(_args(tmp_path, dtypes=dtypes), tmp_path)
    first = dtypes.split(",")[0]

    def keys(script: str, cmd: list[str]) -> dict[str, str]:
        module = importlib.import_module(script)
        values = module.stage_values(module.parser().parse_args(cmd[2:]))
        return {k: v for k, v in stage_keys(make_config(values)).items() if k != "train"}

    prepared = keys("bench_train", dict(commands["prepare"])[f"prepare-{first}"])
    assert list(prepared) == ["download", "partition", "features", "hotness"]
    assert keys("bench_prefetch", commands["prefetch"][0][1]) == prepared
    assert keys("bench_infer", commands["infer"][0][1]) == prepared
    # the dtype is in the keys: another first dtype, another build
    other = {"float32": "int8", "int8": "float32"}[first]
    again = check.step_commands(_args(tmp_path, dtypes=other), tmp_path)
    assert keys("bench_infer", again["infer"][0][1])["features"] != prepared["features"]


def test_the_baseline_runs_the_older_trees_benchmark_on_the_same_artifacts(tmp_path: Path):
    """``--baseline``: the older tree's own bench_train with the first dtype's default run (no variants: an
    older tree need not know them), profiled, on this check's artifacts."""
    check = _gpu_check()
    commands = check.step_commands(_args(tmp_path, baseline=tmp_path / "old.tar"), tmp_path)
    plain = dict(commands["train"])["train-float32"][:-2]
    (name, cmd), = commands["baseline"]
    assert name == "baseline" and cmd[1] == str(tmp_path / "baseline-tree" / "benchmarks" / "bench_train.py")
    assert cmd[2:] == [*plain[2:], "--profile", "10"] and str(tmp_path / "artifacts-small") in cmd


def test_a_step_fails_by_its_status_not_by_its_figures_words():
    check = _gpu_check()
    fell_back = {"status": "ok", "figures": {"dist": {"cuda_graph": "off: the capture failed: RuntimeError: x"}}}
    assert not check.step_failed(fell_back), "a run that went on eagerly is a result, not a failure"
    assert not check.step_failed({"status": "skipped: no --baseline TREE.tar given"})
    assert check.step_failed({"status": "failed (exit 1)", "figures": {}})
    assert check.step_failed([{"status": "ok"}, {"status": "failed: --baseline old.tar did not unpack: x"}])
    assert not check.step_failed([{"status": "ok"}, {"status": "ok"}])


def test_the_baseline_tree_is_unpacked_afresh_and_imported_in_place_of_this_one(tmp_path: Path):
    import tarfile

    check = _gpu_check()
    src = tmp_path / "src" / "benchmarks"
    src.mkdir(parents=True)
    (src / "bench_train.py").write_text("print('old')\n")
    with tarfile.open(tmp_path / "old.tar", "w") as tar:
        tar.add(src, arcname="benchmarks")
    work = tmp_path / "work"
    (check.baseline_tree(work) / "stale").mkdir(parents=True)
    env = {"PYTHONPATH": os.pathsep.join(("/site", str(REPO))), "HOME": "/h"}
    tree, tree_env = check.unpack_baseline(tmp_path / "old.tar", work, env)
    assert tree == check.baseline_tree(work)
    assert (tree / "benchmarks" / "bench_train.py").read_text() == "print('old')\n"
    assert not (tree / "stale").exists(), "a tree left by an earlier check is replaced"
    assert tree_env == {"PYTHONPATH": os.pathsep.join(("/site", str(tree))), "HOME": "/h"}
    assert env["PYTHONPATH"].endswith(str(REPO)), "the other steps' environment is left as it was"


def test_a_baseline_that_is_not_a_tar_file_is_refused(tmp_path: Path):
    (tmp_path / "old.tar").write_text("not a tar")
    for path in (tmp_path / "old.tar", tmp_path / "missing.tar"):
        done = subprocess.run([*CHECK, "--out", str(tmp_path / "out"), "--baseline", str(path)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and not (tmp_path / "out").exists()
        assert done.stderr.strip().splitlines() == [f"error: --baseline {path}: no such tar file; make one with "
                                                    f"`git archive <rev> -o {path}`"]


def test_the_preparation_runs_beside_the_tests_only(tmp_path: Path, monkeypatch):
    check = _gpu_check()
    ran: list[str] = []
    threads: set[str | None] = set()

    def run_step(name, cmd, out, env, timeout_s):
        ran.append(name)
        threads.add(env.get("OMP_NUM_THREADS"))
        return {"status": "ok"}
    monkeypatch.setattr(check, "run_step", run_step)
    runs = [("prepare-float32", ["a"]), ("prepare-sampler", ["b"])]
    env = dict(PYTHONPATH=str(REPO))
    assert check.prepare_while_testing(["env", "train"], runs, tmp_path, env, 10) is None, "no tests to hide it"
    assert check.prepare_while_testing(["env", "tests", "gather"], runs, tmp_path, env, 10) is None
    preparing = check.prepare_while_testing(["tests", "sampler"], runs, tmp_path, env, 10)
    assert preparing is not None and preparing.join() == {"prepare-sampler": {"status": "ok"}}
    ran.clear()
    preparing = check.prepare_while_testing(["tests", "spmm"], runs, tmp_path, env, 10)   # the sampler's graph
    assert preparing is not None and preparing.join() == {"prepare-sampler": {"status": "ok"}}
    ran.clear()
    preparing = check.prepare_while_testing(["tests", "infer", "sampler"], runs, tmp_path, env, 10)
    assert list(preparing.join()) == ["prepare-float32", "prepare-sampler"] == ran
    # beside the tests it takes half the cores (the tests the other half: split_cores), unless the user chose
    assert threads == {str(max(1, (os.cpu_count() or 2) // 2))}
    assert check.split_cores({}, 16) == {"OMP_NUM_THREADS": "8"} and check.split_cores({}, 1)["OMP_NUM_THREADS"] == "1"
    assert check.split_cores({"OMP_NUM_THREADS": "3"}, 16) == {"OMP_NUM_THREADS": "3"}


def test_the_tests_share_the_cores_with_the_preparation_only(tmp_path: Path, monkeypatch):
    """The check's own wiring (``main``): the CUDA tests get half the cores while the preparation runs beside them,
    and the timed steps after it the whole machine."""
    check = _gpu_check()
    threads: dict[str, str | None] = {}

    def run_step(name, cmd, out, env, timeout_s, cwd=REPO):
        threads[name] = env.get("OMP_NUM_THREADS")
        return {"status": "ok"}
    monkeypatch.setattr(check, "run_step", run_step)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    half = str(max(1, (os.cpu_count() or 2) // 2))
    for steps, tests_threads in (("tests,train", half), ("tests", None)):
        threads.clear()
        monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--out", str(tmp_path / "out"), "--steps", steps,
                                          "--scale", "small", "--allow-cpu", "--dtypes", "float32",
                                          "--work", str(tmp_path / "work")])
        assert check.main() == 0
        assert threads["tests"] == tests_threads, steps
        assert all(threads[name] is None for name in threads if name.startswith("train")), threads
        assert all(threads[name] == half for name in threads if name.startswith("prepare")), threads


def test_the_sampler_benchmark_prepares_its_graph_only(tmp_path: Path):
    graph = tmp_path / "g.npz"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_sampler.py"), "--nodes", "3000",
                           "--avg-degree", "8", "--graph", str(graph), "--prepare-only"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert graph.exists() and result["nodes"] == 3000 and "edges_per_s" not in json.dumps(result)


def test_the_tables_of_the_sampler_prefetch_and_inference_steps():
    """``gpu_check.md``'s other tables, from figures shaped as bench_sampler, bench_prefetch and bench_infer print
    them (their last JSON line; the shapes of a ``--scale small --allow-cpu`` run)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import _gpu_tables

    sampler = {"graph_placement": "device", "sampled_edges_per_s": 154_000_000, "s_per_batch": 0.0056,
               "edges_per_batch": 862_000}
    prefetch = {"dist": {"s_per_batch_median": {"0": 0.0217, "1": 0.018, "prepare": 0.011},
                         "s_per_batch_rounds": {"0": [0.022, 0.0214], "1": [0.0181, 0.0179], "prepare": [0.011, 0.011]},
                         "speedup": {"1": 1.206}}}
    infer = {"mode": "exact", "nodes": 2_400_000, "device": ["cuda:0"], "placement": ["device"], "rank_wall_s": 8.1,
             "open_s": [0.9], "layer_s": [[3.0, 2.5, 1.0]], "write_s": [2.1], "export_s": 12.0,
             "job_wall_s": 21.5, "acc": {"test": 0.71234, "valid": 0.8}}
    steps = {"sampler": [{"status": "ok", "seconds": 20.0, "log": "sampler.log", "figures": sampler},
                         {"status": "ok", "seconds": 25.0, "log": "sampler-uva.log",
                          "figures": {**sampler, "graph_placement": "uva", "sampled_edges_per_s": 91_000_000}}],
             "prefetch": {"status": "ok", "seconds": 45.0, "log": "prefetch.log", "figures": prefetch},
             "infer": {"status": "ok", "seconds": 70.0, "log": "infer.log", "figures": infer}}
    text = _gpu_tables.markdown({"what": "NVIDIA H200", "status": "ok", "steps": steps})
    assert "| sampler | device | 154.0 | 5.6 | 862000 |" in text and "| sampler-uva | uva | 91.0 | 5.6 |" in text
    assert "speed-up over depth 0: depth 1: 1.206x" in text
    assert "| depth 0 | 21.7 | 22.00 / 21.40 |" in text and "| the producer's half alone | 11.0 |" in text
    # the rank's time split: open, its layers (the slowest rank's sum), write; then the job and its export
    assert "| exact | 2400000 | cuda:0 | device | 8.1 | 0.9 | 6.5 | 2.1 | 21.5 | 12.0 | 0.7123 |" in text
    assert "Status: ok." in text, "no total time before the check ends"


def test_the_spmm_step_runs_on_request_only_and_makes_its_table(tmp_path: Path, monkeypatch):
    """``spmm`` (item 3's diagnosis) is outside the default steps (the 8-minute check); named, it runs, and its
    one JSON line (bench_step_spmm's, as ``--device cpu`` prints it) becomes a table of its cases."""
    check = _gpu_check()
    sys.path.insert(0, str(REPO / "benchmarks"))
    import _gpu_tables

    ran: list[str] = []

    def run_step(name, cmd, out, env, timeout_s, cwd=REPO):
        ran.append(name)
        return {"status": "ok"}
    monkeypatch.setattr(check, "run_step", run_step)
    for steps, spmm in ((None, False), ("env,spmm", True)):
        ran.clear()
        monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--out", str(tmp_path / "out"), "--scale", "small",
                                          "--allow-cpu", "--dtypes", "float32", "--work", str(tmp_path / "work"),
                                          *(["--steps", steps] if steps else [])])
        assert check.main() == 0
        assert ("spmm" in ran) == spmm and ("infer" in ran) != spmm, ran
    figures = {"device": "cpu", "nodes": 18926, "edges": 109621, "padded_nodes": 58035, "padded_edges": 268960,
               "cases": {"unpadded/eager": {"ms_per_step": 12.5, "csr_product_ms": 0.35, "kernel_ms": 4.1},
                         "padded/replayed": "skipped: a CPU cannot capture a CUDA graph"},
               "precision": "tf32", "cusparse_max_abs_diff": 0.0, "index_add_max_abs_diff": 1.8e-07}
    text = _gpu_tables.markdown({"status": "ok", "steps": {"spmm": {"status": "ok", "log": "spmm.log",
                                                                    "figures": figures}}})
    assert "| unpadded/eager | 12.5 | 0.35 | 4.1 |" in text and "index_add 1.8e-07" in text
    assert "| padded/replayed | skipped: a CPU cannot capture a CUDA graph |" in text


def test_a_step_lacking_a_module_says_what_fetches_it():
    """The wheels carry zarr, pydantic and pymetis; tensorboard (the train stage's requirement) they do not: its
    skip must not send the user to ``make gpu-wheels``. A step's needs name a module the stage itself requires."""
    check = _gpu_check()
    assert "tensorboard" in check.NEEDS["infer"] and "tensorboard" not in check.NEEDS["tests"], "those tests skip alone"
    wheels = check.lacking_status(["zarr", "pymetis"])
    assert wheels.startswith("skipped: no zarr, pymetis (") and "make gpu-wheels` where pip works carries" in wheels
    other = check.lacking_status(["tensorboard"])
    assert "does not carry tensorboard: pip install it" in other and "where pip works" not in other
    assert check.step_failed({"status": other}) is False


@pytest.mark.parametrize(("body", "code", "said"), [
    ("pass", 0, None),
    ("raise RuntimeError('the launch failed')", 1, "Traceback"),
    ("raise CaptureBrokenError('the capture failed: set cuda_graph=off and rerun')", 2,
     "[rank 0] error: the capture failed: set cuda_graph=off and rerun")])
def test_a_benchmark_rank_fails_as_a_train_rank_and_ends_through_os_exit(body: str, code: int, said: str | None,
                                                                         tmp_path):
    """bench_train's and bench_prefetch's ranks end as the train worker's do: a user's error is one ``error:`` line
    (exit 2), any other a traceback (exit 1), each recorded in the launcher's error file; never the interpreter's
    own teardown of torch.distributed (seen to deadlock): nothing after the worker runs."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"result_dir": str(tmp_path), "checkpoint_dir": str(tmp_path)}))
    script = ("from _train_bench import run_rank_worker\n"
              "from stages.train.rank.graphed import CaptureBrokenError\n"
              f"def body():\n    {body}\nrun_rank_worker({str(spec)!r}, body)\nprint('after the worker')\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO / "benchmarks", capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == code and "after the worker" not in done.stdout, done.stderr
    errors = list(tmp_path.glob("error-*.json"))
    if said is None:
        assert not errors and "Traceback" not in done.stderr and "error:" not in done.stderr
        return
    assert said in done.stderr
    record = json.loads(errors[0].read_text())
    assert record["user_error"] == (code == 2) and "the " in record["message"]
