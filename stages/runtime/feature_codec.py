"""How stored feature rows map to the float32 rows the model computes on: one codec per node type's store.

A feature store keeps its rows in a **storage dtype** and the model computes in float32 (docs/design.md §6). The store,
the device cache and the exchange all hold and move rows in the storage dtype (float8 as its bits: ``carrier``);
``FeatureCodec.decode`` turns them into float32 on the device the rows already sit on, once, after the exchange
(``DistFeatures.decode`` is the one place the loader, the typed rows and the infer stage call). Schemes (the
features stage's ``dtype``):

- ``cast``: the rows' own dtype is the storage dtype (float32, float16, bfloat16, or bool/int8/uint8 kept by
  ``auto``); decode is a cast, exact;
- ``int8``: per column ``x ≈ code * scale + offset`` with ``code`` in [-127, 127], ``offset = (max + min) / 2`` and
  ``scale = (max - min) / 254`` over the column's values, so each value is off by at most ``scale / 2``; a constant
  column (scale 0) is stored as code 0 with scale 1, exactly; an integer column spanning at most 254 is stored with
  scale 1, exactly;
- ``float8_e4m3``: per column ``x ≈ code * scale``, ``scale = max|x| / 448`` (448: e4m3fn's largest finite value),
  ``code`` a ``torch.float8_e4m3fn``: 3 mantissa bits, so each value is off by at most 2^-4 of itself (half an ulp),
  or ``scale * 2^-10`` below the normal range (half the smallest subnormal, 2^-9).

The per-column ``scale`` and ``offset`` are fitted once over the WHOLE ``x`` of a node type (``fit_codec``), so a
row decodes identically whichever partition holds it or whichever rank fetched it. Zarr 3 and numpy have neither
bfloat16 nor float8: those codes are stored as their bits (uint16, uint8), read into a tensor of the storage
dtype through ``numpy_view``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from storage.features import CODE_DTYPES, FeatureScheme

INT8_CODE_MAX = 127   # symmetric codes [-127, 127]: 254 steps, and 0 is the column's midpoint
E4M3_MAX = 448.0      # torch.float8_e4m3fn's largest finite value (e4m3fn has no Inf; the encoder clamps to it)
STORAGE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                  "bool": torch.bool, "int8": torch.int8, "uint8": torch.uint8,
                  "float8_e4m3fn": torch.float8_e4m3fn}
# the dtypes whose bits numpy and Zarr carry in a same-width integer dtype: storage.features.CODE_DTYPES (the
# declaration, by name, as storage imports no torch) as torch dtypes
_BITS_AS = {STORAGE_DTYPES[name]: getattr(torch, bits) for name, bits in CODE_DTYPES.items()}
# the storage dtype each quantising scheme codes into (a ``cast`` stores the rows' own dtype)
QUANTISED_STORAGE = {"int8": torch.int8, "float8_e4m3": torch.float8_e4m3fn}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a storage dtype's name (``FeatureScheme.storage_dtype``)."""
    try:
        return STORAGE_DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown feature storage dtype {name!r}; known: {sorted(STORAGE_DTYPES)}") from None


def torch_dtype_of(dtype: np.dtype | type) -> torch.dtype:
    """The torch dtype of a numpy dtype (one numpy has: not bfloat16 or float8, which Zarr holds as their bits)."""
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


