"""What every example and batch must agree on: the :class:`Binding` (vocabulary, tokenizer,
data digest) and the :class:`Split` (train, validation or test; one per batch)."""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass
from typing import Any

from exactpack.core.errors import BindingMismatch, InvalidInput, is_int

INT32_MAX = 2**31 - 1
_FIELDS = ("vocab_size", "tokenizer_id", "split_id")


class Split(str, enum.Enum):
    """The data split an example belongs to; a batch holds one partition only."""

    TRAIN = "train"
    VALIDATION = "validation"
    TEST = "test"

    @classmethod
    def parse(cls, value: Split | str) -> Split:
        if isinstance(value, Split):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            names = ", ".join(p.value for p in cls)
            raise InvalidInput(f"unknown partition {value!r}; use one of {names}") from None


@dataclass(frozen=True)
class Binding:
    """``vocab_size`` bounds token ids to ``[0, vocab_size)``, ``tokenizer_id`` names the
    tokenizer, ``split_id`` is the data digest (it identifies evidence, it approves none)."""

    vocab_size: int
    tokenizer_id: str
    split_id: str

    def __post_init__(self) -> None:
        v = self.vocab_size
        if not is_int(v) or not 0 < v <= INT32_MAX:
            raise InvalidInput(
                f"vocab_size must be an integer in [1, {INT32_MAX}], got {v!r}"
                " — pass the tokenizer's vocabulary size"
            )
        object.__setattr__(self, "vocab_size", int(v))
        for name in ("tokenizer_id", "split_id"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise InvalidInput(f"Binding.{name} must be a non-empty string")

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _FIELDS}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Binding:
        return cls(int(data["vocab_size"]), str(data["tokenizer_id"]), str(data["split_id"]))

    def require(self, other: Binding, what: str) -> None:
        """Raise :class:`BindingMismatch` naming ``what`` unless ``other == self``."""
        if other != self:
            diffs = [
                f"{name} {getattr(other, name)!r} != expected {getattr(self, name)!r}"
                for name in _FIELDS
                if getattr(other, name) != getattr(self, name)
            ]
            raise BindingMismatch(
                f"{what} has a different binding ({'; '.join(diffs)})"
                " — re-encode it with the expected tokenizer and split, or pass its binding"
            )


def data_digest(*parts: str | bytes) -> str:
    """A short sha256 digest usable as a split-receipt identity."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return "sha256:" + h.hexdigest()[:32]
