"""Records of counts and sums that add field by field (a rank's figures, then every rank's)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import Any, TypeVar

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
