"""Text -> packed on Ray with 1, 2 and 4 worker processes vs the local engine: tokens/s.

    .venv/bin/python benchmarks/bench_ray.py                 # 16 MB of text, 1/2/4 workers
    .venv/bin/python benchmarks/bench_ray.py --mb 64 --workers 1,2,4,8 --cores-per-node 32

The corpus is the Python standard library's source (W3's files in W3's
order, whole files as documents, repeated when ``--mb`` asks for more) in
``--shards`` JSON Lines shards under ``.cache/bench_ray/``; the tokenizer a
byte-level BPE (8,192 ids) trained here on its first 4 MB. Every run packs
it with ``--cut-long`` at capacity 4096 (best-fit-decreasing), text in,
packed directory out. Measured in one run, tokens = prediction pairs:

- the tokenizer alone over the same texts, in a fresh process with one Rust
  thread (``encode_batch`` and ``encode_batch_fast``): the per-core limit;
- ``exactpack pack --engine local`` as a fresh process (imports, reading,
  tokenizing on all cores, planning, writing);
- ``exactpack pack --engine ray --ray-num-cpus W`` as a fresh process (pays
  ``ray.init``, worker start-up and shut-down), for each W;
- ``exactpack.ray.pack`` on an instance of W CPUs already running, after one
  pack that started its workers (steady state: the scaling curve; the best
  of ``--repeat``), for each W; its tasks' own seconds (manifest
  ``engine.per_block``) give the per-worker rate.

It prints a table with ratios to the local engine and the load average,
projects a cluster of N nodes from the measured per-worker rate and the
driver's serial costs, and saves the curve to ``docs/ray_scaling.png``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Every Ray node this benchmark starts binds to 127.0.0.1 (read when Ray is imported).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from workloads import stdlib_texts, train_bpe

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "bench_ray"
PLOT = ROOT / "docs" / "ray_scaling.png"
CAPACITY = 4096
VOCAB = 8192
#: The per-block task times of the manifest's ``engine.per_block``.
STAGES = ("read", "tokenize", "plan", "write")
PACK = ["--max-length", str(CAPACITY), "--cut-long", "--policy", "best-fit-decreasing"]


def corpus(mb: int, shards: int) -> Path:
    """The first ``mb`` MB of standard-library source as JSON Lines shards (cached)."""
    folder = CACHE / f"text-{mb}mb-{shards}"
    if (folder / "done").is_file():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    texts, docs, size, rounds = stdlib_texts(), [], 0, 0
    while size < mb << 20:
        for name, text in texts:
            docs.append({"id": f"{name}#{rounds}", "text": text})
            size += len(text.encode())
            if size >= mb << 20:
                break
        rounds += 1
    per = -(-len(docs) // shards)
    for k in range(shards):
        lines = [json.dumps(d) for d in docs[k * per : (k + 1) * per]]
        (folder / f"part-{k:03d}.jsonl").write_text("\n".join(lines) + "\n")
    (folder / "done").touch()
    return folder


def tokenizer() -> Path:
    """A byte-level BPE of :data:`VOCAB` ids trained on the first 4 MB of the corpus (cached)."""
    path = CACHE / f"bpe-{VOCAB}" / "tokenizer.json"
    if not path.is_file():
        texts, size = [], 0
        for _, text in stdlib_texts():
            texts.append(text)
            size += len(text)
            if size > 4 << 20:
                break
        train_bpe(texts, VOCAB, path)
    return path


ALONE = """
import json, sys, time
from pathlib import Path
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
texts = [json.loads(l)["text"] for f in sorted(Path(sys.argv[2]).glob("*.jsonl"))
         for l in open(f) if l.strip()]
out = {}
for name in ("encode_batch", "encode_batch_fast"):
    t0, n = time.perf_counter(), 0
    for i in range(0, len(texts), 1000):
        n += sum(len(e.ids) - 1 for e in getattr(tok, name)(texts[i:i + 1000]))
    out[name] = (n, time.perf_counter() - t0)
