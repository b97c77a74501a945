"""Link prediction metrics against OGB's Evaluator (ties included), and 2 ranks' sums against one process's."""

from __future__ import annotations

import pytest
import torch
from ogb.linkproppred import Evaluator

from stages.train.tasks.link_metrics import RankSums, auc, global_kth_negative, hits_at_k, ogb_rank, pair_auc
from tests._link_worker import WORLD_SIZE, K, scores, worker
from tests._spawn import spawn_ranks


def test_mrr_and_hits_equal_ogbl_citation2s_evaluator():
    pos, neg, _ = scores()
    ours = RankSums.of(pos, neg).means()
    theirs = Evaluator("ogbl-citation2").eval({"y_pred_pos": pos, "y_pred_neg": neg})
    for name in ("mrr", "hits@1", "hits@3", "hits@10"):
        assert ours[name] == pytest.approx(float(theirs[f"{name}_list"].mean()), abs=1e-6), name
    assert ogb_rank(torch.tensor([1.0]), torch.tensor([[2.0, 1.0, 0.0]])).item() == 2.5   # one above, one tied
    assert RankSums().means()["mrr"] is None


def test_hits_at_k_equals_ogbl_collabs_evaluator():
    pos, _, shared = scores()
    evaluator = Evaluator("ogbl-collab")   # Hits@50
    hits, count = hits_at_k(pos, global_kth_negative(shared, evaluator.K))
    assert hits / count == pytest.approx(evaluator.eval({"y_pred_pos": pos, "y_pred_neg": shared})["hits@50"])
    few = shared[:10]   # fewer negatives than K: OGB scores 1.0
    assert global_kth_negative(few, evaluator.K) is None and hits_at_k(pos, None) == (300.0, 300)
    assert evaluator.eval({"y_pred_pos": pos, "y_pred_neg": few})["hits@50"] == 1.0


def test_auc_counts_tied_pairs_half():
    pos, neg, _ = scores()
    flat = neg.flatten()[:2000]
    pairs = (pos[:, None] > flat[None, :]).double() + 0.5 * (pos[:, None] == flat[None, :]).double()
    assert auc(pos, flat) == pytest.approx(float(pairs.mean()), abs=1e-12)
    assert auc(torch.tensor([2.0, 3.0]), torch.tensor([0.0, 1.0])) == 1.0 and auc(torch.tensor([]), flat) is None


def test_filtered_negatives_count_in_no_rank_and_pair_auc_is_the_compared_pairs():
    pos, neg = torch.tensor([1.0, 0.0]), torch.tensor([[2.0, 0.5, 1.0], [3.0, -1.0, 0.0]])
    mask = torch.tensor([[False, True, True], [True, True, False]])
    assert ogb_rank(pos, neg, mask).tolist() == [1.5, 2.0]   # [2.0] and [0.0] filtered out
    assert ogb_rank(pos, neg[:, [1, 2]]).tolist()[0] == 1.5   # as if the filtered negatives had not been drawn
    assert pair_auc(pos, neg, mask).tolist() == [0.75, 0.5]
    assert pair_auc(pos, neg, torch.zeros_like(mask)).tolist() == [1.0, 1.0]   # nothing compared: no loss
    sums = RankSums.of(pos, neg, mask)
    assert RankSums.from_values(sums.values()) == sums and isinstance(RankSums.from_values(sums.values()).count, int)
    assert sums.means()["auc"] == pytest.approx(0.625)
    flat_pos, flat_neg = torch.randn(50), torch.randn(50, 1)
    assert float(pair_auc(flat_pos, flat_neg).mean()) == pytest.approx(
        float(((flat_pos > flat_neg[:, 0]).double()).mean()))


def test_two_ranks_sum_to_one_process(tmp_path):
    pos, neg, shared = scores()
    out = spawn_ranks(worker, (), tmp_path, WORLD_SIZE, 60)
    single = RankSums.of(pos, neg)
    kth = global_kth_negative(shared, K)
    for rank in out:
        assert rank["sums"].count == single.count and rank["sums"].means() == pytest.approx(single.means())
        assert rank["kth"] == kth and rank["few"] is None
    assert sum(r["hits"][0] for r in out) == hits_at_k(pos, kth)[0]
