"""``make gpu-check``'s figures as Markdown tables (``gpu_check.md``, written beside ``gpu_check.json``): the form in
which benchmarks/RESULTS.md cites them, so that a run's numbers reach it without copying by hand.

``markdown(summary)`` reads the summary ``gpu_check.py`` writes (each step's status, seconds and, where its last
stdout line was JSON, ``figures``). A step that failed or was skipped shows in the steps' table only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

# the training thread's phases in the order a batch runs them (stages.runtime.phases), then what is left
PHASES = ("sample", "gather_cache", "gather_local", "gather_remote", "gather", "exchange", "forward_backward",
          "optimizer", "wait", "other")
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC")


def markdown(summary: dict[str, Any]) -> str:
    """The whole check as Markdown: the steps, then a table for each kind of figure that came back."""
    runs = dict(_runs(summary.get("steps", {})))
    parts = [_header(summary), _steps(summary.get("steps", {}))]
    training = {name: r["figures"] for name, r in runs.items() if _is_training(r)}
    sections: list[tuple[str, Callable[[], str]]] = [
        ("tests", lambda: _tests(runs)), ("training", lambda: _training(training)),
        ("profiles", lambda: _profiles(training)), ("phases", lambda: _phases(training)),
        ("sampler", lambda: _sampler(runs)), ("gather", lambda: _gather(runs)), ("prefetch", lambda: _prefetch(runs)),
        ("infer", lambda: _infer(runs)), ("spmm", lambda: _spmm(runs))]
    for name, section in sections:
        try:
            text = section()
        except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError) as error:
            # figures of another shape (an older tree's, a step cut short): said, and the other tables go on
            text = f"({name}: the figures could not be read as a table: {type(error).__name__}: {error})"
        if text:
            parts.append(text)
    return "\n\n".join(parts) + "\n"


def _runs(steps: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every run of every step by its name (a step of several runs, e.g. train, names each by its log)."""
    for step, result in steps.items():
        for run in result if isinstance(result, list) else [result]:
            yield str(run.get("log", step)).removesuffix(".log"), run


def _is_training(run: dict[str, Any]) -> bool:
    return "policies" in run.get("figures", {}).get("dist", {})


