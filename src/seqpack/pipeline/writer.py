"""A corpus planned whole and written shard by shard, each gathered from the spill.

After :func:`seqpack.pipeline.corpus.read_corpus`, :func:`plan_corpus` plans
every example of the corpus at once from its lengths (best-fit-decreasing
stays global), and :func:`gather_rows` builds the rows ``[a, b)`` of the
plan by gathering their windows, flags and ids from the corpus's chunks
(memory-mapped: only those windows are read). :func:`write_shards` writes
the shards (two compressed at once while the next is gathered), handing the
mapped pages back as each chunk's windows are copied, so memory holds at
most two shards, the lengths and the plan.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from seqpack.core.errors import OversizedExample
from seqpack.core.examples import long_ranges
from seqpack.core.gather import gather_into
from seqpack.core.plan import Plan
from seqpack.core.policies import plan_rows
from seqpack.io.atomic import Output
from seqpack.io.shards import (
    Layout,
    ShardColumns,
    call_bounds,
    default_ids,
    shard_table,
    write_shard_file,
)
from seqpack.io.trl_schema import trl_table
from seqpack.pipeline.budget import SHARDS_IN_FLIGHT, StreamBudget
from seqpack.pipeline.corpus import Corpus
from seqpack.pipeline.options import PackOptions


@dataclass(frozen=True, eq=False)
class Examples:
    """What is planned: example ``i`` is the window of ``lengths[i] + 1`` tokens starting at
    token ``starts[i]`` of document ``docs[i]`` (None: example ``i`` is document ``i``
    whole); ``split`` counts the documents cut by ``--split-long``."""

    lengths: np.ndarray
    docs: np.ndarray | None = None
    starts: np.ndarray | None = None
    split: int = 0


def corpus_examples(corpus: Corpus, opts: PackOptions, budget: StreamBudget) -> Examples:
    """The examples to plan; with ``split_long`` the budget is checked on the number of
    pieces before any document is split."""
    counts, capacity = corpus.counts, opts.pair_capacity
    long = counts - 1 > capacity
    if not (opts.split_long and long.any()):
        budget.check(len(corpus), len(corpus), what=f"{len(corpus):,} documents")
        return Examples(counts - 1)
    pieces = int(np.maximum(1, -(-(counts - 1) // capacity)).sum())
    budget.check(len(corpus), pieces, what=f"{pieces:,} pieces of {len(corpus):,} documents")
    docs, starts, ends = long_ranges(counts, capacity)
    return Examples(ends - starts - 1, docs, starts, int(long.sum()))


@dataclass(frozen=True, eq=False)
class Storage:
    """The plan in storage order: occurrence ``k`` (row by row, column by column) is
    example ``order[k]``; row ``r`` holds occurrences ``row_offsets[r]:row_offsets[r+1]``
    and starts after ``row_tokens[r]`` tokens."""

    plan: Plan
    order: np.ndarray
    row_offsets: np.ndarray
    row_tokens: np.ndarray

    @classmethod
    def of(cls, plan: Plan, window_extra: int = 1) -> Storage:
        """``plan`` in storage order; an example planned as ``plan.lengths[i]`` holds
        ``plan.lengths[i] + window_extra`` tokens (1: lengths are pairs; 0: tokens)."""
        key = plan.row_of * plan.capacity + plan.start_of
        if bool(np.all(key[1:] > key[:-1])):  # next-fit and padded keep the supplied order
            order = np.arange(key.shape[0], dtype=np.int64)
        else:
            order = np.argsort(key).astype(np.int64, copy=False)
        del key
        rows = plan.row_of[order]
        row_offsets = np.searchsorted(rows, np.arange(plan.num_rows + 1, dtype=np.int64))
        del rows
        tokens = np.zeros(order.shape[0] + 1, dtype=np.int64)
        np.cumsum(plan.lengths[order] + window_extra, out=tokens[1:])
        return cls(plan, order, row_offsets.astype(np.int64), tokens[row_offsets])

    def shard_bounds(self, max_rows_per_batch: int, shard_tokens: int) -> np.ndarray:
        return call_bounds(self.row_tokens, max_rows_per_batch, shard_tokens)


def plan_corpus(examples: Examples, opts: PackOptions, label: Callable[[int], str]) -> Storage:
    """Plan every example at once with the options' policy; the plan in storage order.

    With format trl the policy packs tokens (``pairs + 1`` per example) into
    ``capacity`` tokens, TRL's unit, and an example longer than that is an
    :class:`~seqpack.core.errors.OversizedExample` naming it (never cut)."""
    if opts.format != "trl":
        plan = plan_rows(
            examples.lengths, opts.capacity, opts.policy, labels=label, **opts.policy_options
        )
        return Storage.of(plan)
    tokens = token_lengths(examples.lengths, opts.capacity, label)
    plan = plan_rows(tokens, opts.capacity, opts.policy, labels=label, **opts.policy_options)
    return Storage.of(plan, window_extra=0)


def token_lengths(pairs: np.ndarray, capacity: int, label: Callable[[int], str]) -> np.ndarray:
    """Tokens per example (``pairs + 1``, TRL's unit), each checked against ``capacity``
    tokens: an :class:`~seqpack.core.errors.OversizedExample` names the first too long."""
    tokens = pairs + 1
    if tokens.size and int(tokens.max()) > capacity:
        i = int(np.argmax(tokens > capacity))
        raise OversizedExample(
            f"{label(i)} has {int(tokens[i])} tokens; capacity is {capacity} tokens"
            " (format trl counts tokens, TRL's max_length) — raise --max-length or split it"
            " with --split-long"
        )
    return tokens


def layout_for(corpus: Corpus, examples: Examples, format: str = "seqpack") -> Layout:
    """What a shard of the output may need gathered besides its required columns (each
    shard then stores what its content needs, :func:`seqpack.io.shards.layout_of`);
    TRL's schema needs only the targets' flags (for ``labels``)."""
    if format == "trl":
        return Layout(source_ids=False, loss_bits=corpus.flagged, example_ids=False, ranges=False)
    split = examples.split > 0
    return Layout(
        source_ids=corpus.named or split, loss_bits=corpus.flagged, example_ids=split, ranges=split
    )


def _by_chunk(corpus: Corpus, docs: np.ndarray) -> tuple[np.ndarray, list]:
    """Each document's row in its chunk, and the occurrences grouped by chunk."""
    chunk = corpus.chunk_of(docs)
    local = docs - corpus.first_rows[chunk]
    order = np.argsort(chunk, kind="stable")
    cuts = np.flatnonzero(np.diff(chunk[order])) + 1
    groups = [(int(chunk[g[0]]), g) for g in np.split(order, cuts) if g.size]
    return local, groups


def _source_ids(corpus: Corpus, docs: np.ndarray, local: np.ndarray, groups: list) -> pa.Array:
    parts, where = [], []
    for c, index in groups:
        ids = corpus.chunks[c].ids
        parts.append(default_ids(docs[index]) if ids is None else ids.take(_arrow(local[index])))
        where.append(index)
    placed = np.empty(docs.shape[0], dtype=np.int64)
    placed[np.concatenate(where)] = np.arange(docs.shape[0], dtype=np.int64)
    return pa.concat_arrays(parts).take(_arrow(placed)) if parts else pa.array([], pa.string())


def _arrow(indices: np.ndarray) -> pa.Array:
    """int64 indices as an Arrow array from their buffer: ``take`` of a NumPy array converts
    it with ``pa.array``, which imports pandas first (0.6-1.5 s of a fresh process here)."""
    values = np.ascontiguousarray(indices, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), values.shape[0], [None, pa.py_buffer(values)])


