"""The local pipeline (``exactpack pack``): :func:`pack_path` reads a corpus chunk by chunk
(:mod:`exactpack.pipeline.corpus`), plans it whole and writes it shard by shard
(:mod:`exactpack.pipeline.writer`); :func:`pack_table` is the same in memory (a Ray block)."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from exactpack.core import config as budget
from exactpack.core.binding import Binding
from exactpack.core.compact import CompactRows, compact_rows
from exactpack.core.errors import InvalidInput, path_argument
from exactpack.core.examples import ExampleTable, cut_long
from exactpack.core.plan import Plan
from exactpack.core.policies import plan_rows
from exactpack.io.atomic import Output, open_output
from exactpack.io.documents import Documents, make_binding
from exactpack.io.integrity import refuse_packed
from exactpack.io.readers import open_input
from exactpack.io.shards import FORMAT, VERSION, manifest_record
from exactpack.io.store import write_shards
from exactpack.io.tokenizers import Tokenizer
from exactpack.io.trl_schema import TRL_FORMAT, TRL_VERSION
from exactpack.pipeline.budget import StreamBudget, packing_bytes, read_limits, split_bytes
from exactpack.pipeline.corpus import read_corpus
from exactpack.pipeline.options import DEFAULT_POLICY, PackOptions, check_pad_id
from exactpack.pipeline.pack_tree import (
    TRL_REFUSAL,
    PlannedBlock,
    split_receipt,
    tree_blocks,
    tree_manifest,
    whole_groups,
)
from exactpack.pipeline.progress import progress_bar, status
from exactpack.pipeline.writer import (
    CorpusSource,
    corpus_examples,
    layout_for,
    plan_corpus,
    shard_spans,
    source_stats,
    write_corpus,
)


def duplicate_ids(ids: np.ndarray) -> tuple[int, int, int]:
    """Rows whose id repeats an earlier row's: ``(count, first such row, the row it repeats)``,
    ``(0, -1, -1)`` when every id is distinct."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = ids if isinstance(ids, (pa.Array, pa.ChunkedArray)) else pa.array(ids, type=pa.string())
    if pc.count_distinct(arr).as_py() == len(arr):
        return 0, -1, -1
    codes = pc.index_in(arr, value_set=pc.unique(arr)).to_numpy(zero_copy_only=False)
    seen = np.maximum.accumulate(codes)
    new = np.ones(codes.shape[0], dtype=bool)
    new[1:] = codes[1:] > seen[:-1]
    repeat = int(np.argmax(~new))
    return int((~new).sum()), repeat, int(np.argmax(codes == codes[repeat]))


def duplicate_report(ids: Any, locate: Callable[[int], str]) -> dict[str, Any]:
    """``duplicate_ids`` and, when some repeat, ``duplicate_first`` (its id, where, first seen)
    of ``ids`` (every input row's, NumPy or Arrow strings); ``locate(row)`` names a row."""
    count, row, first = duplicate_ids(ids)
    if not count:
        return {"duplicate_ids": 0}
    return {
        "duplicate_ids": count,
        "duplicate_first": {"id": _text(ids[row]), "at": locate(row), "first_seen": locate(first)},
    }


def _text(value: Any) -> str:
    return str(value.as_py() if hasattr(value, "as_py") else value)


def pack_table(
    table: ExampleTable,
    max_length: int,
    policy: str = DEFAULT_POLICY,
    labels: Callable[[int], str] | None = None,
    *,
    max_metadata_bytes: int | None = None,
    **options: Any,
) -> tuple[Plan, CompactRows]:
    """Plan ``table`` into rows of ``max_length`` cells with ``policy`` and materialise it as
    compact rows (in memory).

    ``labels(i)`` names example ``i`` in errors (default: :meth:`ExampleTable.label`).
    With ``max_metadata_bytes``, :func:`packing_bytes` over it is
    :class:`~exactpack.core.errors.BudgetExceeded` before anything is allocated.
    """
    if max_metadata_bytes is not None:
        need = packing_bytes(table, max_length, policy, options)
        budget.enforce(need, max_metadata_bytes, "packing")
    plan = plan_rows(table.lengths, max_length, policy, labels=labels or table.label, **options)
    return plan, compact_rows(table, plan)