print(json.dumps(out))
"""


def tokenizer_alone(tok: Path, folder: Path) -> dict[str, float]:
    """Prediction pairs per second of the bare tokenizer on one Rust thread, fresh process."""
    env = os.environ | {"RAYON_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", ALONE, str(tok), str(folder)]
    out = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True).stdout)
    return {name: n / s for name, (n, s) in out.items()}


def cli(args: list[str]) -> tuple[float, dict, float]:
    """``exactpack ARGS --json`` as a fresh process: (wall seconds, statistics, peak RSS GiB)."""
    exactpack = Path(sys.executable).with_name("exactpack")
    t0 = time.perf_counter()
    proc = subprocess.Popen([str(exactpack), *args, "--json"], stdout=subprocess.PIPE, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"exactpack {' '.join(args)} exited {proc.returncode}")
    return wall, json.loads(out.splitlines()[-1]), usage.ru_maxrss / (1 << 20)


def warm(folder: Path, tok: Path, out: Path, workers: int, repeat: int) -> dict:
    """``exactpack.ray.pack`` on a running instance of ``workers`` CPUs: a first pack starts the
    workers, the best of ``repeat`` more is kept; its manifest gives the tasks' seconds."""
    import ray

    from exactpack.ray import pack

    kw = {"capacity": CAPACITY, "tokenizer": str(tok), "cut_long": True, "progress": False}
    ray.init(
        address="local", num_cpus=workers, include_dashboard=False, logging_level=logging.ERROR
    )
    try:
        pack(folder, out / f"first-{workers}", **kw)
        wall = float("inf")
        for k in range(repeat):  # the best: other jobs on a shared machine only slow a run
            t0 = time.perf_counter()
            got = pack(folder, out / f"try-{workers}-{k}", **kw)
            if time.perf_counter() - t0 < wall:
                wall, stats, best = time.perf_counter() - t0, got, out / f"try-{workers}-{k}"
    finally:
        ray.shutdown()
    manifest = json.loads((best / "manifest.json").read_text())
    blocks = manifest["engine"]["per_block"]
    stages = {k: sum(b[f"{k}_seconds"] for b in blocks) for k in STAGES}
    cpu = sum(b["plan_cpu_seconds"] + b["write_cpu_seconds"] for b in blocks)
    busy = sum(stages.values())
    return {"wall": wall, "tokens": stats["tokens"], "busy": busy, "cpu": cpu} | stages


def scan_seconds(folder: Path) -> float:
    """The driver's serial line scan of the JSON Lines shards (what a block layout costs)."""
    from exactpack.ray.blocks import file_blocks

    t0 = time.perf_counter()
    file_blocks(folder, None)
    return time.perf_counter() - t0


def project(rate: float, fixed: float, scan_mb_s: float, cores: int, tokens_per_mb: float):
    """(nodes, tokens/s, hours for 10 GB of text) of a cluster of ``cores``-CPU nodes."""
    rows = []
    for nodes in (1, 2, 4, 8, 16, 32, 64):
        mb = 10_240
        seconds = fixed + mb / scan_mb_s + mb * tokens_per_mb / (nodes * cores * rate)
        rows.append((nodes, mb * tokens_per_mb / seconds, seconds / 3600))
    return rows


def plot(curves: dict, projection: list, cores: int, rate: float, load: float) -> None:
    """Left: pairs/s against Ray workers here; right: the projection to N nodes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.4))
    workers = curves["workers"]
    here = os.cpu_count() or 1
    m = [r / 1e6 for r in curves["warm"]]
    a.plot(workers, m, "o-", label="ray, warm instance (wall clock)")
    a.plot(workers, [r / 1e6 for r in curves["cli"]], "s--", label="ray, CLI (fresh process)")
    cpu = [r * min(w, here) / 1e6 for w, r in zip(workers, curves["per_cpu"], strict=True)]
    a.plot(workers, cpu, "^-.", label="rate per CPU second x busy cores (an unshared machine)")
    a.plot(workers, [m[0] * w for w in workers], ":", color="grey", label="linear from 1 worker")
    a.axhline(curves["local"] / 1e6, color="C3", ls="-.", label="local engine, CLI")
    a.axhline(curves["alone"] / 1e6, color="C4", lw=0.8, label="tokenizer alone, 1 thread")
    a.axvline(here, color="k", lw=0.5)
    a.set(xlabel="Ray worker processes (CPUs)", ylabel="M prediction pairs / s")
    a.set_title(f"text -> packed here: {here} cores, load average {load:.1f}", fontsize=10)
    a.set_xticks(workers)
    a.legend(fontsize=7, loc="center right")
    nodes = [n for n, _, _ in projection]
    b.plot(nodes, [r / 1e6 for _, r, _ in projection], "o-", label="projected (serial parts kept)")
    ideal = [rate * n * cores / 1e6 for n in nodes]
    b.plot(nodes, ideal, ":", color="grey", label="no serial part")
    b.set_xscale("log", base=2)
    b.set_yscale("log")
    b.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    b.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    b.set_xticks(nodes)
    b.set(xlabel=f"nodes of {cores} workers", ylabel="M prediction pairs / s")
    b.set_title("projected from the rate per CPU second: 10 GB of text", fontsize=10)
    for n, r, h in projection:
        label = f"{h * 60:.1f} min"
        b.annotate(label, (n, r / 1e6), fontsize=7, xytext=(3, -10), textcoords="offset points")
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)


def measure(
    folder: Path, tok: Path, workers: list[int], repeat: int
) -> tuple[int, list, dict, float]:
    """Every run: prediction pairs, table rows (name, seconds, pairs/s, peak RSS), the warm
    runs by worker count, and the driver's scan seconds."""
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        out = Path(tmp)
        local = ["pack", str(folder), "--tokenizer", str(tok), *PACK]
        wall, stats, rss = cli([*local, "--out", str(out / "local")])
        tokens = stats["tokens"]
        rows = [("local engine, CLI", wall, tokens / wall, rss)]
        runs = {}
        for w in workers:
            ray_args = ["--engine", "ray", "--ray-num-cpus", str(w), "--out", str(out / f"{w}")]
            wall, stats, rss = cli([*local, *ray_args])
            assert stats["tokens"] == tokens
            rows.append((f"ray CLI, {w} worker(s)", wall, tokens / wall, rss))
            runs[w] = warm(folder, tok, out, w, repeat) | {"cli": wall}
            seconds = runs[w]["wall"]
            rows.append((f"ray warm, {w} worker(s)", seconds, tokens / seconds, None))
        return tokens, rows, runs, scan_seconds(folder)


