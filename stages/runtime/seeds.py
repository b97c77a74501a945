"""Named random streams: one 63-bit seed per ``(seed, rank, epoch, stream)``, the same on any machine.

Every stream id below is used by exactly one consumer, so no two consumers ever draw from the same stream:

==========================  ===  =====================  =============================================================
stream                      id   ``rank`` / ``epoch``   drawn by
==========================  ===  =====================  =============================================================
``STREAM_SHUFFLE``          0    rank / epoch           train: the order of a rank's train seeds (one epoch)
``STREAM_SAMPLER``          1    rank / epoch           train: neighbour sampling (the rank's sampler generator)
``STREAM_TORCH``            2    rank / epoch           train: torch's global generator (dropout)
``STREAM_PY``               3    rank / epoch           train: ``random`` and ``numpy.random`` (global state)
``STREAM_EMBEDDING``        4    node type / chunk      train: initial rows of a featureless type's embeddings, per
                                                       chunk of 2^16 tgids (any rank draws a row alike)
``STREAM_HOTNESS_FIT``      16   partition / 0          hotness: the pre-sampled epochs the cache plan is fitted on
``STREAM_HOTNESS_EVAL``     17   partition / 0          hotness: the held-out epoch its hit rate is measured on
``STREAM_INFER_SAMPLER``    32   rank / layer, block    infer (``infer.fanouts``): one generator per layer and block
                                                       of 1 024 lids (epoch = layer << 32 | block)
``STREAM_LINK_VALID``       5    rank / 0               train, task=link: the validation passes' sampler (the same
                                                       negatives and neighbourhoods every epoch)
``STREAM_LINK_EVAL_EDGES``  6    rank / split           train, task=link: which valid/test positives ``eval_edges``
                                                       keeps (split = its index in SPLITS)
``STREAM_INFER_NEGATIVES``  33   0 / 0                  infer, task=link: the uniform negatives of the exact metrics
``STREAM_INFER_EVAL_EDGES`` 34   0 / split              infer, task=link: which positives the uniform protocol ranks
                                                       (at most train's ``eval_edges`` a split)
==========================  ===  =====================  =============================================================

Training reseeds its streams at the start of every epoch (epoch ``E`` = the number of epochs seeds the final test
pass), which is what makes a resumed run draw exactly what an uninterrupted one draws. The hotness stage draws
all of its pre-sampled epochs from one generator per partition, so it always passes epoch 0; its ids are apart
from training's, so the plan is fitted on draws that are independent of the ones training makes.

Torch-free (numpy only): the hotness stage imports it before torch is needed.
"""

from __future__ import annotations

import numpy as np

STREAM_SHUFFLE, STREAM_SAMPLER, STREAM_TORCH, STREAM_PY, STREAM_EMBEDDING = range(5)
STREAM_HOTNESS_FIT, STREAM_HOTNESS_EVAL = 16, 17
STREAM_LINK_VALID, STREAM_LINK_EVAL_EDGES = 5, 6
STREAM_INFER_SAMPLER, STREAM_INFER_NEGATIVES, STREAM_INFER_EVAL_EDGES = 32, 33, 34


def stream_seed(seed: int, rank: int, epoch: int, stream: int) -> int:
    """A 63-bit seed per (seed, rank, epoch, stream): independent streams, reproducible anywhere."""
    return int(np.random.SeedSequence([seed, rank, epoch, stream]).generate_state(1, dtype=np.uint64)[0] >> 1)
