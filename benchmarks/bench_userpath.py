"""The paths users call, side by side with TRL 1.16 in one run, with the peak RSS of every process.

    nice -n 10 .venv/bin/python benchmarks/bench_userpath.py   # W1, W2, text 20/100/300 MB
    .venv/bin/python benchmarks/bench_userpath.py --quick      # W1 and text 20 MB only

and a tokenizer's load in fresh processes (its ``tokenizer.json``, a generic
``save_pretrained`` folder, a ``GPT2TokenizerFast`` folder's first and later loads).

Three paths (TRL's counterpart in brackets):

1. in memory: ``exactpack.hf.pack_dataset(ds, C, "best-fit-decreasing")`` (and
   ``format="trl"``, TRL's schema) on an in-memory ``datasets.Dataset`` of
   ``input_ids`` (int32 lists, as ``datasets`` stores tokenizer output)
   [``trl.pack_dataset(ds, C, "bfd")``]; in a fresh process per tool, the
   **first call** timed from the tool's import to its return (the headline),
   then the median of ``--repeats`` warm calls beside it;
2. Parquet -> Parquet, fresh processes: ``exactpack pack W.parquet --out DIR``
   [``load_dataset("parquet")`` + ``pack_dataset(bfd)`` + ``to_parquet``, with
   an empty ``datasets`` cache so every run does the whole job]; the median of
   ``--fresh-repeats`` runs of each;
3. text -> packed, fresh processes: ``exactpack pack texts.jsonl --tokenizer
   tokenizer.json --cut-long`` [``load_dataset("json")`` +
   ``map(tokenizer, batched=True)`` + ``pack_dataset(bfd_split)`` (which, like
   ``--cut-long``, keeps every token) + ``to_parquet``], and the tokenizer
   alone: ``encode_batch_fast`` over the same texts in chunks of 8 MB on all
   cores, the physical limit of the path (only the encode calls are timed).

W1 and W2 are DESIGN.md's workloads (:mod:`workloads`; random ids below
32,000, capacity 4096 and 2048); the text corpus is the standard library's
source (:mod:`corpus`) with a byte-level BPE trained on it, capacity 2048.
Capacities are in exactpack's prediction pairs and TRL's tokens; both see the
same documents. Peak RSS is the kernel's ``ru_maxrss`` of each fresh
process (``VmHWM`` of the process for path 1, which holds its input and
output in memory by design). Ratios are TRL seconds / exactpack seconds in
this run; the load average is printed with the table.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from corpus import CACHE, corpus, train_tokenizer
from workloads import EXPECTED_SHA, w1_sft, w2_short

HERE = Path(__file__).resolve().parent
#: The package measured (bench_commits.py sets it for a commit from before the rename).
PACKAGE = os.environ.get("BENCH_PACKAGE", "exactpack")
VOCAB = 32_000
TEXT_CAPACITY = 2048
GIB = 1 << 30
#: The writer's default shard size, in tokens; the RSS target is 2 shards of int32 + 1 GiB.
SHARD_TOKENS = 1 << 25
RSS_LIMIT = 2 * 4 * SHARD_TOKENS + GIB


def workload(name: str):
    w = {"W1": w1_sft, "W2": w2_short}[name]()
    assert w.sha == EXPECTED_SHA[w.name], f"{w.name} lengths changed"
    return w


def token_table(name: str, seed: int = 0):
    """The workload as an Arrow table: ``input_ids`` list<int32>, random ids."""
    import pyarrow as pa

    w = workload(name)
    offsets = np.zeros(w.lengths.shape[0] + 1, dtype=np.int32)
    np.cumsum(w.lengths, out=offsets[1:])
    values = np.random.default_rng(seed).integers(0, VOCAB, size=int(offsets[-1]), dtype=np.int32)
    return pa.table({"input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))})


def parquet_input(name: str) -> Path:
    import pyarrow.parquet as pq

    path = CACHE / f"{name}.parquet"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        # row groups of 65,536 rows, as Arrow and Spark writers make them (17-70 MB here)
        pq.write_table(token_table(name), path.with_suffix(".part"), row_group_size=1 << 16)
        path.with_suffix(".part").rename(path)
    return path


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def _cpu() -> float:
    """CPU seconds (user + system) of this process so far: the machine is shared, so the
    CPU a call took is printed beside its wall time."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def child_in_memory(name: str, tool: str, repeats: int) -> dict:
    """Path 1 in this fresh (child) process: the input built first (the user's data, not
    timed), then the **first call** timed from the tool's import to its return (imports,
    the kernels' machine code included), then ``repeats`` warm calls (median); wall and
    CPU seconds of each; peak RSS from /proc. TRL's torch runs on one thread."""
    import datasets

    datasets.disable_progress_bars()
    w = workload(name)
    table = token_table(name)
    ds = datasets.Dataset(datasets.table.InMemoryTable(table), fingerprint=f"bench-{name}")
    # TRL's schema (capacity in tokens), else the package's own default format
    fmt = {"format": "trl"} if tool == "exactpack-trl" else {}
    before = _status("VmRSS")
    c0, t0 = _cpu(), time.perf_counter()
    if tool.startswith("exactpack"):
        pack_dataset = importlib.import_module(f"{PACKAGE}.hf").pack_dataset

        def run():
            return pack_dataset(ds, w.capacity, "best-fit-decreasing", vocab_size=VOCAB, **fmt)
    else:
        import torch
        from trl.data_utils import pack_dataset as trl_pack

        torch.set_num_threads(1)

        def run():
            return trl_pack(ds, w.capacity, strategy="bfd")

    out = run()
    first, first_cpu = time.perf_counter() - t0, _cpu() - c0
    rows = len(out)
    del out
    times, cpus = [], []
    for _ in range(repeats):
        c0, t0 = _cpu(), time.perf_counter()
        out = run()
        times.append(time.perf_counter() - t0)
        cpus.append(_cpu() - c0)
        del out
    return {"seconds": first, "warm_seconds": statistics.median(times), "times": times,
            "cpu": first_cpu, "warm_cpu": statistics.median(cpus), "cpus": cpus,
            "rows": rows, "rss_before": before, "peak_rss": _status("VmHWM")}  # fmt: skip


