"""200,000 examples in 20 Parquet shards: one process vs a process pool vs Ray.

    .venv/bin/python benchmarks/bench_ray_tokens.py       # 2 workers (this machine's cores)
    .venv/bin/python benchmarks/bench_ray_tokens.py --workers 8

W1's lengths (prediction pairs, 200,000 examples) get synthetic token ids
(``len + 1`` per example), written once as 20 shards of 10,000 examples under
``.cache/bench_ray/``. Every engine packs them with best-fit-decreasing at
capacity 4096 into a packed directory (read, check, plan, materialise, write
zstd Parquet, manifest):

- ``local``: :func:`exactpack.pipeline.pack_path`, one process, one global plan;
- ``pool``: :mod:`exactpack.ray`'s plan and write tasks on a
  ``ProcessPoolExecutor`` — one block per shard, the same shards as ``ray``;
- ``ray``: :func:`exactpack.ray.pack` on a local instance of ``--workers``
  CPUs, one block per shard. ``ray.init`` is timed on its own line; the
  first pack starts the workers (imports), the second is warm;
- ``ray 1k``: the same with 1,000-example blocks (rows cost of small blocks).

Printed: seconds, rows, rows / the global lower bound ``ceil(Σ len / 4096)``
and seconds relative to ``local`` in the same run.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from exactpack.io.atomic import open_output
from exactpack.pipeline.local import pack_path
from exactpack.pipeline.options import PackOptions
from exactpack.ray.blocks import file_blocks
from exactpack.ray.shard_layout import ShardCuts
from exactpack.ray.tasks import Settings, plan_block, write_shard
from workloads import EXPECTED_SHA, w1_sft

VOCAB = 32_000
SHARDS = 20
POLICY = "best-fit-decreasing"
ROOT = Path(__file__).resolve().parents[1] / ".cache" / "bench_ray"


def write_shards(lengths: np.ndarray) -> Path:
    """W1 as 20 Parquet shards of ``input_ids`` (``len + 1`` random ids each), cached."""
    folder = ROOT / f"w1-{EXPECTED_SHA['W1 sft']}"
    if (folder / "done").is_file():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for k, part in enumerate(np.array_split(lengths, SHARDS)):
        offsets = np.zeros(part.shape[0] + 1, dtype=np.int32)
        np.cumsum(part + 1, out=offsets[1:])
        ids = rng.integers(0, VOCAB, size=int(offsets[-1]), dtype=np.int32)
        table = pa.table({"input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids))})
        pq.write_table(table, folder / f"part-{k:02d}.parquet")
    (folder / "done").touch()
    return folder


def pool_pack(folder: Path, out: Path, capacity: int, workers: int) -> dict:
    """exactpack.ray's tasks on a process pool: plan every block, lay out, write every shard."""
    blocks = file_blocks(folder, None)
    settings = Settings(
        PackOptions(max_length=capacity, policy=POLICY, vocab_size=VOCAB, split_id="bench")
    )
    with ProcessPoolExecutor(workers) as pool, open_output(out, overwrite=True) as output:
        planned = list(pool.map(plan_block, blocks, [settings] * len(blocks)))
        layout = ShardCuts(len(blocks), settings.options.max_rows_per_batch)
        shards = [shard for stats, _ in planned for shard in layout.add(stats)]
        jobs = [
            pool.submit(
                write_shard,
                str(output.path),
                output.shard(s.index),
                s.index,
                s.first_row,
                tuple((a, b, e) for _, a, b, e in s.spans),
                settings,
                *(planned[j][1] for j, *_ in s.spans),
            )
            for s in shards
        ]
        entries = [job.result() for job in jobs]
        output.commit({"shards": entries})
    return {"rows": layout.rows, "tokens": sum(stats["tokens"] for stats, _ in planned)}


def row(name: str, seconds: float, rows: int | None, lower: int, base: float | None) -> None:
    ratio = f"{seconds / base:>8.2f}x" if base else f"{'':>9}"
    if rows is None:
        print(f"{name:<26} {seconds:>9.2f} {'':>8} {'':>9} {ratio}")
    else:
        print(f"{name:<26} {seconds:>9.2f} {rows:>8,} {rows / lower:>9.4f} {ratio}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="pool processes and Ray CPUs")
    args = parser.parse_args()
    w = w1_sft()
    assert w.sha == EXPECTED_SHA["W1 sft"], w.sha
    folder = write_shards(w.lengths)
    lower = w.lower_bound
    kw = {"capacity": w.capacity, "vocab_size": VOCAB, "split_id": "bench", "progress": False}
    print(
        f"W1: {w.lengths.size:,} examples, {w.tokens:,} pairs in {SHARDS} shards, capacity"
        f" {w.capacity}, global lower bound {lower:,} rows; {args.workers} workers, {POLICY}"
    )
    print(f"{'engine':<26} {'seconds':>9} {'rows':>8} {'rows/LB':>9} {'vs local':>9}")
    with tempfile.TemporaryDirectory(dir=ROOT) as tmp:
        out = Path(tmp)
        t0 = time.perf_counter()
        local = pack_path(folder, out / "local", **kw)
        base = time.perf_counter() - t0
        row("local (1 process)", base, local["rows"], lower, base)

        t0 = time.perf_counter()
        pooled = pool_pack(folder, out / "pool", w.capacity, args.workers)
        row(
            f"pool ({args.workers} processes)",
            time.perf_counter() - t0,
            pooled["rows"],
            lower,
            base,
        )

        import ray

        from exactpack.ray import pack

        t0 = time.perf_counter()
        ray.init(num_cpus=args.workers, include_dashboard=False, logging_level=logging.ERROR)
        row("ray.init", time.perf_counter() - t0, None, lower, base)
        try:
            for name, dest, blocks in (
                ("ray (cold workers)", "ray-cold", None),
                ("ray (warm)", "ray", None),
                ("ray, 1,000-example blocks", "ray-1k", 1000),
            ):
                t0 = time.perf_counter()
                stats = pack(folder, out / dest, block_examples=blocks, **kw)
                row(name, time.perf_counter() - t0, stats["rows"], lower, base)
        finally:
            ray.shutdown()
        same = sorted((out / "pool").glob("shard-*")) and all(
            (out / "pool" / p.name).read_bytes() == p.read_bytes()
            for p in sorted((out / "ray").glob("shard-*"))
        )
        print(f"pool and ray shards byte-identical: {bool(same)}")


if __name__ == "__main__":
    main()
