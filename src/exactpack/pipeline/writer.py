"""A read corpus planned whole (:func:`plan_corpus`), then gathered shard by shard from its
chunks (:class:`CorpusSource`) and written (:func:`write_corpus`): memory holds at most
two shards, the lengths and the plan."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from exactpack.core.binding import Split
from exactpack.core.compact import CompactRows, Storage, gather_into, gather_rows
from exactpack.core.examples import long_ranges, offsets_of
from exactpack.core.policies import plan_lengths
from exactpack.io.atomic import Output
from exactpack.io.shards import StoredColumns, call_bounds, default_ids
from exactpack.io.store import write_shards
from exactpack.pipeline.budget import StreamBudget
from exactpack.pipeline.corpus import Corpus
from exactpack.pipeline.options import PackOptions


@dataclass(frozen=True, eq=False)
class Examples:
    """What is planned: example ``i`` is the window of ``lengths[i] + 1`` tokens starting at
    token ``starts[i]`` of document ``docs[i]`` (None: example ``i`` is document ``i``
    whole); ``split`` counts the documents cut by ``--cut-long``, ``truncated`` those cut
    to one window by ``--truncation-mode`` and ``dropped`` the tokens it left out."""

    lengths: np.ndarray
    docs: np.ndarray | None = None
    starts: np.ndarray | None = None
    split: int = 0
    truncated: int = 0
    dropped: int = 0


def corpus_examples(corpus: Corpus, opts: PackOptions, budget: StreamBudget) -> Examples:
    """The examples to plan (with ``cut_long``, the budget checked on the pieces first)."""
    counts, capacity = corpus.counts, opts.pair_capacity
    long = counts - 1 > capacity
    if not (opts.cut_long and long.any()):
        budget.check(len(corpus), len(corpus), what=f"{len(corpus):,} documents")
        if opts.truncation_mode is None or not long.any():
            return Examples(counts - 1)
        # one window of capacity + 1 tokens: the first (keep_start) or the last (keep_end)
        keep_end = opts.truncation_mode == "keep_end"
        starts = np.where(long & keep_end, counts - capacity - 1, 0)
        docs = np.arange(len(counts), dtype=np.int64)
        dropped = int((counts[long] - capacity - 1).sum())
        return Examples(np.minimum(counts - 1, capacity), docs, starts, 0, int(long.sum()), dropped)
    pieces = int(np.maximum(1, -(-(counts - 1) // capacity)).sum())
    budget.check(len(corpus), pieces, what=f"{pieces:,} pieces of {len(corpus):,} documents")
    docs, starts, ends = long_ranges(counts, capacity)
    return Examples(ends - starts - 1, docs, starts, int(long.sum()))


def source_stats(corpus: Corpus, examples: Examples) -> dict[str, int]:
    """The report's counts of sources: read, cut by ``cut_long``, cut short by
    ``truncation_mode`` (and the tokens that left out)."""
    out = {"sources": len(corpus), "split_sources": examples.split}
    if examples.truncated:
        out |= {"truncated_sources": examples.truncated, "truncated_tokens": examples.dropped}
    return out


def plan_corpus(examples: Examples, opts: PackOptions) -> Storage:
    """Plan every example at once with the options' policy; the plan in storage order.

    With format trl the policy packs tokens (``pairs + 1`` per example); every example
    fits (:func:`~exactpack.pipeline.corpus.read_corpus` refused the corpus otherwise)."""
    trl = opts.format == "trl"
    lengths = examples.lengths + 1 if trl else examples.lengths
    plan = plan_lengths(lengths, opts.capacity, opts.policy, opts.policy_options)
    return Storage.of(plan, 0 if trl else 1)


def layout_for(corpus: Corpus, examples: Examples, format: str = "exactpack") -> StoredColumns:
    """What a shard may need gathered besides its required columns (for TRL: the flags)."""
    split = format != "trl" and (examples.split > 0 or examples.truncated > 0)
    named = format != "trl" and (corpus.named or split)  # TRL's schema has no id columns
    return StoredColumns(
        source_ids=named, loss_bits=corpus.flagged, example_ids=split, ranges=split
    )


def _arrow(indices: np.ndarray) -> pa.Array:
    """int64 indices as an Arrow array from their buffer: ``take`` of a NumPy array converts
    it with ``pa.array``, which imports pandas first (0.6-1.5 s of a fresh process here)."""
    values = np.ascontiguousarray(indices, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), values.shape[0], [None, pa.py_buffer(values)])


class CorpusSource:
    """A read corpus as a TokenSource of ``examples``, gathering what ``layout`` stores."""

    def __init__(self, corpus: Corpus, examples: Examples, layout: StoredColumns, partition: Split):
        self.corpus, self.examples, self.layout = corpus, examples, layout
        self.lengths, self.binding, self.partition = examples.lengths, corpus.binding, partition

    def take(self, ex: np.ndarray, contiguous: bool) -> tuple[np.ndarray, dict[str, Any]]:
        corpus, examples, layout = self.corpus, self.examples, self.layout
        lengths = examples.lengths[ex]
        docs = ex if examples.docs is None else examples.docs[ex]
        piece = None if examples.starts is None else examples.starts[ex]
        chunk = corpus.chunk_of(docs)
        local = docs - corpus.first_rows[chunk]
        by_chunk = np.argsort(chunk, kind="stable")
        cuts = np.flatnonzero(np.diff(chunk[by_chunk])) + 1
        groups = [(int(chunk[g[0]]), g) for g in np.split(by_chunk, cuts) if g.size]
        windows = lengths + 1
        out_tok = offsets_of(windows)
        tokens = np.empty(int(out_tok[-1]), dtype=np.int32)
        mask = np.ones(int(lengths.sum()), dtype=bool) if layout.loss_bits else None
        ids = []
        for c, index in groups:
            part = corpus.chunks[c]
            first = part.offsets[local[index]] + (0 if piece is None else piece[index])
            gather_into(part.tokens, first, windows[index], tokens, out_tok[index])
            if mask is not None and part.flags is not None:
                targets = first - local[index]  # a document's targets start one before per document
                gather_into(part.flags, targets, lengths[index], mask, out_tok[index] - index)
            if layout.source_ids:
                ids.append(
                    default_ids(docs[index])
                    if part.ids is None
                    else part.ids.take(_arrow(local[index]))
                )
            corpus.release_chunk(c)
        parts: dict[str, Any] = {"loss_mask": mask}
        if not layout.source_ids:
            return tokens, parts
        placed = np.argsort(by_chunk)  # the groups' documents back in the examples' order
        sources = pa.concat_arrays(ids).take(_arrow(placed)) if ids else pa.array([], pa.string())
        parts["source_ids"] = sources
        if not layout.ranges:
            return tokens, parts
        starts = np.zeros_like(lengths) if piece is None else piece
        ends = starts + windows
        cut = (starts > 0) | (ends < corpus.counts[docs])
        names = pc.binary_join_element_wise(
            sources, "[", pc.cast(pa.array(starts), pa.string()), ":",
            pc.cast(pa.array(ends), pa.string()), "]", "",
        )  # fmt: skip
        example_ids = pc.if_else(pa.array(cut), names, sources)
        return tokens, parts | dict(range_starts=starts, range_ends=ends, example_ids=example_ids)


def shard_spans(storage: Storage, opts: PackOptions) -> np.ndarray:
    """Row bounds of the output's shards: whole model calls, about ``shard_tokens`` each."""
    return call_bounds(storage.row_tokens, opts.max_rows_per_batch, opts.shard_tokens)


def write_corpus(
    source: CorpusSource,
    storage: Storage,
    output: Output,
    opts: PackOptions,
    on_shard: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Every shard of the plan gathered from the corpus and written into ``output``."""

    def gather(a: int, b: int) -> CompactRows:
        rows = gather_rows(source, storage, a, b)
        source.corpus.release()  # the windows are copied out: hand the mapped pages back
        return rows

    return write_shards(gather, shard_spans(storage, opts), output, opts.format, on_shard)