TRL_PARQUET = """
import sys, datasets
from trl.data_utils import pack_dataset
datasets.disable_progress_bars()
ds = datasets.load_dataset("parquet", data_files=sys.argv[1], split="train")
packed = pack_dataset(ds, int(sys.argv[3]), strategy="bfd")
packed.to_parquet(sys.argv[2])
print(len(packed))
"""

TRL_TEXT = """
import sys, datasets
from transformers import PreTrainedTokenizerFast
from trl.data_utils import pack_dataset
datasets.disable_progress_bars()
tok = PreTrainedTokenizerFast(tokenizer_file=sys.argv[4])
ds = datasets.load_dataset("json", data_files=sys.argv[1], split="train")
ds = ds.map(lambda b: tok(b["text"]), batched=True, remove_columns=ds.column_names)
packed = pack_dataset(ds, int(sys.argv[3]), strategy="bfd_split")
packed.to_parquet(sys.argv[2])
print(len(packed))
"""

TOKENIZER_ALONE = """
import json, sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[2])
encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
chunk, size, tokens, seconds = [], 0, 0, 0.0
def flush():
    global tokens, seconds
    t0 = time.perf_counter()
    tokens += sum(len(e) for e in encode(chunk, add_special_tokens=True))
    seconds += time.perf_counter() - t0
with open(sys.argv[1], encoding="utf-8") as f:
    for line in f:
        chunk.append(json.loads(line)["text"])
        size += len(chunk[-1])
        if size >= 8 << 20:
            flush()
            chunk, size = [], 0
if chunk:
    flush()
print(json.dumps({"tokens": tokens, "encode_seconds": seconds}))
"""


