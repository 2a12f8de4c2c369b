"""Hugging Face ``datasets`` in and out: pack a Dataset into a packed Dataset, and back.

``pack_dataset(ds, max_length)`` takes a ``datasets.Dataset`` with ``input_ids``
(optional ``labels`` with -100, ``loss_mask``, ``id``: :mod:`exactpack.io.columns`) and
returns one row per packed row in the columns of :mod:`exactpack.io.shards`; the metadata
(binding, partition, capacity, policy, columns, statistics) travels as JSON in
``info.description`` under ``"exactpack"``. For the fixture::

    >>> packed = pack_dataset(Dataset.from_dict({"input_ids": [A, B, C]}), 6, "next-fit")
    >>> packed["tokens"]        # [[0, 99, 100, 1, 0, 101, 1], [0, 102, 103, 104, 1]]
    >>> packed["seq_starts"]    # [[0, 3], [0]]

A memory-mapped input gives a memory-mapped output. ``to_batches(packed)`` rebuilds the
padded model calls; ``unpack_dataset(packed)`` the examples in their original order.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import secrets
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from exactpack.core.batch import PackedBatch
from exactpack.core.binding import Binding, Split
from exactpack.core.compact import CompactRows, Storage, gather_rows, gather_segments, span_labels
from exactpack.core.config import PackConfig
from exactpack.core.errors import InvalidInput, did_you_mean
from exactpack.core.examples import offsets_of
from exactpack.core.policies import policy_option_names
from exactpack.core.supervision import Objective
from exactpack.core.tree import TREE_COLUMNS, max_id
from exactpack.io.documents import make_binding
from exactpack.io.integrity import check_rows
from exactpack.io.readers import Input, open_input
from exactpack.io.shards import (
    FORMAT,
    FULL,
    VERSION,
    arrow_to_rows,
    layout_of,
    list_array,
    manifest_record,
    shard_table,
    union,
)
from exactpack.io.trl_schema import TRL_FORMAT, TRL_SCHEMA, TRL_VERSION, refuse_trl, trl_table
from exactpack.pipeline.budget import StreamBudget, read_limits
from exactpack.pipeline.corpus import Corpus, read_corpus
from exactpack.pipeline.options import PackOptions, check_pad_id
from exactpack.pipeline.pack_tree import PlannedBlock, tree_blocks, whole_groups, with_carried
from exactpack.pipeline.stream_engine import NO_PLACEMENTS, StreamPass, StreamSettings, StreamSource
from exactpack.pipeline.writer import (
    CorpusSource,
    Examples,
    corpus_examples,
    layout_for,
    plan_corpus,
    shard_spans,
    source_stats,
)

META_KEY = "exactpack"
#: The columns tree packing reads (:data:`~exactpack.core.tree.TREE_COLUMNS`).
_TREE = {name for names in TREE_COLUMNS for name in names}
#: Stream rows read, checked and tokenized at a time.
STREAM_CHUNK = 1024


def _options(
    max_length: int | None, policy: str | None, options: PackOptions | None, keywords: dict
) -> PackOptions:
    fields = {f.name for f in dataclasses.fields(PackOptions)}
    strays = sorted(set(keywords) - fields - policy_option_names())
    if strays:  # neither a PackOptions field nor any policy's option: a typo, most likely
        known = fields | policy_option_names() | {"model", "tree"}
        raise InvalidInput(
            f"pack_dataset got an unknown keyword {strays[0]}"
            + (
                did_you_mean(strays[0], known)
                or "; its keywords are PackOptions fields, the policy's options"
                " (lookahead=...), model= and tree="
            )
        )
    overrides = {k: keywords.pop(k) for k in list(keywords) if k in fields}
    given = {"max_length": max_length, "policy": policy}
    overrides |= {k: v for k, v in given.items() if v is not None}
    if keywords:
        base = options.policy_options if options is not None else {}
        overrides["policy_options"] = {**base, **keywords}
    return PackOptions.of(options, **overrides)


def fingerprint_receipt(source: Input, partition: Split) -> str | None:
    """The split receipt of a ``datasets`` input: a digest of its fingerprint (datasets'
    own identity of the data and its transforms) and the partition; None without one."""
    if not source.fingerprint:
        return None
    text = f"exactpack-split\0{partition.value}\0datasets-fingerprint\0{source.fingerprint}"
    return "datasets:" + hashlib.sha256(text.encode()).hexdigest()[:32]


def _fingerprint(base: str | None, meta: dict[str, Any]) -> str:
    """The output's fingerprint: the input's and every option that shaped the output."""
    text = json.dumps({"input": base or secrets.token_hex(8), "exactpack": meta}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def pack_dataset(
    dataset: Any,
    max_length: int | None = None,
    policy: str | None = None,
    *,
    options: PackOptions | None = None,
    **keywords: Any,
) -> Any:
    """Pack ``dataset`` (``input_ids`` [+ ``labels``]) into a ``datasets.Dataset`` of rows.

    ``max_length`` (tokens per row), ``policy``,
    ``options`` and any :class:`PackOptions` field as a keyword say how; other keywords are
    policy options (``lookahead=4096``). ``vocab_size`` defaults to the tokenizer's
    (``tokenizer=``: a path or a loaded tokenizer), else the largest id + 1;
    ``pad_token_id`` (default: the tokenizer's) is checked against it first.
    ``model=`` (a model or its config) is checked before any row
    (:func:`exactpack.hf.capabilities.check_model`).

    ``format="trl"``: TRL's packed schema (:mod:`exactpack.io.trl_schema`). The input's
    ``with_format`` is carried over. A stream (:func:`is_stream`) returns a
    ``datasets.IterableDataset`` packed as it is read (:mod:`exactpack.pipeline.stream_engine`;
    ``vocab_size`` or a tokenizer required). ``tree=True`` (or ``options.tree``): tree
    packing, one record per row (docs/tree.md): a ``Dataset`` as ``pack --tree`` packs a
    file, a stream by the same engine as flat rows, each group's trie one unit (read
    ``tree_block`` rows at a time, on to the end of the last one's ``group``).
    """
    import datasets

    if isinstance(keywords.get("tree"), bool):
        keywords["tree"] = "on" if keywords["tree"] else None
    stream = is_stream(dataset)
    if stream and policy is None and options is None and "policy" not in keywords:
        policy = "stream-best-fit"  # a stream cannot be sorted: its policy, and its options
    model = keywords.pop("model", None)
    opts = _options(max_length, policy, options, keywords)
    _check_model(model, None, None, 0, opts)  # its capability and rows, before any read
    _refuse_tree_options(opts)
    if stream:
        return _pack_stream(dataset, opts, model)
    if opts.tree:
        return _pack_forest(dataset, opts, model)
    tokenizer = opts.load_tokenizer()
    corpus = read_corpus(
        dataset,
        opts,
        tokenizer,
        receipt=lambda found: fingerprint_receipt(found, opts.split),
        default_vocab=True,
    )
    try:
        pad = check_pad_id(opts, corpus.binding.vocab_size, tokenizer)
        examples = corpus_examples(corpus, opts, StreamBudget.of(opts, corpus.source.kind))
        longest = int(max(examples.lengths)) if len(examples.lengths) else 0
        _check_model(model, corpus.binding, pad, longest, opts)  # before any row
        storage = plan_corpus(examples, opts)
        columns, table = _tables(corpus, examples, storage, opts)
        fingerprint_in = corpus.source.fingerprint
    finally:
        corpus.close()
    fields = opts.manifest_fields(pad)
    meta = manifest_record(
        binding=corpus.binding,
        partition=opts.split,
        config=fields["config"],
        kind=(TRL_FORMAT, TRL_VERSION) if opts.format == "trl" else (FORMAT, VERSION),
        columns=columns,
        policy=fields["policy"],
        statistics=storage.plan.stats() | source_stats(corpus, examples),
    )
    info = datasets.DatasetInfo(description=json.dumps({META_KEY: meta}))
    fingerprint = _fingerprint(fingerprint_in, meta)
    packed = _as_dataset(table, info, fingerprint, _cache_folder(dataset))
    return carry_format(dataset, packed)


def _refuse_tree_options(opts: PackOptions) -> None:
    """The tree options ``pack_dataset`` cannot honour, refused before any read."""
    if opts.tree == "auto":
        raise InvalidInput(
            "pack_dataset(..., tree='auto') is not available: prefix grouping reads files"
            " (exactpack pack --tree auto) — pass tree=True with group columns"
        )
    if opts.tree and opts.format == "trl":
        raise InvalidInput(
            "format='trl' cannot express a tree: TRL's packed rows hold disjoint sequences"
            " (seq_lengths, restarting position_ids) and no node/parent columns — use the"
            " default format with tree=True"
        )


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


def stream_world() -> int:
    """The world size of an initialised ``torch.distributed`` group, else 1."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size())
    return 1


def _source(dataset: Any, opts: PackOptions) -> StreamSource:
    """A stream's source: an ``IterableDatasetDict``'s split ``opts.split``."""
    import datasets

    if isinstance(dataset, datasets.IterableDatasetDict):
        if opts.split.value not in dataset:
            raise InvalidInput(
                f"the stream has splits {sorted(dataset)}, not {opts.split.value!r} —"
                " pass split= with one of them"
            )
        dataset = dataset[opts.split.value]
    return StreamSource(dataset, text_field=opts.text_field)


def _pack_stream(dataset: Any, opts: PackOptions, model: Any) -> Any:
    """A stream packed as it is read by :mod:`exactpack.pipeline.stream_engine` (a unit: an
    example or, with ``opts.tree``, a group's trie): each chunk's closed rows an Arrow
    table, ``model``'s conditions checked on them; under torchrun flat rows end padded with
    empty rows to a multiple of ``world_size * max_rows_per_batch``. The metadata as a
    ``Dataset``'s (tree records: none, their carried columns are known once read)."""
    import datasets

    source = _source(dataset, opts)
    tokenizer = opts.load_tokenizer()
    if opts.vocab_size is None and tokenizer is None:
        raise InvalidInput(
            "a stream's largest token id is not known before it is read — pass"
            " vocab_size= (the model's vocabulary size) or a tokenizer= that defines it"
        )
    info = getattr(source.documents, "info", None)
    parts = [type(source.documents).__name__]
    if info is not None:
        parts += [str(info.dataset_name), str(info.config_name), str(info.splits)]
    text = "\0".join(["exactpack-split", opts.split.value, "stream", *parts])
    receipt = "stream:" + hashlib.sha256(text.encode()).hexdigest()[:32]
    binding = make_binding(lambda: receipt, **opts.binding_keywords(tokenizer))
    pad = check_pad_id(opts, binding.vocab_size, tokenizer)
    if opts.truncation_mode is not None:
        raise InvalidInput(
            "truncation_mode= truncates a dataset read whole (a Dataset, or a file):"
            " a stream is packed as it is read — drop truncation_mode= or pass cut_long=True"
        )
    if opts.policy not in ("best-fit-decreasing", "stream-best-fit"):
        raise InvalidInput(
            f"a stream is packed with policy 'stream-best-fit' (it cannot be sorted or"
            f" revisited), not {opts.policy!r} — drop policy= or read the data into a"
            " datasets.Dataset first"
        )
    settings = StreamSettings(
        opts.capacity, opts.pair_capacity, **opts.policy_options, cut_long=opts.cut_long,
        tokenizer=tokenizer, text_field=opts.text_field, partition=opts.split,
        objective=Objective.of(opts), tree=opts.tree,
        chunk=opts.tree_block if opts.tree else STREAM_CHUNK,
    )  # fmt: skip
    settings.check_memory()
    trl = opts.format == "trl"
    schema = TRL_SCHEMA if trl else FULL.schema()  # fixed before a row is read
    meta = manifest_record(
        binding=binding,
        partition=opts.split,
        config=opts.manifest_fields(pad)["config"],
        kind=(TRL_FORMAT, TRL_VERSION) if trl else (FORMAT, VERSION),
        columns=schema.names,
        policy={"name": "stream-best-fit", "options": settings.packer()},
        statistics=None,
        input={"kind": "stream"},
    )
    info = datasets.DatasetInfo(
        description=json.dumps({META_KEY: meta}),
        features=datasets.Features.from_arrow_schema(schema),
    )
    if opts.tree:  # records (docs/tree.md): their carried columns are known once read
        info = None
    spec = (source, binding, settings, opts, pad or 0, _check_model(model, binding, pad, 0, opts))
    from datasets.iterable_dataset import ArrowExamplesIterable

    # a pass each (it re-reads the source), resumable by datasets' own state_dict
    return datasets.IterableDataset(ArrowExamplesIterable(_stream_tables, {"spec": spec}), info)


def _stream_tables(spec: tuple) -> Iterator[tuple[int, pa.Table]]:
    """One pass of a stream: the closed rows of each chunk as an Arrow table (tree records:
    a forest shard's rows less ``row``, with the sequences' carried columns)."""
    source, binding, settings, opts, pad, arch = spec
    trl = opts.format == "trl"
    engine = StreamPass(source, binding, settings)
    done = 0
    while not engine.source_done:
        placed = engine.push()
        rows = np.unique(placed[1])
        if rows.size:
            cols = engine.rows(placed, rows, done)
            units = [engine.pending.pop(e) for e in placed[0].tolist()]
            if arch is not None:  # the longest example (or sequence: its deepest node end)
                depths = 0 if cols.depths is None else cols.depths
                arch.check_batch(int((cols.lengths + depths).max()), settings.capacity)
            if settings.tree:
                carried = pa.concat_tables([u.nodes["carried"] for u in units])
                records = shard_table(cols.to_batch()).drop_columns(["row"])
                yield done, with_carried(records, carried, cols.seq_index)
            else:
                yield done, trl_table(cols) if trl else shard_table(cols, FULL)
            done += rows.size
    world = stream_world()
    missing = (-done) % (world * opts.max_rows_per_batch) if world > 1 and not opts.tree else 0
    if missing and trl:  # a 2-token row of the pad id, nothing supervised (TRL needs tokens)
        empty = {"input_ids": [[pad] * 2], "labels": [[-100] * 2], "seq_lengths": [[2]]}
        yield done, pa.Table.from_pydict({k: v * missing for k, v in empty.items()}, TRL_SCHEMA)
    elif missing:
        yield done, shard_table(engine.rows(NO_PLACEMENTS, np.arange(missing), done), FULL)


def _pack_forest(dataset: Any, opts: PackOptions, model: Any) -> Any:
    """``pack_dataset(Dataset, tree=True)`` (docs/tree.md): ``dataset`` tree-packed as
    ``exactpack pack --tree`` packs a file (:mod:`exactpack.pipeline.pack_tree`: blocks of
    ``tree_block`` rows of whole groups, each block's tries planned by the policy), one
    record per row: a forest shard's rows less ``row``, the carried columns
    (:func:`~exactpack.io.trl_schema.carried_columns`) a list per row."""
    tok = opts.load_tokenizer()  # DPO text rows are tokenized as TRL's DPOTrainer does
    read = [n for n in dataset.column_names if n in _TREE and n != "group"]  # default: max + 1
    vocab = opts.vocab_size or getattr(tok, "vocab_size", None)
    vocab = vocab or 1 + max((max_id(dataset[n]) for n in read), default=0)
    binding = Binding(int(vocab), getattr(tok, "identity", "pretokenized"), "tree-dataset")
    source = open_input(dataset, opts.split, read_limits(opts))
    budget = StreamBudget.of(opts, source.kind)
    tables = []
    for groups, index, carried in tree_blocks(whole_groups(source, opts), opts, binding, tok):
        _check_model(model, binding, None, int(groups.lengths.max(initial=0)), opts)
        block = PlannedBlock.of(groups, index, carried, opts, budget)
        tables.append(block.table(0, block.plan.num_rows).drop_columns(["row"]))
    if not tables:
        raise InvalidInput(f"{source.name}: holds no rows — nothing to pack")
    fingerprint = _fingerprint(
        getattr(dataset, "_fingerprint", None), {"tree": opts.manifest_fields()}
    )
    return _as_dataset(pa.concat_tables(tables), None, fingerprint, None)


def _check_model(
    model: Any, binding: Binding | None, pad: int | None, longest: int, opts: PackOptions
) -> Any:
    """:func:`exactpack.hf.capabilities.check_model` of ``pack_dataset(..., model=)``, if
    given: its :class:`~exactpack.hf.architectures.Architecture` (None without a model)."""
    if model is None:
        return None
    from exactpack.hf.capabilities import check_model

    return check_model(model, binding, pad, longest, opts.capacity, tree=opts.tree is not None)


def _tables(
    corpus: Corpus, examples: Examples, storage: Storage, opts: PackOptions
) -> tuple[list[str], pa.Table]:
    """The packed rows gathered into one table (one schema); its column names."""
    source = CorpusSource(corpus, examples, layout_for(corpus, examples, opts.format), opts.split)
    bounds = shard_spans(storage, opts).tolist()
    parts = [gather_rows(source, storage, a, b) for a, b in itertools.pairwise(bounds)]
    if opts.format == "trl":
        tables = [trl_table(cols) for cols in parts]
        schema = TRL_SCHEMA
    else:
        layout = union(layout_of(cols) for cols in parts)
        tables = [shard_table(cols, layout) for cols in parts]
        schema = layout.schema()
    del parts
    return schema.names, pa.concat_tables(tables) if tables else schema.empty_table()


def carry_format(source: Any, packed: Any) -> Any:
    """``packed`` with ``source``'s ``datasets`` format (type, its keywords, and — when
    the source named its columns — those of them that remain plus every new one)."""
    fmt = getattr(source, "format", None)
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "custom"):
        return packed
    columns = None
    if getattr(source, "_format_columns", None) is not None:
        named, had = set(source._format_columns), set(source.column_names)
        columns = [c for c in packed.column_names if c in named or c not in had]
    return packed.with_format(
        fmt["type"],
        columns=columns,
        output_all_columns=fmt.get("output_all_columns", False),
        **fmt.get("format_kwargs", {}),
    )


