"""Streams in, a stream out: :func:`pack_dataset` over a ``datasets.IterableDataset``.

``pack_dataset(stream, max_length, vocab_size=V)`` (a ``datasets.IterableDataset``, a
function returning an iterable of mappings, or such an iterable) returns a
``datasets.IterableDataset`` of packed rows, packed with ``stream-best-fit`` as it is read::

    source rows ──chunks of 1,024──▶ columns checked, tokenized (as pack_dataset does)
        ──▶ examples ──StreamPacker.push──▶ complete rows ──▶ Arrow tables of rows

Memory: the packer's lookahead and ``max_open_rows``, plus one chunk. Every epoch reads
the source again and packs it identically (a generator: a second pass is refused); resume
packs again and skips the rows yielded. Under torchrun the end is padded with empty rows
to a multiple of ``world_size * max_rows_per_batch``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from exactpack.core.binding import Binding
from exactpack.core.compact import CompactRows
from exactpack.core.errors import BudgetExceeded, InvalidInput, OversizedExample
from exactpack.core.examples import long_ranges, offsets_of
from exactpack.core.stream_packer import (
    DEFAULT_LOOKAHEAD,
    DEFAULT_MAX_OPEN_ROWS,
    DEFAULT_STATE_BYTES,
    StreamPacker,
    stream_bytes,
)
from exactpack.core.supervision import Objective
from exactpack.io.columns import chunk_from_arrow
from exactpack.io.documents import Origin, TokenChunk, make_binding
from exactpack.io.shards import FORMAT, FULL, VERSION, manifest_record, shard_table
from exactpack.io.tokenizers import Tokenizer
from exactpack.io.trl_schema import TRL_FORMAT, TRL_SCHEMA, TRL_VERSION, trl_table
from exactpack.pipeline.corpus import is_sft, refuse_cut_sft
from exactpack.pipeline.options import PackOptions, check_pad_id

#: Source rows read, checked and tokenized at a time.
STREAM_CHUNK = 1024
#: The policies a stream may name (the default becomes stream-best-fit: no sorting).
STREAM_POLICIES = ("best-fit-decreasing", "stream-best-fit")
_NAME = "stream"


def is_stream(dataset: Any) -> bool:
    """Whether ``dataset`` is a stream: an ``IterableDataset`` (or its dict), a function, or
    an iterable that is no in-memory input (``Dataset``, Arrow table, path, mapping)."""
    import datasets

    if isinstance(dataset, (datasets.IterableDataset, datasets.IterableDatasetDict)):
        return True
    in_memory = (datasets.Dataset, datasets.DatasetDict, pa.Table, str, bytes, os.PathLike, Mapping)
    return not isinstance(dataset, in_memory) and (
        callable(dataset) or isinstance(dataset, Iterable)
    )


class _Source:
    """The rows of a stream, as Arrow chunks, once per pass (a generator: one pass)."""

    def __init__(self, dataset: Any, opts: PackOptions) -> None:
        import datasets

        if isinstance(dataset, datasets.IterableDatasetDict):
            if opts.split.value not in dataset:
                raise InvalidInput(
                    f"the stream has splits {sorted(dataset)}, not {opts.split.value!r} —"
                    " pass split= with one of them"
                )
            dataset = dataset[opts.split.value]
        self.dataset = dataset
        self.hf = isinstance(dataset, datasets.IterableDataset)
        self.one_shot = not self.hf and not callable(dataset) and iter(dataset) is dataset
        self.passes = 0

    def identity(self) -> str:
        """What names the data, for the default split receipt."""
        info = getattr(self.dataset, "info", None)
        parts = [type(self.dataset).__name__]
        if info is not None:
            parts += [str(info.dataset_name), str(info.config_name), str(info.splits)]
        return "\0".join(parts)

    def tables(self) -> Iterator[pa.Table]:
        """This pass's rows, ``STREAM_CHUNK`` at a time."""
        if self.one_shot and self.passes:
            raise InvalidInput(
                "the stream is a generator that was already read once; a packed stream reads"
                " its source on every pass (epoch) — pass a function returning a fresh"
                " iterator, or a datasets.IterableDataset"
            )
        self.passes += 1
        if self.hf:
            yield from self.dataset.with_format("arrow").iter(batch_size=STREAM_CHUNK)
            return
        items = iter(self.dataset() if callable(self.dataset) else self.dataset)
        first = 0
        while rows := list(itertools.islice(items, STREAM_CHUNK)):
            for i, row in enumerate(rows):
                if not isinstance(row, Mapping):
                    raise InvalidInput(
                        f"{_NAME} row {first + i} is a {type(row).__name__}, not a mapping —"
                        " yield rows such as {'input_ids': [...]} or {'text': '...'}"
                    )
            try:
                yield pa.Table.from_pylist(rows)
            except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
                raise InvalidInput(
                    f"{_NAME} rows {first}..{first + len(rows) - 1}: cannot read their columns"
                    f" ({err}) — give every row the same columns and types"
                ) from None
            first += len(rows)


