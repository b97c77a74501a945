"""The stage meter reports wall time and a peak RSS that includes short-lived allocations."""

import numpy as np

from stages.meter import measure


def test_peak_includes_a_freed_allocation():
    with measure() as cost:
        block = np.ones(200 * 2**20 // 8)  # 200 MiB, touched, then freed before the block ends
        del block
    assert cost["wall_s"] >= 0
    assert cost["peak_rss_bytes"] - cost["start_rss_bytes"] >= 150 * 2**20