def _cache_folder(dataset: Any) -> Path | None:
    """Where a memory-mapped input's cache files are (None for an in-memory input)."""
    files = getattr(dataset, "cache_files", None) or []
    return Path(files[0]["filename"]).parent if files else None


def _as_dataset(table: pa.Table, info: Any, fingerprint: str, folder: Path | None) -> Any:
    """``table`` as a Dataset with ``fingerprint``: in memory, or memory-mapped from an
    Arrow file written (atomically) into ``folder``."""
    import datasets
    from datasets.table import InMemoryTable, MemoryMappedTable

    if folder is None:
        return datasets.Dataset(InMemoryTable(table), info=info, fingerprint=fingerprint)
    path = folder / f"cache-exactpack-{fingerprint}.arrow"
    part = folder / f".{path.name}.{secrets.token_hex(4)}.part"
    try:
        with pa.OSFile(str(part), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)
    return datasets.Dataset(
        MemoryMappedTable.from_file(str(path)), info=info, fingerprint=fingerprint
    )


def packed_metadata(packed: Any) -> dict[str, Any]:
    """The ``exactpack`` metadata :func:`pack_dataset` stored in ``info.description``, or
    the manifest of the folder ``exactpack pack`` wrote (``packed`` a path; its shards'
    sizes and sha256 checked as :func:`~exactpack.io.store.load_packed` does)."""
    if isinstance(packed, (str, os.PathLike)):
        from exactpack.io.integrity import check_checksums, check_manifest, read_manifest

        path = Path(packed)
        try:
            meta = read_manifest(path)
        except OSError:
            raise InvalidInput(
                f"{path} has no readable manifest.json: not a finished exactpack output — run"
                " exactpack pack again"
            ) from None
        refuse_trl(meta, str(path))
        check_manifest(meta, path)
        check_checksums(meta, path)
    else:
        try:
            meta = json.loads(packed.info.description or "")[META_KEY]
        except (ValueError, KeyError, TypeError):
            raise InvalidInput(
                "this dataset carries no exactpack metadata in info.description — was it made"
                " by exactpack.hf.pack_dataset? For the shards of an `exactpack pack` folder"
                " pass the folder instead: collator_for('OUT', ...)"
            ) from None
        refuse_trl(meta, "this dataset")
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise InvalidInput(
            f"packed dataset format {meta.get('format')!r} version {meta.get('version')!r} is"
            f" not {FORMAT!r} version {VERSION}"
        )
    return meta


