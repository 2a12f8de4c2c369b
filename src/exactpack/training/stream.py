"""Iterable dataset over a stream: documents -> examples -> StreamPacker -> scheduled calls.

Documents are read in chunks into a :class:`~exactpack.core.stream_packer.StreamPacker`;
closed rows gather into steps of ``world_size * micro_batches * rows_per_micro_batch``
rows, each cut with :func:`schedule_rows` (no shuffle). Every rank packs the whole stream
(deterministic, no communication) and yields ``micro_batches`` slots per step.
``state_dict()`` is small plain data; a resumed iteration re-reads the source from the
first document with a waiting example, so the source must give the same documents in the
same order each time (a list, a ``datasets.Dataset`` or a function returning an iterator).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from exactpack.core.binding import INT32_MAX, Binding, Split
from exactpack.core.compact import CompactRows
from exactpack.core.config import check_segment_namespace
from exactpack.core.errors import (
    BindingMismatch,
    InvalidInput,
    OversizedExample,
    positive_int,
    state_columns,
    state_int,
    state_value,
)
from exactpack.core.examples import as_token_array, long_ranges
from exactpack.core.stream_packer import (
    DEFAULT_LOOKAHEAD,
    DEFAULT_MAX_OPEN_ROWS,
    DEFAULT_STATE_BYTES,
    StreamPacker,
    stream_bytes,
)
from exactpack.core.supervision import mapping_flags
from exactpack.io.tokenizers import Tokenizer
from exactpack.training.distributed import (
    Balance,
    RowStats,
    Slot,
    bound,
    check_balance,
    check_flag,
    check_saved,
    check_schedule,
    check_world,
    schedule_rows,
)
from exactpack.training.packed_data import ScheduledBatch

STATE_FORMAT = "exactpack.stream-dataset/2"  # /2: the stream's identity (its binding)
#: A saved state's settings: its on-disk key -> the dataset's attribute (0.2's keys kept).
_CONFIG = {
    "capacity": "capacity",
    "rows_per_micro_batch": "rows_per_micro_batch",
    "micro_batches": "micro_batches",
    "world_size": "world_size",
    "rank": "rank",
    "window": "lookahead",
    "max_open_rows": "max_open_rows",
    "seed": "seed",
    "split_long": "cut_long",
    "balance": "balance",
}
_CLOSED = ("example", "row", "start")

#: Documents a stream reads at a time, at most.
MAX_READ_CHUNK = 1 << 20
#: Bytes a closed row waiting for its step holds per cell: its token (int32) and flag.
WAITING_CELL_BYTES = 4 + 1


def check_source(documents: Any) -> Any:
    """A stream's documents: an iterable (not a text or a mapping) or a function returning one."""
    if callable(documents):
        return documents
    if isinstance(documents, (str, bytes, Mapping)) or not isinstance(documents, Iterable):
        raise InvalidInput(
            f"documents must be an iterable of documents or a function returning one, got"
            f" {type(documents).__name__} — pass a list, a datasets.Dataset or a generator"
            " function"
        )
    return documents


def check_stream_memory(
    capacity: int, lookahead: int, max_open_rows: int, rows_per_step: int
) -> None:
    """The packer's buffers and one optimizer step of closed rows within the budget
    (:data:`~exactpack.core.stream_packer.DEFAULT_STATE_BYTES`), before any is allocated."""
    packer = stream_bytes(capacity, lookahead, max_open_rows)
    bound(
        packer,
        DEFAULT_STATE_BYTES,
        f"a stream-best-fit packer (capacity {capacity:,}, lookahead {lookahead:,}, max_open_rows"
        f" {max_open_rows:,})",
        "lower lookahead or max_open_rows",
    )
    step = rows_per_step * capacity * WAITING_CELL_BYTES
    bound(
        packer + step,
        DEFAULT_STATE_BYTES,
        f"one optimizer step of {rows_per_step:,} rows of capacity {capacity:,} held while"
        " it is cut",
        "lower world_size, micro_batches or rows_per_micro_batch",
    )


