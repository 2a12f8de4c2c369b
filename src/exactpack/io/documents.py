"""Source documents as flat arrays (:class:`TokenChunk` a read chunk, :class:`Documents` a
whole input), where they came from (:class:`Origin`), their split receipt
(:class:`DataDigest`) and the binding they get."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from exactpack.core.binding import Binding, Split
from exactpack.core.errors import BindingMismatch, InvalidInput
from exactpack.core.examples import ExampleTable, offsets_of
from exactpack.io.files import reopen
from exactpack.io.jsonl import JSON_SPACE, file_lines, first_bad_line
from exactpack.io.tokenizers import Tokenizer


@dataclass(frozen=True)
class Origin:
    """Where rows came from, to name them in errors: ``parts`` = (file, first row, unit).
    Row ``r`` is in the last part whose first row is ``<= r``; unit ``"line"`` names the
    file line (blanks skipped), ``"text line"`` a text file's line, ``"row"`` the row."""

    parts: tuple[tuple[str, int, str], ...]

    def locate(self, row: int) -> str:
        name, first, unit = self.parts[0]
        for part in self.parts:
            if part[1] > row:
                break
            name, first, unit = part
        local = row - first
        if unit == "text line":  # every line is a row (a text file)
            return f"{name} line {local + 1}"
        if unit == "line":
            return f"{name} line {_line_of(Path(name), local)}"
        return f"{name} row {local}"

    def type_error(self, message: str, row: int | None = None) -> InvalidInput:
        """A wrong-type error at the line the json module finds first (Arrow typed the
        whole column: re-read only on this error path), else at ``row``."""
        for name, _, unit in self.parts:
            if unit == "line" and (found := first_bad_line(Path(name))) is not None:
                return found
        where = self.parts[0][0] if row is None else self.locate(row)
        return InvalidInput(f"{where}: {message}")


def _line_of(path: Path, record: int) -> int:
    """1-based line of the ``record``-th non-blank line (only on the error path)."""
    stream = reopen(path)  # decompressed again; None for standard input (read once)
    if stream is None:
        return record + 1
    with stream:
        records = (
            n for n, line in enumerate(file_lines(stream, path), 1) if line.strip(JSON_SPACE)
        )
        return next(itertools.islice(records, record, None), record + 1)


