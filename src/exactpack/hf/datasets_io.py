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
from collections.abc import Iterator
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
from exactpack.core.tree import TREE_COLUMNS, groups_from_columns, pack_tree
from exactpack.io.documents import Origin
from exactpack.io.integrity import check_rows
from exactpack.io.readers import Input
from exactpack.io.shards import (
    FORMAT,
    VERSION,
    arrow_to_rows,
    layout_of,
    list_array,
    manifest_record,
    shard_table,
    union,
)
from exactpack.io.tree_rows import max_id, tree_records
from exactpack.io.trl_schema import (
    DPO_TEXT,
    TRL_FORMAT,
    TRL_SCHEMA,
    TRL_VERSION,
    carry_columns,
    dpo_text_groups,
    refuse_trl,
    trl_table,
)
from exactpack.pipeline.budget import StreamBudget
from exactpack.pipeline.corpus import Corpus, read_corpus
from exactpack.pipeline.options import DEFAULT_TREE_WINDOW, PackOptions, check_pad_id
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
    ``with_format`` is carried over. A stream (:func:`exactpack.hf.streaming.is_stream`)
    returns a ``datasets.IterableDataset`` packed with ``stream-best-fit`` as it is read
    (``vocab_size`` or a tokenizer required). ``tree=True``: tree packing,
    one record per row (docs/tree.md).
    """
    import datasets

    from exactpack.hf.streaming import is_stream, pack_stream

    tree = keywords.pop("tree", None)
    if tree or (tree is None and isinstance(options, PackOptions) and options.tree):
        return _pack_tree(dataset, tree or options.tree, max_length, policy, options, keywords)
    stream = is_stream(dataset)
    if stream and policy is None and options is None and "policy" not in keywords:
        policy = "stream-best-fit"  # a stream cannot be sorted: its policy, and its options
    model = keywords.pop("model", None)
    opts = _options(max_length, policy, options, keywords)
    _check_model(model, None, None, None, opts)  # its capability and rows, before any read
    if stream:
        return pack_stream(dataset, opts, META_KEY)
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
        _check_model(model, corpus.binding, pad, examples, opts)  # before any row
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


def _pack_tree(
    dataset: Any,
    tree: Any,
    max_length: int | None,
    policy: str | None,
    options: PackOptions | None,
    keywords: dict,
) -> Any:
    """``pack_dataset(..., tree=True)`` (or ``options.tree``): tree packing, docs/tree.md.

    The tree columns (``prompt_ids`` + ``completion_ids``, TRL's DPO ``prompt_ids`` /
    ``chosen_ids`` / ``rejected_ids`` or its text ``prompt`` / ``chosen`` / ``rejected``
    with ``tokenizer=``, or ``input_ids`` + ``group``) become a ``datasets.Dataset`` of one
    record per row, scalar columns carried per sequence
    (:func:`~exactpack.io.trl_schema.carry_columns`). ``model=`` is checked as flat
    ``pack_dataset`` checks it (on tree rows): before reading, then with the longest
    sequence and the vocabulary."""
    import datasets

    from exactpack.hf.capabilities import check_model
    from exactpack.hf.streaming import is_stream

    if tree == "auto":
        raise InvalidInput(
            "pack_dataset(..., tree='auto') is not available: prefix grouping reads files"
            " (exactpack pack --tree auto) — pass tree=True with group columns"
        )
    if options is not None:  # its fields, where no keyword gives them
        max_length, policy = max_length or options.max_length, policy or options.policy
        keywords.setdefault("vocab_size", options.vocab_size)
    if keywords.pop("format", "exactpack") == "trl":
        raise InvalidInput(
            "format='trl' cannot express a tree: TRL's packed rows hold disjoint sequences"
            " (seq_lengths, restarting position_ids) and no node/parent columns — use the"
            " default format with tree=True"
        )
    if max_length is None:
        raise InvalidInput("pack_dataset(..., tree=True) needs max_length= (cells per row)")
    model, vocab = keywords.pop("model", None), keywords.pop("vocab_size", None)
    texts = {k: keywords.pop(k) for k in ("tokenizer", "chat_template") if k in keywords}
    tok = PackOptions.of(options, max_length=max_length, **texts).load_tokenizer()  # DPO text
    vocab = vocab or getattr(tok, "vocab_size", None)
    if model is not None:  # before any read, as flat pack_dataset
        check_model(model, None, None, 0, max_length, tree=True)
    policy = policy or "best-fit-decreasing"
    ident = getattr(tok, "identity", "pretokenized")
    if is_stream(dataset):
        if vocab is None:
            raise InvalidInput(
                "pack_dataset(stream, tree=True) needs vocab_size= (a stream is not read twice"
                " to find its largest id)"
            )
        binding = Binding(int(vocab), ident, "tree-dataset")
        block = options.tree_block if options is not None else DEFAULT_TREE_WINDOW
        spec = (dataset, binding, tok, max_length, policy, model, block, keywords)
        return datasets.IterableDataset.from_generator(_stream_tries, gen_kwargs={"spec": spec})
    wanted = {name for names in TREE_COLUMNS for name in names} - {"group"}
    table = dataset.with_format("arrow")[0 : len(dataset)]
    vocab = vocab or 1 + max(
        (max_id(table.column(n).to_pylist()) for n in table.column_names if n in wanted),
        default=0,
    )
    binding = Binding(int(vocab), ident, "tree-dataset")
    records, _ = _tries(table, binding, tok, max_length, policy, model, keywords, 0)
    return datasets.Dataset.from_list(records)


def _tries(
    table: pa.Table, binding: Binding, tok: Any, max_length: int, policy: str, model: Any,
    keywords: dict, first: int,
) -> tuple[list[dict[str, list[Any]]], int]:  # fmt: skip
    """The tree records of ``table``'s groups (its scalar columns carried), sequences
    numbered from ``first``; how many."""
    from exactpack.hf.capabilities import check_model

    names = table.column_names
    if set(DPO_TEXT) <= set(names) and not any(set(c) <= set(names) for c in TREE_COLUMNS):
        groups, index = dpo_text_groups(table, Origin((("dataset", -first, "row"),)), tok, binding)
    else:
        wanted = {name for names in TREE_COLUMNS for name in names}
        columns = {n: table.column(n).to_pylist() if n in wanted else [] for n in names}
        groups, index = groups_from_columns(columns, binding)
    if model is not None:
        longest = int(groups.lengths.max()) if len(groups) else 0
        check_model(model, groups.binding, None, longest, max_length, tree=True)
    (batch,) = pack_tree(groups, max_length, policy=policy, **keywords).batches
    batch = dataclasses.replace(batch, seq_index=first + index[batch.seq_index])
    return carry_columns(tree_records(batch), table, groups, first), len(index)


def _stream_tries(spec: tuple) -> Any:
    """A stream's tree records, block by block: ``block`` rows at least, then up to where the
    ``group`` changes (a group's adjacent rows stay one trie), each block packed alone."""
    dataset, binding, tok, max_length, policy, model, block, keywords = spec
    rows: list[dict] = []
    first = 0

    def flush() -> Any:
        nonlocal first
        table = pa.Table.from_pylist(rows)
        records, count = _tries(table, binding, tok, max_length, policy, model, keywords, first)
        yield from records
        first += count
        rows.clear()

    for row in dataset:
        if len(rows) >= block and ("group" not in row or row["group"] != rows[-1].get("group")):
            yield from flush()
        rows.append(row)
    if rows:
        yield from flush()


def _check_model(
    model: Any, binding: Binding | None, pad: int | None, examples: Any, opts: PackOptions
) -> None:
    """:func:`exactpack.hf.capabilities.check_model` of ``pack_dataset(..., model=)``, if given."""
    if model is None:
        return
    from exactpack.hf.capabilities import check_model

    lengths = examples.lengths if examples is not None else ()
    longest = int(max(lengths)) if len(lengths) else 0
    check_model(model, binding, pad, longest, opts.capacity)


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
