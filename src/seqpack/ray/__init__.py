"""Tokenize and pack on Ray: the local pipeline, one block at a time, across machines.

::

    seqpack pack texts/ --engine ray --tokenizer tok.json --capacity 4096 --out packed/ \
        [--ray-address auto]

The input — Parquet or JSON Lines shards of token ids or text, or a
``ray.data.Dataset`` — is cut into *blocks* of consecutive examples in input
order (files in sorted name order, rows in file order): one input shard per
block by default, or ``block_examples`` examples per block (a JSON Lines
block is a line range the driver located with one scan). A **plan** task per
block runs the local pipeline on that block alone (:mod:`seqpack.ray.tasks`);
a **write** task per output shard renumbers the rows and ordinals of one or
more planned blocks globally and writes the shard into the output folder. The
driver lays the blocks' rows end to end, cuts shards on model-call boundaries
(:mod:`seqpack.ray.shard_layout`) and commits one ``manifest.json`` — the local
format, read by :func:`seqpack.io.store.load_packed`. With the A/B/C fixture
(capacity 6, next-fit) in blocks of 2 examples: block 0 = A, B -> row 0
``[0 99 100 1 | 0 101 1]``; block 1 = C -> row 1 ``[0 102 103 104 1]``, its
ordinal 0 renumbered 2.

Guarantees: the output depends only on the input, the block size and the
policy (and its seed), never on the number of workers or the order tasks
finish in. A task retried by Ray recomputes the same block or rewrites the
same shard name whole; the manifest lists exactly the shards the driver laid
out, and the driver checks that they hold every example once. The
manifest's ``engine`` record says which node ran each block and how long it
read, tokenized, planned and wrote (:mod:`seqpack.ray.driver`).
"""

from __future__ import annotations

from seqpack._lazy import lazy_exports

_NAMES = {
    "PARTITION_COLUMN": "blocks",
    "plain_columns": "blocks",
    "pack": "driver",
    "ray_session": "driver",
    "DEFAULT_BLOCK_EXAMPLES": "options",
    "RayOptions": "options",
    "RayTaskFailed": "shard_layout",
}
__all__ = sorted(_NAMES)

__getattr__, __dir__ = lazy_exports(__name__, _NAMES)