def numpy_dtype_of(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of a torch dtype that numpy has (``torch_dtype_of`` reversed)."""
    return torch.empty(0, dtype=dtype).numpy().dtype


@dataclass(frozen=True)
class FeatureCodec:
    """Rows stored as ``storage`` (a torch dtype) under ``scheme``; ``scale``/``offset`` are float32 ``[F]`` on the
    device that decodes (None where the scheme has none)."""

    scheme: str
    storage: torch.dtype
    scale: Tensor | None = None
    offset: Tensor | None = None

    @classmethod
    def cast(cls, storage: torch.dtype) -> FeatureCodec:
        return cls("cast", storage)

    @classmethod
    def of(cls, scheme: FeatureScheme) -> FeatureCodec:
        """The codec of a stored scheme (``storage.features``)."""
        def tensor(a: np.ndarray | None) -> Tensor | None:
            return None if a is None else torch.from_numpy(np.asarray(a, dtype=np.float32))
        codec = cls(scheme.name, torch_dtype(scheme.storage_dtype), tensor(scheme.scale), tensor(scheme.offset))
        codec.check()
        return codec

    def check(self) -> None:
        need = {"cast": (False, False), "int8": (True, True), "float8_e4m3": (True, False)}.get(self.scheme)
        if need is None:
            raise ValueError(f"unknown feature scheme {self.scheme!r}")
        if need != (self.scale is not None, self.offset is not None):
            raise ValueError(f"scheme {self.scheme} needs scale={need[0]}, offset={need[1]}")
        want = QUANTISED_STORAGE.get(self.scheme, self.storage)
        if self.storage != want:
            raise ValueError(f"scheme {self.scheme} stores {want}, not {self.storage}")

    def scheme_record(self) -> FeatureScheme:
        """What the features stage writes beside the codes."""
        def array(t: Tensor | None) -> np.ndarray | None:
            return None if t is None else t.cpu().numpy()
        return FeatureScheme(self.scheme, str(self.storage).removeprefix("torch."), array(self.scale),
                             array(self.offset))

    @property
    def carrier(self) -> torch.dtype:
        """The dtype rows are held, cached and moved in: the storage dtype, but float8 as its uint8 bits (torch 2.13
        has no index_select/index_copy_ for float8 on CPU: "not implemented for 'Float8_e4m3fn'")."""
        return torch.uint8 if self.storage == torch.float8_e4m3fn else self.storage

    def held(self, codes: np.ndarray) -> Tensor:
        """Codes as Zarr stores them (``numpy_view``'s dtype) as a tensor of ``carrier``, sharing memory."""
        return torch.from_numpy(codes).view(self.carrier)

    @property
    def itemsize(self) -> int:
        return self.storage.itemsize

    def to(self, device: torch.device | str) -> FeatureCodec:
        """The codec with its per-column tensors on ``device`` (where rows are decoded)."""
        def move(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(device)
        return replace(self, scale=move(self.scale), offset=move(self.offset))

    def encode(self, rows: Tensor) -> Tensor:
        """float rows ``[n, F]`` -> codes in the storage dtype (CPU)."""
        if self.scheme == "cast":
            return rows.to(self.storage)
        assert self.scale is not None
        x = rows.to(torch.float32)
        if self.scheme == "int8":
            assert self.offset is not None
            codes = torch.round((x - self.offset) / self.scale)
            return codes.clamp_(-INT8_CODE_MAX, INT8_CODE_MAX).to(torch.int8)
        # x / scale lies in [-448, 448] up to rounding; clamped, so no cast can go past e4m3fn's range
        return (x / self.scale).clamp_(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)

    def decode(self, codes: Tensor) -> Tensor:
        """Codes ``[n, F]`` (``carrier`` or storage dtype) -> float32 rows on ``codes``' device (no copy for float32
        rows)."""
        x = codes.view(self.storage).to(torch.float32)
        if self.scheme == "cast":
            return x
        assert self.scale is not None
        if self.scheme == "int8":
            assert self.offset is not None
            return x.mul_(self.scale).add_(self.offset)   # in place: x is already a fresh float32 copy
        return x.mul_(self.scale)


def numpy_view(codes: Tensor) -> np.ndarray:
    """The numpy array sharing ``codes``' memory, in the dtype Zarr stores them in (bits of bfloat16 and float8 as
    uint16 and uint8)."""
    bits = _BITS_AS.get(codes.dtype)
    return codes.numpy() if bits is None else codes.view(bits).numpy()

