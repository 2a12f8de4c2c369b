"""Tokenize and pack on Ray: the local pipeline, one block at a time, across machines.

::

    exactpack pack texts/ --engine ray --tokenizer tok.json --capacity 4096 --out packed/ \
        [--ray-address auto]

The input (Parquet or JSON Lines shards of token ids or text, or a ``ray.data.Dataset``)
is cut into *blocks* of consecutive examples in input order: one input shard per block, or
``block_examples`` examples (:mod:`exactpack.ray.blocks`). A **plan** task runs the local
pipeline on one block (:mod:`exactpack.ray.tasks`); a **write** task per output shard
renumbers the rows and ordinals of its blocks globally and writes it. The driver lays the
blocks' rows end to end, cuts shards on model-call boundaries
(:mod:`exactpack.ray.shard_layout`) and commits one ``manifest.json`` in the local format.
With the A/B/C fixture (capacity 6, next-fit) in blocks of 2 examples: block 0 = A, B ->
row 0 ``[0 99 100 1 | 0 101 1]``; block 1 = C -> row 1 ``[0 102 103 104 1]``, its
ordinal 0 renumbered 2.

With ``--tree`` the driver reads the input through the local tree reader in blocks of
whole groups (:func:`exactpack.ray.blocks.group_blocks`); a plan task plans its block's
tries and the write tasks write forest rows, under one ``"layout": "tree"`` manifest.

The output depends only on the input, the block size and the policy (and its seed), never
on the number of workers or the order tasks finish in; a retried task recomputes the same
block or rewrites the same shard whole, and the driver checks that the shards it laid out
hold every example once.
"""

from __future__ import annotations

from exactpack._lazy import lazy_exports

_NAMES = {
    "pack": "driver",
    "ray_session": "driver",
    "RayOptions": "ray_options",
    "RayTaskFailed": "shard_layout",
}
__all__ = sorted(_NAMES)

__getattr__, __dir__ = lazy_exports(__name__, _NAMES)
