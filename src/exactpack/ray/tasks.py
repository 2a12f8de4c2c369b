"""The two Ray tasks: read, tokenize and plan one block; write one output shard.

Both are plain functions of their arguments, so a task Ray retries computes the same
thing; each reports where and how long it ran (``node``, ``node_ip``, ``*_seconds``: the
manifest's ``engine`` section, never the shards). A task sizes the tokenizer's Rust pool
to its CPUs (:func:`limit_tokenizer_threads`) and encodes with ``encode_batch_fast``.
"""

from __future__ import annotations

import math
import os
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from exactpack.core.binding import Binding
from exactpack.core.config import PackConfig
from exactpack.core.examples import example_label, offsets_of
from exactpack.core.supervision import Objective
from exactpack.io.columns import check_split, chunk_from_arrow
from exactpack.io.documents import Documents
from exactpack.io.shards import (
    FULL,
    arrow_to_rows,
    list_array,
    numpy_array,
    shard_bounds,
    shard_table,
    write_shard_file,
)
from exactpack.pipeline.budget import StreamBudget, check_budget, read_limits
from exactpack.pipeline.local import bind_examples, pack_table, run_statistics
from exactpack.pipeline.options import PackOptions
from exactpack.pipeline.pack_tree import PlannedBlock, tree_blocks
from exactpack.ray.blocks import Block, block_origin, block_table
from exactpack.ray.ray_options import TaskHook


def _ray_worker() -> Any:
    """The ``ray`` module when this process is a connected Ray worker or driver, else None."""
    ray = sys.modules.get("ray")
    return ray if ray is not None and ray.is_initialized() else None


def node_of_task() -> dict[str, str]:
    """``{"node": Ray node id (hex), "node_ip": its address}``; off Ray, the host name."""
    ray = _ray_worker()
    if ray is None:
        return {"node": socket.gethostname(), "node_ip": ""}
    return {
        "node": ray.get_runtime_context().get_node_id(),
        "node_ip": ray.util.get_node_ip_address(),
    }


def limit_tokenizer_threads() -> None:
    """Size the Rust thread pool (``RAYON_NUM_THREADS``, unless set) to the task's CPUs, as
    Ray does for OpenMP (else ``n`` one-CPU tasks each start ``n`` threads)."""
    ray = _ray_worker()
    if ray is None or "RAYON_NUM_THREADS" in os.environ:
        return
    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
    os.environ["RAYON_NUM_THREADS"] = str(max(1, math.floor(cpus)))


@dataclass(frozen=True)
class Settings:
    """What every task gets, once, through the object store: the options (the tokenizer
    loaded on the driver pickles with them: no worker reads its path), the binding (its
    split receipt pending) and the task hook."""

    options: PackOptions
    hook: TaskHook | None = None
    binding: Binding | None = None


def plan_block(
    block: Block, settings: Settings, *tables: pa.Table
) -> tuple[dict[str, Any], pa.Table]:
    """Task 1: the local pipeline on one block; its statistics and rows (Arrow): compact
    rows, or forest rows with ``--tree`` (:func:`plan_tries`).

    The statistics carry ``examples``, ``rows``, ``tokens`` and ``cuts`` (the driver's
    layout), ``ids`` (the block's example ids, Arrow strings in row order), the node, the
    read / tokenize / plan seconds and ``plan_cpu_seconds`` (all three).
    """
    started, cpu = time.perf_counter(), time.process_time()
    limit_tokenizer_threads()
    plan = plan_tries if settings.options.tree is not None else plan_examples
    stats, out, read, tokenized = plan(block, settings, tables)
    stats |= {
        **node_of_task(),
        "read_seconds": read - started,
        "tokenize_seconds": tokenized - read,
        "plan_seconds": time.perf_counter() - tokenized,
        "plan_cpu_seconds": time.process_time() - cpu,
    }
    if settings.hook is not None:
        settings.hook("plan", block.index)
    return stats, out


