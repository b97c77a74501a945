"""The infer stage on a GPU (issue [4/5] item 4; run by ``make gpu-check``, skipped without CUDA): the layer steps on
the device, the layer matrices there whole when they fit (else each chunk's rows), the exchange on the host; every
node's outputs within 1e-5 of the CPU's. tests/test_infer_layerwise.py runs both placements on the CPU."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from stages.infer.params import Params
from stages.train.models.model import build_model
from tests._gpu_marks import needs_tensorboard
from tests._infer_cases import check_against_reference, random_graph, run_case, run_one_process

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
CUDA = torch.device("cuda", 0)


@pytest.mark.parametrize(("kind", "budget"), [("sage", 1 << 30), ("gcn", 1 << 30), ("sage", 0), ("gcn", 0),
                                              ("gat", 1 << 30)])
def test_the_layer_steps_on_the_gpu_infer_what_the_cpu_does(kind: str, budget: int):
    """``budget``: the matrices whole on the device, or 0: each chunk's rows; GAT gathers per chunk either way."""
    indptr, indices, _ = random_graph()
    torch.manual_seed(2)
    x = torch.randn(indptr.shape[0] - 1, 8)
    model = build_model(kind, in_channels=8, hidden=16, out_channels=3, num_layers=3, dropout=0.0).eval()
    cpu_out, cpu_hidden, _ = run_one_process(model, 3, x, indptr, indices, chunk_edges=300)
    gpu_model = copy.deepcopy(model).to(CUDA)
    out, hidden, engine = run_one_process(gpu_model, 3, x, indptr, indices, chunk_edges=300, device=CUDA,
                                           device_budget=budget)
    placement = "chunks" if kind == "gat" or budget == 0 else "device"
    assert [s.placement for s in engine.stats] == [placement] * 3
    assert out.device.type == "cpu"   # the outputs come back to the host matrices
    torch.testing.assert_close(out, cpu_out, rtol=1e-5, atol=1e-5)
    for layer in (0, 1):
        torch.testing.assert_close(hidden[layer], cpu_hidden[layer], rtol=1e-5, atol=1e-5)


@needs_tensorboard
def test_the_stage_on_one_gpu_infers_every_node_as_the_whole_graph_does(tmp_path: Any):
    case = run_case(str(tmp_path / "art"), 1, {"device": "cuda", "chunk_edges": 500})
    check_against_reference(case, layers=[0])
    ranks = case.manifest.summary["ranks"]
    assert ranks[0]["device"].startswith("cuda") and ranks[0]["placement"] == "device,device"
    # the layers in device memory took one chunk each, where the plan of 500 edges has several
    assert ranks[0]["chunks"] == 1 and case.artifact.metrics()["ranks"][0]["chunk_rounds"] > 1
    assert not case.manifest.reproducible   # atomic adds: a rebuild may differ in the last bits
    assert Params(device="cuda").key_params() == Params().key_params(), "the device is a runtime setting"
