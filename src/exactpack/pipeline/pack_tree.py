"""``exactpack pack --tree`` / ``stats --tree``: the one reader's chunks -> blocks of
whole groups -> tries -> units planned -> forest rows, written by the one writer.

:func:`whole_groups` is the one reader (:func:`~exactpack.pipeline.corpus.read_tables`)
through a block adapter (blocks of ``tree_block`` rows or ``chunk_bytes``; rows of
the last ``group`` of a block wait for the next, so a group is never split), and
:func:`block_groups` makes a block's groups. :class:`PlannedBlock` plans a block's tries
as units, as flat examples are planned (a flat example is a one-node trie:
``plan_rows(layout.sizes)``) and makes its shards' tables
(:func:`~exactpack.io.shards.shard_table`). ``pack_path(..., tree=...)``
(:mod:`exactpack.pipeline.local`) runs it block by block: memory holds one block and two
shards, the budget (``max_metadata_bytes``) is checked before each block is planned, and
the output is the packed-row format with the node columns (``"layout": "tree"``), opened
by ``load_packed``. A model call never straddles a shard. The ``--tree*`` flags are
fields of :class:`~exactpack.pipeline.options.PackOptions` (``tree``, ``tree_prefix``,
``tree_block``).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from exactpack.core.binding import INT32_MAX, Binding
from exactpack.core.compact import Storage, gather_rows
from exactpack.core.errors import InvalidInput
from exactpack.core.examples import offsets_of
from exactpack.core.plan import Plan
from exactpack.core.policies import plan_rows
from exactpack.core.tree import (
    TREE_COLUMNS,
    SequenceGroups,
    TrieOrder,
    TrieSource,
    build_layout,
    groups_from_columns,
)
from exactpack.io.columns import check_split, chunk_from_arrow
from exactpack.io.documents import Origin
from exactpack.io.readers import open_input
from exactpack.io.sft import sft_columns
from exactpack.io.shards import FORMAT, VERSION, call_bounds, manifest_record, shard_table
from exactpack.io.tokenizers import Tokenizer
from exactpack.io.trl_schema import carried_columns, dpo_text_groups
from exactpack.pipeline.budget import StreamBudget, read_limits
from exactpack.pipeline.corpus import read_tables
from exactpack.pipeline.options import PackOptions

#: A stored forest cell (7 int32 columns and its sequences' cells) is about this many flat
#: tokens' bytes (6 each, :data:`~exactpack.pipeline.budget.SHARD_TOKEN_BYTES`): a forest
#: shard holds ``shard_tokens / CELL_TOKENS`` cells, so both shards cost about the same.
CELL_TOKENS = 6
#: Why ``--format trl`` and ``--tree`` do not go together.
TRL_REFUSAL = (
    "--format trl cannot express a tree: TRL's packed rows hold disjoint sequences"
    " (seq_lengths, restarting position_ids) and have no node / parent / weight columns —"
    " drop --format trl (the tree output is exactpack's packed-row format with node columns)"
)


def block_groups(
    table: pa.Table, origin: Origin, binding: Binding, tokenizer: Tokenizer | None, opts: Any
) -> tuple[SequenceGroups, np.ndarray]:
    """``table``'s groups under ``binding`` and each sequence's index among the sequences
    of ``table`` (int64 [S]), from the first that applies: the id columns of
    :data:`~exactpack.core.tree.TREE_COLUMNS` (rows of one ``group`` gathered in input
    order, wherever they are); TRL's DPO text ``prompt`` / ``chosen`` / ``rejected`` (prompt +
    each answer read as an SFT prompt-completion row); with ``opts.tree == "auto"``, plain
    SFT rows grouped by their first ``opts.tree_prefix`` tokens within windows of
    ``opts.tree_block`` rows."""
    names = table.column_names
    where = origin.parts[0][0]
    if opts.tree == "auto":
        seqs, masks = _plain_rows(table, origin, tokenizer, binding)
        return _auto_groups(seqs, masks, binding, opts.tree_prefix, opts.tree_block)
    if any(set(cols) <= set(names) for cols in TREE_COLUMNS):
        wanted = {n for cols in TREE_COLUMNS for n in cols}
        columns = {n: _rows(table.column(n)) if n in wanted else [] for n in names}
        return groups_from_columns(columns, binding, origin.locate)
    if {"chosen", "rejected"} <= set(names):  # TRL's DPO text, its prompt implicit or not
        return dpo_text_groups(table, origin, tokenizer, binding)
    if "input_ids" in names or sft_columns(names) is not None:
        raise InvalidInput(
            f"{where}: rows with columns {', '.join(names)} have no groups — pass --tree auto"
            " to group plain SFT rows by their first tokens, or add a group column"
        )
    groups_from_columns({n: [] for n in names}, binding)  # raises, naming the columns
    raise AssertionError("unreachable")


def _rows(col: pa.ChunkedArray | pa.Array) -> list[Any]:
    """A column's values per row: id lists as NumPy views of one buffer (a list of them for
    ``list<list<int>>``), not Python ints (36 bytes an id); other columns as Python values."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if arr.null_count or not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
        return arr.to_pylist()  # the groups' checks name what is wrong
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    values = arr.flatten()
    inner = _rows(values) if pa.types.is_list(values.type) else values.to_numpy(False)
    if isinstance(inner, list) and len(inner) != len(values):
        return arr.to_pylist()
    offsets -= offsets[0]
    return [inner[a:b] for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)]


