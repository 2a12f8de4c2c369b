"""Peak memory of ``exactpack pack --tree`` against input size: bounded, not proportional.

A DPO-like corpus (TRL's ``prompt_input_ids`` / ``chosen_input_ids`` /
``rejected_input_ids``; prompts lognormal in [128, 1024] tokens, answers in
[32, 512], random ids of a 32k vocabulary) is written as JSON Lines at 1x
(``--pairs``) and 4x its size, and each is packed by the CLI in a fresh
process (``python -m exactpack.cli pack --tree``); the child's peak RSS
(``getrusage(RUSAGE_CHILDREN)``) is printed against the input's bytes. The
tree path reads in blocks of ``--tree-block`` rows (default 4096) or
``--chunk-bytes``, so once the input holds a few blocks, 4x the input costs
about the same memory, not 4x.

    .venv/bin/python benchmarks/bench_tree_memory.py --pairs 20000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

VOCAB = 32000


def clipped_lognormal(rng: np.random.Generator, lo: int, hi: int, n: int) -> np.ndarray:
    mu, sigma = np.log(np.sqrt(lo * hi)), np.log(hi / lo) / 4  # ±2σ spans [lo, hi]
    return np.clip(np.rint(rng.lognormal(mu, sigma, n)), lo, hi).astype(np.int64)


def write_corpus(path: Path, pairs: int, seed: int) -> int:
    """``pairs`` DPO rows as JSON Lines at ``path``; its size in bytes."""
    rng = np.random.default_rng(seed)
    with path.open("w") as f:
        for start in range(0, pairs, 1000):
            n = min(1000, pairs - start)
            p, c, r = (
                clipped_lognormal(rng, lo, hi, n) for lo, hi in ((128, 1024), (32, 512), (32, 512))
            )
            for k in range(n):
                ids = [rng.integers(0, VOCAB, int(x[k])).tolist() for x in (p, c, r)]
                row = dict(
                    zip(
                        ("prompt_input_ids", "chosen_input_ids", "rejected_input_ids"),
                        ids,
                        strict=False,
                    )
                )
                f.write(json.dumps(row, separators=(",", ":")) + "\n")
    return path.stat().st_size


def pack_fresh(
    src: Path, out: Path, capacity: int, chunk_bytes: int | None, package: str | None = None,
    tree_block: int | None = None,
) -> dict:  # fmt: skip
    """Pack ``src`` with the CLI in a fresh process (``package``: the ``src`` folder of another
    checkout, e.g. the commit before); its statistics, seconds and peak RSS."""
    cmd = [sys.executable, "-m", "exactpack.cli", "pack", str(src), "--tree", "--max-length",
           str(capacity), "--vocab-size", str(VOCAB), "--out", str(out), "--json"]  # fmt: skip
    if chunk_bytes is not None:
        cmd += ["--chunk-bytes", str(chunk_bytes)]
    if tree_block is not None:
        cmd += ["--tree-block", str(tree_block)]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    if package is not None:
        env["PYTHONPATH"] = package
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    seconds = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"pack failed ({done.returncode}): {done.stderr.strip()}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB, the largest child
    if peak <= before:
        print("note: this child's peak is below an earlier child's; run sizes separately")
    stats = json.loads(done.stdout.strip().splitlines()[-1])
    return stats | {"wall": seconds, "peak_mib": peak / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=20000, help="DPO pairs at 1x")
    ap.add_argument("--scales", default="1,4", help="input sizes, as multiples of --pairs")
    ap.add_argument("--capacity", type=int, default=4096)
    ap.add_argument("--chunk-bytes", type=int, default=None, help="the pack's --chunk-bytes")
    ap.add_argument("--tree-block", type=int, default=None, help="the pack's --tree-block")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--package", help="another checkout's src folder to pack with (a baseline)")
    args = ap.parse_args()
    scales = [int(x) for x in args.scales.split(",")]
    print("| input | pairs | input MiB | blocks | rows | stored/flat | seconds | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="bench-tree-memory-") as tmp:
        for scale in sorted(scales):  # smallest first: RUSAGE_CHILDREN keeps the largest peak
            src = Path(tmp) / f"dpo-{scale}x.jsonl"
            size = write_corpus(src, args.pairs * scale, args.seed)
            out = Path(tmp) / f"out-{scale}x"
            s = pack_fresh(src, out, args.capacity, args.chunk_bytes, args.package, args.tree_block)
            print(
                f"| {scale}x | {args.pairs * scale:,} | {size / 2**20:,.0f}"
                f" | {s.get('blocks', 1)} | {s['rows']:,} | {s['stored_over_flat']:.3f}"
                f" | {s['wall']:.1f} | {s['peak_mib']:,.0f} |",
                flush=True,
            )
            src.unlink()


if __name__ == "__main__":
    main()