def report(
    args: argparse.Namespace,
    folder: Path,
    alone: dict,
    measured: tuple[int, list, dict, float],
) -> None:
    """Print the table, the per-worker rates and the projection; draw the plot."""
    tokens, rows, runs, scan = measured
    workers, base = sorted(runs), rows[0][1]
    print(
        f"{args.mb} MB of Python source, {tokens:,} prediction pairs, {args.shards} shards;"
        f" BPE {VOCAB:,}, capacity {CAPACITY}, --cut-long"
    )
    print(
        f"tokenizer alone, 1 thread: encode_batch {alone['encode_batch'] / 1e6:.3f} M/s,"
        f" encode_batch_fast {alone['encode_batch_fast'] / 1e6:.3f} M/s"
    )
    print(f"{'run':<26} {'seconds':>8} {'M pairs/s':>10} {'vs local':>9} {'peak RSS':>9}")
    for name, seconds, rate, rss in rows:
        mem = f"{rss:.2f} GiB" if rss is not None else ""
        print(f"{name:<26} {seconds:>8.2f} {rate / 1e6:>10.3f} {base / seconds:>8.2f}x {mem:>9}")
    per_worker = {w: tokens / r["busy"] for w, r in runs.items()}
    per_cpu = {w: tokens / r["cpu"] for w, r in runs.items()}
    for w, r in runs.items():
        split = ", ".join(f"{k} {r[k]:.2f}" for k in STAGES)
        print(
            f"  {w} worker(s): tasks busy {r['busy']:.2f} s ({split}), CPU {r['cpu']:.2f} s ->"
            f" {per_worker[w] / 1e6:.3f} M/s per worker, {per_cpu[w] / 1e6:.3f} M/s per CPU"
            f" second; driver + idle {r['wall'] - r['busy'] / w:.2f} s of {r['wall']:.2f};"
            f" CLI start-up and shut-down {r['cli'] - r['wall']:.2f} s"
        )
    # A worker on a node of its own has a core to itself: its rate per CPU second, the
    # lowest measured (other jobs on a shared machine stretch wall time, not CPU time).
    rate = min(per_cpu.values())
    one = runs[workers[0]]
    fixed = one["cli"] - one["wall"] + max(0.0, one["wall"] - one["busy"] / workers[0])
    mb = sum(p.stat().st_size for p in folder.glob("*.jsonl")) / 1e6
    projection = project(rate, fixed, mb / scan, args.cores_per_node, tokens / mb)
    print(
        f"projection: {rate / 1e6:.3f} M pairs/s per worker, {fixed:.1f} s fixed, driver scan"
        f" {mb / scan:.0f} MB/s; nodes of {args.cores_per_node} workers, 10 GB of JSON Lines:"
    )
    for nodes, r, hours in projection:
        read = 10_240 / (hours * 3600)  # what the shared filesystem must deliver
        print(
            f"  {nodes:>3} node(s): {r / 1e6:>7.2f} M pairs/s, {hours * 60:>7.1f} min,"
            f" input {read:>6.1f} MB/s"
        )
    curves = {
        "workers": workers,
        "warm": [tokens / runs[w]["wall"] for w in workers],
        "cli": [tokens / runs[w]["cli"] for w in workers],
        "per_cpu": [per_cpu[w] for w in workers],
        "local": tokens / base,
        "alone": alone["encode_batch_fast"],
    }
    plot(curves, projection, args.cores_per_node, rate, os.getloadavg()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=16, help="MB of text (default 16)")
    parser.add_argument("--shards", type=int, default=16, help="JSON Lines shards (blocks)")
    parser.add_argument("--workers", default="1,2,4", help="Ray worker counts (default 1,2,4)")
    parser.add_argument("--cores-per-node", type=int, default=16, help="for the projection")
    parser.add_argument("--repeat", type=int, default=2, help="warm packs per count (best)")
    args = parser.parse_args()
    workers = [int(w) for w in args.workers.split(",")]
    folder, tok = corpus(args.mb, args.shards), tokenizer()
    print(f"load average before: {os.getloadavg()[0]:.2f}; {os.cpu_count()} cores")
    alone = tokenizer_alone(tok, folder)
    report(args, folder, alone, measure(folder, tok, workers, args.repeat))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)
    print(
        f"plot: {PLOT.relative_to(ROOT)}; load average after: {os.getloadavg()[0]:.2f};"
        f" this process {peak:.2f} GiB peak RSS"
    )


if __name__ == "__main__":
    main()
