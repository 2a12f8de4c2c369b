"""Source documents as flat arrays, where they came from, and the binding they get.

:class:`Documents` is what every reader produces before a binding is
attached: tokens ``int32 [Σn]``, offsets ``int64 [k+1]``, one loss flag per
target, ids. :class:`Origin` names a row in errors (``file line 7``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from seqpack.core.binding import Binding, Partition, split_digest
from seqpack.core.errors import BindingMismatch, InvalidInput
from seqpack.core.examples import ExampleTable
from seqpack.io.jsonl import first_bad_line
from seqpack.io.tokenizers import Tokenizer


@dataclass(frozen=True)
class Origin:
    """Where rows came from, to name them in errors: ``parts`` = (file, first row, unit)."""

    parts: tuple[tuple[str, int, str], ...]

    def locate(self, row: int) -> str:
        name, first, unit = self.parts[0]
        for part in self.parts:
            if part[1] > row:
                break
            name, first, unit = part
        local = row - first
        if unit == "line":
            return f"{name} line {_line_of(Path(name), local)}"
        return f"{name} row {local}"

    def type_error(self, message: str, row: int | None = None) -> InvalidInput:
        """A wrong-type error at the line the json module finds first, else at ``row``.

        Arrow converts a whole JSON column to one type (a float anywhere makes
        every id a float), so for JSON Lines the offending line is found by
        re-reading with the json module (only on this error path).
        """
        for name, _, unit in self.parts:
            if unit == "line" and (found := first_bad_line(Path(name))) is not None:
                return found
        where = self.parts[0][0] if row is None else self.locate(row)
        return InvalidInput(f"{where}: {message}")


def _line_of(path: Path, record: int) -> int:
    """1-based line of the ``record``-th non-blank line (only on the error path)."""
    seen = -1
    with path.open("rb") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                seen += 1
                if seen == record:
                    return number
    return record + 1


@dataclass(frozen=True, eq=False)
class Documents:
    """Source documents as flat arrays, before a binding is attached.

    ``tokens`` int32 [Σn], ``offsets`` int64 [k+1], ``loss_mask`` bool
    [Σ(n-1)] (one flag per target), ``ids`` str [k].
    """

    tokens: np.ndarray
    offsets: np.ndarray
    loss_mask: np.ndarray
    ids: np.ndarray
    origin: Origin

    def __len__(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def lengths(self) -> np.ndarray:
        """Prediction pairs per document, int64 [k]."""
        return np.diff(self.offsets) - 1

    def digest(self, partition: Partition | str) -> str:
        """Split-receipt identity of exactly these tokens, flags and partition."""
        part = Partition.parse(partition).value
        return split_digest(
            "seqpack-split",
            part,
            *(np.ascontiguousarray(a).data for a in (self.tokens, self.offsets, self.loss_mask)),
        )

    def to_table(self, binding: Binding, partition: Partition | str) -> ExampleTable:
        """Attach ``binding`` after checking every id is below its vocabulary size."""
        if self.tokens.size and int(self.tokens.max()) >= binding.vocab_size:
            pos = int(np.argmax(self.tokens >= binding.vocab_size))
            row = int(np.searchsorted(self.offsets, pos, "right") - 1)
            raise InvalidInput(
                f"{self.origin.locate(row)} (id {self.ids[row]!r}): token id"
                f" {int(self.tokens[pos])} at position {pos - int(self.offsets[row])} is not below"
                f" the vocabulary size {binding.vocab_size} — pass the right --vocab-size"
                " or --tokenizer"
            )
        counts = np.diff(self.offsets)
        return ExampleTable(
            windows=self.tokens,
            offsets=self.offsets,
            loss_mask=self.loss_mask,
            source_ids=self.ids,
            example_ids=self.ids,
            range_starts=np.zeros(counts.shape[0], dtype=np.int64),
            range_ends=counts,
            partition=Partition.parse(partition),
            binding=binding,
        )


def resolve_binding(
    docs: Documents,
    partition: Partition | str,
    *,
    vocab_size: int | None = None,
    tokenizer: Tokenizer | None = None,
    tokenizer_id: str | None = None,
    split_id: str | None = None,
) -> Binding:
    """The binding for ``docs``: vocabulary from ``vocab_size`` or the tokenizer.

    ``vocab_size`` may exceed the tokenizer's (a model's padded embedding)
    but not fall below it. ``split_id`` defaults to :meth:`Documents.digest`.
    """
    if vocab_size is None and tokenizer is None:
        raise InvalidInput(
            "pre-tokenized input needs --vocab-size V (the model's vocabulary size) or a"
            " --tokenizer that defines it"
        )
    if vocab_size is not None and tokenizer is not None and vocab_size < tokenizer.vocab_size:
        raise BindingMismatch(
            f"--vocab-size {vocab_size} is below the tokenizer's {tokenizer.vocab_size}"
            " — drop --vocab-size or raise it"
        )
    size = vocab_size if vocab_size is not None else tokenizer.vocab_size  # type: ignore[union-attr]
    name = tokenizer_id or (tokenizer.identity if tokenizer is not None else "pretokenized")
    return Binding(size, name, split_id or docs.digest(partition))
