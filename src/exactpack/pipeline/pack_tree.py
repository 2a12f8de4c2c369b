"""``exactpack pack --tree`` / ``stats --tree``: an input's groups -> tries -> rows or statistics.

:func:`pack_tree_path` writes a version-3 packed directory; :func:`tree_stats` compares
tree with flat packing under one policy; :class:`TreeOptions` carries the ``--tree*`` flags.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from exactpack.core.binding import Binding
from exactpack.core.errors import InvalidInput, positive_int
from exactpack.core.policies import plan_rows
from exactpack.core.tree import SequenceGroups, build_layout, pack_tree
from exactpack.pipeline.options import BOTH, PackOptions, flag

#: ``--tree`` values: ``on`` (groups from the columns) or ``auto`` (rows grouped by prefix).
TREE_MODES = ("on", "auto")
#: ``--tree auto``: rows whose first this many tokens agree share a trie.
DEFAULT_TREE_PREFIX = 16
#: ``--tree auto``: rows are grouped within windows of this many rows (bounded memory).
DEFAULT_TREE_WINDOW = 4096
#: Why ``--format trl`` and ``--tree`` do not go together.
TRL_REFUSAL = (
    "--format trl cannot express a tree: TRL's packed rows hold disjoint sequences"
    " (seq_lengths, restarting position_ids) and have no node / parent / weight columns —"
    " drop --format trl (the tree output is exactpack's format version 3)"
)


@dataclass(frozen=True)
class TreeOptions:
    """``tree``: None (flat packing), ``"on"`` (groups from the tree columns: prompt_ids +
    completion_ids, TRL's DPO columns, input_ids + group, or prompt / chosen / rejected
    text through the tokenizer) or ``"auto"`` (plain SFT rows grouped by their first
    ``tree_prefix`` tokens, within consecutive blocks of ``tree_block`` documents)."""

    tree: str | None = field(
        default=None,
        metadata=flag(
            "--tree",
            "tree packing (docs/tree.md): shared prefixes stored once; --tree auto groups plain"
            " SFT rows whose first --tree-prefix tokens agree (give it after the input)",
            BOTH,
            nargs="?",
            const="on",
            choices=TREE_MODES,
        ),
    )
    tree_prefix: int = field(
        default=DEFAULT_TREE_PREFIX,
        metadata=flag(
            "--tree-prefix",
            f"--tree auto: tokens that must agree to share a trie (default {DEFAULT_TREE_PREFIX})",
            BOTH,
            metavar="K",
            type=int,
        ),
    )
    tree_block: int = field(
        default=DEFAULT_TREE_WINDOW,
        metadata=flag(
            "--tree-block",
            "--tree auto: documents are grouped within consecutive blocks of this many"
            f" (default {DEFAULT_TREE_WINDOW})",
            BOTH,
            metavar="DOCUMENTS",
            type=int,
        ),
    )

    def __post_init__(self) -> None:
        if self.tree is not None and self.tree not in TREE_MODES:
            raise InvalidInput(f"tree must be one of {', '.join(TREE_MODES)} or None")
        object.__setattr__(self, "tree_prefix", positive_int("tree_prefix", self.tree_prefix))
        object.__setattr__(self, "tree_block", positive_int("tree_block", self.tree_block))

    def groups(
        self, table: Any, origin: Any, binding: Binding, tokenizer: Any
    ) -> tuple[SequenceGroups, np.ndarray]:
        """The groups of the input's ``table`` and each sequence's index in it."""
        from exactpack.io.tree_store import file_groups  # pyarrow: only when packing

        return file_groups(
            table,
            origin,
            binding=binding,
            tokenizer=tokenizer,
            mode=self.tree or "on",
            prefix=self.tree_prefix,
            window=self.tree_block,
        )


def pack_tree_path(
    source: str | Path,
    out: str | Path,
    options: PackOptions | None = None,
    tree: TreeOptions | None = None,
    /,
    **overrides: Any,
) -> dict[str, Any]:
    """Tree-pack the input ``source`` (a path, a glob, ``-``, or a list of them) into the
    packed directory ``out``; the statistics (``sequences``, ``tries``, ``nodes``,
    ``tokens_stored``, ``tokens_flat``, ``stored_over_flat``, ``rows``, ``capacity``,
    ``policy``, ``groups``, ``shards``, ``out``, ``seconds``). ``tree`` defaults to
    ``TreeOptions(tree="on")``."""
    opts = PackOptions.of(options, **overrides)
    topts = tree if tree is not None and tree.tree is not None else TreeOptions(tree="on")
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
        groups, index = topts.groups(table, origin, binding, tok)
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
            "tree": topts.tree,
            "eligible_targets": int(groups.loss_mask.sum()),
        }
        fields = opts.manifest_fields()
        tree_fields = {"mode": topts.tree}
        if topts.tree == "auto":
            tree_fields |= {"prefix": topts.tree_prefix, "window": topts.tree_block}
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
    capacity: int,
    policy: str = "best-fit-decreasing",
    tree: TreeOptions | None = None,
    tokenizer: Any = None,
) -> dict[str, Any]:
    """Tree vs flat packing of the input ``source``'s groups at ``capacity`` under ``policy``
    (without a tokenizer the vocabulary is one past the largest id)."""
    from exactpack.io.tree_store import max_id, read_table

    topts = tree if tree is not None and tree.tree is not None else TreeOptions(tree="on")
    table, origin = read_table(source)
    if tokenizer is not None:
        vocab = int(tokenizer.vocab_size)
    else:
        vocab = 1 + max(
            (max_id(table.column(n).to_pylist()) for n in table.column_names if n.endswith("_ids")),
            default=0,
        )
    identity = getattr(tokenizer, "identity", "pre-tokenized")
    groups, _ = topts.groups(
        table, origin, Binding(vocab, identity, f"input:{origin.parts[0][0]}"), tokenizer
    )
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


__all__ = [
    "DEFAULT_TREE_PREFIX",
    "DEFAULT_TREE_WINDOW",
    "TREE_MODES",
    "TRL_REFUSAL",
    "TreeOptions",
    "pack_tree_path",
    "tree_stats",
]
