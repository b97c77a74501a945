"""The partition stage's phase-wise memory plan with KaMinPar (``stages/partition/footprint.py``): the peak of its
phases, KaMinPar's graph compressed only when the uncompressed estimate does not fit, and compression a runtime
choice outside the key (the same partition, the same artifact bytes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stages.memory import MemoryBudget
from stages.partition import footprint
from stages.partition import stage as partition
from stages.partition.assign import assign_parts
from storage import InputError
from storage.graph import GraphArtifact
from tests._partition_cases import community_graph, download_graph
from tests.conftest import artifact_files

GIB = 1 << 30


def _plan(budget: int, **kw: Any) -> footprint.MemoryPlan:
    args = {"num_nodes": 14_000_000, "num_entries": 406_000_000, "num_parts": 2, "method": "kaminpar",
            "symmetrise": False, "graph_bytes": 8 * 14_000_001 + 4 * 406_000_000, **kw}
    return footprint.plan(MemoryBudget(budget, "partition", "memory_budget_bytes"), **args)


def test_compression_gives_the_same_partition(tmp_path: Path) -> None:
    """1 thread, a seed: the compressed graph partitions into the same array as the plain one."""
    indptr, indices, train, _ = community_graph(num_nodes=3000, avg_degree=16, seed=3)
    plain = assign_parts(indptr, indices, train, 3, method="kaminpar", seed=2, scratch_dir=str(tmp_path))
    packed = assign_parts(indptr, indices, train, 3, method="kaminpar", seed=2, scratch_dir=str(tmp_path),
                          compress=True)
    assert np.array_equal(plain, packed)


def test_plan_is_the_peak_phase_not_the_sum() -> None:
    """Each phase frees what the next does not need: the minimum is the largest phase, each below the old sum."""
    p = _plan(64 * GIB)
    names = [name for name, _ in p.phases]
    assert names == ["kaminpar", "repair", "relabel"] and not p.compress
    assert p.minimum == max(b for _, b in p.phases)
    total = sum(b for _, b in p.phases)
    assert p.minimum < total


def _streamed_minimum(compress: bool) -> int:
    chunk = footprint.CHUNK_EDGES * footprint.CHUNK_BYTES_PER_ENTRY
    return max(b for _, b in footprint.kaminpar_phases(14_000_000, 406_000_000, 2, chunk, 0, compress=compress))


def test_choices_cheapest_first() -> None:
    """In memory, uncompressed, when it fits; streamed uncompressed next (a spill copy costs seconds, compression
    ~1.5x KaMinPar's time); streamed compressed last."""
    big = _plan(64 * GIB)
    assert not big.streamed and not big.compress
    raw = _plan(_streamed_minimum(False))
    assert raw.streamed and not raw.compress and raw.minimum == _streamed_minimum(False)
    packed = _plan(_streamed_minimum(True))
    assert packed.streamed and packed.compress and packed.minimum == _streamed_minimum(True)
    assert packed.minimum < raw.minimum


def test_papers100m_shape_fits_4gib_compressed_and_3gib_is_refused_in_one_line() -> None:
    """14 M nodes, 406 M entries: KaMinPar compressed peaks at 2.85 GB (measured), so a 4 GiB budget takes the
    compressed path; 3 GiB is refused before any work, naming what it needs."""
    fits = _plan(4 * GIB)
    assert fits.compress and fits.minimum <= 4 * GIB
    with pytest.raises(InputError) as err:
        _plan(3 * GIB)
    msg = str(err.value)
    assert "\n" not in msg and "compressed" in msg and f"raise memory_budget_bytes to {_streamed_minimum(True)}" in msg


def test_metis_plan_unchanged() -> None:
    """METIS keeps its sum: the O(N) arrays, the chunk temporaries and METIS's 130 B an input entry."""
    p = _plan(64 * GIB, method="metis")
    chunk = footprint.CHUNK_EDGES * footprint.CHUNK_BYTES_PER_ENTRY
    metis = footprint.METIS_BYTES_PER_ENTRY * 7 * 14_000_000
    assert p.minimum == 14_000_000 * (footprint.NODE_BYTES + 2 * footprint.NODE_PART_BYTES) + chunk + metis
    assert p.phases == () and not p.compress


def test_compressed_build_is_byte_identical(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A budget that forces KaMinPar's compressed graph (streamed) writes the default build's bytes, same key."""
    store, dl = download_graph(tmp_path)
    params = partition.Params(num_partitions=3, method="kaminpar")
    default = partition.run(store, params, {"download": dl}, progress=False)
    assert default.summary["kaminpar_compressed"] is False
    before = artifact_files(store, default)
    art = GraphArtifact(store, dl)
    entries = int(art.zarr_array("indices").shape[0])
    # on 3000 nodes the repair is the peak phase: make the uncompressed graph dear enough that only the
    # compressed one fits, with the compressed streamed minimum as the budget
    monkeypatch.setitem(footprint.KAMINPAR_ENTRY_LAW, False, (1, 1000.0))
    budget = max(b for _, b in footprint.kaminpar_phases(
        art.num_nodes, entries, 3, min(footprint.CHUNK_EDGES, entries) * footprint.CHUNK_BYTES_PER_ENTRY, 0,
        compress=True))
    small = partition.run(store, params.model_copy(update={"memory_budget_bytes": budget}), {"download": dl},
                          force=True, progress=False)
    assert small.key == default.key
    assert small.summary["kaminpar_compressed"] is True and small.summary["memory_path"] == "streamed"
    after = artifact_files(store, small)
    assert sorted(after) == sorted(before) and [k for k in before if before[k] != after[k]] == []
    assert small.summary["edge_cut"] == default.summary["edge_cut"]


def test_streamed_symmetrising_costs_the_sort_share_not_64_bytes_an_entry() -> None:
    """A directed (or typed) graph: in memory, symmetrising costs 64 B a graph entry in every phase, as before;
    streamed, the external sort's phase (its O(N) arrays and a bucket share sized to what the peak of the other
    phases leaves) and then the int64 xadj, 8 B a node."""
    n, e, parts = 14_000_000, 406_000_000, 2
    chunk = footprint.CHUNK_EDGES * footprint.CHUNK_BYTES_PER_ENTRY
    extra = 8 * (n + 1) + 4 * e + footprint.PART_BYTES_PER_ENTRY * e // parts
    held = footprint.SORT_NODE_BYTES * n
    in_memory = max(b for _, b in footprint.kaminpar_phases(n, 2 * e, parts, chunk,
                                                            footprint.SYMMETRISE_BYTES_PER_ENTRY * e, False))
    others = footprint.kaminpar_phases(n, 2 * e, parts, chunk, footprint.XADJ_NODE_BYTES * n, False)
    minimum = max(b for _, b in others)
    assert _plan(64 * GIB, symmetrise=True).in_memory == in_memory + extra   # the in-memory path unchanged
    p = _plan(minimum, symmetrise=True)
    assert p.streamed and not p.compress and p.minimum == minimum
    assert p.phases == (("symmetrise", minimum),) + others and p.sort_bytes == minimum - held
    assert minimum < in_memory - 40 * e   # the 64 B an entry are gone from every phase
    metis = _plan(64 * GIB, symmetrise=True, method="metis")
    nodes = n * (footprint.NODE_BYTES + 2 * footprint.NODE_PART_BYTES) + chunk
    metis_bytes = footprint.METIS_BYTES_PER_ENTRY * 7 * n
    assert metis.minimum == nodes + footprint.XADJ_NODE_BYTES * n + metis_bytes
    assert metis.in_memory == nodes + footprint.SYMMETRISE_BYTES_PER_ENTRY * e + metis_bytes + extra
    assert not metis.streamed and metis.sort_bytes == 0
    streamed = _plan(metis.minimum, symmetrise=True, method="metis")
    assert streamed.streamed and streamed.sort_bytes == metis.minimum - held


def test_the_sort_keeps_its_floor_and_a_graph_below_it_runs_in_memory() -> None:
    """On a small sparse graph the sort's floor (its smallest bucket and slice) is the streamed peak; a graph of
    hardly any edges costs less in memory than that floor, and a budget that fits the in-memory path is not
    refused for the streamed one's."""
    small = {"symmetrise": True, "num_nodes": 1000, "num_entries": 2000, "graph_bytes": 8 * 1001 + 4 * 2000}
    floor = footprint.SORT_NODE_BYTES * 1000 + footprint.SORT_MIN_BYTES
    tight = _plan(floor, **small)
    assert tight.streamed and tight.minimum == floor and tight.sort_bytes == footprint.SORT_MIN_BYTES
    assert tight.phases[0] == ("symmetrise", floor) and tight.in_memory > floor
    empty = {**small, "num_entries": 0, "graph_bytes": 8 * 1001}
    in_memory = _plan(64 * GIB, **empty).in_memory
    assert in_memory < floor
    p = _plan(in_memory, **empty)
    assert not p.streamed and p.sort_bytes == 0
    with pytest.raises(InputError, match=f"raise memory_budget_bytes to {in_memory} or more"):
        _plan(in_memory - 1, **empty)