def stream_binding(source: _Source, opts: PackOptions, tokenizer: Tokenizer | None) -> Binding:
    """The binding of a stream, known before it is read (a stream's largest id is not)."""
    if opts.vocab_size is None and tokenizer is None:
        raise InvalidInput(
            "a stream's largest token id is not known before it is read — pass"
            " vocab_size= (the model's vocabulary size) or a tokenizer= that defines it"
        )
    text = f"exactpack-split\0{opts.split.value}\0stream\0{source.identity()}"
    receipt = "stream:" + hashlib.sha256(text.encode()).hexdigest()[:32]
    return make_binding(
        lambda: receipt,
        vocab_size=opts.vocab_size,
        tokenizer=tokenizer,
        tokenizer_id=opts.tokenizer_id,
        split_id=opts.split_id,
    )


def _packer_settings(opts: PackOptions) -> dict[str, Any]:
    if opts.truncation_mode is not None:
        raise InvalidInput(
            "truncation_mode= truncates a dataset read whole (a Dataset, or a file):"
            " a stream is packed as it is read — drop truncation_mode= or pass cut_long=True"
        )
    if opts.policy not in STREAM_POLICIES:
        raise InvalidInput(
            f"a stream is packed with policy 'stream-best-fit' (it cannot be sorted or"
            f" revisited), not {opts.policy!r} — drop policy= or read the data into a"
            " datasets.Dataset first"
        )
    known = {"lookahead", "max_open_rows", "seed"}
    unknown = sorted(set(opts.policy_options) - known)
    if unknown:
        raise InvalidInput(
            f"stream-best-fit has no option {unknown[0]!r} — its options are {sorted(known)}"
        )
    settings = {"lookahead": DEFAULT_LOOKAHEAD, "max_open_rows": DEFAULT_MAX_OPEN_ROWS, "seed": 0}
    settings |= {k: v for k, v in opts.policy_options.items() if v is not None}
    StreamPacker.check_settings(opts.capacity, **settings)
    need = stream_bytes(opts.capacity, settings["lookahead"], settings["max_open_rows"])
    if need > DEFAULT_STATE_BYTES:
        raise BudgetExceeded(
            f"the stream-best-fit packer would take {need:,} bytes, over the"
            f" {DEFAULT_STATE_BYTES:,}-byte bound — lower lookahead or max_open_rows"
        )
    return settings


