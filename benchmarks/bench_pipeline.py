"""End-to-end packing vs TRL: token arrays in memory -> plan -> materialised rows.

    .venv/bin/python benchmarks/bench_pipeline.py            # W1 and W2, table + memory
    .venv/bin/python benchmarks/bench_pipeline.py --quick    # W1 only, no TRL one-batch run

Each workload's lengths (prediction pairs) get synthetic token ids: exactpack
receives windows of ``len + 1`` tokens (``len`` pairs, ``len`` cells), TRL
receives sequences of ``len`` tokens (``len`` cells), so both fill the same
number of cells and share the lower bound ``ceil(Σ len / capacity)``.

Timed, after one warm-up: exactpack ``pipeline.pack_table`` (plan + compact
rows, i.e. tokens and loss flags gathered into storage order with per-row
occurrence metadata) and, as a second line, the same plus the Arrow table of
:data:`exactpack.store.SCHEMA` that ``hf.pack_dataset`` returns; TRL
``trl.data_utils.pack_dataset(ds, capacity, strategy="bfd")`` on an in-memory
``datasets.Dataset`` (default map batches of 1,000). Ratio = TRL seconds /
exactpack seconds in the same run.

Memory: a fresh subprocess builds W2's token arrays (with mixed loss flags,
so they are gathered as well), resets the kernel's
peak-RSS counter (``/proc/self/clear_refs``), packs with best-fit-decreasing,
and reports ``VmHWM - VmRSS(before)``: every byte the packing added, NumPy,
the C kernels and Arrow alike. tracemalloc's peak (NumPy allocations only) is shown
beside it. Both are divided by the bytes of the token arrays (int32 windows).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
import tracemalloc

import numpy as np

from exactpack import Binding, ExampleTable
from exactpack.io.shards import shard_table
from exactpack.pipeline.local import pack_table
from workloads import EXPECTED_SHA, Workload, w1_sft, w2_short

VOCAB = 32_000
POLICIES = ("next-fit", "first-fit-decreasing", "best-fit-decreasing")


def example_table(w: Workload, seed: int = 0, masked: bool = False) -> ExampleTable:
    """Windows of ``len + 1`` random ids per example; every target supervised, or
    (``masked``) about one target in ten not, so the flags must be gathered too."""
    n = w.lengths.shape[0]
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(w.lengths + 1, out=offsets[1:])
    rng = np.random.default_rng(seed)
    windows = rng.integers(0, VOCAB, size=int(offsets[-1]), dtype=np.int32)
    pairs = int(w.lengths.sum())
    mask = rng.integers(0, 10, size=pairs, dtype=np.uint8) != 0 if masked else np.ones(pairs, bool)
    ids = np.arange(n).astype(str).astype(object)
    return ExampleTable(
        windows=windows,
        offsets=offsets,
        loss_mask=mask,
        source_ids=ids,
        example_ids=ids,
        range_starts=np.zeros(n, dtype=np.int64),
        range_ends=w.lengths + 1,
        partition="train",
        binding=Binding(VOCAB, "synthetic", "sha256:" + w.sha),
    )


def trl_dataset(w: Workload, seed: int = 0):
    import datasets
    import pyarrow as pa

    datasets.disable_progress_bars()

    offsets = np.zeros(w.lengths.shape[0] + 1, dtype=np.int32)
    np.cumsum(w.lengths, out=offsets[1:])
    values = np.random.default_rng(seed).integers(0, VOCAB, size=int(offsets[-1]), dtype=np.int32)
    column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    return datasets.Dataset(datasets.table.InMemoryTable(pa.table({"input_ids": column})))


def timed(fn, repeats: int):
    """(median seconds, last result) over ``repeats`` runs after one warm-up."""
    fn()
    times, out = [], None
    for _ in range(repeats):
        out = None
        gc.collect()
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def run_exactpack(w: Workload, repeats: int) -> list[dict]:
    table = example_table(w)
    rows_out = []
    for policy in POLICIES:
        seconds, (plan, _) = timed(lambda p=policy: pack_table(table, w.capacity, p), repeats)
        rows_out.append(_row(f"exactpack {policy}", w, seconds, plan.num_rows))

    def with_arrow():
        plan, rows = pack_table(table, w.capacity, "best-fit-decreasing")
        return plan, shard_table(rows)

    seconds, (plan, _) = timed(with_arrow, repeats)
    rows_out.append(_row("exactpack best-fit-decreasing + Arrow", w, seconds, plan.num_rows))
    return rows_out


def run_trl(w: Workload, repeats: int, one_batch: bool) -> list[dict]:
    from trl.data_utils import pack_dataset

    ds = trl_dataset(w)
    out = []
    variants = [("TRL bfd (default)", {})]
    if one_batch:
        variants.append(("TRL bfd (one map batch)", {"batch_size": len(ds)}))
    for name, kwargs in variants:
        times, rows = [], 0
        for _ in range(repeats):
            t0 = time.perf_counter()
            packed = pack_dataset(ds, w.capacity, strategy="bfd", map_kwargs=kwargs)
            times.append(time.perf_counter() - t0)
            rows = len(packed)
            del packed
            gc.collect()
        out.append(_row(name, w, statistics.median(times), rows))
    return out


def _row(name: str, w: Workload, seconds: float, rows: int) -> dict:
    return {
        "policy": name,
        "workload": w.name,
        "seconds": seconds,
        "examples_per_s": w.lengths.shape[0] / seconds,
        "rows": rows,
        "rows_over_lower_bound": rows / w.lower_bound,
        "efficiency": w.tokens / (rows * w.capacity),
    }


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def memory_probe() -> dict:
    """Run in a fresh process: bytes added while packing W2 with best-fit-decreasing.

    The loss flags are mixed here, so they are gathered too (the worst case).
    """
    w = w2_short()
    table = example_table(w, masked=True)
    pack_table(example_table(Workload("warm", w.lengths[:1000], w.capacity)), w.capacity)
    gc.collect()
    token_bytes = table.windows.nbytes
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM (peak RSS) to the current RSS
    before = _status("VmRSS")
    tracemalloc.start()
    plan, rows = pack_table(table, w.capacity, "best-fit-decreasing")
    _, traced_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    peak = _status("VmHWM")
    return {
        "workload": w.name,
        "token_bytes": token_bytes,
        "rss_added": peak - before,
        "traced_peak": traced_peak,
        "rows": plan.num_rows,
        "output_bytes": sum(
            out.nbytes
            for out, src in ((rows.tokens, table.windows), (rows.loss_mask, table.loss_mask))
            if not np.shares_memory(out, src)
        ),
    }


def print_table(results: list[dict]) -> None:
    trl = {r["workload"]: r["seconds"] for r in results if r["policy"] == "TRL bfd (default)"}
    head = (
        f"{'policy':<38} {'workload':<9} {'seconds':>8} {'examples/s':>12} {'rows':>9}"
        f" {'rows/LB':>8} {'vs TRL':>8}"
    )
    print(head)
    print("-" * len(head))
    for r in results:
        base = trl.get(r["workload"])
        ratio = f"{base / r['seconds']:.1f}x" if base else "-"
        print(
            f"{r['policy']:<38} {r['workload']:<9} {r['seconds']:>8.3f}"
            f" {r['examples_per_s']:>12,.0f} {r['rows']:>9,} {r['rows_over_lower_bound']:>8.4f}"
            f" {ratio:>8}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="W1 only")
    parser.add_argument("--repeats", type=int, default=3, help="timed exactpack runs (median)")
    parser.add_argument("--trl-repeats", type=int, default=1, help="timed TRL runs (median)")
    parser.add_argument("--trl-one-batch", action="store_true", help="also TRL in one map batch")
    parser.add_argument("--no-trl", action="store_true", help="skip TRL")
    parser.add_argument("--memory-probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_probe:
        print(json.dumps(memory_probe()))
        return
    results = []
    for make in (w1_sft,) if args.quick else (w1_sft, w2_short):
        w = make()
        assert w.sha == EXPECTED_SHA[w.name], f"{w.name} lengths changed"
        results += run_exactpack(w, args.repeats)
        gc.collect()
        if not args.no_trl:
            results += run_trl(w, args.trl_repeats, args.trl_one_batch)
            gc.collect()
    print_table(results)
    if not args.quick:
        proc = subprocess.run(
            [sys.executable, __file__, "--memory-probe"], capture_output=True, text=True, check=True
        )
        m = json.loads(proc.stdout.splitlines()[-1])
        gib = 2**30
        print(
            f"\nmemory, {m['workload']} best-fit-decreasing: token arrays"
            f" {m['token_bytes'] / gib:.2f} GiB; packing added {m['rss_added'] / gib:.2f} GiB RSS"
            f" = {m['rss_added'] / m['token_bytes']:.2f}x (tracemalloc peak"
            f" {m['traced_peak'] / gib:.2f} GiB = {m['traced_peak'] / m['token_bytes']:.2f}x;"
            f" compact output {m['output_bytes'] / gib:.2f} GiB)"
        )
    print("\n" + json.dumps({"results": results}))


if __name__ == "__main__":
    main()
