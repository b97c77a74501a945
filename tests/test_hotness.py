"""Hotness: request counting, cache plans within a budget, and hit rates against a degree-ranked cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from stages.hotness import plan as planning
from stages.hotness import stage as hotness
from stages.hotness import units
from stages.hotness.counting import count_requests
from stages.runtime.csr import LocalCSR
from stages.runtime.sampling.sampler import NeighborSampler
from storage import InputError
from storage.hotness import CURVE_PNG, HotnessArtifact
from storage.manifest import stage_key
from storage.partition import PartitionArtifact, concat_parts
from tests._train_pipeline import build_without_prefect


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory):
    store, m = build_without_prefect({"artifacts": str(tmp_path_factory.mktemp("art")), "num_nodes": 6000,
                                      "avg_degree": 12, "num_features": 16, "num_classes": 4, "seed": 5,
                                      "num_partitions": 4, "until": "features"})
    return store, m["partition"], m["features"]


def test_counts_equal_batch_membership():
    # path graph 0-1-2-3 (both directions); seeds [0] and [3] in separate batches, fanout -1, one hop
    indptr = np.array([0, 1, 3, 5, 6])
    indices = np.array([1, 0, 2, 1, 3, 2])
    sampler = NeighborSampler(LocalCSR.from_numpy(indptr, indices), [-1])
    counts = count_requests(sampler, torch.tensor([0, 3]), batch_size=1, epochs=2,
                            generator=torch.Generator().manual_seed(0))
    assert counts.tolist() == [2, 2, 2, 2]  # each batch requests the seed and its one neighbour, twice
    empty = count_requests(sampler, torch.tensor([], dtype=torch.long), batch_size=4, epochs=1,
                           generator=torch.Generator().manual_seed(0))
    assert empty.sum() == 0


def test_counts_follow_the_generator_alone():
    # a star of 50 leaves into node 0, fanout 3: the counts depend on the draws, which must come from the
    # generator (torch's global one moves between the two calls here)
    indptr = np.concatenate([[0], np.full(51, 50)])
    sampler = NeighborSampler(LocalCSR.from_numpy(indptr, np.arange(1, 51)), [3])

    def counts() -> torch.Tensor:
        torch.rand(7)
        return count_requests(sampler, torch.tensor([0]), batch_size=1, epochs=20,
                              generator=torch.Generator().manual_seed(4))

    first = counts()
    assert first.sum() == 20 * 4 and torch.equal(first, counts())


def test_hit_rates_by_hand():
    eval_count = np.array([5, 0, 3, 2])
    order = np.array([0, 2, 3, 1])
    assert planning.hit_rates(eval_count, order, np.array([0, 1, 2, 4])).tolist() == [0.0, 0.5, 0.8, 1.0]
    assert planning.hotness_order(np.array([0, 4, 4, 1]), np.array([9, 1, 2, 0])).tolist() == [2, 1, 3, 0]
    assert planning.remote_share_removed(eval_count, np.array([2]), 0, 2) == pytest.approx(3 / 5)


def test_budget_in_bytes_or_ratio_and_clamped():
    b = planning.budget_rows(budget_bytes=6400, ratio=None, row_bytes=64, part_rows=1000, num_nodes=5000)
    assert b.rows == 100 and "6,400 bytes per rank" in b.note
    b = planning.budget_rows(budget_bytes=None, ratio=0.25, row_bytes=64, part_rows=1000, num_nodes=5000)
    assert b.rows == 250 and "0.25 × the partition's 1,000 own rows" in b.note
    b = planning.budget_rows(budget_bytes=10**12, ratio=None, row_bytes=64, part_rows=1000, num_nodes=5000)
    assert b.rows == 5000 and "clamped to the graph's 5,000 nodes" in b.note


@pytest.mark.parametrize("fanouts", [(), (10, -2), (0,)])
def test_bad_fanouts_are_rejected(fanouts):
    with pytest.raises(InputError, match="fanout"):
        hotness.Params(fanouts=fanouts)


def test_stage_plans_within_budget_and_beats_degree(upstream):
    store, pt, ft = upstream
    params = hotness.Params(fanouts=(10, 5), batch_size=16, cache_budget_bytes=300 * 64)
    m = hotness.run(store, params, {"partition": pt, "features": ft}, progress=False)
    book = PartitionArtifact(store, pt).book()
    for p, row in enumerate(m.summary["parts"]):
        plan = HotnessArtifact(store, m).plan(p)
        assert plan.plan_gid.shape[0] == row["plan_rows"] == 300  # 16 float32 features = 64 B/row
        assert np.unique(plan.plan_gid).size == 300
        assert np.all(np.diff(plan.ranked_count) <= 0), "ranking is most-requested first"
        assert row["requested_gids"] == plan.ranked_gid.shape[0] <= book.num_nodes
        assert 0 < row["expected_hit_rate"] <= 1 and 0 <= row["remote_removed"] <= 1
        # the ceiling (the held-out epoch's own top rows) bounds every cache of the plan's size
        assert max(row["expected_hit_rate"], row["degree_hit_rate"]) <= row["ceiling_hit_rate"] + 1e-12 <= 1 + 1e-12
    for curve in m.summary["curves"]:
        hot, deg, ceiling = np.array(curve["hotness"]), np.array(curve["degree"]), np.array(curve["ceiling"])
        assert np.all(hot >= deg - 1e-9), curve
        assert np.all(ceiling >= np.maximum(hot, deg) - 1e-12) and np.all(np.diff(ceiling) >= 0), curve
        in_range = [i for i, f in enumerate(curve["fraction"]) if 0.05 <= f <= 0.30]
        assert max(hot[in_range] - deg[in_range]) >= 0.05, curve
    assert store.read_bytes("hotness", m.key, CURVE_PNG)[:8] == b"\x89PNG\r\n\x1a\n"
    report = hotness.report(m)
    assert "expected hit rate" in report.headline and "hotness_hit_%" in report.markdown
    assert ", ceiling " in report.headline and "ceiling_hit_%" in report.markdown
    # a build from before the ceiling (same key: the plan is unchanged) reports without it
    older = {**m.summary,
             "parts": [{k: v for k, v in r.items() if k != "ceiling_hit_rate"} for r in m.summary["parts"]],
             "curves": [{k: v for k, v in c.items() if k != "ceiling"} for c in m.summary["curves"]]}
    old_report = hotness.report(m.model_copy(update={"summary": older}))
    assert "ceiling" not in old_report.headline + old_report.markdown


def test_budget_larger_than_graph_is_clamped_and_said(upstream):
    store, pt, ft = upstream
    params = hotness.Params(fanouts=(5,), batch_size=512, cache_budget_bytes=10**12)
    m = hotness.run(store, params, {"partition": pt, "features": ft}, progress=False)
    assert all(r["plan_rows"] == 6000 for r in m.summary["parts"])
    assert "clamped to the graph's 6,000 nodes" in hotness.report(m).headline


def test_edge_fanouts_must_name_an_edge_type_of_the_graph(upstream):
    """One line naming the graph's edge types, before anything is written; the one edge type of a homogeneous graph
    is named ``edge``, and a fanout per edge type that equals ``fanouts`` plans what ``fanouts`` plans."""
    store, pt, ft = upstream
    bad = hotness.Params(fanouts=(5,), batch_size=512, edge_fanouts={"cites": (3,)})
    with pytest.raises(InputError, match=r"edge_fanouts names 'cites'.*\(its edge types: node___edge___node\)"):
        hotness.run(store, bad, {"partition": pt, "features": ft}, progress=False)
    assert store.find("hotness", stage_key("hotness", hotness.VERSION, bad.key_params(),
                                           {"partition": pt.key, "features": ft.key})) is None
    same = hotness.run(store, hotness.Params(fanouts=(5,), batch_size=512, edge_fanouts={"edge": (5,)}),
                       {"partition": pt, "features": ft}, progress=False)
    plain = hotness.run(store, hotness.Params(fanouts=(5,), batch_size=512), {"partition": pt, "features": ft},
                        progress=False)
    assert [r["requested_gids"] for r in same.summary["parts"]] == [r["requested_gids"] for r in plain.summary["parts"]]


def test_partition_without_train_nodes_has_empty_counts(upstream):
    store, pt, _ = upstream
    partition = PartitionArtifact(store, pt)
    book = partition.book()
    csr = LocalCSR.from_numpy(*concat_parts([partition.csr(p) for p in range(4)]), start_gid=0)
    in_degree = np.diff(csr.indptr.numpy())
    lo, hi = int(book.bounds[1]), int(book.bounds[2])
    plan, row, curve = units.plan_partition(1, NeighborSampler(csr, [5]), torch.tensor([], dtype=torch.long),
                                            in_degree, planning.degree_order(in_degree), lo, hi,
                                            units.RowCosts(64), hotness.Params(cache_ratio=0.1), False)
    assert row["train_seeds"] == 0 and row["requested_gids"] == 0 and row["lookups_per_epoch"] == 0
    assert plan.ranked_gid.size == 0 and row["expected_hit_rate"] == 0.0
    assert plan.plan_gid.size == round(0.1 * (hi - lo))  # still a plan (by degree) of the budgeted size
    assert curve["hotness"] == [0.0] * len(planning.CURVE_FRACTIONS)


def test_the_ceiling_is_the_epochs_own_top_rows() -> None:
    """By hand: lookups 5, 0, 3, 1 (total 9): the best 1, 2, 3 and 5 rows serve 5, 8, 9, 9 of them."""
    from stages.hotness.plan import ceiling_hit_rates, hit_rates

    held_out = np.array([5, 0, 3, 1])
    np.testing.assert_allclose(ceiling_hit_rates(held_out, np.array([0, 1, 2, 3, 5])), [0, 5 / 9, 8 / 9, 1, 1])
    # no order of the rows does better at any size; the ideal one does as well
    sizes = np.arange(5)
    for order in (np.array([0, 1, 2, 3]), np.array([3, 2, 1, 0]), np.array([0, 2, 3, 1])):
        assert np.all(hit_rates(held_out, order, sizes) <= ceiling_hit_rates(held_out, sizes) + 1e-12)
    np.testing.assert_allclose(hit_rates(held_out, np.array([0, 2, 3, 1]), sizes), ceiling_hit_rates(held_out, sizes))
    assert not ceiling_hit_rates(np.zeros(3, dtype=np.int64), sizes).any()