def fresh(argv: list[str], env: dict | None = None) -> dict:
    """Run ``argv`` as a fresh process: wall seconds, its own peak RSS (bytes), stdout.

    The peak is GNU time's ``%M`` (the command's ``ru_maxrss``): the command
    is forked by ``/usr/bin/time``, a small process, so it does not inherit
    this process's resident size the way a child forked from here would.
    """
    with tempfile.NamedTemporaryFile("r") as rss, tempfile.TemporaryFile("w+") as out:
        with tempfile.TemporaryFile("w+") as err:
            t0 = time.perf_counter()
            timed = ["/usr/bin/time", "-f", "%M", "-o", rss.name, *argv]
            env = {**os.environ, **(env or {})}
            # a user's install has its bytecode compiled (pip does it); this sandbox's
            # PYTHONDONTWRITEBYTECODE would make every process compile exactpack's modules
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            code = subprocess.call(timed, stdout=out, stderr=err, env=env)
            seconds = time.perf_counter() - t0
            err.seek(0)
            if code:
                raise SystemExit(f"{argv[:5]} failed ({code}):\n{err.read()[-3000:]}")
        out.seek(0)
        peak = int(rss.read().split()[-1]) * 1024
        return {"seconds": seconds, "stdout": out.read(), "peak_rss": peak}


def exactpack_pack(source: Path, out: Path, *flags: str) -> dict:
    argv = [sys.executable, "-m", PACKAGE, "pack", str(source), "--out", str(out)]
    result = fresh([*argv, "--json", "--overwrite", *flags])
    result["stats"] = json.loads(result["stdout"].strip().splitlines()[-1])
    return result


def scratch(prefix: str) -> Path:
    """A fresh folder under ``.cache/bench``, made first on a fresh clone."""
    CACHE.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=CACHE))


def trl_run(script: str, *args: str) -> dict:
    cache = scratch("hf-cache-")
    try:  # an empty datasets cache: the run converts and packs like a user's first run
        return fresh([sys.executable, "-c", script, *args], {"HF_DATASETS_CACHE": str(cache)})
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def in_memory(name: str, tool: str, repeats: int) -> dict:
    argv = [sys.executable, __file__, "--child", name, tool, str(repeats)]
    return json.loads(fresh(argv)["stdout"].strip().splitlines()[-1])  # VmHWM of the child