def packed_rows(packed: Any, *, contiguous: bool = True) -> CompactRows:
    """All rows of a packed dataset as :class:`CompactRows` (checked)."""
    meta = packed_metadata(packed)
    table = packed.with_format("arrow")[0 : len(packed)]
    binding = Binding.from_dict(meta["binding"])
    return _rows_of(table, meta, binding, "packed dataset", contiguous=contiguous)


def _rows_of(table: pa.Table, meta: dict, binding: Binding, where: str, **kw: Any) -> CompactRows:
    """``table``'s rows, checked as a loaded shard's are (:func:`check_rows`) against the
    occurrence count the metadata states (a stream's ordinals: only each once)."""
    partition = Split.parse(meta["partition"])
    capacity = int(meta["config"]["capacity"])
    rows = arrow_to_rows(
        table, capacity=capacity, partition=partition, binding=binding, where=where, **kw
    )
    stats = meta.get("statistics")  # None for a stream: its count is not known
    examples = stats.get("examples") if isinstance(stats, dict) else 1 << 62
    if not isinstance(examples, int) or isinstance(examples, bool) or examples < len(rows):
        raise InvalidInput(
            f"{where}: its metadata's statistics.examples is {examples!r}, not the count of the"
            f" {len(rows):,} or more examples it holds — the dataset was changed; pack it again"
        )
    check_rows(rows, examples, where)
    return rows