def _table(header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join("" if v is None else str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _header(summary: dict[str, Any]) -> str:
    seconds = summary.get("seconds")
    took = f", {seconds:.0f} s in all (the aim: 480 s on a fresh machine)" if seconds is not None else ""
    return f"## gpu-check: {summary.get('what', '?')}\n\nStatus: {summary.get('status', 'unfinished')}{took}."


def _steps(steps: dict[str, Any]) -> str:
    rows = [(name, run.get("status"), run.get("seconds")) for name, run in _runs(steps)]
    return _table(("run", "status", "seconds"), rows)


def _tests(runs: dict[str, Any]) -> str:
    counts = runs.get("tests", {}).get("figures")
    if not counts:
        return ""
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    slowest = "; ".join(f"{_short(name)} {t} s" for name, t in counts.get("slowest", []))
    return (f"CUDA tests: **{passed} passed**, {counts['failures']} failed, {counts['errors']} errors, "
            f"{counts['skipped']} skipped (`tests.log`, `tests.xml`)." + (f" Slowest: {slowest}." if slowest else ""))


def _short(test: str) -> str:
    """``tests.test_a::test_b[x-0.2]`` as ``test_a::test_b[x-0.2]``: the module's last part (ids may hold dots)."""
    module, _, name = test.partition("::")
    return f"{module.rsplit('.', 1)[-1]}::{name}"


def _settings(figures: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(policy, variant, figures) of a bench_train result: every policy under the first variant, then the others."""
    dist = figures["dist"]
    for policy, f in dist["policies"].items():
        yield policy, f.get("variant", "as run"), f
    first = next(iter(dist["policies"]), "")
    for variant, f in dist.get("variants", {}).items():
        yield first, variant, f


def _training(training: dict[str, dict[str, Any]]) -> str:
    rows = []
    for name, figures in training.items():
        for policy, variant, f in _settings(figures):
            dist = figures["dist"]   # an older bench_train states the settings there, once
            rows.append((name, policy, variant, round(f["s_per_batch"] * 1e3, 2),
                         " / ".join(str(ms) for ms in f.get("rounds_ms_per_batch", [])), f["epoch_s"],
                         f"{f['hit_rate']:.1%}", f["uncached_MiB_per_epoch"], round(f["sampled_edges_per_s"] / 1e6, 1),
                         f.get("cuda_graph", dist.get("cuda_graph")),
                         f.get("graphed_sampling", dist.get("graphed_sampling"))))
    return "### Training, 1 GPU\n\n" + _table(
        ("run", "cache", "setting", "ms/batch", "rounds ms", "epoch s", "hits", "uncached MiB/epoch",
         "M edges/s", "cuda_graph", "graphed_sampling"), rows) if rows else ""


def _profiles(training: dict[str, dict[str, Any]]) -> str:
    rows = []
    for name, figures in training.items():
        for _, variant, f in _settings(figures):
            p = f.get("profile")
            if not p:
                continue
            calls = p.get("runtime_calls_per_batch", {})
            rows.append((name, variant, p["ms_per_batch"], p["kernel_ms_per_batch"], f"{p['device_busy']:.0%}",
                         p["kernels_per_batch"], round(sum(calls.get(c, 0) for c in LAUNCHES), 1),
                         round(sum(calls.get(c, 0) for c in SYNCS), 1), calls.get("cudaMemcpyAsync", 0)))
    return "### Profiles, per batch (`--profile`)\n\n" + _table(
        ("run", "setting", "ms", "kernel ms", "device busy", "kernels", "launches", "host syncs", "memcpy"),
        rows) if rows else ""


def _phases(training: dict[str, dict[str, Any]]) -> str:
    rows = []
    for name, figures in training.items():
        for policy, variant, f in _settings(figures):
            split = f.get("phases_ms_per_batch", {})
            ahead = sum(f.get("prefetch_phases_ms_per_batch", {}).values())
            rows.append((name, policy, variant, *(split.get(p) for p in PHASES), round(ahead, 3) if ahead else None))
    return "### Where a batch's time goes, ms (the training thread; then the prefetch thread's total)\n\n" + \
        _table(("run", "cache", "setting", *PHASES, "prefetch thread"), rows) if rows else ""


def _sampler(runs: dict[str, Any]) -> str:
    rows = [(name, f.get("graph_placement"), round(f["sampled_edges_per_s"] / 1e6, 1), round(f["s_per_batch"] * 1e3, 2),
             f.get("edges_per_batch"))
            for name, run in runs.items() if name.startswith("sampler") and (f := run.get("figures"))]
    return "### Sampler alone\n\n" + _table(("run", "graph", "M edges/s", "ms/batch", "edges/batch"), rows) \
        if rows else ""


def _gather(runs: dict[str, Any]) -> str:
    figures = runs.get("gather", {}).get("figures")
    if not figures:
        return ""
    rows = [(dtype, d["row_bytes"], *(d["GB_per_s"].get(k) for k in ("copy", "uva", "hbm")), d.get("faster_host_path"))
            for dtype, d in figures["dtypes"].items()]
    return (f"### Gather of {figures['batch_rows']} rows of {figures['rows']}, GB/s\n\n"
            + _table(("dtype", "row bytes", "copy", "uva", "hbm", "faster host path"), rows))


def _prefetch(runs: dict[str, Any]) -> str:
    figures = runs.get("prefetch", {}).get("figures")
    if not figures:
        return ""
    dist = figures["dist"]
    rows = [(f"depth {depth}" if depth.isdigit() else "the producer's half alone", round(s * 1e3, 2),
             " / ".join(f"{r * 1e3:.2f}" for r in dist["s_per_batch_rounds"][depth]))
            for depth, s in dist["s_per_batch_median"].items()]
    speedup = ", ".join(f"depth {d}: {x}x" for d, x in dist.get("speedup", {}).items())
    return f"### Prefetch (speed-up over depth 0: {speedup})\n\n" + _table(
        ("prefetch", "ms/batch (median)", "rounds"), rows)


def _infer(runs: dict[str, Any]) -> str:
    f = runs.get("infer", {}).get("figures")
    if not f or "rank_wall_s" not in f:
        return ""
    acc = f.get("acc")

    def slowest(name: str) -> Any:   # a per-rank figure (older trees' benchmarks: absent)
        return max(f[name], default=None) if f.get(name) else ""
    row = (f["mode"], f["nodes"], ", ".join(map(str, f["device"])), ", ".join(map(str, f.get("placement", []))),
           f["rank_wall_s"], slowest("open_s"), sum(max(f["layer_s"], key=sum)) if f.get("layer_s") else "",
           slowest("write_s"), f["job_wall_s"], f.get("export_s", ""),
           round(acc["test"], 4) if isinstance(acc, dict) else acc)
    return "### Inference, every node\n\n" + _table(
        ("mode", "nodes", "device", "placement", "rank wall s", "open s", "layers s", "write s", "job wall s",
         "export s", "test acc"), [row])


def _spmm(runs: dict[str, Any]) -> str:
    f = runs.get("spmm", {}).get("figures")
    if not f or "cases" not in f:
        return ""
    rows = [(case, *((r.get("ms_per_step"), r.get("csr_product_ms", ""), r.get("kernel_ms", ""))
                     if isinstance(r, dict) else (r, "", "")))
            for case, r in f["cases"].items()]
    diffs = ", ".join(f"{k.removesuffix('_max_abs_diff')} {v:.1e}" for k, v in f.items() if k.endswith("_max_abs_diff"))
    return (f"### The step's CSR products ({f['nodes']:,} nodes; a batch of {f['padded_edges']:,} edges padded; "
            f"{f.get('precision', '')} GEMMs; logits against the step's: {diffs})\n\n" +
            _table(("case", "ms a step", "CSR products ms", "kernels ms"), rows))
