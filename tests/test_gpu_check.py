"""``make gpu-check`` (issue [7/7] item 5): a clean skip without a GPU, the command's own steps on the CPU, and the
zero-copy (UVA) gather against the host rows where CUDA exists."""

from __future__ import annotations

import json
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


def test_gpu_check_refuses_an_unknown_step(tmp_path: Path):
    done = subprocess.run([*CHECK, "--out", str(tmp_path), "--steps", "env,warp"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["error: unknown step 'warp'; choose from env, tests, gather, "
                                                "sampler, train, prefetch"]


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
    assert torch.equal(_features(x, "cpu", "uva").gather(n_id), x[n_id])


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
