"""What loading a packed directory costs at each verification depth.

    .venv/bin/python benchmarks/bench_verify.py            # W1: 200,000 examples, ~69M tokens
    .venv/bin/python benchmarks/bench_verify.py --quick    # 20,000 examples

Workload: W1 lengths (benchmarks/workloads.py), random token ids below 32,000,
packed best-fit-decreasing at capacity 4096 and written by ``write_packed``
(shards of 2**25 tokens, zstd). Then, each timed ``--repeats`` times with the
files in the page cache (one untimed read first), median reported:

- ``integrity=False``: the manifest checks alone (``check_manifest``);
- ``integrity=True``: plus size and sha256 of every shard (the checksum fast path,
  the default);
- ``integrity="full"``: plus every shard decoded now and held against the
  manifest (``check_contents``);
- the baseline, in the same run: decoding every shard once (``shard_rows``),
  which any epoch over the output does anyway; each shard read at any depth
  runs ``check_table`` (schema: declared columns and types; no nulls) and
  ``check_shard``, timed separately, against a plain decode without them
  (``pq.read_table`` + ``arrow_to_rows``);
- the same W1 examples packed ``--format trl``: ``load_trl``'s content check
  (``check_trl_contents``, run at the default depth) against reading every
  shard once (``pq.read_table``).

Arrow's thread pools are set to one thread (``--threads``) so runs compare;
the load average is printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from exactpack import Binding, ExampleTable
from exactpack.io.integrity import check_shard, check_table
from exactpack.io.shards import arrow_to_rows
from exactpack.io.store import load_packed, write_packed
from exactpack.io.trl_schema import check_trl_contents
from exactpack.pipeline.local import pack_path, pack_table

sys.path.insert(0, str(Path(__file__).parent))
from workloads import w1_sft

VOCAB = 32_000


def build(folder: Path, examples: int) -> Path:
    lengths = w1_sft().lengths[:examples]
    rng = np.random.default_rng(0)
    offsets = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = np.array([f"doc-{i}" for i in range(lengths.shape[0])], dtype=object)
    table = ExampleTable(
        windows=rng.integers(0, VOCAB, size=int(offsets[-1]), dtype=np.int32),
        offsets=offsets,
        loss_mask=np.ones(int(offsets[-1]) - lengths.shape[0], dtype=bool),
        source_ids=ids,
        example_ids=ids,
        range_starts=np.zeros(lengths.shape[0], dtype=np.int64),
        range_ends=lengths.astype(np.int64),
        partition="train",
        binding=Binding(VOCAB, "bench", "sha256:bench-verify"),
    )
    _, rows = pack_table(table, 4096)
    write_packed(rows, folder / "out", max_rows_per_batch=8)
    return folder / "out"


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def decode_all(out: Path) -> None:
    store = load_packed(out, integrity=False)
    for k in range(len(store.shards)):
        store.shard_rows(k)


def checks_only(out: Path) -> tuple[float, float]:
    """Seconds ``check_table`` and ``check_shard`` take over every shard (decoding
    excluded)."""
    store = load_packed(out, integrity=False)
    tables = shards = 0.0
    for k, entry in enumerate(store.shards):
        table = pq.read_table(out / entry["file"], memory_map=True)
        started = time.perf_counter()
        check_table(table, entry["file"], entry)
        tables += time.perf_counter() - started
        rows = store.shard_rows(k)
        started = time.perf_counter()
        check_shard(rows, entry, store.occurrences, entry["file"])
        shards += time.perf_counter() - started
    return tables, shards


def plain_decode(out: Path) -> None:
    """Every shard decoded into rows with no check (what loading cost before checking)."""
    store = load_packed(out, integrity=False)
    for entry in store.shards:
        table = pq.read_table(out / entry["file"], memory_map=True)
        arrow_to_rows(table, capacity=store.capacity, partition=store.partition,
                      binding=store.binding, where=entry["file"])  # fmt: skip


def build_trl(folder: Path, examples: int) -> Path:
    lengths = w1_sft().lengths[:examples]
    rng = np.random.default_rng(0)
    offsets = np.zeros(lengths.shape[0] + 1, dtype=np.int32)
    np.cumsum(lengths + 1, out=offsets[1:])
    ids = rng.integers(0, VOCAB, size=int(offsets[-1]), dtype=np.int32)
    table = pa.table({"input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids))})
    pack_path(table, folder / "trl", max_length=4097, vocab_size=VOCAB, format="trl",
              spill_dir=folder)  # fmt: skip
    return folder / "trl"


def trl_rows(folder: Path, repeats: int) -> list[tuple[str, float]]:
    import json

    manifest = json.loads((folder / "manifest.json").read_text())
    files = [folder / e["file"] for e in manifest["shards"]]
    base = timed(lambda: [pq.read_table(f) for f in files], repeats)
    check = timed(lambda: check_trl_contents(manifest, folder), repeats)
    return [("trl: read every shard once", base), ("trl: check_trl_contents", check)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20,000 examples")
    parser.add_argument("--examples", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    pa.set_cpu_count(args.threads)
    pa.set_io_thread_count(args.threads)
    examples = 20_000 if args.quick else args.examples
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        out = build(Path(tmp), examples)
        store = load_packed(out, integrity="full")  # warms the page cache
        size = sum(s["bytes"] for s in store.shards)
        tokens = sum(s["tokens"] for s in store.shards)
        print(f"W1[:{examples:,}]: {store.num_rows:,} rows, {tokens:,} tokens, "
              f"{len(store.shards)} shards, {size / 2**20:,.1f} MiB; arrow threads {args.threads};"
              f" load average {os.getloadavg()[0]:.2f}")  # fmt: skip
        base = timed(lambda: decode_all(out), args.repeats)
        rows = [
            ("verify=False (manifest checks)", timed(lambda: load_packed(out, integrity=False),
                                                     args.repeats)),
            ("verify=True (+ sha256 of every shard)", timed(lambda: load_packed(out),
                                                            args.repeats)),
            ('verify="full" (+ every shard decoded, checked)',
             timed(lambda: load_packed(out, integrity="full"), args.repeats)),
            ("baseline: decode every shard once", base),
            ("plain decode, no checks", timed(lambda: plain_decode(out), args.repeats)),
            *zip(("check_table alone, every shard", "check_shard alone, every shard"),
                 checks_only(out), strict=True),
        ]  # fmt: skip
        print(f"{'what':<50} {'seconds':>9} {'x decode':>9}")
        for what, seconds in rows:
            print(f"{what:<50} {seconds:>9.3f} {seconds / base:>9.3f}")
        trl = trl_rows(build_trl(Path(tmp), examples), args.repeats)
        for what, seconds in trl:
            print(f"{what:<50} {seconds:>9.3f} {seconds / trl[0][1]:>9.3f}")
        print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
