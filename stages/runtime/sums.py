"""Records of counts and sums that add field by field (a rank's figures, then every rank's)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

T = TypeVar("T", bound="FieldSums")


class FieldSums:
    """A dataclass mixin: ``a + b`` adds every field (the totals of two epochs, or of two ranks)."""

    def __add__(self: T, other: T) -> T:
        values: dict[str, Any] = {f.name: getattr(self, f.name) + getattr(other, f.name)
                                  for f in fields(self)}  # type: ignore[arg-type]
        return type(self)(**values)
