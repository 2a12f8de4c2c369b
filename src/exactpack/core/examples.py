"""Examples: input/target pairs formed inside one span ``[start, end)`` of a document::

    document A = [0, 99, 100, 1]          (BOS 0, EOS 1)
    inputs     = tokens[0:3] = [0, 99, 100]
    targets    = tokens[1:4] = [99, 100, 1]     3 prediction pairs

A's last input 100 predicts its own EOS 1, never the next document's BOS.
:class:`SequenceExample` holds one example, :class:`ExampleTable` many as flat arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from exactpack.core.binding import Binding, Split
from exactpack.core.errors import InvalidInput, SplitMismatch


def offsets_of(counts: np.ndarray) -> np.ndarray:
    """Offsets int64 [n+1] from 0 of ``counts`` [n] laid end to end: ``[2, 3]`` -> ``[0, 2, 5]``."""
    offsets = np.zeros(counts.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return offsets


def pair_offsets(offsets: np.ndarray) -> np.ndarray:
    """Pair offsets int64 [n+1] of token ``offsets`` (``n`` tokens make ``n - 1`` pairs):
    ``[0, 4, 7]`` -> ``[0, 3, 5]``."""
    return offsets - np.arange(offsets.shape[0], dtype=np.int64)


def _outside(tokens: np.ndarray, vocab_size: int) -> tuple[int, int] | None:
    """``(id, position)`` of the lowest id if negative, else of the largest if
    ``>= vocab_size``; None when all are inside."""
    if not tokens.size:
        return None
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo >= 0 and hi < vocab_size:
        return None
    bad = lo if lo < 0 else hi
    return bad, int(np.argmax(tokens == bad))


def as_token_array(tokens: Any, vocab_size: int, what: str) -> np.ndarray:
    """Validate ``tokens`` as ids in ``[0, vocab_size)``; return int32 (no copy when possible)."""
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise InvalidInput(f"{what}: tokens must be a 1-D sequence of ids, got shape {arr.shape}")
    if arr.size and not (np.issubdtype(arr.dtype, np.integer) and arr.dtype != np.bool_):
        raise InvalidInput(
            f"{what}: token ids must be integers, got dtype {arr.dtype}"
            " — encode text with a tokenizer first and pass integer ids"
        )
    if (found := _outside(arr, vocab_size)) is not None:
        raise InvalidInput(
            f"{what}: token id {found[0]} at position {found[1]} is outside [0, {vocab_size})"
            " — check the tokenizer or raise the vocabulary size"
        )
    return arr.astype(np.int32, copy=False)


def example_label(index: int, example_id: str, start: int, end: int) -> str:
    """How errors name an example: ``example 17 ('doc-42'[0:9001])``."""
    return f"example {index} ({example_id!r}[{start}:{end}])"


@dataclass(frozen=True, eq=False)
class SequenceExample:
    """One example: ``len(self)`` prediction pairs from one span; ``inputs``, ``targets``
    int32 and ``loss_mask`` bool (True = supervised), all of length ``len(self)``."""

    inputs: np.ndarray
    targets: np.ndarray
    loss_mask: np.ndarray
    source_id: str
    example_id: str
    range: tuple[int, int]
    partition: Split
    binding: Binding
    window: np.ndarray = field(repr=False)  # int32 [len + 1]: tokens[start:end]

    @classmethod
    def from_document(
        cls,
        tokens: Any,
        *,
        source_id: str,
        partition: Split | str,
        binding: Binding,
        example_id: str | None = None,
        range: tuple[int, int] | None = None,
        loss_mask: Any = None,
    ) -> SequenceExample:
        """Form pairs inside ``tokens[start:end]`` (the whole document by default).

        >>> b = Binding(266, "bytes", "receipt")
        >>> ex = SequenceExample.from_document([0, 99, 100, 1], source_id="A",
        ...                                    partition="train", binding=b)
        >>> ex.inputs.tolist(), ex.targets.tolist(), len(ex)
        ([0, 99, 100], [99, 100, 1], 3)

        ``loss_mask`` (length ``end - start - 1``) marks supervised targets.
        """
        if not isinstance(binding, Binding):
            raise InvalidInput(f"source {source_id!r}: binding must be a exactpack.Binding")
        part = Split.parse(partition)
        doc = as_token_array(tokens, binding.vocab_size, f"source {source_id!r}")
        n = doc.shape[0]
        start, end = (0, n) if range is None else (int(range[0]), int(range[1]))
        eid = str(example_id) if example_id is not None else f"{source_id}[{start}:{end}]"
        label = f"source {source_id!r} range [{start}, {end})"
        if not 0 <= start <= end <= n:
            raise InvalidInput(
                f"{label} lies outside the document of {n} tokens — choose 0 <= start < end <= {n}"
            )
        if end - start < 2:
            raise InvalidInput(
                f"{label} has {end - start} token(s); an example needs at least 2"
                " to form one input/target pair — drop it or widen the range"
            )
        window, length = doc[start:end].copy(), end - start - 1
        mask = np.ones(length, dtype=bool) if loss_mask is None else np.asarray(loss_mask)
        if loss_mask is not None:
            if mask.ndim != 1 or mask.shape[0] != length:
                raise InvalidInput(
                    f"{label}: loss_mask has shape {mask.shape}, expected ({length},)"
                    " — one flag per target (end - start - 1)"
                )
            if mask.dtype != np.bool_:
                if not np.issubdtype(mask.dtype, np.integer) or not np.isin(mask, (0, 1)).all():
                    raise InvalidInput(f"{label}: loss_mask must hold booleans (or 0/1)")
                mask = mask.astype(bool)
        return cls(
            inputs=window[:-1],
            targets=window[1:],
            loss_mask=mask,
            source_id=str(source_id),
            example_id=eid,
            range=(start, end),
            partition=part,
            binding=binding,
            window=window,
        )

    def __len__(self) -> int:
        return int(self.inputs.shape[0])


@dataclass(frozen=True, eq=False)
class ExampleTable:
    """Many examples of one split and binding: example ``i`` owns
    ``windows[offsets[i]:offsets[i+1]]``, ``lengths[i]`` pairs and the flags
    ``loss_mask[target_offsets[i]:target_offsets[i+1]]``. ``windows`` int32 [Σ(len+1)],
    ``offsets`` int64 [n+1], ``loss_mask`` bool [Σlen], ``source_ids``/``example_ids``
    [n] (str), ``range_starts``/``range_ends`` int64 [n].
    """

    windows: np.ndarray
    offsets: np.ndarray
    loss_mask: np.ndarray
    source_ids: np.ndarray
    example_ids: np.ndarray
    range_starts: np.ndarray
    range_ends: np.ndarray
    partition: Split
    binding: Binding

    def __post_init__(self) -> None:
        object.__setattr__(self, "partition", Split.parse(self.partition))
        if not isinstance(self.binding, Binding):
            raise InvalidInput(
                "ExampleTable.binding must be a exactpack.Binding — build one with"
                " Binding(vocab_size, tokenizer_id, split_id)"
            )
        for name, kinds in (("windows", "iu"), ("offsets", "iu"), ("loss_mask", "b")):
            arr = getattr(self, name)
            if not isinstance(arr, np.ndarray) or arr.ndim != 1 or arr.dtype.kind not in kinds:
                what = "bool" if kinds == "b" else "integer"
                raise InvalidInput(
                    f"ExampleTable.{name} must be a 1-D {what} NumPy array, got"
                    f" {getattr(arr, 'dtype', type(arr).__name__)} — encode text with a tokenizer;"
                    " build tables with ExampleTable.from_examples or exactpack.io.load_examples"
                )
        n = self.offsets.shape[0] - 1
        if n < 0 or self.offsets[0] != 0 or self.offsets[-1] != self.windows.shape[0]:
            raise InvalidInput("ExampleTable offsets must start at 0 and end at len(windows)")
        if n and int(np.diff(self.offsets).min()) < 2:
            i = int(np.argmin(np.diff(self.offsets)))
            raise InvalidInput(
                f"{self.label(i)} has fewer than 2 tokens; drop it or widen its range"
            )
        if self.loss_mask.shape[0] != self.windows.shape[0] - n:
            raise InvalidInput("ExampleTable loss_mask must hold one flag per target")
        for name in ("source_ids", "example_ids", "range_starts", "range_ends"):
            if getattr(self, name).shape[0] != n:
                raise InvalidInput(f"ExampleTable.{name} must have one entry per example")
        if (found := _outside(self.windows, self.binding.vocab_size)) is not None:
            i = int(np.searchsorted(self.offsets, found[1], "right") - 1)
            raise InvalidInput(
                f"{self.label(i)}: token id {found[0]} is outside [0, {self.binding.vocab_size})"
                " — check the tokenizer or raise the vocabulary size"
            )

    def __len__(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def lengths(self) -> np.ndarray:
        """Prediction pairs per example, int64 [n]."""
        return np.diff(self.offsets) - 1

    @property
    def target_offsets(self) -> np.ndarray:
        """Offsets of each example's targets in ``loss_mask``, int64 [n+1]."""
        return pair_offsets(self.offsets)

    def label(self, i: int) -> str:
        return example_label(
            i, str(self.example_ids[i]), int(self.range_starts[i]), int(self.range_ends[i])
        )

    def example(self, i: int) -> SequenceExample:
        """Example ``i`` as a :class:`SequenceExample` (views, no copy of tokens)."""
        w = self.windows[self.offsets[i] : self.offsets[i + 1]]
        t0 = self.offsets[i] - i  # target_offsets[i], without building all of them
        return SequenceExample(
            inputs=w[:-1],
            targets=w[1:],
            loss_mask=self.loss_mask[t0 : t0 + w.shape[0] - 1],
            source_id=str(self.source_ids[i]),
            example_id=str(self.example_ids[i]),
            range=(int(self.range_starts[i]), int(self.range_ends[i])),
            partition=self.partition,
            binding=self.binding,
            window=w,
        )

    @classmethod
    def from_examples(
        cls,
        examples: Sequence[SequenceExample],
        partition: Split | str,
        binding: Binding,
    ) -> ExampleTable:
        """Gather examples into one table, checking each one's partition and binding."""
        part = Split.parse(partition)
        for i, ex in enumerate(examples):
            if not isinstance(ex, SequenceExample):
                raise InvalidInput(f"example {i} is a {type(ex).__name__}, not a SequenceExample")
            what = example_label(i, ex.example_id, *ex.range)
            if ex.partition is not part:
                raise SplitMismatch(
                    f"{what} belongs to partition {ex.partition.value!r} but this batch is"
                    f" {part.value!r} — a batch holds one partition only; pack it separately"
                )
            binding.require(ex.binding, what)
        windows = np.concatenate([np.zeros(0, np.int32), *(ex.window for ex in examples)])
        mask = np.concatenate([np.zeros(0, bool), *(ex.loss_mask for ex in examples)])
        return cls(
            windows=windows.astype(np.int32, copy=False),
            offsets=offsets_of(np.array([len(ex) + 1 for ex in examples], dtype=np.int64)),
            loss_mask=mask.astype(bool, copy=False),
            source_ids=np.array([ex.source_id for ex in examples], dtype=object),
            example_ids=np.array([ex.example_id for ex in examples], dtype=object),
            range_starts=np.array([ex.range[0] for ex in examples], dtype=np.int64),
            range_ends=np.array([ex.range[1] for ex in examples], dtype=np.int64),
            partition=part,
            binding=binding,
        )

    def take(self, index: np.ndarray) -> ExampleTable:
        """A new table holding examples ``index`` in that order (duplicates allowed)."""
        index = np.asarray(index, dtype=np.int64)
        lens = np.diff(self.offsets)[index]
        return _select(self, index, 0, lens, self.example_ids[index], self.range_starts[index],
                       self.range_ends[index])  # fmt: skip


