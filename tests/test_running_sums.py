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


def test_a_tensor_refilled_in_place_is_added_as_it_was_and_shapes_and_devices_are_read_alike():
    sums, buffer = RunningSums(1), torch.zeros((), dtype=torch.float64)
    for v in (3.0, 4.0):   # a task that reuses one buffer for every batch's sum
        buffer.fill_(v)
        sums.add([buffer])
    assert sums.values() == [7.0]
    shaped = RunningSums(2)
    shaped.add([torch.tensor([2]), torch.tensor(1.5)])   # a [1]-shaped count beside a 0-dim sum
    assert shaped.values() == [2.0, 1.5]