def to_batches(
    packed: Any, max_rows_per_batch: int | None = None, expected_binding: Binding | None = None
) -> Iterator[PackedBatch]:
    """The padded model calls of a packed ``Dataset`` or streamed ``IterableDataset``
    (checked first), identical to :func:`exactpack.materialize`'s."""
    import datasets

    if not isinstance(packed, (datasets.Dataset, datasets.IterableDataset)):
        raise InvalidInput(
            "to_batches reads the output of exactpack.hf.pack_dataset, not a"
            f" {type(packed).__name__}"
        )
    if expected_binding is not None and not isinstance(expected_binding, Binding):
        raise InvalidInput(
            f"expected_binding must be a exactpack.Binding, got {type(expected_binding).__name__}"
        )
    meta = packed_metadata(packed)
    config = meta["config"]
    per = int(config["max_rows_per_batch"]) if max_rows_per_batch is None else max_rows_per_batch
    per = PackConfig(int(config["capacity"]), per).max_rows_per_batch  # checked
    binding = Binding.from_dict(meta["binding"])
    if expected_binding is not None:
        expected_binding.require(binding, "the packed dataset")
    if isinstance(packed, datasets.Dataset):
        return packed_rows(packed).batches(per)
    tables = packed.with_format("arrow").iter(batch_size=per)
    return (_rows_of(t, meta, binding, "packed stream").to_batch() for t in tables)


def unpack_dataset(packed: Any) -> Any:
    """The packed examples back as a ``datasets.Dataset``, in their original order: ``id``,
    ``example_id``, ``range_start``, ``range_end``, ``input_ids`` (the range's tokens) and
    ``labels`` (the token where its pair is supervised, else -100, as on the first token)."""
    import datasets
    from datasets.table import InMemoryTable

    rows = packed_rows(packed, contiguous=False)
    order = np.argsort(rows.ordinals, kind="stable")
    lens = rows.lengths[order]
    tokens = gather_segments(rows.tokens, rows.token_offsets[order], lens + 1)
    mask = gather_segments(rows.loss_mask, rows.target_offsets[order], lens)
    offsets = offsets_of(lens + 1)
    labels = span_labels(tokens, mask, lens)
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
    base = getattr(packed, "_fingerprint", None) or secrets.token_hex(8)
    fingerprint = hashlib.sha256(f"exactpack-unpack\0{base}".encode()).hexdigest()[:32]
    return datasets.Dataset(InMemoryTable(table), fingerprint=fingerprint)
