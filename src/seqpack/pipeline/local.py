"""The local pipeline: read -> plan -> materialise -> write (``seqpack pack``).

:func:`pack_path` is what ``seqpack pack`` runs on one machine: readers from
:mod:`seqpack.io`, any policy of :func:`seqpack.plan_rows`, compact rows
from :mod:`seqpack.core.compact`, the atomic writer of :mod:`seqpack.io.store`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from seqpack.core import budget
from seqpack.core.compact import CompactRows, compact_rows
from seqpack.core.config import PackConfig
from seqpack.core.errors import InvalidInput
from seqpack.core.examples import ExampleTable, split_long
from seqpack.core.plan import Plan
from seqpack.core.policies import plan_rows
from seqpack.io.claim import Claim, claim_output
from seqpack.io.documents import Documents, resolve_binding
from seqpack.io.readers import read_documents
from seqpack.io.store import write_packed
from seqpack.io.tokenizers import Tokenizer
from seqpack.pipeline.budget import check_budget, packing_bytes
from seqpack.pipeline.options import DEFAULT_POLICY, PackOptions
from seqpack.pipeline.progress import progress_bar, status
from seqpack.pipeline.report import duplicate_report


def pack_table(
    table: ExampleTable,
    capacity: int,
    policy: str = DEFAULT_POLICY,
    labels: Callable[[int], str] | None = None,
    *,
    max_metadata_bytes: int | None = None,
    **options: Any,
) -> tuple[Plan, CompactRows]:
    """Plan ``table`` with ``policy`` and materialise it as compact rows (in memory).

    ``labels(i)`` names example ``i`` in errors (default: :meth:`ExampleTable.label`).
    With ``max_metadata_bytes``, :func:`packing_bytes` is checked against it
    first: :class:`~seqpack.core.errors.BudgetExceeded` before anything is allocated.
    """
    if max_metadata_bytes is not None:
        budget.enforce(packing_bytes(table, capacity, policy), max_metadata_bytes, "packing")
    plan = plan_rows(table.lengths, capacity, policy, labels=labels or table.label, **options)
    return plan, compact_rows(table, plan)


def bind_examples(
    docs: Documents, options: PackOptions, tokenizer: Tokenizer | None
) -> tuple[ExampleTable, int]:
    """``docs`` bound as ``options`` say (vocabulary, tokenizer, split receipt) and, with
    ``split_long``, long sources cut into ranges: the examples to plan, and how many
    sources were split."""
    binding = resolve_binding(
        docs,
        options.partition,
        vocab_size=options.vocab_size,
        tokenizer=tokenizer,
        tokenizer_id=options.tokenizer_id,
        split_id=options.split_id,
    )
    table = docs.to_table(binding, options.partition)
    if not options.split_long:
        return table, 0
    return split_long(table, options.capacity)


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

    ``options`` (a :class:`~seqpack.pipeline.options.PackOptions`) and/or
    its fields as keywords (``capacity=4096, vocab_size=32000``) say how.
    ``source``: a ``.jsonl`` / ``.parquet`` file, a folder of shards, a
    ``datasets`` folder or an in-memory ``datasets.Dataset`` / Arrow table.

    Statistics: ``examples``, ``tokens`` (prediction pairs), ``rows``,
    ``lower_bound`` (``ceil(tokens / capacity)``), ``efficiency``,
    ``sources``, ``split_sources``, ``eligible_targets``, ``batches``,
    ``shards``, ``seconds``, ``duplicate_ids`` (rows whose id repeats an
    earlier row's; ``duplicate_first`` names the first) and ``recovered``
    (hidden folders of killed runs cleaned up at ``out``, see
    :func:`seqpack.io.atomic.recover_output`). ``max_metadata_bytes`` bounds
    :func:`packing_bytes` plus one padded model call, checked before planning.
    ``out`` is held from its first check to publication: a second writer at
    the same path is refused, naming this one.
    """
    opts = PackOptions.of(options, **overrides)
    with claim_output(out, opts.overwrite) as claim:
        return pack_claimed(source, claim, opts)


def pack_claimed(source: str | Path | Any, claim: Claim, opts: PackOptions) -> dict[str, Any]:
    """:func:`pack_path`'s work, holding the output path (``claim``, see
    :func:`seqpack.io.claim.claim_output`) from the first check to publication."""
    started = time.perf_counter()
    config = PackConfig(opts.capacity, opts.max_rows_per_batch)
    out = claim.path
    show = opts.show_progress(sys.stderr)
    say = status(show)
    tok = opts.load_tokenizer()
    say(f"reading {source}")
    docs = read_documents(
        source, tokenizer=tok, text_field=opts.text_field, partition=opts.partition
    )
    if not len(docs):
        raise InvalidInput(f"{source} holds no rows — nothing to pack")
    table, split = bind_examples(docs, opts, tok)
    check_budget(table, config, opts.policy, opts.max_metadata_bytes)
    say(f"planning {len(table):,} examples with {opts.policy}")

    def name(i: int) -> str:
        return table.label(i) if split else f"{docs.origin.locate(i)}: {table.label(i)}"

    plan, rows = pack_table(table, config.capacity, opts.policy, name, **opts.policy_options)
    stats = run_statistics(plan, docs, table, split) | {
        "batches": -(-plan.num_rows // config.max_rows_per_batch)
    }
    with progress_bar(plan.num_rows, "writing", "row", show) as bar:
        manifest = write_packed(
            rows,
            out,
            max_rows_per_batch=config.max_rows_per_batch,
            extra={
                "policy": opts.manifest_fields()["policy"],
                "statistics": stats,
                "input": {"source": str(source), "text_field": opts.text_field},
            },
            overwrite=opts.overwrite,
            shard_tokens=opts.shard_tokens,
            on_shard=bar.update,
        )
    return (
        stats
        | duplicate_report(docs.ids, docs.origin.locate)
        | {
            "shards": len(manifest["shards"]),
            "out": str(out),
            "recovered": claim.notes,
            "seconds": time.perf_counter() - started,
        }
    )