def bind_examples(
    docs: Documents, options: PackOptions, tokenizer: Tokenizer | None
) -> tuple[ExampleTable, int]:
    """``docs`` bound as ``options`` say, long sources cut with ``cut_long``; (examples, splits)."""
    binding = make_binding(
        lambda: docs.digest(options.split), **options.binding_keywords(tokenizer)
    )
    table = docs.to_table(binding, options.split)
    if not options.cut_long:
        return table, 0
    if options.max_metadata_bytes is not None:
        need = split_bytes(table.offsets, options.capacity, options.policy, options.policy_options)
        budget.enforce(need, options.max_metadata_bytes, "splitting and packing the sources")
    return cut_long(table, options.capacity)


def run_statistics(plan: Plan, docs: Documents, table: ExampleTable, split: int) -> dict[str, Any]:
    """What a packing reports: the plan's statistics, sources, splits and eligible targets."""
    return plan.stats() | {
        "sources": len(docs),
        "split_sources": split,
        "eligible_targets": int(table.loss_mask.sum()),
    }


def pack_path(
    source: str | Path | Any,
    out: str | Path,
    options: PackOptions | None = None,
    /,
    **overrides: Any,
) -> dict[str, Any]:
    """Pack ``source`` into the packed directory ``out``; return the statistics.

    ``options`` (a :class:`~exactpack.pipeline.options.PackOptions`) and/or its fields as
    keywords say how. ``source``: a ``.jsonl`` / ``.parquet`` file, a folder of shards, a
    ``datasets`` folder or an in-memory ``datasets.Dataset`` / Arrow table. Memory: one
    read chunk, two output shards and the lengths (``max_metadata_bytes`` bounds it all,
    :class:`~exactpack.pipeline.budget.StreamBudget`); the spill goes to ``spill_dir``.

    Statistics: ``examples``, ``tokens`` (prediction pairs), ``rows``, ``lower_bound``,
    ``efficiency``, ``sources``, ``split_sources``, ``eligible_targets``, ``batches``,
    ``shards``, ``input_tokens``, ``seconds``, ``tokens_per_s``, ``duplicate_ids`` (and
    ``duplicate_first``) and ``recovered`` (:mod:`exactpack.io.atomic`'s notes). A second
    writer at ``out`` is refused while this one holds it.
    """
    opts = PackOptions.of(options, **overrides)
    path_argument("out", out)  # its type; the value is checked where it is opened
    if isinstance(source, (str, Path)) and os.path.exists(source):
        refuse_packed(Path(source))  # before any other complaint about it
    with open_output(out, opts.overwrite, inputs=[source]) as output:
        return pack_into(source, output, opts)


def pack_into(source: str | Path | Any, output: Output, opts: PackOptions) -> dict[str, Any]:
    """:func:`pack_path`'s work into the held ``output`` (see :func:`open_output`): the one
    pipeline, flat (:func:`_pack_corpus`) or tree (``opts.tree``: :func:`_pack_forest`)."""
    started = time.perf_counter()
    tok = opts.load_tokenizer()
    show = opts.show_progress(sys.stderr)
    status(show)(f"reading {source}")
    pack = _pack_corpus if opts.tree is None else _pack_forest
    stats = pack(source, output, opts, tok, show)
    seconds = time.perf_counter() - started
    if "input_tokens" in stats:
        stats["tokens_per_s"] = stats["input_tokens"] / seconds if seconds > 0 else 0.0
    return stats | {"out": str(output.path), "recovered": output.notes, "seconds": seconds}


