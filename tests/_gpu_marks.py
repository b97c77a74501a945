"""Marks the CUDA tests share. ``make gpu-check`` runs them on a bare GPU machine's python, which may lack what the
CPU suite's venv always has."""

from __future__ import annotations

import importlib.util

import pytest

# the train and infer stages refuse to start without tensorboard (stages.tracking.require_trackers); make gpu-wheels
# does not carry it (the H200s had it), so a machine without it skips these tests alone, not the whole CUDA step
needs_tensorboard = pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None,
                                       reason="the train and infer stages need tensorboard: pip install tensorboard")