def gather_rows(
    corpus: Corpus, examples: Examples, storage: Storage, a: int, b: int, layout: Layout
) -> ShardColumns:
    """Rows ``[a, b)`` of the plan, gathered from the corpus (see the module docstring)."""
    o0, o1 = int(storage.row_offsets[a]), int(storage.row_offsets[b])
    ex = storage.order[o0:o1]
    lengths = examples.lengths[ex]
    docs = ex if examples.docs is None else examples.docs[ex]
    piece = None if examples.starts is None else examples.starts[ex]
    local, groups = _by_chunk(corpus, docs)
    windows = lengths + 1
    out_tok = np.zeros(ex.shape[0] + 1, dtype=np.int64)
    np.cumsum(windows, out=out_tok[1:])
    tokens = np.empty(int(out_tok[-1]), dtype=np.int32)
    mask = np.ones(int(lengths.sum()), dtype=bool) if layout.loss_bits else None
    for c, index in groups:
        part = corpus.chunks[c]
        first = part.offsets[local[index]] + (0 if piece is None else piece[index])
        gather_into(part.tokens, first, windows[index], tokens, out_tok[index])
        if mask is not None and part.flags is not None:
            targets = first - local[index]  # a document's targets start one before per document
            gather_into(part.flags, targets, lengths[index], mask, out_tok[index] - index)
        corpus.release_chunk(c)
    sources = _source_ids(corpus, docs, local, groups) if layout.source_ids else None
    cols = ShardColumns(
        first_row=a,
        row_offsets=storage.row_offsets[a : b + 1] - o0,
        tokens=tokens,
        lengths=lengths,
        starts=storage.plan.start_of[ex],
        ordinals=ex,
        loss_mask=mask,
        source_ids=sources,
    )
    if not layout.ranges:
        return cols
    starts = np.zeros_like(lengths) if piece is None else piece
    ends = starts + windows
    cut = (starts > 0) | (ends < corpus.counts[docs])
    names = pc.binary_join_element_wise(
        sources, "[", pc.cast(pa.array(starts), pa.string()), ":",
        pc.cast(pa.array(ends), pa.string()), "]", "",
    )  # fmt: skip
    return replace(
        cols,
        range_starts=starts,
        range_ends=ends,
        example_ids=pc.if_else(pa.array(cut), names, sources),
    )


