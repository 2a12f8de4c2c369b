"""``seqpack pack --tree``: one file's groups -> tries -> a version-3 packed directory.

:func:`pack_tree_path` reads one ``.jsonl`` / ``.json`` or ``.parquet``
file whole, builds its groups (:func:`seqpack.io.tree_rows.file_groups`:
id columns, TRL's DPO text through the tokenizer, or ``--tree auto``),
plans the tries with the run's policy and writes the rows
(:mod:`seqpack.io.tree_store`) into an atomically published packed
directory (:func:`seqpack.io.atomic.open_output`, the manifest the commit);
:func:`seqpack.io.store.load_packed` opens it as a
:class:`~seqpack.io.tree_store.TreeStore` whose records
:func:`seqpack.hf.tree_data.tree_batch_from_rows` / ``TreeCollator`` take.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from seqpack.core.errors import InvalidInput
from seqpack.core.tree import pack_tree
from seqpack.io.atomic import Output, open_output
from seqpack.io.tree_files import read_table
from seqpack.io.tree_rows import file_binding, file_groups
from seqpack.io.tree_store import tree_records, write_tree_shards
from seqpack.pipeline.options import PackOptions
from seqpack.pipeline.tree_options import TreeOptions

#: Why ``--format trl`` and ``--tree`` do not go together.
TRL_REFUSAL = (
    "--format trl cannot express a tree: TRL's packed rows hold disjoint sequences"
    " (seq_lengths, restarting position_ids) and have no node / parent / weight columns —"
    " drop --format trl (the tree output is seqpack's format version 3)"
)


def pack_tree_path(
    source: str | Path,
    out: str | Path,
    options: PackOptions | None = None,
    tree: TreeOptions | None = None,
    /,
    **overrides: Any,
) -> dict[str, Any]:
    """Tree-pack the file ``source`` into the packed directory ``out``; the statistics
    (``sequences``, ``tries``, ``nodes``, ``tokens_stored``, ``tokens_flat``,
    ``stored_over_flat``, ``rows``, ``capacity``, ``policy``, ``groups``, ``shards``,
    ``out``, ``seconds``). ``tree`` defaults to ``TreeOptions(tree="on")``."""
    opts = PackOptions.of(options, **overrides)
    topts = tree if tree is not None and tree.tree is not None else TreeOptions(tree="on")
    if opts.format == "trl":
        raise InvalidInput(TRL_REFUSAL)
    if not isinstance(source, (str, Path)) or str(source) == "-":
        raise InvalidInput("--tree reads one .jsonl/.json or .parquet file (not several, not -)")
    started = time.perf_counter()
    with open_output(out, opts.overwrite, inputs=[source]) as output:  # before reading
        stats, manifest = _pack(source, output, opts, topts)
        output.commit(manifest)
    return stats | {
        "shards": len(manifest["shards"]),
        "out": str(output.path),
        "recovered": output.notes,
        "seconds": time.perf_counter() - started,
    }


def _pack(
    source: str | Path, output: Output, opts: PackOptions, topts: TreeOptions
) -> tuple[dict[str, Any], dict[str, Any]]:
    tok = opts.load_tokenizer()
    binding = file_binding(
        source,
        opts.partition,
        vocab_size=opts.vocab_size,
        tokenizer=tok,
        tokenizer_id=opts.tokenizer_id,
        split_id=opts.split_id,
    )
    groups, index = file_groups(
        read_table(source),
        str(source),
        binding=binding,
        tokenizer=tok,
        mode=topts.tree or "on",
        prefix=topts.tree_prefix,
        window=topts.tree_window,
    )
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
        tree_fields |= {"prefix": topts.tree_prefix, "window": topts.tree_window}
    manifest = write_tree_shards(
        records,
        output,
        binding=binding,
        partition=opts.partition,
        config=fields["config"],
        policy=fields["policy"],
        tree=tree_fields,
        statistics=stats,
        input={"source": str(source)},
    )
    return stats, manifest


__all__ = ["TRL_REFUSAL", "pack_tree_path"]