def stream_world() -> int:
    """The world size of an initialised ``torch.distributed`` group, else 1."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size())
    return 1


class _Packing:
    """One pass: source chunks -> examples -> packer -> Arrow tables of complete rows."""

    def __init__(self, spec: StreamSpec) -> None:
        self.spec = spec
        opts = spec.opts
        self.trl = opts.format == "trl"
        self.packer = StreamPacker(opts.capacity, **spec.settings)
        # example index -> (window int32 [n], flags bool [n-1], source id, start, end)
        self.pending: dict[int, tuple[np.ndarray, np.ndarray, str, int, int]] = {}
        self.rows = 0
        self.docs = 0

    def run(self) -> Iterator[tuple[int, pa.Table]]:
        for table in self.spec.source.tables():
            origin = Origin(((_NAME, -self.docs, "row"),))
            chunk = chunk_from_arrow(
                table,
                origin,
                tokenizer=self.spec.tokenizer,
                text_field=self.spec.opts.text_field,
                partition=self.spec.opts.split,
                objective=Objective.of(self.spec.opts),
            ).rebased(self.docs)
            chunk.check_vocabulary(self.spec.binding.vocab_size)
            long = chunk.counts - 1 > self.spec.opts.pair_capacity
            if self.spec.opts.cut_long and long.any() and is_sft(table):
                i = int(np.argmax(long))
                refuse_cut_sft(f"{chunk.origin.locate(i)} (id {chunk.id_of(i)!r})")
            lengths = self._push_examples(chunk)
            self.docs += len(chunk)
            yield from self._emit(self.packer.push(lengths))
        yield from self._emit(self.packer.finish())
        yield from self._padding()

    def _push_examples(self, chunk: TokenChunk) -> np.ndarray:
        """The examples of ``chunk``'s documents into ``pending``; their packed lengths."""
        cap = self.spec.opts.pair_capacity
        counts = chunk.counts
        if counts.size and int(counts.min()) < 2:
            i = int(np.argmax(counts < 2))
            raise InvalidInput(
                f"{chunk.origin.locate(i)} (id {chunk.id_of(i)!r}) has {int(counts[i])}"
                " token(s); an example needs 2 — drop it"
            )
        if counts.size and int(counts.max()) - 1 > cap and not self.spec.opts.cut_long:
            i = int(np.argmax(counts - 1 > cap))
            unit = "tokens (format trl counts tokens)" if self.trl else "prediction pairs"
            size = int(counts[i]) if self.trl else int(counts[i]) - 1
            raise OversizedExample(
                f"{chunk.origin.locate(i)} (id {chunk.id_of(i)!r}) has {size} {unit};"
                f" capacity is {self.spec.opts.capacity} — raise max_length= or pass"
                " cut_long=True"
            )
        doc, starts, ends = long_ranges(counts, cap)
        first = self.packer.examples_pushed
        for k, (d, a, b) in enumerate(
            zip(doc.tolist(), starts.tolist(), ends.tolist(), strict=True)
        ):
            lo = int(chunk.offsets[d])
            tokens = np.asarray(chunk.tokens[lo + a : lo + b], dtype=np.int32)
            if chunk.flags is None:
                flags = np.ones(b - a - 1, dtype=bool)
            else:
                flags = np.asarray(chunk.flags[lo - d + a : lo - d + b - 1], dtype=bool)
            self.pending[first + k] = (tokens, flags, chunk.id_of(d), a, b)
        pairs = (ends - starts - 1).astype(np.int64)
        return pairs + 1 if self.trl else pairs

    def _emit(self, placed: Any) -> Iterator[tuple[int, pa.Table]]:
        example, row, start = placed
        if example.size == 0:
            return
        _, counts = np.unique(row, return_counts=True)
        parts = [self.pending.pop(e) for e in example.tolist()]
        cols = self._rows(parts, offsets_of(counts), start, example)
        key, self.rows = self.rows, self.rows + cols.num_rows
        yield key, trl_table(cols) if self.trl else shard_table(cols, FULL)

    def _rows(self, parts: list, row_offsets: np.ndarray, starts: Any, ordinals: Any) -> Any:
        """Compact rows of this pass of ``parts`` (a ``pending`` entry per example)."""
        opts = self.spec.opts
        return CompactRows(
            capacity=opts.capacity,
            partition=opts.split,
            binding=self.spec.binding,
            first_row=self.rows,
            row_offsets=row_offsets,
            tokens=np.concatenate([np.zeros(0, np.int32)] + [p[0] for p in parts]),
            lengths=np.array([p[0].shape[0] - 1 for p in parts], dtype=np.int64),
            starts=np.asarray(starts, dtype=np.int64),
            ordinals=np.asarray(ordinals, dtype=np.int64),
            loss_mask=np.concatenate([np.zeros(0, bool)] + [p[1] for p in parts]),
            source_ids=pa.array([p[2] for p in parts], pa.string()),
            example_ids=pa.array([f"{p[2]}[{p[3]}:{p[4]}]" for p in parts], pa.string()),
            range_starts=np.array([p[3] for p in parts], dtype=np.int64),
            range_ends=np.array([p[4] for p in parts], dtype=np.int64),
        )

    def _padding(self) -> Iterator[tuple[int, pa.Table]]:
        """Empty rows up to a multiple of ``world * max_rows_per_batch`` under torchrun."""
        world = stream_world()
        multiple = world * self.spec.opts.max_rows_per_batch
        missing = (-self.rows) % multiple if world > 1 else 0
        if not missing:
            return
        if self.trl:  # a 2-token row of the pad id, nothing supervised (TRL needs tokens)
            pad = self.spec.pad or 0
            empty = {
                "input_ids": [[pad, pad]] * missing,
                "labels": [[-100, -100]] * missing,
                "seq_lengths": [[2]] * missing,
            }
            yield self.rows, pa.Table.from_pydict(empty, schema=TRL_SCHEMA)
            return
        cols = self._rows([], np.zeros(missing + 1, dtype=np.int64), [], [])
        yield self.rows, shard_table(cols, FULL)


