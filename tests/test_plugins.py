"""Plug-in models and losses, the Task seam, the recipe's pieces and the loss check, in one process (or two ranks).

The end-to-end runs (the example trained through the pipeline, a NaN loss failing the job) are in test_recipe.py.
"""

from __future__ import annotations

import importlib
import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from flows.config import make_config, stage_keys
from stages.train.models.plugin_code import plugin_files, source_digest
from stages.train.models.plugin_names import Lookup, look_up
from stages.train.models.plugins import make_loss, make_model
from stages.train.params import Params
from stages.train.rank.recipe import BestModel, make_scheduler
from stages.train.spec import code_digest
from stages.train.tasks import NodeClassification
from storage import InputError
from tests._spawn import spawn_ranks
from tests.conftest import GNNPIPE, REPO, TINY, cli_env

EXAMPLE = REPO / "examples" / "custom_model.py"
SIZES = {"in_channels": 8, "hidden": 16, "out_channels": 3, "num_layers": 2, "dropout": 0.0, "heads": 4}


@pytest.fixture
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh directory the user runs gnnpipe from; sys.path is restored afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))   # also makes monkeypatch restore sys.path (plugins appends cwd)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("field, value, message", [
    ("model", "gnn", "invalid parameter model='gnn': unknown model; expected auto, sage, gcn, gat, rgcn, rgat, "
                     "hgt, mlp, or an import path package.module:factory"),
    ("model", "examples.custom_model", "unknown model"),                        # no :factory
    ("model", "examples/custom_model.py:build", "unknown model"),
    ("model", "no_such_pkg.models:build", "module no_such_pkg.models not found on the Python path"),
    ("loss", "mse", "invalid parameter loss='mse': unknown loss; expected auto, cross_entropy, bce, or an import path"),
    ("loss", "examples.nothing_here:f", "module examples.nothing_here not found"),
    # the module is there, the name is not (or is no function): said now, not after four stages inside rank 0
    ("model", "examples.custom_model:nosuch", "invalid parameter model='examples.custom_model:nosuch': module "
                                              "examples.custom_model has no attribute 'nosuch' ("),
    ("loss", "examples.custom_model:nosuch", "module examples.custom_model has no attribute 'nosuch' ("),
    ("decoder", "examples.link_decoder:nosuch", "module examples.link_decoder has no attribute 'nosuch' ("),
    ("loss", "tests._plugins:NOT_CALLABLE", "tests._plugins:NOT_CALLABLE is not callable"),
])
def test_a_bad_plugin_name_is_one_input_error_at_config_time(field: str, value: str, message: str):
    with pytest.raises(InputError) as err:
        Params(**{field: value})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_builtins_and_import_paths_validate_without_importing_them():
    sys.modules.pop("examples.custom_model", None)
    params = Params(model="examples.custom_model:build", loss="examples.custom_model:smoothed_cross_entropy",
                    model_kwargs={"aggr": "max"})
    with pytest.raises(InputError, match="has no attribute 'nosuch'"):
        Params(model="examples.custom_model:nosuch")
    assert "examples.custom_model" not in sys.modules, "validation reads the module's source, it does not run it"
    assert params.model_kwargs == {"aggr": "max"} and Params(model="gcn").model == "gcn"


def test_what_the_source_cannot_tell_is_imported(user_dir: Path):
    (user_dir / "plugs.py").write_text(
        "import functools\nfrom os.path import join\n\nif join:\n    def build(**sizes):\n        return None\n"
        "else:\n    build = None\nloss = lambda a, b: a\nWIDTH = 3\nmade = functools.partial(join, 'a')\n"
        "ROWS: int = 4\n")
    (user_dir / "starry.py").write_text("from os.path import *\n")
    assert look_up(user_dir / "plugs.py", "loss") is Lookup.CALLABLE
    assert look_up(user_dir / "plugs.py", "WIDTH") is look_up(user_dir / "plugs.py", "ROWS") is Lookup.NOT_CALLABLE
    assert look_up(user_dir / "plugs.py", "nosuch") is Lookup.MISSING
    for name in ("build", "made", "join"):   # if/else, a call's result, an import
        assert look_up(user_dir / "plugs.py", name) is Lookup.UNKNOWN
    assert look_up(user_dir / "starry.py", "nosuch") is Lookup.UNKNOWN
    assert Params(loss="plugs:loss").loss == "plugs:loss" and "plugs" not in sys.modules
    assert Params(model="plugs:made").model == "plugs:made" and "plugs" in sys.modules   # imported to know
    assert Params(loss="starry:join").loss == "starry:join"
    with pytest.raises(InputError, match="module starry has no attribute 'nosuch'"):
        Params(model="starry:nosuch")
    with pytest.raises(InputError, match="plugs:WIDTH is not callable: a model is a function or a class"):
        Params(model="plugs:WIDTH")
    sys.modules.pop("plugs", None)
    sys.modules.pop("starry", None)


