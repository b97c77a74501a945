"""``make gpu-check``: the GPU validation in one command — CUDA tests and GPU benchmarks, results to ``--out``.

On a machine without a usable CUDA device it says so, writes ``gpu_check.json`` with ``"status": "skipped"`` and
exits 0. On a GPU machine (no network needed) it:

1. installs what the machine lacks from the wheels that ``make gpu-wheels`` prepared beforehand in ``.whl/`` (an
   ignored folder; the GPU machines have Python 3.12 with torch and torch_geometric, not zarr, pydantic or pymetis),
   into ``benchmarks/work/gpu-site``, and puts it on the steps' ``PYTHONPATH``; a step whose modules are still
   missing is skipped, saying which;
2. runs the steps, each a subprocess with its own time limit, its log in ``<out>/<step>.log`` and its figures in
   ``<out>/<step>.json`` as soon as it ends (a run cut short keeps what finished):

   - ``env``: GPU, driver, torch and CUDA versions;
   - ``tests``: every test marked ``cuda`` (``pytest -m cuda`` over the files that hold one; junit XML beside);
   - ``gather``: zero-copy (UVA) vs gather-then-copy vs HBM rows (``bench_gpu_gather.py``, issue [7/7] item 4);
   - ``sampler``: sampled edges/s of our sampler on the GPU at products scale (``bench_sampler.py``; goal ≥ 40 M/s
     on an H100, GLT publishes 32 M/s on an A100), with the CSR in device memory, then pinned in host memory and
     read in place (``--graph-placement uva``);
   - ``train``: a products-scale training epoch on 1 GPU with the train stage's defaults (the device cache sized
     by the free memory, ``host_gather`` and ``prefetch`` auto) for each stored feature dtype of ``--dtypes``
     (``bench_train.py --parts 1``), hit rate and host→device bytes; the first dtype profiled (``--profile 10``)
     and, with ``--compare``, also with the step's other settings on the same load (``cuda_graph`` off, step and
     auto, each with and without TF32 GEMMs, in 2 rounds, each profiled: the JSON's ``variants``, ~1 minute more
     at products scale); then capped at 0.2 of the rows beside the plans of that size of each cache policy;
   - ``baseline``: with ``--baseline TREE.tar`` (``git archive <rev> -o TREE.tar``), that older tree's own
     ``bench_train.py`` times the first dtype's defaults on the same artifacts, profiled: issue [4/5] item 3's
     before and after, in the same call;
   - ``prefetch``: seconds per batch on 1 GPU at prefetch depths 0 and 1, 2 rounds (``bench_prefetch.py --ranks 1``);
   - ``infer``: exact layer-wise inference of every node on 1 GPU after a 1-epoch train stage (``bench_infer.py``;
     issue [4/5] item 4); prefetch and infer read the first dtype's stages, the ones the train step timed;
   - ``spmm``, only when ``--steps`` names it: the training step's CSR products, eager and replayed from a CUDA
     graph, padded or not, and a gather + ``index_add_`` in their place (``bench_step_spmm.py``, item 3's
     diagnosis), on the sampler's graph;

   A step still running at ``--step-timeout-s`` is stopped (SIGINT, as Ctrl-C, then SIGTERM and SIGKILL), keeping
   what it wrote: pytest its junit XML, bench_train the figures it had timed;
3. writes ``<out>/gpu_check.json``: each step's status, seconds and figures, and the whole check's seconds (the
   goal: 8 minutes on a fresh machine, [4/5] item 6); and ``<out>/gpu_check.md``, those figures as the tables
   that benchmarks/RESULTS.md cites (``_gpu_tables``), both rewritten as each step ends.

While the CUDA tests run (they time nothing), a background thread builds what the timed steps read: each dtype's
stages up to hotness (``bench_train.py --prepare-only``) and the sampler's graph (``bench_sampler.py
--prepare-only``), about 2 minutes of CPU at products scale; the first timed step waits for it (``prepare`` in the
JSON), so no timing shares the machine.

``--scale small`` runs the same steps on a 100 k-node graph (a quick pass, or ``--allow-cpu`` on a machine without
a GPU, to check the command itself); ``--steps`` picks steps, e.g. to split a run over two device calls::

    make gpu-check GPU_OUT=/tmp/gpu                         # all steps, products scale
    python3 benchmarks/gpu_check.py --out $OUT --steps env,tests,gather,sampler
    python3 benchmarks/gpu_check.py --out $OUT --steps train --dtypes float32,float16
    python3 benchmarks/gpu_check.py --out $OUT --steps env,tests,train,baseline --compare --baseline old_tree.tar
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

from _gpu_tables import markdown  # benchmarks/ is on sys.path when run as a script
from _gpu_wheels import download_wheels, install_wheels, lacking_status, missing

REPO = Path(__file__).resolve().parents[1]
STEPS = ("env", "tests", "gather", "sampler", "train", "baseline", "prefetch", "infer", "spmm")
# run unless --steps names them: spmm is a diagnosis (item 3's CSR products), outside the 8-minute check
ON_REQUEST = ("spmm",)
UNTIMED = ("env", "tests")   # the steps that time nothing: the timed ones' inputs are prepared beside them
GOAL_S = 480                 # the whole check on a fresh GPU machine, upstream builds included ([4/5] item 6)
STOP_GRACE_S = 30            # a stopped step's time to write what it has (pytest: its summary and junit XML)
# the train step's settings timed beside the defaults, on one load (bench_train's variants: every combination)
# in 2 rounds, forward then backward: a drift of the machine weighs on each alike (bench_train --rounds)
VARIANTS = ("--cuda-graph", "auto,step,off", "--precision", "tf32,float32", "--rounds", "2")
# modules each step imports beyond the GPU machine's own python (torch, torch_geometric, numpy, scipy, yaml, ...);
# tensorboard: the train stage refuses to start without it (require_trackers), and the infer step trains through
# that stage (bench_train starts the ranks itself); the CUDA tests that do skip alone (tests/_gpu_marks.py).
NEEDS = {"env": (), "tests": ("zarr", "pydantic", "pytest"), "gather": (), "sampler": ("zarr", "pydantic"),
         "train": ("zarr", "pydantic", "pymetis"), "baseline": ("zarr", "pydantic", "pymetis"),
         "prefetch": ("zarr", "pydantic", "pymetis"),
         "infer": ("zarr", "pydantic", "pymetis", "pyarrow", "tensorboard"), "spmm": ("zarr", "pydantic")}
SCALES = {"products": {"nodes": 2_400_000, "avg_degree": 50, "features": 100, "classes": 47, "max_batches": 30,
                       "gather_rows": 2_400_000, "batch_rows": 650_000},
          "small": {"nodes": 100_000, "avg_degree": 20, "features": 100, "classes": 47, "max_batches": 5,
                    "gather_rows": 200_000, "batch_rows": 50_000}}


def cuda_status() -> tuple[bool, str]:
    """Whether torch sees a CUDA device here, and a line saying what it sees."""
    if importlib.util.find_spec("torch") is None:
        return False, f"no torch in {sys.executable}, so no CUDA device to check"
    import torch

    if not torch.cuda.is_available():
        return False, f"torch {torch.__version__} sees no CUDA device"
    return True, f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}"


def run_step(name: str, cmd: list[str], out: Path, env: dict[str, str], timeout_s: float,
             cwd: Path = REPO) -> dict[str, object]:
    """Run ``cmd`` in ``cwd``, in its own session; its output goes to ``<out>/<name>.log``, and its last stdout
    line, when it is JSON, to ``<out>/<name>.json``. At the limit its group gets SIGINT, as Ctrl-C: pytest then
    still writes its summary and junit XML (the tests that ran), a benchmark its traceback; then SIGTERM, then
    SIGKILL."""
    start = time.perf_counter()
    log_path = out / f"{name}.log"
    timed_out = False
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=log, text=True,
                                start_new_session=True)
        try:
            stdout, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            stdout = _stop(proc)
        log.write(stdout)
    status = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
    if timed_out:
        status = f"failed: stopped at the step limit ({timeout_s:g} s, --step-timeout-s)"
    result: dict[str, object] = {"status": status, "seconds": round(time.perf_counter() - start, 1),
                                 "log": log_path.name}
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if lines:
        figures = json.loads(lines[-1])
        (out / f"{name}.json").write_text(json.dumps(figures, indent=1))
        result["figures"] = figures
    return result


def _stop(proc: subprocess.Popen) -> str:
    """Stop ``proc``'s process group: SIGINT, SIGTERM, SIGKILL, each given its grace; all it printed (a timed-out
    ``communicate`` keeps what it read for the next call)."""
    for sig, grace_s in ((signal.SIGINT, STOP_GRACE_S), (signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, None)):
        with contextlib.suppress(ProcessLookupError):   # the group ended after the previous signal
            os.killpg(proc.pid, sig)
        try:
            stdout, _ = proc.communicate(timeout=grace_s)
            return stdout or ""
        except subprocess.TimeoutExpired:
            continue
    raise AssertionError("communicate() without a timeout returned")


def step_failed(result: object) -> bool:
    """Whether a step's run, or one of its runs, failed: by its status, not by its figures' words (a timed run
    that fell back to eager reports "off: the capture failed: ..." among figures that hold)."""
    runs = result if isinstance(result, list) else [result]
    return any(str(run.get("status", "")).startswith("failed") for run in runs if isinstance(run, dict))


def record(out: Path, summary: dict[str, object]) -> None:
    """The check so far: ``gpu_check.json``, and its figures as tables in ``gpu_check.md`` (``_gpu_tables``)."""
    (out / "gpu_check.json").write_text(json.dumps(summary, indent=1))
    (out / "gpu_check.md").write_text(markdown(summary))


SLOWEST_TESTS = 8   # the slowest CUDA tests named in the figures: what to shorten for the 8-minute check


def junit_counts(path: Path) -> dict[str, Any]:
    """Tests, failures, errors and skips of a pytest junit XML, and its slowest tests (``[name, seconds]``)."""
    import xml.etree.ElementTree as ElementTree

    root = ElementTree.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    attrs = suite.attrib if suite is not None else {}
    counts: dict[str, Any] = {k: int(attrs.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    cases = [(f"{c.get('classname', '')}::{c.get('name', '')}", float(c.get("time", 0) or 0))
             for c in root.iter("testcase") if c.find("skipped") is None]   # a skipped test took no time
    counts["slowest"] = [[name, round(t, 1)] for name, t in sorted(cases, key=lambda c: -c[1])[:SLOWEST_TESTS]]
    return counts


def baseline_tree(work: Path) -> Path:
    """Where ``--baseline``'s older tree is unpacked, inside the work folder."""
    return work / "baseline-tree"


