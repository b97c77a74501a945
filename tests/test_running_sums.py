"""stages.runtime.sums.RunningSums: per-batch sums kept where they arrive, read once."""

import pytest
import torch

from stages.runtime.sums import RunningSums


def test_running_sums_add_host_numbers_and_device_tensors_apart():
    sums = RunningSums(3)
    for loss, correct, total in [(0.1, 3, 4.0), (0.7, 1, 2.0)]:
        # a float32 loss widened to float64 before it is scaled, as float(loss) * n is on the host
        sums.add([torch.tensor(loss, dtype=torch.float32).to(torch.float64) * 4, torch.tensor(correct), total])
    host = [float(torch.tensor(0.1, dtype=torch.float32)) * 4 + float(torch.tensor(0.7, dtype=torch.float32)) * 4,
            4.0, 6.0]
    assert sums.values() == host
    assert RunningSums(2).values() == [0.0, 0.0]
    with pytest.raises(ValueError, match="2 sums where 3"):
        sums.add([1.0, 2.0])