@pytest.mark.parametrize("field, value", [("model", "examples.custom_model:nosuch"),
                                          ("loss", "examples.custom_model:nosuch"),
                                          ("decoder", "examples.link_decoder:nosuch")])
def test_the_cli_refuses_a_missing_plugin_attribute_before_any_stage(tmp_path: Path, field: str, value: str):
    """Before, the config check found the module only: the run failed after four stages (14 s), inside rank 0."""
    sets = [a for k, v in TINY.items() for a in ("--set", f"{k}={json.dumps(v)}")]
    started = time.monotonic()
    proc = subprocess.run([*GNNPIPE, "run", "--artifacts", str(tmp_path / "art"), *sets, "--set", f"{field}={value}"],
                          cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300)
    elapsed = time.monotonic() - started
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.splitlines() == [f"error: invalid parameter {field}='{value}': module {value.split(':')[0]} "
                                        f"has no attribute 'nosuch' ({proc.stderr.split(' (', 1)[1].strip()}"]
    assert not (tmp_path / "art").exists(), "no stage ran"
    assert elapsed < 30, f"{elapsed:.1f} s: the check is the CLI's start-up, no server and no stage"


def test_plugin_code_is_in_the_key_and_an_edit_retrains(user_dir: Path):
    shutil.copy(EXAMPLE, user_dir / "mymodels.py")
    params = Params(model="mymodels:build")
    key = params.key_params()
    stages_before = stage_keys(make_config(model="mymodels:build"))
    assert key["model_code"] == source_digest("mymodels:build") and "loss_code" not in key
    assert "model_code" not in Params().key_params(), "built-ins are covered by the stage's VERSION"
    source = (user_dir / "mymodels.py").read_text()
    (user_dir / "mymodels.py").write_text("# a comment and a blank line do not retrain\n\n" + source)
    assert Params(model="mymodels:build").key_params() == key
    (user_dir / "mymodels.py").write_text(source.replace("label_smoothing=0.1", "label_smoothing=0.2"))
    assert Params(model="mymodels:build").key_params()["model_code"] != key["model_code"], "a code edit retrains"
    stages_after = stage_keys(make_config(model="mymodels:build"))
    assert [s for s in stages_before if stages_before[s] != stages_after[s]] == ["train", "infer"]   # and below
    assert plugin_files(["sage", "mymodels:build"]) == [user_dir / "mymodels.py"]
    # the nodes of a multi-node job compare their code, the plug-in's included
    fingerprint = code_digest(extra=plugin_files(["mymodels:build"]))
    (user_dir / "mymodels.py").write_text(source)
    assert code_digest(extra=plugin_files(["mymodels:build"])) != fingerprint


def test_the_digest_follows_imports_beside_the_plugin_but_not_gnnpipe(user_dir: Path):
    pkg = user_dir / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "layers.py").write_text("WIDTH = 1\n")
    (pkg / "models.py").write_text("import torch\nfrom stages.train.models import model\nfrom .layers import WIDTH\n\n"
                                   "def build(**sizes):\n    return torch.nn.Linear(WIDTH, 1)\n")
    files = plugin_files(["mypkg.models:build"])
    assert files == [pkg / "__init__.py", pkg / "layers.py", pkg / "models.py"]   # not torch, not stages
    before = source_digest("mypkg.models:build")
    (pkg / "layers.py").write_text("WIDTH = 2\n")
    assert source_digest("mypkg.models:build") != before
    # the same code elsewhere has the same digest: keys agree across machines and checkouts
    here = source_digest("mypkg.models:build")
    other = user_dir / "elsewhere"
    shutil.move(pkg, other / "mypkg")
    sys.modules.pop("mypkg", None)   # finding mypkg.models imported its package, from the old place
    sys.path.insert(0, str(other))
    importlib.invalidate_caches()
    assert plugin_files(["mypkg.models:build"])[0].parent == other / "mypkg"
    assert source_digest("mypkg.models:build") == here
    sys.modules.pop("mypkg", None)


def test_step_settings_key_only_the_step_schedule():
    assert Params(lr_gamma=0.5).key_params() == Params().key_params()
    assert Params(lr_schedule="step", lr_gamma=0.5).key_params() != Params(lr_schedule="step").key_params()
    assert Params(patience=3).key_params() != Params().key_params()
    assert Params(lr_schedule="cosine").key_params() != Params().key_params()