def _select(table: ExampleTable, source: np.ndarray, starts: Any, lens: np.ndarray,
            example_ids: np.ndarray, range_starts: np.ndarray, range_ends: np.ndarray
            ) -> ExampleTable:  # fmt: skip
    """Tokens ``[starts, starts + lens)`` of examples ``source`` as a new table."""
    return ExampleTable(
        windows=table.windows[concat_ranges(table.offsets[source] + starts, lens)],
        offsets=offsets_of(lens),
        loss_mask=table.loss_mask[concat_ranges(table.target_offsets[source] + starts, lens - 1)],
        source_ids=table.source_ids[source],
        example_ids=example_ids,
        range_starts=range_starts,
        range_ends=range_ends,
        partition=table.partition,
        binding=table.binding,
    )


def spread(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Owner and offset of every element of ranges of ``counts`` end to end, int64 [Σ]:
    ``[2, 1]`` -> ``[0, 0, 1], [0, 1, 0]``."""
    owner = np.repeat(np.arange(counts.shape[0], dtype=np.int64), counts)
    return owner, concat_ranges(np.zeros(counts.shape[0], np.int64), counts)


def concat_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenate ``arange(s, s+l)`` for each pair, vectorised (int64): starts ``[5, 0]``,
    lengths ``[2, 3]`` give ``[5, 6, 0, 1, 2]``."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    step = np.arange(total, dtype=np.int64) - np.repeat(offsets_of(lengths)[:-1], lengths)
    return np.repeat(starts.astype(np.int64), lengths) + step


def next_at_most(
    values: np.ndarray, limits: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> np.ndarray:
    """Per query ``i``: the smallest ``m`` in ``[starts[i], ends[i])``, ``values[m] <= limits[i]``
    (``ends[i]`` when none); binary lifting over a sparse table of range minima."""
    n = values.shape[0]
    pos = np.asarray(starts, dtype=np.int64).copy()
    if pos.size == 0 or n == 0:
        return np.minimum(pos, ends)
    levels = max(1, int(np.ceil(np.log2(int((ends - pos).max(initial=0)) + 1))))
    table = [values]
    for p in range(1, levels):
        prev, step = table[-1], 1 << (p - 1)
        nxt = prev.copy()
        nxt[: max(n - step, 0)] = np.minimum(prev[: max(n - step, 0)], prev[step:])
        table.append(nxt)
    for p in range(levels - 1, -1, -1):
        size = 1 << p
        skip = (pos + size <= ends) & (table[p][np.minimum(pos, n - 1)] > limits)
        pos = pos + size * skip
    return np.minimum(pos, ends)


def prev_at_most(
    values: np.ndarray, limits: np.ndarray, lows: np.ndarray, highs: np.ndarray
) -> np.ndarray:
    """Per query ``i``: the largest ``k`` in ``[lows[i], highs[i]]``, ``values[k] <= limits[i]``
    (``lows[i] - 1`` when there is none)."""
    n = values.shape[0]
    return n - 1 - next_at_most(values[::-1].copy(), limits, n - 1 - highs, n - lows)


def long_ranges(
    token_counts: np.ndarray, capacity: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Spans keeping each document's pairs once (``--cut-long``): ``n - 1 <= capacity``
    pairs stay whole, more become ``[k*capacity, min((k+1)*capacity + 1, n))``::

        tokens  [0, 11, 12, 13, 14, 15, 1]    7 tokens, 6 pairs, capacity 4
        ranges  [0, 5)  -> pairs 0->11 11->12 12->13 13->14
                [4, 7)  -> pairs 14->15 15->1

    Returns ``(source, starts, ends)``, int64 [m] each, in source order.
    """
    counts = np.asarray(token_counts, dtype=np.int64)
    pieces = np.maximum(1, -(-(counts - 1) // capacity))
    source, k = spread(pieces)
    starts = k * capacity
    ends = np.minimum(starts + capacity + 1, counts[source])
    return source, starts, ends


def cut_long(table: ExampleTable, capacity: int) -> tuple[ExampleTable, int]:
    """Cut examples longer than ``capacity`` as :func:`long_ranges`; ``(table, examples
    cut)``. A span keeps its source id and flags, gets its document range and the id
    ``'{source_id}[{start}:{end}]'``; with nothing to cut, the table itself."""
    counts = np.diff(table.offsets)
    long = counts - 1 > capacity
    if not long.any():
        return table, 0
    source, starts, ends = long_ranges(counts, capacity)
    range_starts = table.range_starts[source] + starts
    range_ends = table.range_starts[source] + ends
    example_ids = table.example_ids[source].copy()
    for i in np.flatnonzero(long[source]).tolist():
        example_ids[i] = f"{table.source_ids[source[i]]}[{range_starts[i]}:{range_ends[i]}]"
    split = _select(table, source, starts, ends - starts, example_ids, range_starts, range_ends)
    return split, int(long.sum())
