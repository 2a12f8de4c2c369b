"""What loading a packed directory costs at each verification depth.

    .venv/bin/python benchmarks/bench_verify.py            # W1: 200,000 examples, ~69M tokens
    .venv/bin/python benchmarks/bench_verify.py --quick    # 20,000 examples

Workload: W1 lengths (benchmarks/workloads.py), random token ids below 32,000,
packed best-fit-decreasing at capacity 4096 and written by ``write_packed``
(shards of 2**25 tokens, zstd). Then, each timed ``--repeats`` times with the
files in the page cache (one untimed read first), median reported:

- ``verify=False``: the manifest checks alone (``check_manifest``);
- ``verify=True``: plus size and sha256 of every shard (the checksum fast path,
  the default);
- ``verify="full"``: plus every shard decoded now and held against the
  manifest (``check_contents``);
- the baseline, in the same run: decoding every shard once (``shard_rows``),
  which any epoch over the output does anyway; each shard read at any depth
  runs ``check_shard``, timed separately.

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

from seqpack import Binding, ExampleTable
from seqpack.io.store import load_packed, write_packed
from seqpack.io.verify import check_shard
from seqpack.pipeline.local import pack_table

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
    store = load_packed(out, verify=False)
    for k in range(len(store.shards)):
        store.shard_rows(k)


def checks_only(out: Path) -> float:
    """Seconds ``check_shard`` takes over every shard (decoding excluded)."""
    store = load_packed(out, verify=False)
    total = 0.0
    for k, entry in enumerate(store.shards):
        rows = store.shard_rows(k)
        started = time.perf_counter()
        check_shard(rows, entry, store.occurrences, entry["file"])
        total += time.perf_counter() - started
    return total


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
        store = load_packed(out, verify="full")  # warms the page cache
        size = sum(s["bytes"] for s in store.shards)
        tokens = sum(s["tokens"] for s in store.shards)
        print(f"W1[:{examples:,}]: {store.num_rows:,} rows, {tokens:,} tokens, "
              f"{len(store.shards)} shards, {size / 2**20:,.1f} MiB; arrow threads {args.threads};"
              f" load average {os.getloadavg()[0]:.2f}")  # fmt: skip
        base = timed(lambda: decode_all(out), args.repeats)
        rows = [
            ("verify=False (manifest checks)", timed(lambda: load_packed(out, verify=False),
                                                     args.repeats)),
            ("verify=True (+ sha256 of every shard)", timed(lambda: load_packed(out),
                                                            args.repeats)),
            ('verify="full" (+ every shard decoded, checked)',
             timed(lambda: load_packed(out, verify="full"), args.repeats)),
            ("baseline: decode every shard once", base),
            ("check_shard alone, every shard", checks_only(out)),
        ]  # fmt: skip
        print(f"{'what':<50} {'seconds':>9} {'x decode':>9}")
        for what, seconds in rows:
            print(f"{what:<50} {seconds:>9.3f} {seconds / base:>9.3f}")
        print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