def write_shards(
    corpus: Corpus,
    examples: Examples,
    storage: Storage,
    output: Output,
    opts: PackOptions,
    layout: Layout,
    on_shard: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Write every shard of the plan into ``output``; their manifest entries, in order.

    This thread gathers the shards (the kernels release the GIL) and
    :data:`SHARDS_IN_FLIGHT` writer threads compress them, a shard gathered
    only when fewer than that many are alive: at most that many shards are
    in memory, and two compress at once. A single shard is written here, where
    signals arrive. ``on_shard(entry)`` reports each shard written, in order;
    a failing write stops the run at the next shard.
    """
    spans = list(
        itertools.pairwise(storage.shard_bounds(opts.max_rows_per_batch, opts.shard_tokens))
    )

    to_table = trl_table if opts.format == "trl" else shard_table

    def build(k: int) -> pa.Table:
        table = to_table(gather_rows(corpus, examples, storage, *spans[k], layout))
        corpus.release()  # the windows are copied out: hand the mapped pages back
        return table

    folder, name = output.path, output.shard
    if len(spans) <= 1:
        entries = [
            write_shard_file(build(k), folder, name(k), spans[k][0]) for k in range(len(spans))
        ]
        for entry in entries if on_shard is not None else ():
            on_shard(entry)
        return entries
    slots = threading.BoundedSemaphore(SHARDS_IN_FLIGHT)
    futures: list[Future] = []
    reported = 0

    def write(k: int, table: pa.Table) -> dict[str, Any]:
        try:
            return write_shard_file(table, folder, name(k), spans[k][0])
        finally:
            slots.release()

    def report() -> None:
        nonlocal reported
        while reported < len(futures) and futures[reported].done():
            entry = futures[reported].result()  # raises a writer's error here
            reported += 1
            if on_shard is not None:
                on_shard(entry)

    with ThreadPoolExecutor(SHARDS_IN_FLIGHT, thread_name_prefix="seqpack-write") as pool:
        try:
            for k in range(len(spans)):
                slots.acquire()
                try:
                    report()
                    table = build(k)
                except BaseException:
                    slots.release()
                    raise
                futures.append(pool.submit(write, k, table))
                del table
            for future in futures:
                future.result()
            report()
        except BaseException:
            for future in futures:
                future.cancel()
            raise
    return [future.result() for future in futures]
