"""Moved to ``stages.external_sort``: the partition stage symmetrises directed and typed graphs with it too, so it
sits beside the helpers every data stage shares (``stages.memory``, ``stages.meter``). This name stays so that
the download modules (edited in parallel, some adding imports of it) keep working unchanged; drop it once they
import ``stages.external_sort``."""

from stages.external_sort import (
    BUCKET_BYTES_PER_KEY,
    MIN_BUCKET_KEYS,
    EdgeChunks,
    ExternalCsr,
    array_chunks,
    csr_chunks,
    external_csr,
)

__all__ = ["BUCKET_BYTES_PER_KEY", "MIN_BUCKET_KEYS", "EdgeChunks", "ExternalCsr", "array_chunks", "csr_chunks",
           "external_csr"]
