"""The features unit with a pause a fault test controls, and ``gnnpipe`` running it (kept free of pytest: Dask
workers import this module to run the unit).

A fault test must act while a unit runs on a worker, and a unit of a tiny graph lasts ~0.1 s; so the unit that
holds part 0 stops, on its first attempt only, after part 0's ``x`` is written and before its ``y``, splits and
attrs (a partial store, as a kill mid-unit leaves), writes its worker's pid to ``<control>/held`` and waits there
until ``<control>/release`` appears (at most ``HOLD_S``), and writes ``<control>/ended`` when that attempt ends,
however it ends; ``<control>`` is the artifact root's parent directory, so the pause needs no setting sent to the
workers. A later attempt (the unit rescheduled onto another worker) does not stop. Production code paths know
nothing of it: ``stages.features.units.write_parts``, which the stage imports when it runs, is swapped in the
process that submits the units, and the function travels to the workers by reference.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from stages.features import units
from stages.features.units import PartsJob, write_parts

HOLD_S = 60.0   # a pause nobody ends (a failed test) must not hold a shared cluster's worker for long


def control_dir(root: str) -> Path:
    return Path(root).parent


def held_write_parts(job: PartsJob) -> dict[str, Any]:
    """:func:`~stages.features.units.write_parts`, paused in part 0's ``finish`` on the first attempt."""
    control = control_dir(job.root)
    if 0 not in job.parts:
        return write_parts(job)
    try:   # O_EXCL: exactly one attempt, the first, pauses
        os.close(os.open(control / "attempted", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return write_parts(job)
    finish = units.PartFeaturesWriter.finish

    def paused_finish(self: Any, **kwargs: Any) -> dict[str, Any]:
        if self.part == 0:
            (control / "held.tmp").write_text(str(os.getpid()))
            os.rename(control / "held.tmp", control / "held")   # the pid is whole when the test reads it
            deadline = time.monotonic() + HOLD_S
            while not (control / "release").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        return finish(self, **kwargs)

    units.PartFeaturesWriter.finish = paused_finish   # type: ignore[method-assign]
    try:
        return write_parts(job)
    finally:
        units.PartFeaturesWriter.finish = finish   # type: ignore[method-assign]
        (control / "ended").touch()


def hold_features() -> None:
    """Make this process's features stage submit :func:`held_write_parts` as its unit."""
    units.write_parts = held_write_parts   # type: ignore[assignment]


def cli() -> None:
    """``gnnpipe`` (``flows.cli.main``) with the features unit paused: ``python -c "from tests._fault_units import
    cli; cli()" run ...``."""
    hold_features()
    from flows.cli import main

    sys.argv[0] = "gnnpipe"
    main()
