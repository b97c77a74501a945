"""Records of counts and sums that add field by field (a rank's figures, then every rank's)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import Any, TypeVar

import torch
from torch import Tensor

T = TypeVar("T", bound="FieldSums")


class FieldSums:
    """A dataclass mixin: ``a + b`` adds every field (the totals of two epochs, or of two ranks); ``values`` lists
    them in field order as floats (for one all-reduce, or a ``Task``'s metric sums) and ``from_values`` reads such a
    list back, each field as its declared type (counts stay int)."""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))  # type: ignore[arg-type]

    def values(self) -> list[float]:
        return [float(getattr(self, name)) for name in self.names()]

    @classmethod
    def from_values(cls: type[T], values: Sequence[float]) -> T:
        kinds = {f.name: f.type for f in fields(cls)}  # type: ignore[arg-type]
        return cls(**{name: int(v) if kinds[name] in (int, "int") else float(v)
                      for name, v in zip(cls.names(), values, strict=True)})

    def __add__(self: T, other: T) -> T:
        values: dict[str, Any] = {f.name: getattr(self, f.name) + getattr(other, f.name)
                                  for f in fields(self)}  # type: ignore[arg-type]
        return type(self)(**values)


class RunningSums:
    """Per-batch sums added where they arrive: numbers on the host, tensors on their device, read once at the end.

    A training thread that turned each batch's loss and metric into host numbers would stop at every batch until
    the GPU had finished it (a stream synchronisation), so the host could never queue the next batch's kernels
    while the device runs this one's; tensors are added on the device instead (in float64: counts stay exact to
    2^53, and a float32 loss widens exactly, as ``float()`` widens it) and ``values`` reads them all in one copy.
    """

    def __init__(self, size: int) -> None:
        self._host = [0.0] * size
        self._device: list[Any] = [None] * size   # Tensor | None

    def add(self, values: Sequence[Any]) -> None:
        """Add one batch's ``values`` (floats, ints or 0-dim tensors), entry by entry."""
        if len(values) != len(self._host):
            raise ValueError(f"{len(values)} sums where {len(self._host)} were declared")
        for i, v in enumerate(values):
            if isinstance(v, Tensor):   # a copy: the task may refill its tensor in place for the next batch
                v = v.detach().reshape(()).to(torch.float64, copy=True)
                self._device[i] = v if self._device[i] is None else self._device[i] + v
            else:
                self._host[i] += float(v)

    def values(self) -> list[float]:
        """Every sum as a float: the device's read in one copy (one synchronisation), added to the host's."""
        on_device = [(i, t) for i, t in enumerate(self._device) if t is not None]
        out = list(self._host)
        if on_device:
            where = on_device[0][1].device   # a task's sums on two devices are read through the first's
            for (i, _), v in zip(on_device, torch.stack([t.to(where) for _, t in on_device]).tolist()):
                out[i] += v
        return out