@dataclass(frozen=True, eq=False)
class TokenChunk:
    """Checked documents of one read chunk, as views of the reader's buffers: ``tokens``
    int32 or int64 [T] (ids in ``[0, 2**31)``), ``offsets`` int64 [k+1] from 0, ``flags``
    bool [T - k] (one per target; None: all supervised), ``ids`` an Arrow string array [k]
    (None: the row numbers); ``origin`` names row 0, ``first_row`` is its global row and
    ``largest`` the largest id (-1: not known)."""

    tokens: np.ndarray
    offsets: np.ndarray
    flags: np.ndarray | None
    ids: Any
    origin: Origin
    first_row: int = 0
    largest: int = -1

    def __len__(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def counts(self) -> np.ndarray:
        """Tokens per document, int64 [k]."""
        return np.diff(self.offsets)

    def id_of(self, row: int) -> str:
        return str(self.first_row + row) if self.ids is None else str(self.ids[row])

    def check_vocabulary(self, vocab_size: int) -> None:
        """Raise :class:`InvalidInput` naming the row when an id is not below ``vocab_size``."""
        if not 0 <= self.largest < vocab_size:
            check_vocabulary(self.tokens, self.offsets, vocab_size, self.origin.locate, self.id_of)

    def rebased(self, first_row: int) -> TokenChunk:
        return replace(self, first_row=first_row)


def check_vocabulary(
    tokens: np.ndarray,
    offsets: np.ndarray,
    vocab_size: int,
    locate: Callable[[int], str],
    id_of: Callable[[int], Any],
) -> None:
    """Every id below ``vocab_size``, or an error naming the row, position, id and the fix."""
    if not tokens.size or int(tokens.max()) < vocab_size:
        return
    pos = int(np.argmax(tokens >= vocab_size))
    row = int(np.searchsorted(offsets, pos, "right") - 1)
    raise InvalidInput(
        f"{locate(row)} (id {id_of(row)!r}): token id {int(tokens[pos])} at position"
        f" {pos - int(offsets[row])} is not below the vocabulary size {vocab_size} — pass the"
        " right --vocab-size or --tokenizer"
    )


class DataDigest:
    """The split receipt of documents read chunk by chunk (:meth:`Documents.digest`'s value):
    sha256 over ``exactpack-split``, the partition, every token (int32), offset (int64) and
    target flag (a byte), each part ended by a zero byte, so it does not depend on how
    the input was cut: :meth:`tokens` per chunk in order, then :meth:`finish`."""

    def __init__(self, partition: Split | str) -> None:
        self._hash = hashlib.sha256()
        self._hash.update(b"exactpack-split\0" + Split.parse(partition).value.encode() + b"\0")

    def tokens(self, tokens: np.ndarray) -> None:
        self._hash.update(np.ascontiguousarray(tokens, dtype="<i4").data)

    def finish(self, counts: Iterable[np.ndarray], flags: Iterable[np.ndarray | int]) -> str:
        """``counts``: tokens per document, chunk by chunk; ``flags``: each chunk's target
        flags, or its number of targets when all are supervised."""
        self._hash.update(b"\0" + np.zeros(1, dtype="<i8").tobytes())
        base = 0
        for chunk in counts:
            ends = base + np.cumsum(chunk, dtype=np.int64)
            self._hash.update(ends.astype("<i8", copy=False).data)
            base = int(ends[-1]) if ends.size else base
        self._hash.update(b"\0")
        ones = np.ones(1 << 16, dtype=np.uint8)
        for part in flags:
            if isinstance(part, (int, np.integer)):
                for lo in range(0, int(part), ones.shape[0]):
                    self._hash.update(ones[: min(ones.shape[0], int(part) - lo)].data)
            else:
                self._hash.update(np.ascontiguousarray(part).view(np.uint8).data)
        self._hash.update(b"\0")
        return "sha256:" + self._hash.hexdigest()[:32]


@dataclass(frozen=True, eq=False)
class Documents:
    """Source documents before a binding is attached: ``tokens`` int32 [Σn], ``offsets``
    int64 [k+1], ``loss_mask`` bool [Σ(n-1)] (one flag per target), ``ids`` str [k]."""

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

    @classmethod
    def from_chunks(cls, chunks: Sequence[TokenChunk], origin: Origin) -> Documents:
        """The chunks of one input in order, as one in-memory table (int32 tokens)."""
        tokens = [np.zeros(0, np.int32), *(c.tokens.astype(np.int32, copy=False) for c in chunks)]
        counts = [np.zeros(0, np.int64), *(c.counts for c in chunks)]
        flags = [np.zeros(0, bool)] + [
            np.ones(c.tokens.shape[0] - len(c), bool) if c.flags is None else c.flags
            for c in chunks
        ]
        ids = [np.zeros(0, object)] + [
            np.arange(c.first_row, c.first_row + len(c)).astype(str)
            if c.ids is None
            else c.ids.to_numpy(zero_copy_only=False)
            for c in chunks
        ]
        return cls(
            np.concatenate(tokens), offsets_of(np.concatenate(counts)), np.concatenate(flags),
            np.concatenate(ids), origin
        )  # fmt: skip

    def digest(self, partition: Split | str) -> str:
        """Split-receipt identity of exactly these tokens, flags and partition."""
        digest = DataDigest(partition)
        digest.tokens(self.tokens)
        return digest.finish([np.diff(self.offsets)], [self.loss_mask])

    def to_table(self, binding: Binding, partition: Split | str) -> ExampleTable:
        """Attach ``binding`` after checking every id is below its vocabulary size."""
        check_vocabulary(
            self.tokens, self.offsets, binding.vocab_size, self.origin.locate, self.ids.__getitem__
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
            partition=Split.parse(partition),
            binding=binding,
        )


def make_binding(
    receipt: Callable[[], str],
    *,
    vocab_size: int | None = None,
    tokenizer: Tokenizer | None = None,
    tokenizer_id: str | None = None,
    split_id: str | None = None,
) -> Binding:
    """The binding of a read: vocabulary from ``vocab_size`` (at least the tokenizer's) or
    the tokenizer; ``split_id`` defaults to ``receipt()`` (for a whole input in memory,
    ``lambda: docs.digest(partition)``: :meth:`Documents.digest`)."""
    if vocab_size is None and tokenizer is None:
        raise InvalidInput(
            "no --tokenizer given: text input needs --tokenizer (bytes or a local tokenizer"
            " folder), pre-tokenized input needs --vocab-size V (the model's"
            " vocabulary size) or the --tokenizer that made them"
        )
    if vocab_size is not None and tokenizer is not None and vocab_size < tokenizer.vocab_size:
        raise BindingMismatch(
            f"--vocab-size {vocab_size} is below the tokenizer's {tokenizer.vocab_size}"
            " — drop --vocab-size or raise it"
        )
    size = vocab_size if vocab_size is not None else tokenizer.vocab_size  # type: ignore[union-attr]
    name = tokenizer_id or (tokenizer.identity if tokenizer is not None else "pretokenized")
    return Binding(size, name, split_id or receipt())
