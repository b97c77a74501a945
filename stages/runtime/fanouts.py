"""Fanout validation, kept free of torch/PyG imports so configs validate in milliseconds (``gnnpipe status``).

A bad fanout is a ``ValueError`` here, as every broken invariant of the runtime library (storage/errors.py): the
stages' Params validate their fanouts with this function, and pydantic turns the ValueError into the user's one-line
error naming the parameter (``stages.params.Fanouts``); the samplers re-check the fanouts they are given.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def check_fanout(fanout: int) -> None:
    if isinstance(fanout, bool) or not isinstance(fanout, (int, np.integer)) or fanout == 0 or fanout < -1:
        raise ValueError(f"invalid fanout {fanout!r}: each hop needs a positive number of neighbours, "
                         f"or -1 for all of them")


def validate_fanouts(fanouts: Iterable[int]) -> list[int]:
    """One fanout per hop: a positive count, or -1 for all neighbours."""
    fanouts = list(fanouts)
    if not fanouts:
        raise ValueError("fanouts is empty: give one value per hop, e.g. [15, 10, 5] (-1 = all neighbours)")
    for fanout in fanouts:
        check_fanout(fanout)
    return [int(f) for f in fanouts]