def plan_examples(
    block: Block, settings: Settings, tables: Sequence[pa.Table]
) -> tuple[dict[str, Any], pa.Table, float, float]:
    """A flat block: (statistics, compact rows, when read, when tokenized)."""
    opts = settings.options
    tokenizer = opts.load_tokenizer()
    table, origin = block_table(block, opts.text_field, tables, read_limits(opts))
    read = time.perf_counter()
    chunk = chunk_from_arrow(
        table, origin, tokenizer=tokenizer, text_field=opts.text_field, objective=Objective.of(opts)
    )
    docs = Documents.from_chunks([chunk], origin)
    check_split(table, origin, opts.split, docs.ids)
    tokenized = time.perf_counter()
    examples, split = bind_examples(docs, opts, tokenizer)
    names = ", ".join(dict.fromkeys(p.name for p in block.pieces))
    check_budget(  # the local max_metadata_bytes check, for this block alone
        examples,
        PackConfig(opts.capacity, opts.max_rows_per_batch),
        opts.policy,
        opts.max_metadata_bytes,
        where=f"block {block.index} ({names}, input rows {block.first:,}.."
        f"{block.first + len(docs) - 1:,}): ",
        fix="use fewer examples per block (--block-examples): on Ray the budget applies per block",
        options=opts.policy_options,
    )

    def name(i: int) -> str:
        if split:
            return f"block {block.index}: {examples.label(i)}"
        ex = examples.example(i)
        return f"{origin.locate(i)}: {example_label(block.first + i, ex.example_id, *ex.range)}"

    plan, rows = pack_table(examples, opts.capacity, opts.policy, name, **opts.policy_options)
    cuts = shard_bounds(rows, opts.max_rows_per_batch, opts.shard_tokens)[1:-1]
    out = shard_table(rows, FULL)  # the shard's writer drops what its rows can derive
    stats = run_statistics(plan, docs, examples, split) | {
        "split_id": examples.binding.split_id,
        "cuts": cuts.tolist(),
        "ids": pa.array(docs.ids, type=pa.string()),
    }
    return stats, out, read, tokenized


def plan_tries(
    block: Block, settings: Settings, tables: Sequence[pa.Table]
) -> tuple[dict[str, Any], pa.Table, float, float]:
    """A ``--tree`` block (read by the driver, its groups whole): its groups' tries planned
    with the run's policy as the local engine plans a block (:class:`PlannedBlock`);
    sequence indexes count from the block's first sequence."""
    opts = settings.options
    tokenizer = opts.load_tokenizer()
    read = time.perf_counter()
    blocks = [(tables[0], block_origin(block))]
    groups, index, carried = next(tree_blocks(blocks, opts, settings.binding, tokenizer))
    tokenized = time.perf_counter()
    budget = StreamBudget.of(opts, "text" if tokenizer is not None else "table")
    planned = PlannedBlock.of(groups, index, carried, opts, budget)
    counts = planned.counts()
    stats = counts | {
        "examples": counts["sequences"],
        "tokens": counts["tokens_stored"],
        "cuts": planned.bounds[1:-1].tolist(),
        "ids": pa.array([], type=pa.string()),
    }
    return stats, planned.table(0, planned.plan.num_rows), read, tokenized


def write_shard(
    folder: str,
    name: str,
    index: int,
    first_row: int,
    spans: tuple[tuple[int, int, int], ...],
    settings: Settings,
    *tables: pa.Table,
) -> dict[str, Any]:
    """Task 2: rows ``[a, b)`` of each planned block (ordinals + offset) as shard ``index``,
    the file ``folder/name``; its manifest entry plus ``node``, ``node_ip`` and timings."""
    started, cpu = time.perf_counter(), time.process_time()
    opts = settings.options
    parts = [t.slice(a, b - a) for (a, b, _), t in zip(spans, tables, strict=True)]
    table = renumbered(parts, [e for *_, e in spans], first_row)
    if "node_ids" not in table.column_names:  # flat rows: checked, stored as every writer stores
        table = shard_table(arrow_to_rows(table, capacity=opts.capacity, partition=opts.split,
                                          binding=settings.binding, where=name))  # fmt: skip
    entry = write_shard_file(table, folder, name, first_row) | {
        **node_of_task(),
        "write_seconds": time.perf_counter() - started,
        "write_cpu_seconds": time.process_time() - cpu,
    }
    if settings.hook is not None:
        settings.hook("write", index)
    return entry


def renumbered(parts: list[pa.Table], firsts: list[int], first_row: int) -> pa.Table:
    """Rows of several blocks as one shard: rows numbered from ``first_row``, each block's
    ordinals (forest rows: ``sequence_index``) moved up by its first example (``firsts``)."""
    table = pa.concat_tables(parts).combine_chunks()
    name = "sequence_index" if "node_ids" in table.column_names else "ordinals"
    lengths = pc.list_value_length(table[name]).to_numpy(zero_copy_only=False).astype(np.int64)
    moved = np.repeat(np.repeat(firsts, [p.num_rows for p in parts]), lengths)
    values = pc.list_flatten(table[name]).to_numpy(zero_copy_only=False) + moved
    table = table.set_column(
        0, "row", numpy_array(np.arange(table.num_rows) + first_row, pa.int64())
    )
    at = table.column_names.index(name)
    return table.set_column(at, name, list_array(offsets_of(lengths), values, pa.int64()))