def unpack_baseline(tar: Path, work: Path, env: dict[str, str]) -> tuple[Path, dict[str, str]]:
    """``tar`` (``git archive`` of an older revision) unpacked afresh, and the steps' environment with that tree
    on ``PYTHONPATH`` in place of this one (the installed wheels stay)."""
    tree = baseline_tree(work)
    shutil.rmtree(tree, ignore_errors=True)
    tree.mkdir(parents=True)
    with tarfile.open(tar) as archive:
        archive.extractall(tree, filter="data")
    paths = [str(tree) if p == str(REPO) else p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return tree, dict(env, PYTHONPATH=os.pathsep.join(paths))


def cuda_test_files() -> list[str]:
    """The test files that hold a test marked ``cuda``."""
    return sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_*.py")
                  if re.search(r"pytest\.mark\.cuda\b", p.read_text()))


def step_commands(args: argparse.Namespace, out: Path) -> dict[str, list[tuple[str, list[str]]]]:
    """Each step's runs: (the run's name, for its log and figures; its command)."""
    py, bench = sys.executable, str(REPO / "benchmarks")
    s = SCALES[args.scale]
    work = args.work
    graph = ["--nodes", str(s["nodes"]), "--avg-degree", str(s["avg_degree"])]
    device = "cuda" if not args.allow_cpu else "cpu"
    train = [(f"train-{dtype}", [py, f"{bench}/bench_train.py", *graph, "--features", str(s["features"]),
                                 "--classes", str(s["classes"]), "--parts", "1", "--device", device, "--skip-single",
                                 "--max-batches", str(s["max_batches"]), "--feature-dtype", dtype,
                                 "--root", str(work / f"artifacts-{args.scale}"), "--policies", "runtime"])
             for dtype in args.dtypes.split(",")]
    first = args.dtypes.split(",")[0]
    # each dtype with the train stage's defaults (the device cache sized by the free memory, prefetch auto); the
    # first profiled (issue [4/5] item 3), then capped at 0.2 beside that size's plans (hotness, degree, none).
    # host_gather=copy, item 2's other path, is settled on two cards (benchmarks/RESULTS.md): left out for time
    plain = train[0][1]
    # the stages up to hotness of each dtype, and the sampler's graph: built while the CUDA tests run (main)
    sampler_graph = ["--graph", str(work / f"sampler-{args.scale}.npz")]
    prepare = [(f"prepare-{dtype}", [*cmd, "--prepare-only"]) for (_, cmd), dtype in zip(train, args.dtypes.split(","))]
    prepare.append(("prepare-sampler", [py, f"{bench}/bench_sampler.py", *graph, *sampler_graph, "--prepare-only"]))
    # --compare: the step's settings (item 3) on the same load, each profiled; the first of each list is what the
    # defaults resolve to on a GPU (cuda_graph=auto, precision=auto: tf32)
    train[0] = (train[0][0], [*plain, *(VARIANTS if args.compare else ()), "--profile", "10"])
    cap = ["--device-cache-ratio", "0.2"]
    train.append((f"train-{first}-cap0.2", [*plain[:-1], ",".join(("runtime", "hotness", "degree", "none")), *cap]))
    return {
        "prepare": prepare,
        "env": [("env", [py, "-c", "import json, torch; print(json.dumps({'torch': torch.__version__, 'cuda': "
                 "torch.version.cuda, 'device': torch.cuda.get_device_name(0) if torch.cuda.is_available() else "
                 "'cpu', 'memory_GiB': round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1) if "
                 "torch.cuda.is_available() else None}))"])],
        # the junit XML's times name the slowest tests in the figures (junit_counts)
        "tests": [("tests", [py, "-m", "pytest", "-q", "-rA", "-m", "cuda", "-p", "no:cacheprovider",
                             f"--junitxml={out / 'tests.xml'}", *cuda_test_files()])],
        "gather": [("gather", [py, f"{bench}/bench_gpu_gather.py", "--rows", str(s["gather_rows"]), "--batch-rows",
                               str(s["batch_rows"]), *(["--allow-cpu"] if args.allow_cpu else [])])],
        # the CSR in device memory, then pinned and read in place (issue [4/5] item 7)
        "sampler": [(name, [py, f"{bench}/bench_sampler.py", *graph, "--device", device, "--batches", "30",
                            *sampler_graph, "--graph-placement", placement])
                    for name, placement in (("sampler", "device"), ("sampler-uva", "uva"))
                    if placement == "device" or not args.allow_cpu],
        "train": train,
        # the older tree's own benchmark, run in that tree (main), on this check's artifacts
        "baseline": [("baseline", [py, str(baseline_tree(work) / "benchmarks" / "bench_train.py"), *plain[2:],
                                   "--profile", "10"])] if args.baseline else [],
        "prefetch": [("prefetch", [py, f"{bench}/bench_prefetch.py", *graph, "--features", str(s["features"]),
                                   "--classes", str(s["classes"]), "--ranks", "1", "--device", device,
                                   "--hidden", "256", "--depths", "0,1", "--rounds", "2", "--feature-dtype", first,
                                   "--max-batches", str(s["max_batches"]),
                                   "--root", str(work / f"artifacts-{args.scale}")])],
        # exact inference of every node on one GPU (item 4: <= 10 s at products scale); the CPU beside it
        # (--devices cuda,cpu: the largest difference of the probabilities) costs the 8-minute check ~1 min at
        # products scale, so tests/test_gpu_infer.py holds the 1e-5 check; the stages up to train are cached in --root
        "infer": [("infer", [py, f"{bench}/bench_infer.py", *graph, "--features", str(s["features"]),
                             "--classes", str(s["classes"]), "--parts", "1", "--epochs", "1", "--feature-dtype", first,
                             "--devices", "cuda" if not args.allow_cpu else "cpu",
                             "--root", str(work / f"artifacts-{args.scale}")])],
        # the graphed step's CSR products against the eager step's, padded or not, and a gather + index_add_ in
        # their place, on the sampler's graph (session 31: cuSPARSE's kernel 3.56 ms a graphed batch, 0.35 eager)
        "spmm": [("spmm", [py, f"{bench}/bench_step_spmm.py", *graph, *sampler_graph, "--device", device,
                           "--aggregate", "cusparse,index_add", "--precision", "tf32"])],
    }