def check_stream_identity(state: Any, binding: Binding) -> None:
    """Refuse a state saved from another stream: its ``binding`` (vocabulary, tokenizer and
    split receipt, the stream's identity) must be ``binding``."""
    saved = state_value(state, "binding", "stream-dataset")
    fields = binding.to_dict()
    if not isinstance(saved, Mapping) or set(saved) != set(fields):
        raise InvalidInput(
            f"the stream-dataset state's binding must hold {', '.join(fields)}, got {saved!r}"
            " — the state is damaged; save it again with state_dict()"
        )
    diffs = [f"{k} {saved[k]!r} != {v!r}" for k, v in fields.items() if saved[k] != v]
    if diffs:
        raise BindingMismatch(
            f"the stream-dataset state was saved from another stream ({'; '.join(diffs)}) —"
            " resume it with the documents, tokenizer and split it was saved from, or start"
            " the stream again"
        )


@dataclass(frozen=True, eq=False)
class Example:
    window: np.ndarray  # int32 [len + 1]
    loss_mask: np.ndarray  # bool [len]
    source_id: str
    start: int
    doc: int
    doc_first_example: int


def text_of(ds: Any, item: Any, index: int) -> str | None:
    """The text of a text document (a ``str``, or a mapping with ``text_field`` and no
    ``input_ids``); None for a tokenized one."""
    if isinstance(item, Mapping) and "input_ids" not in item:
        if ds.text_field not in item:
            raise InvalidInput(
                f"document {index} has neither input_ids nor {ds.text_field!r} (columns"
                f" {sorted(map(str, item))}) — pass text_field= naming its text column"
            )
        item = item[ds.text_field]
        if not isinstance(item, str):
            raise InvalidInput(
                f"document {index}: {ds.text_field!r} is a {type(item).__name__}, not text"
            )
    if not isinstance(item, str):
        return None
    if ds.tokenizer is None:
        raise InvalidInput(f"document {index} is text; pass a tokenizer")
    return item


def stream_examples(ds: Any, items: list[Any], first: int, first_example: int) -> list[Example]:
    """The examples of documents ``first, first + 1, ...`` (one each, or its ``long_ranges``
    pieces), numbered from ``first_example``; a mapping's ``labels`` / ``loss_mask`` /
    ``completion_mask`` / ``assistant_masks`` are ANDed."""
    found = ((i, text_of(ds, item, first + i)) for i, item in enumerate(items))
    texts = {i: text for i, text in found if text is not None}
    encoded: dict[int, np.ndarray] = {}
    if texts:
        tokens, offsets = ds.tokenizer.encode_batch(list(texts.values()))
        encoded = {i: tokens[offsets[j] : offsets[j + 1]] for j, i in enumerate(texts)}
    out: list[Example] = []
    for i, item in enumerate(items):
        index = first + i
        mapping = isinstance(item, Mapping)
        source_id = str(item.get("id", index)) if mapping else str(index)
        raw = encoded[i] if i in encoded else item["input_ids"] if mapping else item
        what = f"document {index} ({source_id!r})"
        tokens = as_token_array(raw, ds.binding.vocab_size, what)
        if tokens.shape[0] < 2:
            raise InvalidInput(f"{what} has {tokens.shape[0]} token(s); drop it (needs 2)")
        pairs = tokens.shape[0] - 1
        flags = mapping_flags(item, tokens, what) if mapping and i not in encoded else None
        mask = np.ones(pairs, dtype=bool) if flags is None else flags
        if pairs > ds.capacity and not ds.cut_long:
            raise OversizedExample(
                f"{what} has {pairs} prediction pairs; capacity is {ds.capacity}"
                " — raise the capacity or pass cut_long=True"
            )
        _, starts, ends = long_ranges(np.array([tokens.shape[0]]), ds.capacity)
        doc_first = first_example + len(out)
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
            out.append(Example(tokens[a:b], mask[a : b - 1], source_id, a, index, doc_first))
    return out


