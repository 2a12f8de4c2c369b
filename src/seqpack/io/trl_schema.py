"""TRL's packed schema (``--format trl``): rows that TRL and transformers consume unchanged.

One table row per packed row (``K`` examples in it, ``n_i`` tokens each)::

    input_ids     list<int32>   the examples' tokens back to back (Σ n_i <= capacity)
    labels        list<int64>   the token where its pair is supervised; -100 on each
                                example's first token (no pair of the example predicts
                                it) and where the input's labels / loss_mask say so
    seq_lengths   list<int32>   [K] tokens per example (TRL 1.16's meaning)
    position_ids  list<int32>   0..n_i-1 per example

``labels`` are int64 because a loss indexes with them (``cross_entropy`` and
TRL's fused head need int64 targets, and ``with_format("torch")`` hands the
stored type on); ids and positions are int32, as ``datasets`` stores a
tokenizer's output, and an embedding or rotary table takes them as they are.

This is what ``trl.pack_dataset(strategy="bfd")`` returns (plus
``position_ids``), so ``DataCollatorForLanguageModeling(padding_free=True)``
reads it as its own: it derives positions from ``seq_lengths`` and sets
``labels`` to -100 where a position is 0, which the labels here already
are. Capacity counts tokens (TRL's ``max_length``), not seqpack's
prediction pairs. For the fixture A=[0,99,100,1], B=[0,101,1], C=[0,102,103,104,1]
at capacity 7, next-fit::

    input_ids     [[0, 99, 100, 1, 0, 101, 1], [0, 102, 103, 104, 1]]
    labels        [[-100, 99, 100, 1, -100, 101, 1], [-100, 102, 103, 104, 1]]
    seq_lengths   [[4, 3], [5]]
    position_ids  [[0, 1, 2, 3, 0, 1, 2], [0, 1, 2, 3, 4]]

A packed directory in this format holds these Parquet shards (readable by
``datasets.load_dataset("parquet", data_files=...)``) and a
``manifest.json`` of format :data:`TRL_FORMAT`, with the same atomic
publication, sizes and sha256 as seqpack's own format.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from seqpack.core import engine
from seqpack.core.batch import IGNORE_INDEX
from seqpack.core.compact import CompactRows, span_labels
from seqpack.core.errors import InvalidInput
from seqpack.io.shards import list_array, token_offsets

TRL_FORMAT = "seqpack.trl-packed"
TRL_VERSION = 1
TRL_SCHEMA = pa.schema(
    [
        ("input_ids", pa.list_(pa.int32())),
        ("labels", pa.list_(pa.int64())),
        ("seq_lengths", pa.list_(pa.int32())),
        ("position_ids", pa.list_(pa.int32())),
    ]
)


@engine.kernel
def trl_loop(tokens, mask, every, lens, labels, positions):  # pragma: no cover - numba
    # One pass writes both per-token columns (int64 labels, int32 positions); unsigned
    # indices keep LLVM's loop free of wraparound checks.
    one = np.uint64(1)
    p = np.uint64(0)
    q = np.uint64(0)
    for i in range(lens.shape[0]):
        n = np.uint64(lens[i])
        labels[p] = IGNORE_INDEX
        positions[p] = 0
        if every:
            for j in range(n):
                labels[p + one + j] = tokens[p + one + j]
                positions[p + one + j] = j + one
        else:
            for j in range(n):
                labels[p + one + j] = tokens[p + one + j] if mask[q + j] else IGNORE_INDEX
                positions[p + one + j] = j + one
        p += n + one
        q += n


def trl_columns(cols: CompactRows, tok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``labels`` int64 and ``position_ids`` int32, [Σ(len+1)] each, of ``cols``'s windows
    (``tok``: their token offsets): one numba pass, or NumPy without numba."""
    lengths = np.ascontiguousarray(cols.lengths, dtype=np.int64)
    mask = cols.loss_mask
    kernel = engine.compiled("trl_loop")
    if kernel is not None:
        labels = np.empty(int(tok[-1]), dtype=np.int64)
        positions = np.empty(int(tok[-1]), dtype=np.int32)
        every = mask is None
        flags = np.ones(1, dtype=bool) if every else mask
        kernel(cols.tokens, flags, every, lengths, labels, positions)
        return labels, positions
    if mask is None:
        mask = np.ones(int(lengths.sum()), dtype=bool)
    labels = span_labels(cols.tokens, mask, lengths).astype(np.int64)
    positions = np.arange(int(tok[-1]), dtype=np.int32)
    positions -= np.repeat(tok[:-1].astype(np.int32), lengths + 1)
    return labels, positions


