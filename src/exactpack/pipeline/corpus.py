"""A corpus read out of core: chunk by chunk, tokenized, spilled; only the lengths in memory.

:func:`read_tables` is the one reader of every pipeline (flat and ``--tree``, local and the
Ray driver's ``--tree`` blocks): an input's chunks in order, read ahead, with progress.

:func:`read_corpus` checks and tokenizes each chunk of ``chunk_bytes`` and appends it to a
:class:`~exactpack.io.spill.Spill` (Arrow inputs are not spilled: their chunks are views);
the split receipt is computed on the way (:class:`~exactpack.io.documents.DataDigest`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from exactpack.core.binding import Binding
from exactpack.core.errors import InvalidInput, OversizedExample
from exactpack.core.examples import example_label
from exactpack.core.supervision import Objective
from exactpack.io.columns import chunk_from_arrow
from exactpack.io.documents import DataDigest, Origin, TokenChunk, make_binding
from exactpack.io.readers import Input, open_input
from exactpack.io.sft import sft_columns
from exactpack.io.shards import default_ids
from exactpack.io.spill import Spill
from exactpack.io.tokenizers import Tokenizer
from exactpack.pipeline.budget import StreamBudget, read_limits
from exactpack.pipeline.options import PackOptions
from exactpack.pipeline.progress import Progress, progress_bar


@dataclass(eq=False)
class Corpus:
    """Documents ``0..N-1`` of an input as views (spilled or the input's own Arrow).

    ``chunks[c]`` holds documents ``first_rows[c] .. first_rows[c+1] - 1``;
    ``counts`` int64 [N] are their tokens. ``flagged``: some target is not
    supervised; ``named``: some document has an id other than its row number.
    """

    source: Input
    chunks: list[TokenChunk]
    first_rows: np.ndarray
    counts: np.ndarray
    binding: Binding
    flagged: bool
    named: bool
    eligible: int
    spill: Spill | None

    def __len__(self) -> int:
        return int(self.counts.shape[0])

    @property
    def tokens(self) -> int:
        return int(self.counts.sum())

    def chunk_of(self, docs: np.ndarray) -> np.ndarray:
        """The chunk holding each document, int64 [k]."""
        return np.searchsorted(self.first_rows, docs, "right") - 1

    def locate(self, doc: int) -> str:
        c = int(self.chunk_of(np.array([doc]))[0])
        return self.chunks[c].origin.locate(doc - int(self.first_rows[c]))

    def ids(self) -> pa.ChunkedArray:
        """Every document's id in order (the row number where the input has none)."""
        parts = [
            default_ids(np.arange(c.first_row, c.first_row + len(c))) if c.ids is None else c.ids
            for c in self.chunks
        ]
        return pa.chunked_array(parts, pa.string())

    def release(self) -> None:
        """Hand back the memory-mapped pages read so far (see :mod:`exactpack.io.spill`)."""
        if self.spill is not None:
            self.spill.release()
        self.source.release()

    def release_chunk(self, c: int) -> None:
        """Hand back the mapped pages of chunk ``c`` (its windows were just gathered)."""
        maps = (self.spill.mapped if self.spill is not None else []) + self.source.mapped
        chunk = self.chunks[c]
        for array in (chunk.tokens, chunk.offsets, chunk.flags):
            if maps and array is not None and array.size:
                address = array.__array_interface__["data"][0]
                for mapped in maps:
                    mapped.release_span(address, array.nbytes)

    def close(self) -> None:
        self.chunks = []
        if self.spill is not None:
            self.spill.close()
        self.source.close()


def _drop_default_ids(chunk: TokenChunk) -> TokenChunk:
    """``chunk`` without its id column when that only repeats the row numbers."""
    if chunk.ids is None:
        return chunk
    rows = default_ids(np.arange(chunk.first_row, chunk.first_row + len(chunk)))
    same = len(chunk.ids) == len(rows) and chunk.ids.cast(pa.string()).equals(rows)
    return replace(chunk, ids=None) if same else chunk


#: How many of the examples longer than a row an error names (all are counted).
NAMED_LONG = 3


def is_sft(table: pa.Table) -> bool:
    """Whether ``table``'s rows are rendered SFT rows (prompt/completion or messages)."""
    return "input_ids" not in table.column_names and bool(sft_columns(table.column_names))


def refuse_cut_sft(name: str) -> None:
    """``cut_long`` on an SFT row longer than a row: its later pieces would lose the prompt
    and earlier turns they answer, so it is refused (``truncation_mode`` keeps the start)."""
    raise InvalidInput(
        f"{name} is an SFT row (prompt/completion or messages) longer than a row: cut_long=True"
        " would train its later pieces without their prompt — raise max_length=, or keep its"
        " start with truncation_mode= ('keep_start')"
    )


@dataclass
class _TooLong:
    """The examples longer than a row, found chunk by chunk: counted, the first few named."""

    count: int = 0
    longest: int = 0  # tokens
    named: tuple[str, ...] = ()

    def take(self, chunk: TokenChunk, opts: PackOptions, sft: bool) -> None:
        long = np.flatnonzero(chunk.counts - 1 > opts.pair_capacity)
        if not long.size:
            return

        def label(i: int) -> str:
            name = example_label(chunk.first_row + i, chunk.id_of(i), 0, int(chunk.counts[i]))
            return f"{chunk.origin.locate(i)}: {name}"

        if sft and opts.cut_long:
            refuse_cut_sft(label(int(long[0])))
        if opts.cut_long or opts.truncation_mode is not None:
            return
        self.count += int(long.size)
        self.longest = max(self.longest, int(chunk.counts[long].max()))
        more = [f"{label(int(i))}, {int(chunk.counts[i]):,} tokens" for i in long[:NAMED_LONG]]
        self.named = (*self.named, *more)[:NAMED_LONG]

    def check(self, documents: int, opts: PackOptions) -> None:
        """One line for every example longer than a row, in the format's unit (tokens)."""
        if not self.count:
            return
        room = opts.pair_capacity + 1
        unit = "format trl: n tokens fill n cells" if opts.format == "trl" else (
            f"a row holds {opts.max_length:,} prediction pairs")  # fmt: skip
        rest = f"; and {self.count - len(self.named):,} more" if self.count > NAMED_LONG else ""
        raise OversizedExample(
            f"{self.count:,} of {documents:,} examples are longer than {room:,} tokens"
            f" (max_length {opts.max_length:,}; {unit}): {'; '.join(self.named)}{rest} — raise"
            f" max_length= (the longest, {self.longest:,} tokens, needs"
            f" {self.longest - room + opts.max_length:,}), cut them with cut_long=True, or"
            " truncate them with truncation_mode= ('keep_start' or 'keep_end')"
        )


#: Token bytes of a corpus kept in memory rather than spilled (without a budget): 32 M
#: ids, a 100 MB text corpus; below it memory costs less than writing and mapping a spill.
KEEP_BYTES = 128 << 20


class _Reading:
    """What :func:`read_corpus` accumulates: chunks kept up to ``keep_bytes``, then spilled."""

    def __init__(self, opts: PackOptions, vocab: int | None, digest: DataDigest | None,
                 persistent: bool, spill_dir: str | Path) -> None:  # fmt: skip
        self.opts, self.vocab, self.digest, self.persistent = opts, vocab, digest, persistent
        # kept in memory up to KEEP_BYTES, none under a budget (a budget counts no corpus)
        self.spill_dir, self.keep_bytes = spill_dir, 0 if opts.max_metadata_bytes else KEEP_BYTES
        self.counts: list[np.ndarray] = []
        self.flags: list[Any] = []  # per chunk: its target count, None when it has flags
        self.origins: list[Origin] = []
        self.firsts: list[int] = []
        self.kept: list[TokenChunk] = []
        self.spill: Spill | None = None
        self.documents = self.tokens = self.eligible = self.held = 0
        self.largest = -1
        self.named = False
        self.too_long = _TooLong()

    def take(self, chunk: TokenChunk, sft: bool) -> None:
        """Check ``chunk`` against the options and keep what the corpus needs of it
        (``sft``: its rows were rendered from prompt/completion or messages)."""
        if self.vocab is not None:
            chunk.check_vocabulary(self.vocab)
        elif chunk.tokens.size:
            largest = chunk.largest if chunk.largest >= 0 else int(chunk.tokens.max())
            self.largest = max(self.largest, largest)
        self.too_long.take(chunk, self.opts, sft)
        chunk = _drop_default_ids(chunk)
        targets = chunk.tokens.shape[0] - len(chunk)
        self.counts.append(chunk.counts)
        self.flags.append(targets if chunk.flags is None else None)
        self.named |= chunk.ids is not None
        self.origins.append(chunk.origin)
        self.firsts.append(chunk.first_row)
        if self.digest is not None:
            self.digest.tokens(chunk.tokens)
        self._hold(chunk)
        self.documents += len(chunk)
        self.tokens += int(chunk.tokens.shape[0])
        self.eligible += targets if chunk.flags is None else int(np.count_nonzero(chunk.flags))

    def _hold(self, chunk: TokenChunk) -> None:
        if self.spill is not None:
            self.spill.append(chunk)
            return
        if not self.persistent:  # own int32 ids, not the reader's buffers
            chunk = replace(chunk, tokens=chunk.tokens.astype(np.int32, copy=False))
            self.held += chunk.tokens.nbytes + chunk.offsets.nbytes
            self.held += 0 if chunk.flags is None else chunk.flags.nbytes
        self.kept.append(chunk)
        if not self.persistent and self.held > self.keep_bytes:
            self.spill = Spill(self.spill_dir)
            for kept in self.kept:
                self.spill.append(kept)
            self.kept = []

    def chunks(self) -> list[TokenChunk]:
        return self.spill.open(self.origins, self.firsts) if self.spill is not None else self.kept

    def close(self) -> None:
        self.kept = []
        if self.spill is not None:
            self.spill.close()


def read_corpus(
    source: str | Path | Any,
    opts: PackOptions,
    tokenizer: Tokenizer | None,
    *,
    show: bool = False,
    receipt: Callable[[Input], str | None] | None = None,
    spill_dir: str | Path | None = None,
    default_vocab: bool = False,
) -> Corpus:
    """Read, check, tokenize and spill ``source`` (see the module docstring).

    ``receipt(input)`` may supply the split receipt (None: the content digest).
    Pre-tokenized input without a vocabulary size or tokenizer is refused before reading,
    unless ``default_vocab`` (then the vocabulary is the largest id + 1). The budget
    (:class:`StreamBudget`) is checked before the first chunk and as documents are counted.
    """
    binding = None
    if opts.vocab_size is not None or tokenizer is not None or not default_vocab:
        binding = make_binding(lambda: "pending", **opts.binding_keywords(tokenizer))
    vocab = None if binding is None else binding.vocab_size
    source_input = open_input(source, opts.split, read_limits(opts))
    budget = StreamBudget.of(opts, "text" if tokenizer is not None else source_input.kind)
    budget.check(documents=source_input.rows or 0, what=f"{source_input.name}")
    given = (receipt(source_input) if receipt else None) or opts.split_id
    digest = None if given else DataDigest(opts.split)
    state = _Reading(opts, vocab, digest, source_input.persistent, spill_dir or ".")
    try:
        with progress_bar(source_input.bytes or None, "reading", "B", show, unit_scale=True) as bar:
            for table, origin in read_tables(source_input, opts.chunk_bytes, opts.text_field, bar):
                if table.num_rows:
                    chunk = chunk_from_arrow(
                        table, origin, tokenizer=tokenizer, text_field=opts.text_field,
                        partition=opts.split, objective=Objective.of(opts),
                    ).rebased(state.documents)  # fmt: skip
                    budget.check(documents=state.documents + len(chunk), what=source_input.name)
                    state.take(chunk, is_sft(table))
                done = f"{state.documents:,} docs, {state.tokens:,} tokens"
                bar.set_postfix_str(done, refresh=False)
        if not state.documents:
            raise InvalidInput(f"{source_input.name} holds no rows — nothing to pack")
        state.too_long.check(state.documents, opts)
        chunks = state.chunks()
        flags = [n if n is not None else c.flags for n, c in zip(state.flags, chunks, strict=True)]
        split_id = given or digest.finish(state.counts, flags)  # type: ignore[union-attr]
        if state.spill is not None:
            state.spill.release()
        if binding is None:  # default_vocab: the largest id read + 1
            binding = make_binding(
                lambda: split_id, vocab_size=state.largest + 1, tokenizer_id=opts.tokenizer_id
            )
        binding = replace(binding, split_id=split_id)
    except BaseException:
        state.close()
        source_input.close()
        raise
    first_rows = np.array([*state.firsts, state.documents], dtype=np.int64)
    return Corpus(
        source_input, chunks, first_rows, np.concatenate(state.counts), binding,
        None in state.flags, state.named, state.eligible, state.spill,
    )  # fmt: skip


def read_tables(
    source_input: Input, chunk_bytes: int, field: str, bar: Progress | None = None,
    on_read: Callable[[pa.Table], Any] | None = None,
) -> Iterator[tuple[pa.Table, Origin]]:  # fmt: skip
    """The one reader: ``source_input``'s chunks of about ``chunk_bytes`` in input order
    (``field``: a column to read besides the known ones), each read ahead on a helper thread
    while the one before is used, as (rows, :class:`Origin`); ``bar`` counts a chunk's input
    bytes as its consumer moves (:meth:`Progress.chunk`); ``on_read(table)`` sees each
    chunk first (a split receipt). Chunks may be empty."""
    for table, origin, size in read_ahead(source_input.chunks(chunk_bytes, field)):
        if on_read is not None:
            on_read(table)
        with bar.chunk(size) if bar is not None else contextlib.nullcontext():
            yield table, origin  # the bar moves as the chunk is tokenized


_END = object()


def read_ahead(items: Iterator[Any]) -> Iterator[Any]:
    """``items``, each produced by a helper thread while the previous one is used."""
    with ThreadPoolExecutor(1, thread_name_prefix="exactpack-read") as pool:
        ahead = pool.submit(next, items, _END)
        try:
            while (item := ahead.result()) is not _END:
                ahead = pool.submit(next, items, _END)
                yield item
        finally:
            with contextlib.suppress(BaseException):
                ahead.result()  # the helper is done with the generator before it closes
            close = getattr(items, "close", None)
            if close is not None:
                close()