def test_a_factory_gets_the_sizes_and_model_kwargs():
    model = make_model("examples.custom_model:build", {"aggr": "max"}, **SIZES)
    assert model.convs[0].aggr == "max" and model.skip.in_features == 8 and model.skip.out_features == 3
    assert len(model.convs) == 2 and model.convs[0].out_channels == 16
    with pytest.raises(InputError, match=r"model examples.custom_model:build: calling it with .*, colour failed"):
        make_model("examples.custom_model:build", {"colour": "red"}, **SIZES)
    with pytest.raises(InputError, match=r"model tests._plugins:not_a_model returned a str, not a torch.nn.Module"):
        make_model("tests._plugins:not_a_model", {}, **SIZES)
    with pytest.raises(InputError, match=r"module examples.custom_model has no attribute 'nope' \(.*custom_model.py\)"):
        make_model("examples.custom_model:nope", {}, **SIZES)


def test_a_typed_plugin_gets_the_metadata_and_needs_a_typed_graph():
    from stages.train.models.typed_model import HeteroBody, HeteroModel
    from storage.schema import EdgeType, GraphSchema, NodeType

    schema = GraphSchema((NodeType("paper", 5, 4, 3), NodeType("author", 2)),
                         (EdgeType("author", "writes", "paper"), EdgeType("paper", "rev_writes", "author")))
    sizes = {**SIZES, "in_channels": {"author": None, "paper": 4}}
    model = make_model("examples.hetero_model:build", {}, **sizes, schema=schema)
    assert isinstance(model, HeteroModel) and isinstance(model.body, HeteroBody)
    assert set(model.body.module.heads) == {"author", "paper"} and len(model.body.module.convs) == 2
    x_dict = {"paper": torch.randn(5, 4), "author": torch.randn(2, 16)}   # an author's row: its embedding
    node_type = torch.tensor([1, 1, 1, 1, 1, 0, 0])   # 5 papers, 2 authors; schema order: author (0), paper (1)
    # authors 5, 6 wrote papers 0, 1 (edge type 0: author writes paper); paper 0 -> author 5 (1: rev_writes)
    edge_index, edge_type = torch.tensor([[5, 6, 0], [0, 1, 5]]), torch.tensor([0, 0, 1])
    out = model(x_dict, node_type=node_type, edge_index=edge_index, edge_type=edge_type)
    assert out.shape == (7, 3)
    h = model.encoder(x_dict, node_type)
    ref = model.body.module({"author": h[5:], "paper": h[:5]},
                            {("author", "writes", "paper"): torch.tensor([[0, 1], [0, 1]]),
                             ("paper", "rev_writes", "author"): torch.tensor([[0], [0]])})
    assert torch.allclose(out[:5], ref["paper"]) and torch.allclose(out[5:], ref["author"])
    with pytest.raises(InputError, match="takes metadata .* it needs a typed graph"):
        make_model("examples.hetero_model:build", {}, **SIZES)


def test_losses_builtin_and_plugin():
    logits, y = torch.randn(5, 3), torch.tensor([0, 1, 2, 1, 0])
    assert torch.equal(make_loss("cross_entropy")(logits, y), torch.nn.functional.cross_entropy(logits, y))
    smooth = make_loss("examples.custom_model:smoothed_cross_entropy")(logits, y)
    assert torch.isclose(smooth, torch.nn.functional.cross_entropy(logits, y, label_smoothing=0.1))
    with pytest.raises(InputError, match="loss tests._plugins:NOT_CALLABLE is a int, not a function"):
        make_loss("tests._plugins:NOT_CALLABLE")


def test_node_classification_task():
    labels = torch.tensor([2, 0, 1, 1])
    task = NodeClassification(lambda seed: labels[seed], {"train": torch.tensor([0, 1])})
    seed_gid, target = task.batch(torch.tensor([3]), training=True)
    assert torch.equal(task.seeds("train"), torch.tensor([0, 1])) and torch.equal(target, torch.tensor([1]))
    assert torch.equal(seed_gid, torch.tensor([3])) and task.size(target) == 1
    out = torch.tensor([[0.0, 0.0, 5.0], [0.0, 5.0, 0.0], [0.0, 5.0, 0.0]], requires_grad=True)
    y = torch.tensor([2, 0, 1])
    correct, total = task.metric_sums(out, y)   # the count stays a tensor: the loop reads it once a pass
    assert isinstance(correct, torch.Tensor) and [float(correct), total] == [2.0, 3.0]
    assert task.metric([2.0, 3.0]) == pytest.approx(2 / 3)
    assert math.isnan(task.metric([0.0, 0.0])), "no seeds: no accuracy (reported n/a), not 0 %"
    assert torch.isclose(task.loss(out, y), torch.nn.functional.cross_entropy(out, y))
    empty = task.loss(out[:0], y[:0])   # a padding rank's empty batch: 0, and still a gradient for DDP
    empty.backward()
    assert float(empty.detach()) == 0.0 and out.grad is not None
    bad = NodeClassification(lambda s: s, loss_fn=make_loss("tests._plugins:per_seed_loss"), loss_name="per_seed")
    with pytest.raises(InputError, match=r"loss per_seed returned \(3,\): it must return a 0-d tensor"):
        bad.loss(out, y)