def _plain_rows(
    table: pa.Table, origin: Origin, tokenizer: Tokenizer | None, binding: Binding
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Plain SFT rows read as flat packing reads them (``chunk_from_arrow``: ids, labels and
    masks, templates checked): the sequences and their per-pair supervision."""
    names = table.column_names
    if "input_ids" not in names and sft_columns(names) is None:
        raise InvalidInput(
            f"{origin.parts[0][0]}: --tree auto groups plain SFT rows: input_ids, prompt /"
            f" completion or messages; this input has columns {', '.join(names) or 'none'}"
        )
    chunk = chunk_from_arrow(table, origin, tokenizer=tokenizer)
    chunk.check_vocabulary(binding.vocab_size)
    if (n := np.diff(chunk.offsets)).size and int(n.min()) < 2:  # tokens per row
        i = int(np.argmin(n))
        raise InvalidInput(
            f"{origin.locate(i)}: {int(n[i])} token(s); a sequence needs at least 2"
            " (one prediction pair) — drop the row"
        )
    flags = np.ones(chunk.tokens.size, bool) if chunk.flags is None else chunk.flags
    starts, ends = chunk.offsets[:-1].tolist(), chunk.offsets[1:].tolist()
    seqs = [chunk.tokens[a:b] for a, b in zip(starts, ends, strict=True)]
    return seqs, [
        flags[a - i : b - i - 1] for i, (a, b) in enumerate(zip(starts, ends, strict=True))
    ]


def _auto_groups(
    seqs: list[np.ndarray], masks: list[np.ndarray], binding: Binding, prefix: int, window: int
) -> tuple[SequenceGroups, np.ndarray]:
    """Rows whose first ``prefix`` tokens agree, within each window of rows, as one group
    (groups in first-seen order; sequences reordered so groups are contiguous)."""
    order: list[int] = []
    group: list[int] = []
    for start in range(0, len(seqs), window):
        keys: dict[bytes, list[int]] = {}
        for i in range(start, min(start + window, len(seqs))):
            keys.setdefault(seqs[i][:prefix].tobytes(), []).append(i)
        for members in keys.values():
            group.extend([group[-1] + 1 if group else 0] * len(members))
            order.extend(members)
    picked = SequenceGroups.of([seqs[i] for i in order], [masks[i] for i in order], group, binding)
    return picked, np.asarray(order, dtype=np.int64)


def _group_tail(table: pa.Table, opts: PackOptions, limit: int) -> int:
    """Where the rows that wait for the next block start: the first ``group`` change at or
    after ``limit`` rows, else the last group's run (``--tree auto``: the last multiple of
    ``tree_block`` up to ``limit``; without a group column: ``limit``)."""
    n = min(table.num_rows, limit)
    if opts.tree == "auto":
        return n - n % opts.tree_block
    if "group" not in table.column_names or not table.num_rows:
        return n
    group = table["group"]
    starts = np.flatnonzero(pc.not_equal(group[1:], group[:-1]).to_numpy(False)) + 1
    after = starts[starts >= limit]
    return int(after[0]) if after.size else int(starts[-1]) if starts.size else 0


def whole_groups(
    source_input: Any, opts: PackOptions, bar: Any = None, digest: Any = None,
    block_rows: int | None = None,
) -> Iterator[tuple[pa.Table, Origin]]:  # fmt: skip
    """The one reader's chunks (:func:`~exactpack.pipeline.corpus.read_tables` of
    ``source_input``, closed at the end; ``bar``: its progress; ``digest(table)`` sees each
    chunk as read, the split receipt) as blocks of about ``block_rows`` rows (default
    ``opts.tree_block``; a chunk is cut into several) or ``opts.chunk_bytes`` Arrow bytes.
    A block ends at a ``group`` change, so a group is never split; with ``--tree auto`` on
    a multiple of ``tree_block`` rows (its grouping windows are the input's). Small chunks
    (small files) join one block."""
    tables_: list[pa.Table] = []
    parts: list[tuple[str, int, str]] = []  # the block's Origin
    rows, held = 0, 0  # rows and Arrow bytes in the block

    def block(last: bool) -> Iterator[tuple[pa.Table, Origin]]:
        nonlocal rows, held
        limit = block_rows or opts.tree_block
        while rows and (last or rows >= limit or held >= opts.chunk_bytes):
            table = pa.concat_tables(tables_, promote_options="permissive")
            origin = Origin(tuple(parts) or ((source_input.name, 0, "row"),))
            tail = rows if last and rows <= limit else _group_tail(table, opts, limit)
            tail = tail or (rows if last else 0)  # a group longer than a block waits whole
            # the rows carried on keep their names: the part covering row `tail` and those after
            kept = [p for p in parts if p[1] <= tail][-1:] + [p for p in parts if p[1] > tail]
            tables_[:], rows, held = [table.slice(tail)], table.num_rows - tail, 0
            parts[:] = [(name, first - tail, unit) for name, first, unit in kept]
            if not tail:
                return
            yield table.slice(0, tail), origin

    try:
        for table, origin in read_tables(source_input, opts.chunk_bytes, "group", bar, digest):
            if not table.num_rows:
                continue
            check_split(table, origin, opts.split)
            name, shift, unit = origin.parts[0]
            parts.append((name, rows + shift, unit))  # the chunk's rows, numbered in the block
            tables_.append(table)
            rows, held = rows + table.num_rows, held + table.nbytes  # bytes held, not read
            yield from block(last=False)
            source_input.release()
        if rows:
            yield from block(last=True)
    finally:
        source_input.close()


def tree_blocks(
    blocks: Iterable[tuple[pa.Table, Origin]],
    opts: PackOptions,
    binding: Binding,
    tokenizer: Tokenizer | None,
) -> Iterator[tuple[SequenceGroups, np.ndarray, pa.Table]]:
    """Blocks of whole groups (:func:`whole_groups`) as their groups
    (:func:`block_groups`), their sequences' indexes in the whole input and their carried
    columns (:func:`~exactpack.io.trl_schema.carried_columns`, a row per sequence; none
    for ``--tree auto``'s plain SFT rows)."""
    base = 0
    for table, origin in blocks:
        groups, index = block_groups(table, origin, binding, tokenizer, opts)
        carried = pa.table({}) if opts.tree == "auto" else carried_columns(table, groups)
        yield groups, index + base, carried
        base += len(groups)


@dataclasses.dataclass(frozen=True)
class PlannedBlock:
    """One block's tries planned with the run's policy: its rows as forest tables on
    demand (:meth:`table`), its shard bounds (local rows, whole model calls) and counts."""

    groups: SequenceGroups
    index: np.ndarray  # each sequence's index in the whole input (int64 [S])
    carried: pa.Table  # [S] rows: its sequences' carried columns, in index order
    layout: TrieOrder
    plan: Plan
    per_call: int
    bounds: np.ndarray

    @classmethod
    def of(cls, groups: SequenceGroups, index: np.ndarray, carried: pa.Table, opts: PackOptions,
           budget: StreamBudget) -> PlannedBlock:  # fmt: skip
        capacity = opts.capacity
        layout = build_layout(groups, capacity)
        budget.check(len(groups), int(layout.sizes.shape[0]),
                     what=f"a block of {len(groups):,} sequences")  # fmt: skip
        plan = plan_rows(layout.sizes, capacity, opts.policy, **opts.policy_options)
        cells = np.bincount(plan.row_of, layout.sizes, minlength=plan.num_rows).astype(np.int64)
        shard_cells = max(1, opts.shard_tokens // CELL_TOKENS)
        bounds = call_bounds(offsets_of(cells), opts.max_rows_per_batch, shard_cells)
        return cls(groups, index, carried, layout, plan, opts.max_rows_per_batch, bounds)

    def table(self, a: int, b: int, first: int = 0) -> pa.Table:
        """Rows ``[a, b)`` (numbered from ``first + a``), one model call's padded cells at a
        time; the table holds only used cells, then the carried columns (a list per row, one
        value per sequence of ``sequence_index``)."""
        source, storage = TrieSource(self.groups, self.layout, self.index), Storage.of(self.plan)
        tables = []
        for c in range(a, b, self.per_call):
            d = min(c + self.per_call, b)
            batch = gather_rows(source, storage, c, d).to_batch()
            tables.append(shard_table(batch, first_row=first + c))
        return with_carried(pa.concat_tables(tables), self.carried, np.sort(self.index))

    def counts(self) -> dict[str, int]:
        """This block's :data:`COUNTED` (``batches``: its own model calls, shard by shard)."""
        groups, layout, plan = self.groups, self.layout, self.plan
        batches = sum(-(-int(n) // self.per_call) for n in np.diff(self.bounds))
        counts = (batches, len(groups), int(np.unique(groups.group).shape[0]),
                  int(layout.sizes.shape[0]), int(layout.node_len.shape[0]),
                  int(layout.sizes.sum()), int(layout.lengths.sum()),
                  int(groups.loss_mask.sum()), plan.num_rows, 1)  # fmt: skip
        return dict(zip(COUNTED, counts, strict=True))


def with_carried(table: pa.Table, carried: pa.Table, index: np.ndarray) -> pa.Table:
    """``table`` (forest rows) with ``carried``'s columns (row ``i``: sequence ``index[i]``'s
    values) as a list per row, one value per sequence of its ``sequence_index``."""
    seq = table.column("sequence_index").combine_chunks()
    offsets = np.asarray(seq.offsets) - seq.offsets[0].as_py()
    order = np.argsort(index)
    take = order[np.searchsorted(index[order], seq.flatten().to_numpy())]
    for name, column in zip(carried.column_names, carried.columns, strict=True):
        values = pa.ListArray.from_arrays(offsets, column.take(take).combine_chunks())
        table = table.append_column(name, values)
    return table


#: What ``pack --tree`` counts, block by block (:meth:`PlannedBlock.counts`).
COUNTED = ("batches", "sequences", "groups", "tries", "nodes", "tokens_stored", "tokens_flat",
           "eligible_targets", "rows", "blocks")  # fmt: skip


def split_receipt(opts: PackOptions) -> tuple[Any, Any]:
    """The split receipt's hasher and ``update(table)``, which digests a chunk's Arrow stream
    (the same on every engine)."""
    hasher = hashlib.sha256(f"tree:{opts.split.value}:".encode())

    def update(table: pa.Table) -> None:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        hasher.update(sink.getvalue())

    return hasher, update


def tree_manifest(
    opts: PackOptions, binding: Binding, totals: dict[str, int], shards: list[dict[str, Any]],
    source: str, **sections: Any,
) -> dict[str, Any]:  # fmt: skip
    """The forest output's manifest (``layout`` ``"tree"``) from the summed :data:`COUNTED`
    (``binding``: with its split receipt); ``sections`` (``engine``) after ``input``."""
    flat = totals["tokens_flat"]
    stats = totals | {
        "stored_over_flat": totals["tokens_stored"] / flat if flat else 0.0,
        "capacity": opts.capacity,
        "policy": opts.policy,
        "tree": opts.tree,
    }
    tree_fields = {"mode": opts.tree, "prefix": opts.tree_prefix, "block": opts.tree_block}
    return manifest_record(
        binding=binding, partition=opts.split, shards=shards, kind=(FORMAT, VERSION),
        layout="tree", rows=totals["rows"], occurrences=totals["sequences"],
        **opts.manifest_fields(), tree=tree_fields, statistics=stats, input={"source": source},
        **sections,
    )  # fmt: skip


def tree_stats(source: str | Path, options: PackOptions, policy: str) -> dict[str, Any]:
    """Tree vs flat packing of the input ``source``'s groups (``options.tree``, None:
    ``"on"``) at ``options.capacity`` under ``policy``, read block by block as
    :func:`~exactpack.pipeline.local.pack_path` reads it (only the trie sizes and sequence
    lengths are kept)."""
    capacity, tokenizer = options.capacity, options.load_tokenizer()
    vocab = options.vocab_size or getattr(tokenizer, "vocab_size", None) or INT32_MAX
    identity = getattr(tokenizer, "identity", "pre-tokenized")
    source_input = open_input(source, options.split, read_limits(options))
    binding = Binding(int(vocab), identity, f"input:{source_input.name}")
    sizes, lengths, groups = [], [], 0
    for block, *_ in tree_blocks(whole_groups(source_input, options), options, binding, tokenizer):
        sizes.append(build_layout(block, capacity).sizes)
        lengths.append(block.lengths)
        groups += int(np.unique(block.group).shape[0])
    size, length = (np.concatenate([np.zeros(0, np.int64), *x]) for x in (sizes, lengths))
    stored, total = int(size.sum()), int(length.sum())
    return {
        "groups": groups,
        "sequences": int(length.shape[0]),
        "tries": int(size.shape[0]),
        "capacity": int(capacity),
        "policy": policy,
        "tokens_stored": stored,
        "tokens_flat": total,
        "stored_over_flat": stored / total if total else 0.0,
        "rows_tree": plan_rows(size, capacity, policy).num_rows,
        "rows_flat": plan_rows(length, capacity, policy).num_rows,
    }
