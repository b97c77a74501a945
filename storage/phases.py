"""The phases a training pass's time is split into (``stages.runtime.phases`` measures them; the train report reads
them), in plotting order."""

from __future__ import annotations

PHASES = ("sample", "gather_cache", "gather_local", "gather_remote", "gather", "exchange", "forward_backward",
          "optimizer", "wait", "other")