def test_best_model_selection_and_patience():
    model = torch.nn.Linear(2, 1)
    best = BestModel(patience=2)
    assert not best.should_stop(-1)
    for epoch, val in enumerate([0.5, 0.7, 0.7, 0.6]):
        with torch.no_grad():
            model.weight.fill_(epoch)
        best.update(epoch, val, model)
    assert (best.epoch, best.val) == (1, 0.7), "the earliest best epoch wins a tie"
    assert torch.equal(best.state["weight"], torch.full((1, 2), 1.0)), "a copy of the best epoch's weights"
    assert best.should_stop(3) and not best.should_stop(2)
    again = BestModel(patience=2)
    again.load_state_dict(best.state_dict())
    assert (again.epoch, again.val) == (1, 0.7) and again.should_stop(3)
    assert not BestModel(patience=None).should_stop(100)


def _lrs(params: Params) -> list[float]:
    opt = torch.optim.Adam(torch.nn.Linear(2, 1).parameters(), lr=params.lr)
    sched = make_scheduler(opt, params)
    out = []
    for _ in range(params.epochs):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        if sched is not None:
            sched.step()
    return out


def test_lr_schedules():
    assert _lrs(Params(lr=0.1, epochs=4)) == [0.1] * 4
    assert _lrs(Params(lr=0.1, epochs=5, lr_schedule="step", lr_step_epochs=2, lr_gamma=0.5)) == pytest.approx(
        [0.1, 0.1, 0.05, 0.05, 0.025])
    cosine = _lrs(Params(lr=0.1, epochs=4, lr_schedule="cosine"))
    assert cosine == pytest.approx([0.1 * (1 + math.cos(math.pi * e / 4)) / 2 for e in range(4)])


def test_a_non_finite_loss_stops_every_rank_at_the_same_batch(tmp_path: Path):
    from tests._plugins import loss_check_worker

    first, last = zip(*spawn_ranks(loss_check_worker, (), tmp_path, world=2, timeout_s=120), strict=True)
    # read one batch late: batch 2's Inf stops both ranks at batch 3's check, before its backward pass
    assert [o["checked"] for o in first] == [2, 2], "both ranks stop at the same call, neither goes on"
    assert first[1]["type"] == "NonFiniteLossError" and first[0]["type"] == "PeerStoppedError"
    assert first[1]["message"].startswith("the loss is inf at epoch 5, batch 2: training stopped on every rank and "
                                          "nothing was published")
    assert first[0]["message"] == "rank 1's loss is inf at epoch 5, batch 2"
    # the pass's last batch: found by finish(), before the pass returns
    assert [o["checked"] for o in last] == [2, 2]
    assert last[0]["type"] == "NonFiniteLossError" and last[1]["type"] == "PeerStoppedError"
    assert last[0]["message"].startswith("the loss is nan at epoch 6, batch 2:")
    assert last[1]["message"] == "rank 0's loss is nan at epoch 6, batch 2"


@pytest.mark.parametrize(("value", "kind"), [(float("nan"), "nan"), (float("inf"), "inf"), (float("-inf"), "-inf")])
def test_a_lone_rank_checks_its_loss_without_a_collective(value, kind):
    """world 1: no process group at all; the bad batch is named at the next check, and a clean pass ends quietly."""
    from stages.train.rank.guard import LossGuard, NonFiniteLossError

    guard = LossGuard(0, 1, epoch=0)
    for b, loss in enumerate([1.0, 2.0]):
        guard(b, torch.tensor(loss))
    guard.finish()
    guard = LossGuard(0, 1, epoch=2)
    guard(0, torch.tensor(value))
    with pytest.raises(NonFiniteLossError, match=rf"^the loss is {kind} at epoch 3, batch 1: training stopped"):
        guard(1, torch.tensor(0.5))
    guard.finish()   # said once: the pending batch was consumed
