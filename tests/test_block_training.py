"""The trainer around the blocks: the true degrees reach the models that need them, a lone rank trains without DDP
to the bit, a parameter the loss never reaches is named, and the ranks' big tensors sit on huge pages."""

from __future__ import annotations

import itertools

import pytest
import torch

from stages.train.models.model import MODELS, seed_logits
from tests._block_graphs import features, full_graph_gcn, one_rank_data, true_degrees
from tests._sampler_graphs import NUM_NODES, power_law_graph

_PAGE_FAULTS = """
import resource
import stages.train.rank.worker   # everything the train worker imports, before its first tensor
import torch
for _ in range(2):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.ones(154_000, 256)   # 158 MB, a products batch's layer-0 activation
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""

# tiny models: one torch thread each (tests/conftest.py's one_torch_thread)
pytestmark = [pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning"),
              pytest.mark.usefixtures("one_torch_thread")]


@pytest.mark.parametrize("kind", MODELS)
def test_the_trainer_sends_true_degrees_to_the_models_that_need_them(one_rank_group, tmp_path, kind):
    from stages.train.params import Params
    from stages.train.rank.trainer import Trainer
    from stages.train.spec import TrainSpec

    spec = TrainSpec(artifacts=str(tmp_path), key="k", partition_key="p", features_key="f", hotness_key="h",
                     params={}, checkpoint_dir=str(tmp_path / "ckpt"), result_dir=str(tmp_path / "out"))
    trainer = Trainer(spec, Params(model=kind, hidden=8, fanouts=(-1, -1)), one_rank_data())
    seed_gid = torch.tensor([3, 10, 500, NUM_NODES - 1])
    batch = trainer.loader.sample(seed_gid)
    assert hasattr(batch, "deg") == (kind == "gcn")
    if kind == "gcn":
        assert torch.equal(batch.deg, true_degrees(power_law_graph()[0])[batch.n_id])
        model = trainer.model.eval()
        with torch.no_grad():
            logits = seed_logits(model, trainer.loader.gather_rows(batch.n_id), batch)
        assert torch.allclose(logits, full_graph_gcn(model, 2, features())[seed_gid], atol=1e-5)


def test_the_ranks_environment_puts_big_tensors_on_huge_pages(monkeypatch):
    """The train stage starts its ranks with ``huge_page_env()``: a 158 MB tensor then takes 341 page faults
    instead of 38.7 k (2 MiB pages). Fresh processes: torch reads the switch at a process's first CPU allocation."""
    import os
    import subprocess
    import sys

    from stages.jobs.host_memory import THP_ENV, huge_page_env, huge_pages_granted
    from tests.conftest import REPO

    monkeypatch.delenv(THP_ENV, raising=False)
    assert huge_page_env() == {THP_ENV: "1"}
    monkeypatch.setenv(THP_ENV, "0")
    assert huge_page_env() == {THP_ENV: "0"}, "a user's own setting wins"
    if not huge_pages_granted():
        pytest.skip("the kernel grants no transparent huge pages here (THP mode never, or not Linux)")

    def faults(value: str) -> int:
        out = subprocess.run([sys.executable, "-c", _PAGE_FAULTS], cwd=REPO, env={**os.environ, THP_ENV: value},
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return int(out.stdout)

    on, off = faults("1"), faults("0")
    assert off > 30_000, off                   # one fault per 4 KiB page: 38.7 k
    assert on < off / 4, (on, off)


def test_a_lone_rank_trains_without_ddp_to_the_bit(one_rank_group, tmp_path):
    """One rank steps its model itself, without DDP's hooks and bucket copies: the weights after some batches are
    DDP-wrapped training's, bit for bit (DDP divides the gradients by a world of 1)."""
    from stages.train.params import Params
    from stages.train.rank.trainer import Trainer
    from stages.train.spec import TrainSpec

    def trained(wrap: bool) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        spec = TrainSpec(artifacts=str(tmp_path), key="k", partition_key="p", features_key="f", hotness_key="h",
                         params={}, checkpoint_dir=str(tmp_path / "ckpt"), result_dir=str(tmp_path / "out"))
        trainer = Trainer(spec, Params(model="sage", hidden=8, fanouts=(3, 2), batch_size=64, seed=3),
                          one_rank_data())
        assert trainer.train_module is trainer.model, "one rank: no DDP wrapper"
        initial = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        if wrap:
            trainer.train_module = torch.nn.parallel.DistributedDataParallel(trainer.model)
        trainer.rng.seed_epoch(0)
        sums = trainer.run_batches(itertools.islice(trainer.loader.train_batches(), 4), 4, epoch=0)
        assert sums.batches == 4
        return initial, {k: v.clone() for k, v in trainer.model.state_dict().items()}

    (initial, plain), (_, wrapped) = trained(False), trained(True)
    assert plain.keys() == wrapped.keys() == initial.keys()
    assert all(torch.equal(plain[k], wrapped[k]) for k in plain)
    assert any(not torch.equal(plain[k], initial[k]) for k in plain), "the steps changed the weights"


def test_a_parameter_the_loss_never_reaches_is_named(one_rank_group, tmp_path):
    """DDP would fail at the second step without naming it; a lone rank has no DDP: the trainer says which."""
    from stages.train.params import Params
    from stages.train.rank.trainer import Trainer
    from stages.train.spec import TrainSpec
    from storage.errors import InputError

    spec = TrainSpec(artifacts=str(tmp_path), key="k", partition_key="p", features_key="f", hotness_key="h",
                     params={}, checkpoint_dir=str(tmp_path / "ckpt"), result_dir=str(tmp_path / "out"))
    trainer = Trainer(spec, Params(model="sage", hidden=8, fanouts=(3, 2), batch_size=64), one_rank_data())
    trainer.rng.seed_epoch(0)
    assert trainer.run_batches(itertools.islice(trainer.loader.train_batches(), 3), 3, epoch=0).batches == 3
    trainer.model.spare = torch.nn.Linear(2, 2)   # in the model, never in its forward
    trainer.rng.seed_epoch(0)
    with pytest.raises(InputError, match=r"^model sage: the loss of a training batch reaches no gradient to "
                                         r"spare\.weight, spare\.bias: every parameter"):
        trainer.run_batches(itertools.islice(trainer.loader.train_batches(), 3), 3, epoch=0)