class Preparing:
    """The ``prepare`` runs in a background thread, one after the other; ``join`` waits and gives their results."""

    def __init__(self, runs: list[tuple[str, list[str]]], out: Path, env: dict[str, str], timeout_s: float) -> None:
        self.results: dict[str, object] = {}
        self._thread = threading.Thread(target=self._run, args=(runs, out, env, timeout_s), daemon=True)
        self._thread.start()

    def _run(self, runs: list[tuple[str, list[str]]], out: Path, env: dict[str, str], timeout_s: float) -> None:
        for name, cmd in runs:
            self.results[name] = run_step(name, cmd, out, env, timeout_s)

    def join(self) -> dict[str, object]:
        self._thread.join()
        return self.results


def split_cores(env: dict[str, str], cpus: int) -> dict[str, str]:
    """``env`` for one of the two sides that share the machine while the CUDA tests run (the tests, the
    preparation): half its cores each, as OpenMP threads, unless the user set ``OMP_NUM_THREADS``. On the H200
    (16 cores) the hotness stage beside the tests, each side taking every core, took 143 s, where the int8
    build's hotness and features after them took 45 s together (benchmarks/RESULTS.md, session 31): the first
    timed step then waited 62 s for the preparation."""
    if "OMP_NUM_THREADS" in env:
        return env
    return dict(env, OMP_NUM_THREADS=str(max(1, cpus // 2)))


def prepare_while_testing(steps: list[str], runs: list[tuple[str, list[str]]], out: Path, env: dict[str, str],
                          timeout_s: float) -> Preparing | None:
    """Build what the timed steps read (the stages up to hotness, the sampler's graph: ~2 minutes of CPU at
    products scale) while the CUDA tests run, which time nothing; None when no test step runs first. Each timed
    step waits for it (so no timing shares the machine), then finds it cached."""
    if "tests" not in steps:
        return None
    chosen = []
    if {"train", "baseline", "prefetch", "infer"} & set(steps) and not missing(NEEDS["train"], env):
        chosen += [r for r in runs if r[0] != "prepare-sampler"]
    if {"sampler", "spmm"} & set(steps) and not missing(NEEDS["sampler"], env):
        chosen += [r for r in runs if r[0] == "prepare-sampler"]
    return Preparing(chosen, out, split_cores(env, os.cpu_count() or 2), timeout_s) if chosen else None


def run_runs(step: str, runs: list[tuple[str, list[str]]], out: Path, env: dict[str, str],
             args: argparse.Namespace) -> object:
    """A step's runs, one after the other: its result (a list for several runs). The baseline's run in the older
    tree, unpacked first; an archive that does not unpack fails the step, not the check."""
    cwd, step_env = REPO, env
    if step == "baseline":
        try:
            cwd, step_env = unpack_baseline(args.baseline, args.work, env)
        except (OSError, tarfile.TarError) as error:
            return {"status": f"failed: --baseline {args.baseline} did not unpack: {error}"}
    results = [run_step(name, cmd, out, step_env, args.step_timeout_s, cwd) for name, cmd in runs]
    if step == "tests" and (out / "tests.xml").exists():
        results[0]["figures"] = junit_counts(out / "tests.xml")
    return results[0] if len(results) == 1 else results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="where the logs and figures go (created)")
    ap.add_argument("--download-wheels", action="store_true", help="fetch the GPU machines' missing wheels to .whl/")
    ap.add_argument("--steps", default=",".join(s for s in STEPS if s not in ON_REQUEST),
                    help=f"comma-separated, of {', '.join(STEPS)} (default: all but {', '.join(ON_REQUEST)})")
    ap.add_argument("--scale", choices=sorted(SCALES), default="products")
    # float32 and int8: the widest rows and the narrowest, which auto gathers the other way (copy); float16 and
    # float8_e4m3 on request: each dtype rebuilds features and hotness (~30 s) and runs an epoch, and the whole
    # check aims at 8 minutes on a fresh machine (issue [4/5] item 6)
    ap.add_argument("--dtypes", default="float32,int8",
                    help="train step: the stored feature dtypes (also: float16, bfloat16, float8_e4m3)")
    ap.add_argument("--work", type=Path, default=REPO / "benchmarks" / "work" / "gpu",
                    help="cached graphs and artifacts")
    ap.add_argument("--compare", action="store_true",
                    help="train step: also time cuda_graph off/step/auto with and without TF32 on the first dtype")
    ap.add_argument("--baseline", type=Path, metavar="TREE.tar",
                    help="an older tree (git archive REV -o TREE.tar) timed beside this one: the baseline step")
    ap.add_argument("--step-timeout-s", type=float, default=1800)
    ap.add_argument("--allow-cpu", action="store_true", help="run the steps on the CPU (checks this command)")
    args = ap.parse_args()
    args.work = args.work.resolve()   # absolute: the baseline step runs in another tree
    if args.download_wheels:
        return download_wheels()
    if not args.out:
        print("error: --out DIR is required: where the results go", file=sys.stderr)
        return 2
    steps = args.steps.split(",")
    if unknown := [s for s in steps if s not in STEPS]:
        print(f"error: unknown step {unknown[0]!r}; choose from {', '.join(STEPS)}", file=sys.stderr)
        return 2
    if args.baseline is not None and not (args.baseline.is_file() and tarfile.is_tarfile(args.baseline)):
        print(f"error: --baseline {args.baseline}: no such tar file; make one with `git archive <rev> -o "
              f"{args.baseline}`", file=sys.stderr)
        return 2
    started = time.perf_counter()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    has_cuda, what = cuda_status()
    print(f"gpu-check: {what}", flush=True)
    summary: dict[str, object] = {"cuda": has_cuda, "what": what, "scale": args.scale, "steps": {}}
    if not has_cuda and shutil.which("nvidia-smi") and not args.allow_cpu:
        # a GPU machine whose chosen python has a CPU-only torch (the project's venv pins one): not a clean skip
        print(f"error: this machine has a GPU (nvidia-smi) but {sys.executable} cannot use it ({what}); run with "
              f"GPU_PYTHON=python3, a python whose torch is a CUDA build", file=sys.stderr)
        return 2
    if not has_cuda and not args.allow_cpu:
        print("gpu-check: no GPU on this machine: nothing to run (skipped)", flush=True)
        summary["status"] = "skipped"
        record(out, summary)
        return 0
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    needed = tuple(sorted({m for step in steps for m in NEEDS[step]}))
    install_wheels(env, needed, lambda line: print(f"gpu-check: {line}", flush=True))
    commands = step_commands(args, out)
    results: dict[str, object] = {}
    preparing = prepare_while_testing(steps, commands["prepare"], out, env, args.step_timeout_s)
    for step in steps:
        if step not in UNTIMED and preparing is not None:   # a timed step: the machine to itself again
            summary["prepare"] = preparing.join()
            print(f"gpu-check: prepared: {json.dumps(summary['prepare'])[:400]}", flush=True)
            preparing = None
        if lacking := missing(NEEDS[step], env):
            results[step] = {"status": lacking_status(lacking)}
        elif not commands[step]:
            results[step] = {"status": "skipped: no --baseline TREE.tar given"}
        else:
            # the tests beside the preparation: half the cores each (split_cores)
            shared = step == "tests" and preparing is not None
            results[step] = run_runs(step, commands[step], out, split_cores(env, os.cpu_count() or 2) if shared
                                     else env, args)
        print(f"gpu-check: {step}: {json.dumps(results[step])[:400]}", flush=True)
        summary["steps"] = results
        record(out, summary)
    if preparing is not None:
        summary["prepare"] = preparing.join()
    failed = [s for s, r in results.items() if step_failed(r)]
    summary["status"] = "failed: " + ", ".join(failed) if failed else "ok"
    summary["seconds"] = round(time.perf_counter() - started, 1)
    record(out, summary)
    print(f"gpu-check: {summary['status']} in {summary['seconds']:.0f} s (the goal of a whole check on a fresh "
          f"machine: {GOAL_S} s); results in {out}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
