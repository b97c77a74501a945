"""Edge-aware models train end to end (the train stage, 2 gloo ranks) on the synthetic graph with edge features,
and beat the same model without them.

Measured (2 000 nodes, 4 classes, 4 edge features, 4 epochs, 2 ranks; 1 200 test nodes, so one run's test accuracy
has a standard error of ~1.3 points): gat with edge features 0.773 test accuracy, gat with edge_features=false
0.713, the TransformerConv plug-in with edge features 0.776. The 3-point margin asked below is 4-5 standard errors
under the measured gaps.
"""

from __future__ import annotations

import json

import pytest

from stages.infer import stage as infer
from stages.train import stage as train
from storage import ArtifactStore, InputError, Manifest
from storage.train import METRICS
from tests._train_pipeline import build_upstream, train_params, train_upstream

pytestmark = pytest.mark.slow
EDGE_GRAPH = {"num_nodes": 2000, "avg_degree": 10.0, "num_features": 16, "num_classes": 4, "seed": 1,
              "split": (0.3, 0.1, 0.6), "num_edge_features": 4}
MARGIN = 0.03


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[ArtifactStore, dict[str, Manifest], dict[str, Manifest]]:
    art = ArtifactStore(tmp_path_factory.mktemp("art"))
    upstream = build_upstream(art, 2, EDGE_GRAPH)
    trained = {}
    for name, kw in (("gat", {"model": "gat"}), ("gat_blind", {"model": "gat", "edge_features": False}),
                     ("plugin", {"model": "examples.edge_model:build"})):
        trained[name] = train.run(art, train_params(epochs=4, hidden=32, **kw), train_upstream(upstream),
                                  log=lambda line: None)
    return art, upstream, trained


@pytest.fixture(scope="module")
def runs(built) -> dict[str, dict]:
    art, _, trained = built
    return {name: json.loads(art.read_bytes("train", m.key, METRICS)) for name, m in trained.items()}


def test_gat_with_edge_features_beats_gat_without(runs):
    assert runs["gat"]["test_acc"] >= runs["gat_blind"]["test_acc"] + MARGIN


def test_plugin_with_edge_attr_trains_and_beats_the_edge_blind_model(runs):
    assert runs["plugin"]["test_acc"] >= runs["gat_blind"]["test_acc"] + MARGIN


@pytest.mark.parametrize("name", ["gat", "plugin"])
def test_infer_refuses_an_edge_aware_model_in_one_line(built, name):
    art, upstream, trained = built
    with pytest.raises(InputError, match=r"uses the graph's 4 edge features, which the infer stage cannot feed"):
        infer.run(art, infer.Params(), {"partition": upstream["partition"], "features": upstream["features"],
                                        "train": trained[name]})