class StreamDataset(IterableDataset):
    """Scheduled model calls (:class:`ScheduledBatch`) of one rank, packed on the fly.

    ``documents``: token-id sequences, ``str`` or mappings with a ``text_field`` column
    (with ``tokenizer``), or mappings with ``input_ids`` and optional ``loss_mask`` /
    ``labels`` / ``completion_mask`` / ``assistant_masks`` (ANDed,
    :mod:`exactpack.core.supervision`); a mapping's ``id`` names it. A document over
    ``capacity`` pairs is an error unless ``cut_long`` (consecutive ranges). DataLoader
    worker ``w`` of ``W`` yields slots ``w, w+W, ...`` (resume needs ``num_workers=0``).
    """

    def __init__(
        self,
        documents: Iterable[Any] | Callable[[], Iterable[Any]],
        *,
        binding: Binding,
        max_length: int,
        rows_per_micro_batch: int,
        micro_batches: int = 1,
        world_size: int | None = None,
        rank: int | None = None,
        split: Split | str = "train",
        cut_long: bool = False,
        tokenizer: Tokenizer | None = None,
        lookahead: int = DEFAULT_LOOKAHEAD,
        max_open_rows: int = DEFAULT_MAX_OPEN_ROWS,
        seed: int = 0,
        balance: Balance = "tokens",
        read_chunk: int = 256,
        text_field: str = "text",
    ) -> None:
        self.documents = check_source(documents)
        if not isinstance(binding, Binding):
            raise InvalidInput(f"binding must be a exactpack.Binding, got {type(binding).__name__}")
        self.binding = binding
        self.partition = Split.parse(split)
        self.world_size, self.rank = check_world(world_size, rank)
        self.rows_per_micro_batch = positive_int(
            "rows_per_micro_batch", rows_per_micro_batch, INT32_MAX
        )
        self.micro_batches = positive_int("micro_batches", micro_batches, INT32_MAX)
        check_flag("cut_long", cut_long)
        self.cut_long = bool(cut_long)
        if tokenizer is not None and not callable(getattr(tokenizer, "encode_batch", None)):
            raise InvalidInput(
                f"tokenizer must be a loaded tokenizer (exactpack.io.load_tokenizer(...)), got"
                f" {type(tokenizer).__name__}"
            )
        self.tokenizer = tokenizer
        if not isinstance(text_field, str) or not text_field:
            raise InvalidInput(f"text_field must be a column name, got {text_field!r}")
        self.text_field = text_field
        self.read_chunk = positive_int("read_chunk", read_chunk, MAX_READ_CHUNK)
        check_balance(balance)
        self.balance = balance
        settings = StreamPacker.check_settings(max_length, lookahead, max_open_rows, seed)
        self.capacity, self.lookahead, self.max_open_rows, self.seed = settings[:4]
        check_stream_memory(self.capacity, self.lookahead, self.max_open_rows, self.rows_per_step)
        check_schedule(
            self.rows_per_step, self.world_size, self.micro_batches, self.rows_per_micro_batch
        )
        self._cursor: _StreamPass | None = None
        self._resume: dict[str, Any] | None = None

    @property
    def rows_per_step(self) -> int:
        return self.world_size * self.micro_batches * self.rows_per_micro_batch

    def __iter__(self) -> Iterator[ScheduledBatch]:
        info = get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        cursor = _StreamPass(self, self._resume)
        self._cursor, self._resume = cursor, None
        for item in cursor.run():
            if item.slot.index % workers == worker:
                yield item
        self._cursor = None

    def state_dict(self) -> dict[str, Any]:
        """Where the current iteration stands (or the state loaded, or the start)."""
        if self._cursor is not None:
            return self._cursor.state()
        if self._resume is not None:
            return self._resume
        return _StreamPass(self, None).state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The next iteration continues from ``state`` (same configuration required)."""
        settings = SimpleNamespace(**{key: getattr(self, a) for key, a in _CONFIG.items()})
        check_saved(state, STATE_FORMAT, "stream-dataset", "dataset", settings, tuple(_CONFIG))
        check_stream_identity(state, self.binding)
        self._resume, self._cursor = state, None


class _StreamPass:
    """One pass over the stream; its fields are what :meth:`state` saves."""

    def __init__(self, ds: StreamDataset, state: dict[str, Any] | None) -> None:
        self.ds = ds
        self.packer = StreamPacker(
            ds.capacity, lookahead=ds.lookahead, max_open_rows=ds.max_open_rows, seed=ds.seed,
            stream=ds.binding.split_id,
        )  # fmt: skip
        self.pending: dict[int, Example] = {}  # example index -> data, until trained on
        self.closed = (np.zeros(0, dtype=np.int64),) * 3  # example, row, start: not yet used
        self.docs_read = self.step = self.micro_done = 0
        self.source_done = False
        self.source = iter(ds.documents() if callable(ds.documents) else ds.documents)
        if state is not None:
            self._restore(state)

    def state(self) -> dict[str, Any]:
        docs = [(e.doc, e.doc_first_example) for e in self.pending.values()]
        first_doc, first_example = min(docs) if docs else (self.docs_read, 0)
        return {
            "format": STATE_FORMAT,
            **{key: getattr(self.ds, attr) for key, attr in _CONFIG.items()},
            "binding": self.ds.binding.to_dict(),
            "packer": self.packer.state_dict(),
            "closed": {k: v.tolist() for k, v in zip(_CLOSED, self.closed, strict=True)},
            "docs_read": self.docs_read,
            "first_doc": first_doc,
            "first_doc_example": first_example,
            "step": self.step,
            "micro_done": self.micro_done,
            "source_done": self.source_done,
            "pending_digest": self._digest(),
        }

    def _digest(self) -> str:
        """Fingerprint of the waiting examples, to detect a source that changed on resume."""
        h = hashlib.sha256()
        for e in sorted(self.pending):
            ex = self.pending[e]
            h.update(f"{e}:{ex.source_id}:{ex.start}:".encode())
            h.update(ex.window.tobytes() + np.packbits(ex.loss_mask).tobytes())
        return h.hexdigest()

    def _restore(self, state: dict[str, Any]) -> None:
        """Re-read the documents that still have waiting examples, then continue."""
        what, packer = "stream-dataset", state_value(state, "packer", "stream-dataset")
        self.packer.load_state_dict(packer)  # checked whole, and against this dataset's settings
        pushed, rows = self.packer.examples_pushed, self.packer.rows_emitted
        limits = {"example": pushed, "row": rows, "start": self.ds.capacity}
        self.closed = state_columns(state, "closed", what, limits)
        self.step, self.micro_done = (state_int(state, k, what) for k in ("step", "micro_done"))
        self.source_done = state_value(state, "source_done", what) is True
        # every document read gave the packer at least one example, and example indices
        # fit int32: re-reading never goes past what was pushed (a huge docs_read on an
        # endless source was read for ever)
        if pushed > INT32_MAX + 1:
            raise InvalidInput(
                f"the {what} state's packer pushed {pushed:,} examples, more than the"
                f" {INT32_MAX + 1:,} a stream numbers — the state is damaged; save it again"
            )
        self.docs_read = state_int(state, "first_doc", what)
        docs_read = state_int(state, "docs_read", what, self.docs_read, pushed)
        self._check_source_holds(docs_read)
        example = state_int(state, "first_doc_example", what, 0, pushed)
        digest = state_value(state, "pending_digest", what)
        wanted = set(packer["buffer"]["example"]) | set(self.closed[0].tolist())
        wanted |= {e for row in packer["open_rows"] for e in row["example"]}
        self.source = itertools.islice(self.source, self.docs_read, None)
        while self.docs_read < docs_read:
            count = min(self.ds.read_chunk, docs_read - self.docs_read)
            examples, read = self._read(count, example)
            if read != count:
                raise InvalidInput(f"the source ended after {self.docs_read} documents")
            for ex in examples:
                if example in wanted:
                    self.pending[example] = ex
                example += 1
        if len(self.pending) != len(wanted) or self._digest() != digest:
            raise InvalidInput(
                "the source gave different documents than when the state was saved — resume"
                " needs a source that yields the same documents in the same order"
            )

    def _check_source_holds(self, docs: int) -> None:
        """Refuse at once a state that read more documents than a sized source holds."""
        source = self.ds.documents
        size = None if callable(source) else getattr(source, "__len__", None)
        if size is not None and docs > size():
            raise InvalidInput(
                f"the stream-dataset state has read {docs:,} documents but the source holds"
                f" {size():,} — resume with the source it was saved from"
            )

    def _read(self, count: int, first_example: int) -> tuple[list[Example], int]:
        """Up to ``count`` next documents as examples numbered from ``first_example``."""
        items = list(itertools.islice(self.source, count))
        examples = stream_examples(self.ds, items, self.docs_read, first_example)
        self.docs_read += len(items)
        return examples, len(items)

    def _push_chunk(self) -> None:
        """Read up to ``read_chunk`` documents and push their examples; finish at the end."""
        first = self.packer.examples_pushed
        examples, read = self._read(self.ds.read_chunk, first)
        check_segment_namespace(first + len(examples))
        if examples:
            lengths = np.array([e.window.shape[0] - 1 for e in examples], dtype=np.int64)
            placed = self.packer.push(lengths)
            self.pending.update(zip(range(first, first + len(examples)), examples, strict=True))
            self._close(placed)
        if read < self.ds.read_chunk:
            self._close(self.packer.finish())
            self.source_done = True

    def _close(self, placed: Any) -> None:
        self.closed = tuple(
            np.concatenate([old, new]) for old, new in zip(self.closed, placed, strict=True)
        )

    def _batch(self, rows: np.ndarray, example: np.ndarray, row: np.ndarray, start: np.ndarray):
        """Global ``rows`` (ascending) as one model call."""
        take = np.flatnonzero(np.isin(row, rows))  # already in (row, start) order
        local = np.searchsorted(rows, row[take])
        exs = [self.pending[e] for e in example[take].tolist()]
        offsets = np.searchsorted(local, np.arange(rows.size + 1, dtype=np.int64))
        lengths = np.array([e.window.shape[0] - 1 for e in exs], dtype=np.int64)
        ids = np.array([e.source_id for e in exs], dtype=object)
        range_starts = np.array([e.start for e in exs], dtype=np.int64)
        range_ends = range_starts + lengths + 1
        names = [f"{s}[{a}:{b}]" for s, a, b in zip(ids, range_starts, range_ends, strict=True)]
        return CompactRows(
            tokens=np.concatenate([np.zeros(0, np.int32)] + [e.window for e in exs]),
            loss_mask=np.concatenate([np.zeros(0, bool)] + [e.loss_mask for e in exs]),
            lengths=lengths,
            starts=start[take],
            row_offsets=offsets.astype(np.int64),
            ordinals=example[take],
            source_ids=ids,
            example_ids=np.array(names, dtype=object),
            range_starts=range_starts,
            range_ends=range_ends,
            capacity=self.ds.capacity,
            partition=self.ds.partition,
            binding=self.ds.binding,
            first_row=int(rows[0]) if rows.size else 0,
        )

    def _step_stats(self, step_rows: np.ndarray, example: np.ndarray, row: np.ndarray):
        lengths = np.array([self.pending[e].window.shape[0] - 1 for e in example.tolist()])
        eligible = [int(self.pending[e].loss_mask.sum()) for e in example.tolist()]
        local = np.searchsorted(step_rows, row)
        per_row = np.bincount(local, eligible, step_rows.shape[0]).astype(np.int64)
        return RowStats.from_segments(lengths.astype(np.int64), local, per_row)

    def run(self) -> Iterator[ScheduledBatch]:
        ds = self.ds
        while True:
            while np.unique(self.closed[1]).shape[0] < ds.rows_per_step and not self.source_done:
                self._push_chunk()
            example, row, start = self.closed
            if row.size == 0:
                return
            step_rows = np.unique(row)[: ds.rows_per_step]
            in_step = np.isin(row, step_rows)
            stats = self._step_stats(step_rows, example[in_step], row[in_step])
            plan = schedule_rows(
                stats.costs(ds.balance),
                world_size=ds.world_size,
                micro_batches=ds.micro_batches,
                rows_per_micro_batch=ds.rows_per_micro_batch,
                shuffle=False,
            )
            eligible = int(stats.eligible.sum())
            for micro in range(self.micro_done, ds.micro_batches):
                rows = step_rows[plan.slot(0, ds.rank, micro)]
                batch = self._batch(rows, example, row, start)
                self.micro_done = micro + 1
                index = self.step * ds.micro_batches + micro
                slot = Slot(
                    0, self.step, ds.rank, micro, ds.micro_batches, tuple(rows.tolist()),
                    eligible, index,
                )  # fmt: skip
                yield ScheduledBatch(batch, slot, ds.world_size)
            for e in example[in_step].tolist():
                del self.pending[e]
            self.closed = (example[~in_step], row[~in_step], start[~in_step])
            self.step, self.micro_done = self.step + 1, 0
