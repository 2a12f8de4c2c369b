"""``exactpack pack --tree`` / ``stats --tree``: an input's groups -> tries -> rows or statistics.

:func:`pack_tree_path` writes a version-3 packed directory; :func:`tree_stats` compares
tree with flat packing under one policy. The ``--tree*`` flags are fields of
:class:`~exactpack.pipeline.options.PackOptions` (``tree``, ``tree_prefix``, ``tree_block``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from exactpack.core.binding import Binding
from exactpack.core.errors import InvalidInput
from exactpack.core.policies import plan_rows
from exactpack.core.tree import SequenceGroups, build_layout, pack_tree
from exactpack.pipeline.options import PackOptions

#: Why ``--format trl`` and ``--tree`` do not go together.
TRL_REFUSAL = (
    "--format trl cannot express a tree: TRL's packed rows hold disjoint sequences"
    " (seq_lengths, restarting position_ids) and have no node / parent / weight columns —"
    " drop --format trl (the tree output is exactpack's format version 3)"
)


def file_groups_of(
    opts: PackOptions, table: Any, origin: Any, binding: Binding, tokenizer: Any
) -> tuple[SequenceGroups, np.ndarray]:
    """The groups of the input's ``table`` under ``opts.tree`` (None: ``"on"``) and each
    sequence's index in it."""
    from exactpack.io.tree_store import file_groups  # pyarrow: only when packing

    return file_groups(
        table,
        origin,
        binding=binding,
        tokenizer=tokenizer,
        mode=opts.tree or "on",
        prefix=opts.tree_prefix,
        window=opts.tree_block,
    )


def pack_tree_path(
    source: str | Path,
    out: str | Path,
    options: PackOptions | None = None,
    /,
    **overrides: Any,
) -> dict[str, Any]:
    """Tree-pack the input ``source`` (a path, a glob, ``-``, or a list of them) into the
    packed directory ``out``; the statistics (``sequences``, ``tries``, ``nodes``,
    ``tokens_stored``, ``tokens_flat``, ``stored_over_flat``, ``rows``, ``capacity``,
    ``policy``, ``groups``, ``shards``, ``out``, ``seconds``). ``tree`` (a
    :class:`PackOptions` field) defaults to ``"on"`` here."""
    opts = PackOptions.of(options, **overrides)
    opts = opts if opts.tree is not None else PackOptions.of(opts, tree="on")
    if opts.format == "trl":
        raise InvalidInput(TRL_REFUSAL)
    from exactpack.io.atomic import open_output
    from exactpack.io.files import is_stdin
    from exactpack.io.tree_store import read_table, table_binding, tree_records, write_tree_shards

    started = time.perf_counter()
    named = list(source) if isinstance(source, (list, tuple)) else [source]
    inputs = [s for s in named if isinstance(s, (str, Path)) and not is_stdin(s)]
    with open_output(out, opts.overwrite, inputs=inputs) as output:  # before reading
        tok = opts.load_tokenizer()
        table, origin = read_table(source, opts.split)
        binding = table_binding(table, opts.split, **opts.binding_keywords(tok))
        groups, index = file_groups_of(opts, table, origin, binding, tok)
        epoch = pack_tree(
            groups,
            opts.capacity,
            policy=opts.policy,
            max_rows_per_batch=opts.max_rows_per_batch,
            **opts.policy_options,
        )
        records = [rec for batch in epoch.batches for rec in tree_records(batch)]
        for rec in records:  # sequences named by their index in the input
            rec["sequence_index"] = index[np.asarray(rec["sequence_index"], np.int64)].tolist()
        stats = epoch.stats() | {
            "groups": int(np.unique(groups.group).shape[0]),
            "policy": opts.policy,
            "tree": opts.tree,
            "eligible_targets": int(groups.loss_mask.sum()),
        }
        fields = opts.manifest_fields()
        tree_fields = {"mode": opts.tree}
        if opts.tree == "auto":
            tree_fields |= {"prefix": opts.tree_prefix, "window": opts.tree_block}
        manifest = write_tree_shards(
            records,
            output,
            binding=binding,
            partition=opts.split,
            config=fields["config"],
            policy=fields["policy"],
            tree=tree_fields,
            statistics=stats,
            input={"source": origin.parts[0][0] if len(named) == 1 else [str(n) for n in named]},
        )
        output.commit(manifest)
    return stats | {
        "shards": len(manifest["shards"]),
        "out": str(output.path),
        "recovered": output.notes,
        "seconds": time.perf_counter() - started,
    }


def tree_stats(
    source: str | Path,
    options: PackOptions,
    policy: str = "best-fit-decreasing",
    tokenizer: Any = None,
) -> dict[str, Any]:
    """Tree vs flat packing of the input ``source``'s groups (``options.tree``, None:
    ``"on"``) at ``options.capacity`` under ``policy`` (without a tokenizer the
    vocabulary is one past the largest id)."""
    from exactpack.io.tree_store import max_id, read_table

    capacity = options.capacity
    table, origin = read_table(source)
    if tokenizer is not None:
        vocab = int(tokenizer.vocab_size)
    else:
        vocab = 1 + max(
            (max_id(table.column(n).to_pylist()) for n in table.column_names if n.endswith("_ids")),
            default=0,
        )
    identity = getattr(tokenizer, "identity", "pre-tokenized")
    binding = Binding(vocab, identity, f"input:{origin.parts[0][0]}")
    groups, _ = file_groups_of(options, table, origin, binding, tokenizer)
    layout = build_layout(groups, capacity)
    stored, total = int(layout.sizes.sum()), int(groups.lengths.sum())
    return {
        "groups": int(np.unique(groups.group).shape[0]),
        "sequences": len(groups),
        "tries": int(layout.sizes.shape[0]),
        "capacity": int(capacity),
        "policy": policy,
        "tokens_stored": stored,
        "tokens_flat": total,
        "stored_over_flat": stored / total if total else 0.0,
        "rows_tree": plan_rows(layout.sizes, capacity, policy).num_rows,
        "rows_flat": plan_rows(groups.lengths, capacity, policy).num_rows,
    }


__all__ = ["TRL_REFUSAL", "file_groups_of", "pack_tree_path", "tree_stats"]