def trl_table(cols: CompactRows) -> pa.Table:
    """``cols`` (one shard's rows) in TRL's packed schema (see the module docstring)."""
    windows = cols.lengths + 1
    tok, row_tok = token_offsets(cols)
    labels, positions = trl_columns(cols, tok)
    arrays = [
        list_array(row_tok, cols.tokens, pa.int32()),  # the gathered tokens, no copy
        list_array(row_tok, labels, pa.int64()),
        list_array(cols.row_offsets, windows, pa.int32()),
        list_array(row_tok, positions, pa.int32()),
    ]
    return pa.Table.from_arrays(arrays, schema=TRL_SCHEMA)


def is_trl(manifest: object) -> bool:
    """Whether ``manifest`` (a packed output's metadata) is a TRL-format output's."""
    return (
        isinstance(manifest, dict)
        and manifest.get("format") == TRL_FORMAT
        and manifest.get("version") == TRL_VERSION
    )


def refuse_trl(manifest: object, where: str) -> None:
    """Raise a clear :class:`InvalidInput` when ``manifest`` is a TRL-format output, which
    seqpack's own loaders (``load_packed``, ``PackedBatches``, ``to_batches``) do not read."""
    if isinstance(manifest, dict) and manifest.get("format") == TRL_FORMAT:
        raise InvalidInput(
            f"{where} holds TRL-format rows (packed with --format trl), which seqpack's own"
            " loaders do not read — load it with seqpack.hf.load_trl(path) or"
            " datasets.load_dataset('parquet', data_files=...), and train it with TRL's"
            " padding-free collator; pack without --format trl for PackedBatches"
        )


def check_trl_contents(manifest: Mapping, folder: Path) -> None:
    """Decode every shard of a TRL-format directory (:mod:`seqpack.io.trl_schema`) and hold it
    against the manifest: TRL's schema (declared columns and Arrow types), the entry's
    rows, examples, tokens and supervised labels, rows of at most ``capacity`` tokens made
    of whole examples, ids in ``[0, vocab_size)``, labels -100 or their token (-100 on
    each example's first), positions restarting per example."""
    capacity = int(manifest["config"]["capacity"])
    vocab = int(manifest["binding"]["vocab_size"])
    for entry in manifest["shards"]:
        file = folder / entry["file"]
        try:
            table = pq.read_table(file)
        except (pa.ArrowException, OSError) as err:
            raise _damaged(file, f"cannot read the shard ({err})") from None
        if not table.schema.equals(TRL_SCHEMA):
            raise _damaged(file, f"schema {table.schema} is not TRL's {TRL_SCHEMA}")
        if any(_nulls(table.column(n)) for n in TRL_SCHEMA.names):
            raise _damaged(file, "a value is missing (null)")
        ids, labels, lens, pos = (table.column(n).combine_chunks() for n in TRL_SCHEMA.names)
        tokens, targets = ids.flatten().to_numpy(), labels.flatten().to_numpy()
        if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
            raise _damaged(file, f"a token id is outside [0, {vocab}) (binding.vocab_size)")
        row_len = np.diff(ids.offsets.to_numpy())
        seq = lens.flatten().to_numpy().astype(np.int64)
        per_row = np.add.reduceat(seq, lens.offsets.to_numpy()[:-1]) if seq.size else seq
        starts = np.zeros(seq.shape[0], dtype=np.int64)
        np.cumsum(seq[:-1], out=starts[1:])
        want = np.arange(int(seq.sum()), dtype=np.int64) - np.repeat(starts, seq)
        ignored = targets == -100
        if (
            table.num_rows != entry["rows"]
            or len(seq) != entry["occurrences"]
            or int(row_len.sum()) != entry["tokens"]
            or not np.array_equal(np.diff(labels.offsets.to_numpy()), row_len)
            or not np.array_equal(per_row, row_len)
            or (seq.size and (int(seq.min()) < 2 or int(row_len.max()) > capacity))
            or not np.array_equal(pos.flatten().to_numpy(), want)
            or not np.all(ignored | (targets == tokens))
            or not np.all(ignored[starts])
            or entry.get("eligible", int((~ignored).sum())) != int((~ignored).sum())
        ):
            raise _damaged(
                file,
                "rows, seq_lengths, labels or position_ids disagree with each other, the"
                f" manifest entry or capacity {capacity:,}",
            )


def _nulls(column: pa.ChunkedArray) -> int:
    return sum(c.null_count + c.flatten().null_count for c in column.chunks)


def _damaged(where: Path, what: str) -> InvalidInput:
    return InvalidInput(
        f"{where}: {what} — the packed directory was changed or damaged; pack again"
    )
