"""The user paths of two commits in one run: is the new code slower than the old?

    .venv/bin/python benchmarks/bench_commits.py --old d3f8ca2          # old vs the working tree
    .venv/bin/python benchmarks/bench_commits.py --old A --new B --rounds 3

Each round runs, alternately for the old and the new source tree (``git worktree``
checkouts under ``.cache/commits/``, imported through ``PYTHONPATH``), the two
headline user paths of :mod:`bench_userpath` as fresh processes:

1. ``pack_dataset`` on W1 in memory, the first call timed from import to return;
2. ``exactpack pack W1.parquet --out DIR`` (Parquet -> Parquet), the whole process.

Each checkout gets its C kernels built in place (as ``pip install -e .`` builds them), so
both trees run native. Alternating the two trees inside each round keeps the machine's
load the same for both; the table prints the median of the rounds and new/old ratios
(below 1: faster).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import bench_userpath as user

ROOT = Path(__file__).resolve().parents[1]


def checkout(rev: str) -> Path:
    """A worktree of ``rev`` under .cache/commits/ (made once)."""
    sha = subprocess.check_output(["git", "rev-parse", rev], cwd=ROOT, text=True).strip()
    path = ROOT / ".cache" / "commits" / sha[:12]
    if not path.exists():
        argv = ["git", "worktree", "add", "-q", "--detach", str(path), sha]
        subprocess.check_call(argv, cwd=ROOT)
    if not list((path / "src").glob("*/core/native*.so")):  # the C kernels, as installed
        build = [sys.executable, "-c", "import setuptools; setuptools.setup()", "build_ext"]
        subprocess.run([*build, "--inplace"], cwd=path, check=True, capture_output=True)
    return path / "src"


def package_of(src: Path) -> str:
    """The import package a source tree holds (an old commit may predate a rename)."""
    return next(p.name for p in sorted(src.iterdir()) if (p / "__main__.py").exists())


def one_round(src: Path, work: Path) -> dict[str, float]:
    os.environ["PYTHONPATH"] = str(src)  # fresh children import this tree's package
    os.environ["BENCH_PACKAGE"] = user.PACKAGE = package_of(src)
    mem = user.in_memory("W1", "exactpack", 1)
    w = user.workload("W1")
    flags = ["--max-length", str(w.capacity), "--vocab-size", str(user.VOCAB)]
    pack = user.exactpack_pack(user.parquet_input("W1"), work / "out", *flags)
    return {
        "pack_dataset first call (s)": mem["seconds"],
        "pack_dataset peak RSS (MB)": mem["peak_rss"] / 1e6,
        "exactpack pack, fresh process (s)": pack["seconds"],
        "exactpack pack peak RSS (MB)": pack["peak_rss"] / 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="the old commit")
    parser.add_argument("--new", default=None, help="the new commit (default: working tree)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    trees = {"old": checkout(args.old), "new": checkout(args.new) if args.new else ROOT / "src"}
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    user.CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="commits-", dir=user.CACHE) as tmp:
        for r in range(args.rounds):
            for name in ("old", "new") if r % 2 == 0 else ("new", "old"):
                runs[name].append(one_round(trees[name], Path(tmp)))
                print(f"round {r + 1} {name}: {runs[name][-1]}", file=sys.stderr)
    print(f"old {args.old} vs new {args.new or 'working tree'}; median of {args.rounds} rounds;"
          f" load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print("| measure | old | new | new/old |\n|---|---|---|---|")
    for key in runs["old"][0]:
        old = statistics.median(run[key] for run in runs["old"])
        new = statistics.median(run[key] for run in runs["new"])
        print(f"| {key} | {old:.2f} | {new:.2f} | {new / old:.2f} |")


if __name__ == "__main__":
    main()
