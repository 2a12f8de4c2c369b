"""Hugging Face ``datasets`` in and out: pack a Dataset into a packed Dataset, and back.

``pack_dataset(ds, capacity)`` takes a ``datasets.Dataset`` with an
``input_ids`` column (optional ``labels`` with -100, ``loss_mask``, ``id``;
see :mod:`seqpack.io.columns`) and returns one output row per packed row, with the
columns of the packed-directory format (:data:`seqpack.io.store.SCHEMA`:
``tokens``, ``labels``, ``seq_lengths``, ``seq_starts``, provenance). The
binding, partition, capacity, policy and statistics travel as JSON in
``info.description`` under the key ``"seqpack"``. For the fixture::

    >>> packed = pack_dataset(Dataset.from_dict({"input_ids": [A, B, C]}), 6, "next-fit")
    >>> packed["tokens"]        # [[0, 99, 100, 1, 0, 101, 1], [0, 102, 103, 104, 1]]
    >>> packed["seq_starts"]    # [[0, 3], [0]]

``to_batches(packed)`` rebuilds the padded :class:`PackedBatch` model calls;
``unpack_dataset(packed)`` recovers the examples in their original order.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from seqpack.core.batch import PackedBatch
from seqpack.core.binding import Binding, Partition
from seqpack.core.compact import CompactRows, gather_segments, window_labels
from seqpack.core.config import PackConfig
from seqpack.core.errors import InvalidInput
from seqpack.core.examples import split_long
from seqpack.io.columns import documents_from_arrow
from seqpack.io.documents import resolve_binding
from seqpack.io.readers import read_arrow
from seqpack.io.shards import (
    FORMAT,
    VERSION,
    arrow_to_rows,
    list_array,
    manifest_record,
    rows_to_arrow,
)
from seqpack.pipeline.local import pack_table
from seqpack.pipeline.options import PackOptions

META_KEY = "seqpack"


def pack_dataset(
    dataset: Any,
    capacity: int | None = None,
    policy: str | None = None,
    *,
    options: PackOptions | None = None,
    **keywords: Any,
) -> Any:
    """Pack ``dataset`` (``input_ids`` [+ ``labels``]) into a ``datasets.Dataset`` of rows.

    ``capacity``, ``policy``, ``options`` and any :class:`PackOptions` field
    as a keyword say how; other keywords are policy options (e.g.
    ``window=4096`` for ``stream-best-fit``). ``vocab_size`` defaults to the
    largest id + 1 and ``tokenizer_id`` to ``"pretokenized"``; pass the real
    ones to bind the output to your model.
    """
    import datasets

    fields = {f.name for f in dataclasses.fields(PackOptions)} | {"split_long_sources"}
    overrides = {k: keywords.pop(k) for k in list(keywords) if k in fields}
    if capacity is not None:
        overrides["capacity"] = capacity
    if policy is not None:
        overrides["policy"] = policy
    if keywords:
        base = options.policy_options if options is not None else {}
        overrides["policy_options"] = {**base, **keywords}
    opts = PackOptions.of(options, **overrides)
    config = PackConfig(opts.capacity, opts.max_rows_per_batch)
    table, origin = read_arrow(dataset, opts.partition)
    docs = documents_from_arrow(table, origin)
    if not len(docs):
        raise InvalidInput("the dataset has no rows — nothing to pack")
    vocab_size = opts.vocab_size if opts.vocab_size is not None else int(docs.tokens.max()) + 1
    binding = resolve_binding(
        docs,
        opts.partition,
        vocab_size=vocab_size,
        tokenizer_id=opts.tokenizer_id,
        split_id=opts.split_id,
    )
    examples = docs.to_table(binding, opts.partition)
    split = 0
    if opts.split_long:
        examples, split = split_long(examples, config.capacity)
    plan, rows = pack_table(examples, config.capacity, opts.policy, **opts.policy_options)
    meta = manifest_record(
        binding=binding,
        partition=examples.partition,
        config=opts.manifest_fields()["config"],
        policy=opts.manifest_fields()["policy"],
        statistics=plan.stats() | {"sources": len(docs), "split_sources": split},
    )
    info = datasets.DatasetInfo(description=json.dumps({META_KEY: meta}))
    return datasets.Dataset(datasets.table.InMemoryTable(rows_to_arrow(rows)), info=info)


def packed_metadata(packed: Any) -> dict[str, Any]:
    """The ``seqpack`` metadata :func:`pack_dataset` stored in ``info.description``."""
    try:
        meta = json.loads(packed.info.description or "")[META_KEY]
    except (ValueError, KeyError, TypeError):
        raise InvalidInput(
            "this dataset carries no seqpack metadata in info.description — was it made by"
            " seqpack.hf.pack_dataset?"
        ) from None
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise InvalidInput(f"packed dataset format {meta.get('format')!r} is not {FORMAT!r}")
    return meta


def packed_rows(packed: Any, *, contiguous: bool = True) -> CompactRows:
    """All rows of a packed dataset as :class:`CompactRows` (checked)."""
    meta = packed_metadata(packed)
    table = packed.with_format("arrow")[0 : len(packed)]
    return arrow_to_rows(
        table,
        capacity=int(meta["config"]["capacity"]),
        partition=Partition.parse(meta["partition"]),
        binding=Binding.from_dict(meta["binding"]),
        where="packed dataset",
        contiguous=contiguous,
    )


def to_batches(
    packed: Any, max_rows_per_batch: int | None = None, expected_binding: Binding | None = None
) -> Iterator[PackedBatch]:
    """The padded model calls of a packed dataset, identical to :func:`seqpack.materialize`'s."""
    rows = packed_rows(packed)
    if expected_binding is not None:
        expected_binding.require(rows.binding, "the packed dataset")
    per = max_rows_per_batch or int(packed_metadata(packed)["config"]["max_rows_per_batch"])
    yield from rows.batches(PackConfig(rows.capacity, per).max_rows_per_batch)


def unpack_dataset(packed: Any) -> Any:
    """The packed examples back as a ``datasets.Dataset``, in their original order.

    Columns: ``id`` (source id), ``example_id``, ``range_start``, ``range_end``,
    ``input_ids`` (the selected range's tokens) and ``labels`` (the token
    where its pair is supervised, -100 otherwise and on the first token).
    """
    import datasets

    rows = packed_rows(packed, contiguous=False)
    order = np.argsort(rows.ordinals, kind="stable")
    lens = rows.lengths[order]
    tokens = gather_segments(rows.tokens, rows.token_offsets[order], lens + 1)
    mask = gather_segments(rows.loss_mask, rows.target_offsets[order], lens)
    offsets = np.zeros(order.shape[0] + 1, dtype=np.int64)
    np.cumsum(lens + 1, out=offsets[1:])
    labels = window_labels(tokens, mask, lens)
    table = pa.table(
        {
            "id": pa.array(rows.source_ids[order], pa.string()),
            "example_id": pa.array(rows.example_ids[order], pa.string()),
            "range_start": pa.array(rows.range_starts[order]),
            "range_end": pa.array(rows.range_ends[order]),
            "input_ids": list_array(offsets, tokens, pa.int32()),
            "labels": list_array(offsets, labels, pa.int32()),
        }
    )
    return datasets.Dataset(datasets.table.InMemoryTable(table))