class StreamSpec:
    """Everything a pass needs, checked before the output exists (nothing is read)."""

    def __init__(self, dataset: Any, opts: PackOptions) -> None:
        self.opts = opts
        self.source = _Source(dataset, opts)
        self.tokenizer = opts.load_tokenizer()
        self.binding = stream_binding(self.source, opts, self.tokenizer)
        self.pad = check_pad_id(opts, self.binding.vocab_size, self.tokenizer)
        self.settings = _packer_settings(opts)
        if opts.format == "trl" and opts.capacity < 2:
            raise InvalidInput("format trl counts tokens: capacity must be at least 2")

    def metadata(self) -> dict[str, Any]:
        fields = self.opts.manifest_fields(self.pad)
        trl = self.opts.format == "trl"
        return manifest_record(
            binding=self.binding,
            partition=self.opts.split,
            config=fields["config"],
            kind=(TRL_FORMAT, TRL_VERSION) if trl else (FORMAT, VERSION),
            columns=self.schema().names,
            policy={"name": "stream-best-fit", "options": dict(self.settings)},
            statistics=None,
            input={"kind": "stream"},
        )

    def schema(self) -> pa.Schema:
        # a stream's schema is fixed before a row is read: TRL's rows keep their labels
        return TRL_SCHEMA if self.opts.format == "trl" else FULL.schema()


def _generate(spec: StreamSpec) -> Iterator[tuple[int, pa.Table]]:
    yield from _Packing(spec).run()


def pack_stream(dataset: Any, opts: PackOptions, meta_key: str) -> Any:
    """``dataset`` (a stream, :func:`is_stream`) as a ``datasets.IterableDataset`` of packed
    rows; the metadata in ``info.description`` under ``meta_key``, as for a ``Dataset``."""
    import datasets
    from datasets.iterable_dataset import ArrowExamplesIterable

    spec = StreamSpec(dataset, opts)
    meta = spec.metadata()
    info = datasets.DatasetInfo(
        description=json.dumps({meta_key: meta}),
        features=datasets.Features.from_arrow_schema(spec.schema()),
    )
    examples = ArrowExamplesIterable(_generate, {"spec": spec})
    return datasets.IterableDataset(examples, info=info)


__all__ = ["STREAM_CHUNK", "StreamSpec", "is_stream", "pack_stream"]
