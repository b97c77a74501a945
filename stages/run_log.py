"""Where a stage's progress lines go: Prefect's run logger inside a flow or task run (the lines show in the UI),
else the ``gnnpipe.<stage>`` logger (``gnnpipe train``, tests, benchmarks)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable


def stage_log(stage: str) -> Callable[[str], None]:
    """The ``info`` of the logger a stage's lines belong to now. Prefect is only asked when already imported:
    importing it just to find no run would cost seconds."""
    if "prefect" in sys.modules:
        try:
            from prefect import get_run_logger

            return get_run_logger().info
        except Exception:  # noqa: BLE001 - MissingContextError outside a run
            pass
    return logging.getLogger(f"gnnpipe.{stage}").info