def _pack_forest(
    source: str | Path | Any, output: Output, opts: PackOptions, tok: Tokenizer | None, show: bool
) -> dict[str, Any]:
    """Tree-pack ``source`` block by block (:mod:`exactpack.pipeline.pack_tree`: blocks of
    whole groups from the one reader, each block's tries planned as units) into ``output``
    and commit; the statistics (``sequences``, ``groups``, ``tries``, ``nodes``,
    ``tokens_stored``, ``tokens_flat``, ``stored_over_flat``, ``eligible_targets``, ``rows``,
    ``batches``, ``blocks``, ``capacity``, ``policy``, ``tree``, ``shards``)."""
    if opts.format == "trl":
        raise InvalidInput(TRL_REFUSAL)
    source_input = open_input(source, opts.split, read_limits(opts))
    budget_ = StreamBudget.of(opts, "text" if tok is not None else source_input.kind)
    budget_.check(what="one block of groups")  # the policy's look-ahead before anything is read
    binding = make_binding(lambda: "pending", **opts.binding_keywords(tok))
    hasher, digest = split_receipt(opts)
    totals: Counter[str] = Counter()
    shards: list[dict[str, Any]] = []
    with progress_bar(source_input.bytes or None, "packing", "B", show, unit_scale=True) as bar:
        blocks = whole_groups(source_input, opts, bar, digest)
        for groups, index, carried in tree_blocks(blocks, opts, binding, tok):
            block = PlannedBlock.of(groups, index, carried, opts, budget_)
            first = totals["rows"]
            gather = lambda a, b, f=first, k=block: k.table(a - f, b - f, f)  # noqa: E731
            shards += write_shards(gather, block.bounds + first, output, first_shard=len(shards))
            totals.update(block.counts())
            bar.set_postfix_str(f"{totals['rows']:,} rows, {totals['sequences']:,} sequences")
    if not totals:
        raise InvalidInput(f"{source_input.name}: holds no rows — nothing to pack")
    final = Binding(binding.vocab_size, binding.tokenizer_id, opts.split_id or hasher.hexdigest())
    manifest = tree_manifest(opts, final, dict(totals), shards, source_input.name)
    output.commit(manifest)
    return manifest["statistics"] | {"shards": len(shards)}


def _pack_corpus(
    source: str | Path | Any, output: Output, opts: PackOptions, tok: Tokenizer | None, show: bool
) -> dict[str, Any]:
    """Read ``source`` out of core (:func:`read_corpus`), plan it whole, write its shards into
    ``output`` and commit; the statistics."""
    spill_dir = Path(opts.spill_dir) if opts.spill_dir else output.path.absolute().parent
    corpus = read_corpus(source, opts, tok, show=show, spill_dir=spill_dir)
    with contextlib.closing(corpus):
        pad = check_pad_id(opts, corpus.binding.vocab_size, tok)  # before anything is planned
        budget_ = StreamBudget.of(opts, "text" if tok is not None else corpus.source.kind)
        examples = corpus_examples(corpus, opts, budget_)
        status(show)(f"planning {examples.lengths.shape[0]:,} examples with {opts.policy}")
        with progress_bar(examples.lengths.shape[0], "planning", "example", show) as bar:
            storage = plan_corpus(examples, opts)
            bar.update(examples.lengths.shape[0])
        plan = storage.plan
        bounds = storage.row_offsets[shard_spans(storage, opts)]
        widest = int(np.diff(bounds).max()) if bounds.shape[0] > 1 else 0
        budget_.check(len(corpus), len(examples.lengths), widest, what=f"{len(corpus):,} documents")
        source_ = CorpusSource(
            corpus, examples, layout_for(corpus, examples, opts.format), opts.split
        )
        stats = (
            plan.stats()
            | source_stats(corpus, examples)
            | {
                "eligible_targets": corpus.eligible,
                "batches": -(-plan.num_rows // opts.max_rows_per_batch),
            }
        )
        written: Counter[str] = Counter()

        def on_shard(entry: dict[str, Any]) -> None:
            written.update(rows=entry["rows"], tokens=entry["tokens"])
            bar.update(4 * entry["tokens"])
            bar.set_postfix_str(f"{written['rows']:,} rows, {written['tokens']:,} tokens")

        total = 4 * int(storage.row_tokens[-1])
        with progress_bar(total, "writing", "B", show, unit_scale=True) as bar:
            shards = write_corpus(source_, storage, output, opts, on_shard)
        if examples.truncated:  # what the kept windows supervise, counted as written
            stats["eligible_targets"] = sum(entry["eligible"] for entry in shards)
        output.commit(manifest_record(
            binding=corpus.binding, partition=opts.split, shards=shards,
            kind=(TRL_FORMAT, TRL_VERSION) if opts.format == "trl" else (FORMAT, VERSION),
            rows=plan.num_rows, occurrences=len(examples.lengths), **opts.manifest_fields(pad),
            statistics=stats, input={"source": str(source), "text_field": opts.text_field},
        ))  # fmt: skip
        report = duplicate_report(corpus.ids(), corpus.locate) if corpus.named else {}
    return (
        stats
        | ({"duplicate_ids": 0} | report)
        | {"shards": len(shards), "input_tokens": corpus.tokens}
    )
