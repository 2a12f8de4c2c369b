"""Planning speed and quality of every packing policy on W1-W3.

    .venv/bin/python benchmarks/bench_policies.py            # table
    .venv/bin/python benchmarks/bench_policies.py --json     # JSON (one object per row)

For each workload and policy: median seconds of ``--repeat`` timed runs of
``exactpack.plan_rows`` (after one untimed call, whose time is reported as
``first s``: the first call's page faults and caches), the median
CPU seconds of the same runs (robust when other jobs share the cores),
examples/s (wall clock), rows, and rows / lower bound. Lengths are the workloads' prediction lengths
at the workload capacity.

If ``trl`` imports, TRL's best-fit-decreasing planner (``_pack_bfd``, the
function ``trl.pack_dataset(strategy="bfd")`` maps over the dataset) runs on
the same lengths: once per 1,000-example batch as ``pack_dataset`` does by
default, and once over the whole workload. Its input is a one-column Arrow
table of int8 zeros with those lengths; ``vs TRL`` is TRL's default time
divided by ours, measured in this run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workloads import Workload, all_workloads

POLICIES = [
    ("next-fit", {}),
    ("first-fit-decreasing", {}),
    ("best-fit-decreasing", {}),
    ("stream-best-fit", {}),
    ("stream-best-fit", {"window": 256}),
    ("stream-best-fit", {"window": 1024}),
    ("stream-best-fit", {"window": 16384}),
]
TARGETS = {"next-fit": 50e6, "best-fit-decreasing": 5e6}  # examples/s, issue 4


def timed(fn, repeat: int) -> tuple[float, float, float, object]:
    """(first-call seconds, median wall and median CPU seconds of ``repeat`` further
    calls, last result). CPU time shows the cost when other jobs share the cores."""
    t0 = time.perf_counter()
    result = fn()
    first = time.perf_counter() - t0
    wall, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        result = fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return first, statistics.median(wall), statistics.median(cpu), result


def bench_exactpack(w: Workload, engine: str, repeat: int) -> list[dict]:
    from exactpack import plan_rows

    rows = []
    for policy, options in POLICIES:
        reps = repeat if engine != "python" else 1
        first, seconds, cpu, plan = timed(
            lambda p=policy, o=options: plan_rows(w.lengths, w.capacity, p, kernels=engine, **o),
            reps,
        )
        label = policy + "".join(f" {k}={v}" for k, v in options.items())
        rows.append(row(w, label, engine, seconds, cpu, first, plan.num_rows))
    return rows


def trl_planner():
    try:
        from trl.data_utils import _pack_bfd
    except ImportError:
        return None
    return _pack_bfd


def bench_trl(w: Workload, pack_bfd, batch: int | None) -> dict:
    import pyarrow as pa

    offsets = np.zeros(w.lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(w.lengths, out=offsets[1:])
    values = pa.array(np.zeros(int(offsets[-1]), dtype=np.int8))
    table = pa.table({"input_ids": pa.LargeListArray.from_arrays(pa.array(offsets), values)})
    step = batch or table.num_rows
    t0, c0 = time.perf_counter(), time.process_time()
    packed = sum(
        pack_bfd(table.slice(lo, step), w.capacity).num_rows
        for lo in range(0, table.num_rows, step)
    )
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    label = "TRL _pack_bfd (" + (f"batches of {batch}" if batch else "one batch") + ")"
    return row(w, label, "trl", seconds, cpu, None, packed)


def row(w: Workload, policy: str, engine: str, seconds, cpu, first, rows: int) -> dict:
    return {
        "workload": w.name,
        "examples": int(w.lengths.shape[0]),
        "capacity": w.capacity,
        "policy": policy,
        "engine": engine,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "first_call_seconds": first,
        "examples_per_s": w.lengths.shape[0] / seconds if seconds else float("inf"),
        "rows": int(rows),
        "lower_bound": w.lower_bound,
        "rows_over_lower_bound": rows / w.lower_bound,
    }


def print_table(results: list[dict]) -> None:
    head = (
        f"{'workload':9} {'policy':36} {'engine':6} {'seconds':>9} {'cpu s':>9} {'first s':>8}"
        f" {'examples/s':>11} {'rows':>8} {'rows/LB':>8} {'vs TRL':>7}"
    )
    print(head)
    print("-" * len(head))
    for r in results:
        first = "" if r["first_call_seconds"] is None else f"{r['first_call_seconds']:.3f}"
        speedup = "" if r.get("vs_trl") is None else f"{r['vs_trl']:.0f}x"
        print(
            f"{r['workload']:9} {r['policy']:36} {r['engine']:6} {r['seconds']:9.4f}"
            f" {r['cpu_seconds']:9.4f} {first:>8}"
            f" {r['examples_per_s'] / 1e6:10.1f}M {r['rows']:8d}"
            f" {r['rows_over_lower_bound']:8.5f} {speedup:>7}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per policy (median)")
    parser.add_argument(
        "--engines", default="auto", help="comma list of auto,native,python (python is slow)"
    )
    parser.add_argument("--no-trl", action="store_true", help="skip TRL even if installed")
    args = parser.parse_args()

    from exactpack.core import engine as kernels

    engines = [kernels.resolve(e) for e in args.engines.split(",")]
    pack_bfd = None if args.no_trl else trl_planner()
    results = []
    for w in all_workloads():
        ours = [r for e in engines for r in bench_exactpack(w, e, args.repeat)]
        if pack_bfd is not None:
            trl_default = bench_trl(w, pack_bfd, 1000)
            for r in ours:
                r["vs_trl"] = trl_default["seconds"] / r["seconds"]
            ours += [trl_default, bench_trl(w, pack_bfd, None)]
        results += ours
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print_table(results)
    if pack_bfd is None and not args.no_trl:
        print("\nTRL is not installed: no comparison (pip install trl, if it leaves torch alone)")
    print()
    for policy, target in TARGETS.items():
        timed_here = [
            r["examples_per_s"]
            for r in results
            if r["policy"] == policy and r["engine"] == "native" and r["workload"] != "W3 real"
        ]
        if not timed_here:
            continue
        worst = min(timed_here)
        verdict = "meets" if worst >= target else "MISSES"
        print(
            f"{policy} (native, W1/W2): slowest {worst / 1e6:.1f}M examples/s"
            f" {verdict} the target of {target / 1e6:g}M"
        )


if __name__ == "__main__":
    main()
