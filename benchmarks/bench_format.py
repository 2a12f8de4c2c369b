"""Packed-shard encodings measured: write speed vs size vs read speed for training.

    .venv/bin/python benchmarks/bench_format.py              # one shard of W2-like rows
    .venv/bin/python benchmarks/bench_format.py --tokens 8e6 # smaller shard

One output shard (default 2**25 tokens, the writer's shard size) of rows of
capacity 2048 filled with W2-like examples (16..512 tokens). The token ids
are real: the standard library encoded with the benchmark BPE
(:mod:`corpus`), so compression ratios are those of text, not of random
ids. About a third of the examples carry a prompt prefix that is not
supervised (the loss flags of SFT data). Each candidate writes the shard
with ``pyarrow.parquet`` and reads it back as ``PackedStore`` does
(``read_table`` + NumPy views of every column). Speeds are MB of int32
tokens per CPU second of the one thread that writes or reads (robust to a
shared machine's load, where wall time is not); they are medians of
``--repeats`` runs taken round-robin (a change of load hits every candidate
alike); the first line is version 1's encoding (nine zstd columns,
labels repeating tokens). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import io
import itertools
import os
import resource
import statistics

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from corpus import stdlib_texts, train_tokenizer


def real_tokens(count: int) -> np.ndarray:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(train_tokenizer()))
    out, have = [], 0
    for _, text in stdlib_texts():
        ids = np.asarray(tok.encode(text).ids, dtype=np.int32)
        out.append(ids)
        have += ids.size
        if have >= count:
            break
    flat = np.concatenate(out)
    return np.resize(flat, count)


def shard_columns(total: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Windows of W2-like lengths packed next-fit into rows of 2048 pairs."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(16, 513, size=total // 200)
    lengths = lengths[np.cumsum(lengths + 1) <= total]
    cap = 2048
    row_of = np.zeros(lengths.shape[0], dtype=np.int64)
    start_of = np.zeros_like(row_of)
    row = used = 0
    for i, n in enumerate(lengths.tolist()):
        if used + n > cap:
            row, used = row + 1, 0
        row_of[i], start_of[i] = row, used
        used += n
    tokens = real_tokens(int((lengths + 1).sum()))
    prompt = np.where(rng.random(lengths.shape[0]) < 0.35, rng.integers(1, 15, lengths.shape[0]), 0)
    flags = np.ones(int(lengths.sum()), dtype=bool)
    firsts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    for f, p in zip(firsts.tolist(), prompt.tolist(), strict=True):
        flags[f : f + p] = False
    return {
        "lengths": lengths,
        "row_of": row_of,
        "start_of": start_of,
        "tokens": tokens,
        "flags": flags,
        "rows": row + 1,
    }


def _lists(offsets: np.ndarray, values: pa.Array) -> pa.ListArray:
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values)


def tables(cols: dict) -> dict[str, pa.Table]:
    """Candidate layouts of the same rows: v1 (labels) and v2 (flags as bools or bits)."""
    lengths, row_of = cols["lengths"], cols["row_of"]
    occ = np.searchsorted(row_of, np.arange(cols["rows"] + 1))
    tok_off = np.concatenate([[0], np.cumsum(lengths + 1)])
    row_tok = tok_off[occ]
    tokens, flags = cols["tokens"], cols["flags"]
    keep = np.ones(tokens.shape[0], dtype=bool)
    keep[tok_off[:-1]] = False
    labels = np.full(tokens.shape[0], -100, dtype=np.int32)
    labels[np.flatnonzero(keep)[flags]] = tokens[np.flatnonzero(keep)[flags]]
    n = lengths.shape[0]
    ids = pa.array(np.arange(n).astype(str))
    per_occ = {
        "seq_starts": _lists(occ, pa.array(cols["start_of"].astype(np.int32))),
        "ordinals": _lists(occ, pa.array(np.arange(n, dtype=np.int64))),
        "source_ids": _lists(occ, ids),
        "example_ids": _lists(occ, ids),
        "range_starts": _lists(occ, pa.array(np.zeros(n, dtype=np.int64))),
        "range_ends": _lists(occ, pa.array(lengths + 1)),
    }
    row = pa.array(np.arange(cols["rows"], dtype=np.int64))
    v1 = pa.table(
        {
            "row": row,
            "tokens": _lists(row_tok, pa.array(tokens)),
            "labels": _lists(row_tok, pa.array(labels)),
            "seq_lengths": _lists(occ, pa.array(lengths.astype(np.int32))),
            **per_occ,
        }
    )
    pair_off = np.concatenate([[0], np.cumsum(lengths)])[occ]
    base = {
        "row": row,
        "tokens": _lists(row_tok, pa.array(tokens)),
        "pair_counts": _lists(occ, pa.array(lengths.astype(np.int32))),
        "seq_starts": per_occ["seq_starts"],
        "ordinals": per_occ["ordinals"],
        "source_ids": per_occ["source_ids"],
    }
    bools = pa.table({**base, "loss_flags": _lists(pair_off, pa.array(flags))})
    packed = [np.packbits(flags[a:b]).tobytes() for a, b in itertools.pairwise(pair_off)]
    bits = pa.table({**base, "loss_bits": pa.array(packed, pa.binary())})
    uniform = pa.table(base)
    return {"v1": v1, "v2 list<bool>": bools, "v2 packed bits": bits, "v2 all supervised": uniform}


def encodings() -> dict[str, dict]:
    return {
        "zstd(1)": {"compression": "zstd", "compression_level": 1},
        "zstd(3)": {"compression": "zstd", "compression_level": 3},
        "lz4": {"compression": "lz4"},
        "snappy": {"compression": "snappy"},
        "none": {"compression": "none"},
    }


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_utime + usage.ru_stime


def measure_once(table: pa.Table, kwargs: dict) -> tuple[float, int, float]:
    """CPU seconds of one write, its size (bytes), CPU seconds of one read back.

    CPU time of this thread (the writer and a ``use_threads=False`` reader
    run here), not wall time: on a shared machine it barely moves with the
    load, where wall time doubles.
    """
    sink = io.BytesIO()
    t0 = _cpu()
    pq.write_table(table, sink, row_group_size=4096, **kwargs)
    write = _cpu() - t0
    data = sink.getvalue()
    t0 = _cpu()
    back = pq.read_table(pa.BufferReader(data), use_threads=False)
    for name in back.column_names:
        col = back.column(name).combine_chunks()
        if isinstance(col, pa.ListArray):
            col.flatten().to_numpy(zero_copy_only=False)
        else:
            col.to_numpy(zero_copy_only=False)
    return write, len(data), _cpu() - t0


def measure_all(cases: list, candidates: dict, repeats: int) -> list[tuple[float, int, float]]:
    """Medians per case, the cases taken round-robin so a change of load hits them all."""
    runs: list[list[tuple[float, int, float]]] = [[] for _ in cases]
    for _ in range(repeats):
        for k, (layout, _, kw) in enumerate(cases):
            runs[k].append(measure_once(candidates[layout], kw))
    return [
        (statistics.median(r[0] for r in rs), rs[0][1], statistics.median(r[2] for r in rs))
        for rs in runs
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=float, default=2**25, help="tokens in the shard")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    cols = shard_columns(int(args.tokens))
    mb = cols["tokens"].nbytes / 1e6
    print(
        f"shard: {cols['rows']:,} rows, {cols['lengths'].shape[0]:,} occurrences,"
        f" {cols['tokens'].shape[0]:,} tokens ({mb:.0f} MB int32); load {os.getloadavg()[0]:.2f}"
    )
    print("| layout | encoding | write MB/CPU-s | size MB | size / int32 tokens | read MB/CPU-s |")
    print("|---|---|---:|---:|---:|---:|")
    cases = [("v1", "zstd(1)", encodings()["zstd(1)"])]
    for layout in ("v2 list<bool>", "v2 packed bits", "v2 all supervised"):
        for name, kw in encodings().items():
            cases.append((layout, name, kw))
        cases.append(
            (layout, "zstd(1), no dictionary", {**encodings()["zstd(1)"], "use_dictionary": False})
        )
    candidates = tables(cols)
    for (layout, name, _), (w, size, r) in zip(
        cases, measure_all(cases, candidates, args.repeats), strict=True
    ):
        ratio = size / 1e6 / mb
        print(
            f"| {layout} | {name} | {mb / w:.0f} | {size / 1e6:.1f} | {ratio:.2f} | {mb / r:.0f} |"
        )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
