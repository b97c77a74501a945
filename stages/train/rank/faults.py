"""Test-only fault injection: ``GNNPIPE_TRAIN_FAULT=rank:epoch:batch`` makes that rank SIGKILL itself before that
batch (all 0-based), a hard death as a crashed node's. The kill/resume tests use it; the entry point
(``stages.train.rank.worker``) hands ``fault_hook`` to the ``Trainer``, whose loop only calls an optional hook.
"""

from __future__ import annotations

import os
import signal

from stages.train.rank.loop import OnBatch

FAULT_ENV = "GNNPIPE_TRAIN_FAULT"


def fault_hook(rank: int, epoch: int) -> OnBatch | None:
    """The ``FAULT_ENV`` hook for this rank and epoch, if any: called with the batch index before each batch."""
    fault = os.environ.get(FAULT_ENV)
    if not fault:
        return None
    f_rank, f_epoch, f_batch = (int(v) for v in fault.split(":"))
    if (f_rank, f_epoch) != (rank, epoch):
        return None

    def die(batch: int) -> None:
        if batch == f_batch:
            print(f"fault injection: rank {rank} (pid {os.getpid()}) kills itself at epoch {epoch} batch {batch}",
                  flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    return die