def run_workload(
    name: str, repeats: int, fresh_repeats: int, work: Path, parquet: bool = True
) -> list[dict]:
    w = workload(name)
    rows = []
    seq = in_memory(name, "exactpack", repeats)
    trl = in_memory(name, "trl", max(1, repeats // 2))
    rows.append(_row("pack_dataset (in memory)", name, seq, trl))
    same = in_memory(name, "exactpack-trl", repeats)  # TRL's own schema and unit
    rows.append(_row("pack_dataset(format='trl') (in memory)", name, same, trl))
    if not parquet:
        return rows
    source = parquet_input(name)
    flags = ["--max-length", str(w.capacity), "--vocab-size", str(VOCAB),
             "--policy", "best-fit-decreasing"]  # fmt: skip
    seq = _median(fresh_repeats, lambda: exactpack_pack(source, work / f"{name}-exactpack", *flags))
    trl_args = (str(source), str(work / f"{name}-trl.parquet"), str(w.capacity))
    trl = _median(fresh_repeats, lambda: trl_run(TRL_PARQUET, *trl_args))
    rows.append(_row("Parquet -> Parquet (fresh processes)", name, seq, trl))
    return rows


def first_calls(names: list[str], processes: int, repeats: int) -> None:
    """Path 1 for exactpack's format and TRL's, in ``processes`` fresh processes each: every
    first call (from the import) against the warm median of its own process, and the median
    of those ratios (a single first call varies with the OS's first huge pages)."""
    print("| path | workload | first (warm) s, one per fresh process | median first / warm |")
    print("|---|---|---|---:|")
    for name in names:
        for tool, path in (("exactpack", "pack_dataset"), ("exactpack-trl", "format='trl'")):
            runs = [in_memory(name, tool, repeats) for _ in range(processes)]
            pairs = ", ".join(f"{r['seconds']:.2f} ({r['warm_seconds']:.2f})" for r in runs)
            ratio = statistics.median(r["seconds"] / r["warm_seconds"] for r in runs)
            print(f"| {path} | {name} | {pairs} | {ratio:.2f}x |", flush=True)
    print(f"\nload average {os.getloadavg()[0]:.2f}")


def _median(repeats: int, run) -> dict:
    """The run of median wall time among ``repeats`` fresh runs (the machine is shared: one
    run can land on a busy second), with the largest peak RSS of them all."""
    runs = sorted((run() for _ in range(repeats)), key=lambda r: r["seconds"])
    return runs[len(runs) // 2] | {"peak_rss": max(r["peak_rss"] for r in runs),
                                   "all_seconds": [r["seconds"] for r in runs]}  # fmt: skip


TOKENIZER_LOAD = """
import resource, sys, time
t0 = time.perf_counter()
from exactpack.io.tokenizers import load_tokenizer
load_tokenizer(sys.argv[1]).encode_batch(["def f(x):\\n    return x"])
u = resource.getrusage(resource.RUSAGE_SELF)
print(time.perf_counter() - t0, u.ru_utime + u.ru_stime, "transformers" in sys.modules)
"""


def run_tokenizer_load(work: Path) -> list[dict]:
    """A tokenizer's load in fresh processes (import to its first encode): its
    ``tokenizer.json``, a ``save_pretrained`` folder of the generic class, and one of a
    model's own class (``GPT2TokenizerFast``: transformers rebuilds its pipeline), whose
    first load goes through transformers and later ones read what it kept."""
    from transformers import PreTrainedTokenizerFast

    file = train_tokenizer()
    generic = work / "tok-generic"
    PreTrainedTokenizerFast(tokenizer_file=str(file), bos_token="<s>", eos_token="</s>",
                            pad_token="<pad>").save_pretrained(str(generic))  # fmt: skip
    model = work / "tok-gpt2"
    shutil.copytree(generic, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(
        json.dumps(config | {"tokenizer_class": "GPT2TokenizerFast"})
    )
    env = {"XDG_CACHE_HOME": str(work / "xdg"), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    rows = []
    for label, path in [("tokenizer.json", file), ("generic folder", generic),
                        ("GPT2TokenizerFast folder, first load", model),
                        ("GPT2TokenizerFast folder, later loads", model)]:  # fmt: skip
        runs = []
        for _ in range(1 if label.endswith("first load") else 3):
            out = fresh([sys.executable, "-c", TOKENIZER_LOAD, str(path)], env)
            wall, cpu, heavy = out["stdout"].split()
            runs.append((float(wall), float(cpu), heavy == "True", out["peak_rss"]))
        runs.sort()
        wall, cpu, heavy, rss = runs[len(runs) // 2]
        rows.append({"tokenizer": label, "seconds": wall, "cpu": cpu, "transformers": heavy,
                     "peak_rss": rss})  # fmt: skip
    return rows


def run_text(megabytes: float, work: Path, with_trl: bool) -> list[dict]:
    source, tok = corpus(megabytes), train_tokenizer()
    name = f"text {megabytes:g} MB"
    alone = fresh([sys.executable, "-c", TOKENIZER_ALONE, str(source), str(tok)])
    limit = json.loads(alone["stdout"].strip().splitlines()[-1])
    flags = ["--max-length", str(TEXT_CAPACITY), "--tokenizer", str(tok), "--cut-long",
             "--policy", "best-fit-decreasing"]  # fmt: skip
    seq = exactpack_pack(source, work / f"text-{megabytes:g}", *flags)
    shutil.rmtree(work / f"text-{megabytes:g}", ignore_errors=True)
    trl = None
    if with_trl:
        out = str(work / f"text-{megabytes:g}-trl.parquet")
        trl = trl_run(TRL_TEXT, str(source), out, str(TEXT_CAPACITY), str(tok))
        Path(out).unlink(missing_ok=True)
    row = _row("text -> packed (fresh processes)", name, seq, trl)
    row |= {
        "tokenizer_seconds": limit["encode_seconds"],
        "tokenizer_tokens_per_s": limit["tokens"] / limit["encode_seconds"],
        "tokens": seq["stats"]["input_tokens"],
        "exactpack_tokens_per_s": seq["stats"]["input_tokens"] / seq["seconds"],
        "over_tokenizer": seq["seconds"] / limit["encode_seconds"],
        "tokenizer_rss": alone["peak_rss"],
    }
    return [row]


def _row(path: str, workload_name: str, seq: dict, trl: dict | None) -> dict:
    warm = seq.get("warm_seconds"), (trl or {}).get("warm_seconds")
    return {
        "exactpack_cpu": seq.get("cpu"),
        "exactpack_warm_cpu": seq.get("warm_cpu"),
        "trl_cpu": (trl or {}).get("cpu"),
        "trl_warm_cpu": (trl or {}).get("warm_cpu"),
        "path": path,
        "workload": workload_name,
        "exactpack_seconds": seq["seconds"],
        "trl_seconds": trl["seconds"] if trl else None,
        "ratio": trl["seconds"] / seq["seconds"] if trl else None,
        "exactpack_warm": warm[0],
        "trl_warm": warm[1],
        "warm_ratio": warm[1] / warm[0] if None not in warm else None,
        "exactpack_rss": seq["peak_rss"],
        "trl_rss": trl["peak_rss"] if trl else None,
    }


def print_table(rows: list[dict]) -> None:
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores;"
          f" RSS target {RSS_LIMIT / GIB:.2f} GiB (2 shards of int32 tokens + 1 GiB)")  # fmt: skip
    print("first call in a fresh process, imports included; (warm median) where measured\n")
    print("| path | workload | exactpack s | TRL s | TRL / exactpack | exactpack peak RSS |"
          " TRL peak RSS |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|")

    def both(first, warm, fmt="{:.2f}"):
        if first is None:
            return "-"
        return fmt.format(first) + (f" ({fmt.format(warm)})" if warm is not None else "")

    for r in rows:
        ratio = both(r["ratio"], r["warm_ratio"], "{:.1f}x") if r["ratio"] else "-"
        trl_rss = f"{r['trl_rss'] / GIB:.2f} GiB" if r["trl_rss"] else "-"
        ours = both(r["exactpack_seconds"], r["exactpack_warm"])
        print(f"| {r['path']} | {r['workload']} | {ours}"
              f" | {both(r['trl_seconds'], r['trl_warm'])} | **{ratio}**"
              f" | {r['exactpack_rss'] / GIB:.2f} GiB | {trl_rss} |")  # fmt: skip
    timed = [r for r in rows if r.get("exactpack_cpu") is not None]
    if timed:
        print("\nCPU seconds (user + system) of the same calls, first (warm median):\n")
        print(
            "| path | workload | exactpack CPU s | TRL CPU s | exactpack first / warm (wall, CPU) |"
        )
        print("|---|---|---:|---:|---:|")
        for r in timed:
            print(f"| {r['path']} | {r['workload']}"
                  f" | {both(r['exactpack_cpu'], r['exactpack_warm_cpu'])}"
                  f" | {both(r['trl_cpu'], r['trl_warm_cpu'])}"
                  f" | {r['exactpack_seconds'] / r['exactpack_warm']:.2f}x,"
                  f" {r['exactpack_cpu'] / r['exactpack_warm_cpu']:.2f}x |")  # fmt: skip
    text = [r for r in rows if "tokenizer_seconds" in r]
    if text:
        print("\n| text corpus | tokens | tokenizer alone s (M tok/s) | exactpack s (M tok/s) |"
              " exactpack / tokenizer | exactpack peak RSS | tokenizer peak RSS |")  # fmt: skip
        print("|---|---:|---:|---:|---:|---:|---:|")
        for r in text:
            print(f"| {r['workload']} | {r['tokens']:,} | {r['tokenizer_seconds']:.2f}"
                  f" ({r['tokenizer_tokens_per_s'] / 1e6:.2f}) | {r['exactpack_seconds']:.2f}"
                  f" ({r['exactpack_tokens_per_s'] / 1e6:.2f}) | {r['over_tokenizer']:.2f}"
                  f" | {r['exactpack_rss'] / GIB:.2f} GiB"
                  f" | {r['tokenizer_rss'] / GIB:.2f} GiB |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="W1 and 20 MB of text only")
    parser.add_argument("--workloads", default="W1,W2", help="token workloads (W1, W2)")
    parser.add_argument("--no-parquet", action="store_true", help="in-memory path 1 only")
    parser.add_argument("--repeats", type=int, default=3, help="in-memory calls (median)")
    parser.add_argument("--fresh-repeats", type=int, default=3,
                        help="fresh Parquet -> Parquet runs per tool (median)")  # fmt: skip
    parser.add_argument("--text", default="20,100,300", help="text corpus sizes in MB")
    parser.add_argument("--trl-text", default="20,100", help="sizes TRL packs too")
    parser.add_argument("--no-tokenizers", action="store_true",
                        help="skip the tokenizer loads (file, folders)")  # fmt: skip
    parser.add_argument("--first-calls", type=int, metavar="N",
                        help="path 1 only, N processes a tool: median first/warm")  # fmt: skip
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child_in_memory(args.child[0], args.child[1], int(args.child[2]))))
        return
    if args.first_calls:
        first_calls(args.workloads.split(","), args.first_calls, args.repeats)
        return
    sizes = [20.0] if args.quick else [float(x) for x in args.text.split(",") if x]
    trl_sizes = {float(x) for x in args.trl_text.split(",") if x}
    work = scratch("userpath-")
    rows: list[dict] = []
    loads: list[dict] = []
    try:
        if not args.no_tokenizers:
            loads = run_tokenizer_load(work)
        for name in ("W1",) if args.quick else args.workloads.split(","):
            rows += run_workload(
                name, args.repeats, args.fresh_repeats, work, parquet=not args.no_parquet
            )
        for mb in sizes:
            rows += run_text(mb, work, mb in trl_sizes)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(rows)
    if loads:
        print("\n| tokenizer (fresh process, import to first encode) | wall s | CPU s |"
              " imports transformers | peak RSS |")  # fmt: skip
        print("|---|---:|---:|---|---:|")
        for r in loads:
            print(
                f"| {r['tokenizer']} | {r['seconds']:.2f} | {r['cpu']:.2f}"
                f" | {'yes' if r['transformers'] else 'no'} | {r['peak_rss'] / GIB:.2f} GiB |"
            )
    text = [r for r in rows if "tokenizer_seconds" in r]
    if len(text) > 1:
        a, b = text[0], text[-1]
        print(f"\nmemory scaling: {b['workload']} / {a['workload']} peak RSS"
              f" {b['exactpack_rss'] / a['exactpack_rss']:.2f}x for"
              f" {b['tokens'] / a['tokens']:.1f}x the tokens")  # fmt: skip
    print("\n" + json.dumps({"rows": rows, "tokenizer_loads": loads,
                             "load_average": os.getloadavg()}))  # fmt: skip


if __name__ == "__main__":
    main()
