"""Training-step speed of packed rows with variable-length attention vs padding and dense masks.

    .venv/bin/python benchmarks/bench_attention.py            # the README table (~10 min, CPU)
    .venv/bin/python benchmarks/bench_attention.py --quick    # smoke run: 2 rows of 512, 1 thread

Workload: W1 (benchmarks/workloads.py) lengths <= capacity, in supplied order,
packed next-fit into ``--rows`` rows of ``--capacity`` cells; the *same*
examples right-padded one per row to the longest of them (dynamic padding,
the stronger padded baseline) with the dense backend. Token ids are random.

Model: ``exactpack.verify.TinyDecoder`` (Llama-style, tied byte vocabulary 266),
default width 256, 4 heads, SwiGLU 704, 4 layers, float32, seed 0 — the
same weights in every run. A training step is layout + forward + token-
weighted loss + backward; ``forward`` rows are the same under no_grad (the
only mode FlexAttention has on CPU). Each measurement runs in a fresh
subprocess with ``torch.set_num_threads(n)``: one warm-up step (compiles
flex), then ``--repeats`` timed steps; the table shows the best, and the
speed-up in real tokens/s over the first row of the same mode (train: padded
+ dense; forward: packed + dense). Memory:
peak resident memory added by one step (``/proc/self/clear_refs`` resets
VmHWM, freed heap trimmed first), or ``torch.cuda.max_memory_allocated``.

Also: one layer's attention alone (q, k, v of the packed rows, heads x 64)
for every varlen bucketing, dense and flex, on the W1 rows, on W2 rows and
on rows of 8-64-token segments (where grouping matters; ``--attention-only``
stops there); and loss/gradient agreement of the backends on the same
examples.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from exactpack import Binding, ExampleTable, PackConfig, Split, pack_examples
from exactpack.core.loss import token_weighted_loss
from exactpack.core.policies import plan_rows
from exactpack.nn import AttentionLayout, attention
from exactpack.nn.varlen import BUCKETING, varlen_attention, varlen_plan
from exactpack.verify.decoder import DecoderConfig, TinyDecoder

sys.path.insert(0, str(Path(__file__).parent))
from workloads import w1_sft, w2_short

BINDING = Binding(266, "exactpack/bytes-266", "sha256:bench-attention")
RUNS = [  # (layout, backend, mode)
    ("padded", "dense", "train"),
    ("packed", "dense", "train"),
    ("packed", "varlen", "train"),
    ("packed", "dense", "forward"),
    ("packed", "varlen", "forward"),
    ("packed", "flex", "forward"),
]
CUDA_RUNS = [("padded", "dense", "train")] + [
    ("packed", b, m) for m in ("train", "forward") for b in ("dense", "varlen", "flex", "flash")
]


LABELS = {"w1": "W1", "w2": "W2", "tiny": "8-64-token"}


def workload_lengths(workload: str) -> np.ndarray:
    """W1 or W2 (benchmarks/workloads.py), or ``tiny``: uniform 8-64 (many short segments)."""
    if workload == "tiny":
        return np.random.default_rng(20240603).integers(8, 65, size=100_000).astype(np.int64)
    return (w1_sft() if workload == "w1" else w2_short()).lengths


def workload_table(rows: int, capacity: int, workload: str = "w1", seed: int = 0) -> ExampleTable:
    """The workload's examples, lengths <= capacity in supplied order, filling ``rows`` rows."""
    lengths = workload_lengths(workload)
    lengths = lengths[lengths <= capacity][: rows * capacity]
    plan = plan_rows(lengths, capacity, "next-fit")
    lengths = lengths[: int(np.searchsorted(plan.row_of, rows))]
    n = lengths.size
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths + 1, out=offsets[1:])
    ids = np.array([f"w1-{i}" for i in range(n)], dtype=object)
    return ExampleTable(
        windows=np.random.default_rng(seed).integers(0, 266, offsets[-1]).astype(np.int32),
        offsets=offsets,
        loss_mask=np.ones(int(lengths.sum()), dtype=bool),
        source_ids=ids,
        example_ids=ids,
        range_starts=np.zeros(n, dtype=np.int64),
        range_ends=lengths + 1,
        partition=Split.TRAIN,
        binding=BINDING,
    )


def layouts(rows: int, capacity: int, workload: str = "w1") -> dict:
    table = workload_table(rows, capacity, workload)
    n, longest = len(table), int(table.lengths.max())
    packed = pack_examples("train", table, BINDING, PackConfig(capacity, rows))
    padded = pack_examples("train", table, BINDING, PackConfig(longest, n), policy="padded")
    assert len(packed.batches) == len(padded.batches) == 1
    return {"packed": packed.batches[0], "padded": padded.batches[0]}


def model_for(args: argparse.Namespace) -> TinyDecoder:
    cfg = DecoderConfig(266, args.width, args.heads, args.ff, args.layers, args.capacity)
    dtype = getattr(torch, args.dtype)
    return TinyDecoder(config=cfg, seed=0, dtype=dtype, device=args.device)


def step(model: TinyDecoder, batch, backend: str, mode: str) -> torch.Tensor:
    """Layout + forward + token-weighted loss (+ backward); returns the loss."""
    model.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(mode == "train"):
        ids, layout = model.inputs_of(batch)
        loss = token_weighted_loss(model(ids, layout, attention=backend), batch).mean
        if mode == "train":
            loss.backward()
    return loss.detach()


def trim_heap() -> None:
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def seconds(fn, device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def peak_mib(fn, device: str) -> float:
    """Memory one call of ``fn`` adds at its peak (MiB)."""
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    trim_heap()
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    base = rss_kib("VmRSS")
    fn()
    return (rss_kib("VmHWM") - base) / 1024


def interleaved(fns: dict, rounds: int, device: str) -> dict:
    """Best seconds of each function over ``rounds`` round-robin passes, after one warm-up each.

    Round-robin spreads other load on the machine over all candidates alike.
    """
    best: dict = {}
    for name, fn in fns.items():
        try:
            fn()  # warm-up (and FlexAttention's compile)
        except Exception as err:  # e.g. flash without CUDA: report, keep going
            best[name] = f"n/a ({type(err).__name__})"
    for _ in range(rounds):
        for name, fn in fns.items():
            if not isinstance(best.get(name), str):
                best[name] = min(best.get(name, float("inf")), seconds(fn, device))
    return best


def training_steps(args: argparse.Namespace, threads: int, grads: dict | None) -> dict:
    """Best seconds per run; when ``grads`` is a dict, fills it with each train run's loss/grads."""
    torch.set_num_threads(threads)
    batches = layouts(args.rows, args.capacity)
    model = model_for(args)

    def run(layout: str, backend: str, mode: str):
        def fn():
            loss = step(model, batches[layout], backend, mode)
            if grads is not None and mode == "train":
                flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).cpu()
                grads[f"{layout} + {backend}"] = {"loss": loss.cpu(), "grads": flat}

        return fn

    runs = CUDA_RUNS if args.device == "cuda" else RUNS
    return interleaved({r: run(*r) for r in runs}, args.repeats, args.device)


def worker(args: argparse.Namespace, spec: dict) -> dict:
    """Peak memory of one step in a fresh process (after a warm-up step)."""
    torch.set_num_threads(1)
    batch = layouts(args.rows, args.capacity)[spec["layout"]]
    model = model_for(args)
    step(model, batch, spec["backend"], spec["mode"])
    return {
        **spec,
        "peak_mib": peak_mib(
            lambda: step(model, batch, spec["backend"], spec["mode"]), args.device
        ),
    }


def attention_alone(args: argparse.Namespace, threads: int, workload: str) -> dict:
    """Best seconds of one layer's attention over the packed rows, per (backend, mode)."""
    torch.set_num_threads(threads)
    batch = layouts(args.rows, args.capacity, workload)["packed"]
    layout = AttentionLayout.from_batch(batch, args.device)
    gen = torch.Generator().manual_seed(0)
    shape = (layout.shape[0], args.heads, layout.shape[1], args.width // args.heads)
    dtype = getattr(torch, args.dtype)
    q, k, v, g = (torch.randn(shape, generator=gen).to(args.device, dtype) for _ in range(4))
    fns = {"dense": lambda q, k, v: attention(q, k, v, layout, "dense")}
    for b in BUCKETING:
        calls = len(varlen_plan(layout, b).groups)
        fns[f"varlen {b} ({calls} calls)"] = lambda q, k, v, b=b: varlen_attention(
            q, k, v, layout, q.shape[-1] ** -0.5, b
        )
    fns["flex"] = lambda q, k, v: attention(q, k, v, layout, "flex")
    if args.device == "cuda":
        fns["flash"] = lambda q, k, v: attention(q, k, v, layout, "flash")
    calls = {}
    for name, fn in fns.items():
        for mode in ("train", "forward"):
            if mode == "train" and name == "flex" and args.device == "cpu":
                continue
            leaves = [x.detach().requires_grad_(mode == "train") for x in (q, k, v)]

            def call(fn=fn, leaves=leaves, mode=mode):
                with torch.set_grad_enabled(mode == "train"):
                    out = fn(*leaves)
                    if mode == "train":
                        out.backward(g)

            calls[(name, mode)] = call
    return interleaved(calls, max(args.repeats, 3), args.device)


def agreement(grads: dict) -> list[tuple[str, float, float, float]]:
    """(run, |Δloss|, max|Δgrad|/max|grad|, ||Δgrad||/||grad||) against packed + varlen."""
    ref = grads["packed + varlen"]
    want = ref["grads"].double()
    out = []
    for name, got in grads.items():
        diff = got["grads"].double() - want
        loss_diff = float((got["loss"].double() - ref["loss"].double()).abs())
        out.append(
            (
                name,
                loss_diff,
                float(diff.abs().max() / want.abs().max()),
                float(diff.norm() / want.norm()),
            )
        )
    return out


def spawn(args: argparse.Namespace, spec: dict) -> dict:
    cmd = [sys.executable, __file__, *args.forward, "--worker", json.dumps(spec)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return {**spec, "error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fmt(value: object, scale: float = 1e3) -> str:
    return value if isinstance(value, str) else f"{scale * value:.1f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--capacity", type=int, default=2048)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ff", type=int, default=704)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="float32 on CPU, bfloat16 on CUDA")
    p.add_argument("--no-memory", action="store_true", help="skip the per-run memory subprocesses")
    p.add_argument("--attention-only", action="store_true", help="only the attention tables")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.quick:
        args.rows, args.capacity, args.threads, args.repeats = 2, 512, [1], 1
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    keys = ("rows", "capacity", "width", "heads", "ff", "layers", "device", "dtype")
    args.forward = [f"--{k}={getattr(args, k)}" for k in keys]
    if args.worker:
        print(json.dumps(worker(args, json.loads(args.worker))))
        return

    batches = layouts(args.rows, args.capacity)
    packed, padded = batches["packed"], batches["padded"]
    tokens = int(packed.input_valid.sum())
    lengths = np.diff(packed.cu_seqlens().cu_seqlens).astype(np.int64)
    (rows, width), (padded_rows, longest) = packed.shape, padded.shape
    print(
        f"W1: {len(lengths)} examples, {tokens} real tokens (mean {tokens / len(lengths):.0f},"
        f" max {lengths.max()}); packed {rows}x{width} cells, padded {padded_rows}x{longest};"
        f" score cells per head: Σl² {int((lengths**2).sum()):,}, packed R·T² {rows * width**2:,},"
        f" padded {padded_rows * longest**2:,}"
    )
    print(
        f"model: width {args.width}, {args.heads} heads, ff {args.ff}, {args.layers} layers,"
        f" vocab 266, {args.dtype}, {args.device}; best of {args.repeats} interleaved rounds;"
        f" load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    for workload, threads in itertools.product(("w1", "w2", "tiny"), args.threads):
        lengths = layouts(args.rows, args.capacity, workload)["packed"].cu_seqlens().cu_seqlens
        print(
            f"\none layer's attention alone, {LABELS[workload]} rows ({len(lengths) - 1} segments),"
            f" {threads} thread(s), ms:"
        )
        print("| backend | forward + backward | forward |\n|---|---:|---:|")
        best = attention_alone(args, threads, workload)
        for name in dict.fromkeys(n for n, _ in best):
            cells = [fmt(best.get((name, mode), "-")) for mode in ("train", "forward")]
            print(f"| {name} | {cells[0]} | {cells[1]} |")
    if args.attention_only:
        return

    memory = {}
    if not args.no_memory:
        runs = CUDA_RUNS if args.device == "cuda" else RUNS
        for layout, backend, mode in runs:
            r = spawn(args, {"layout": layout, "backend": backend, "mode": mode})
            memory[(layout, backend, mode)] = r.get("peak_mib", r.get("error", "n/a"))
    grads: dict = {}
    for threads in args.threads:
        print(f"\ntraining step, {threads} thread(s):")
        print("| layout + attention | mode | ms / step | real tokens / s | speed-up | peak MiB |")
        print("|---|---|---:|---:|---:|---:|")
        base: dict[str, float] = {}
        best = training_steps(args, threads, grads if threads == args.threads[0] else None)
        for (layout, backend, mode), secs in best.items():
            mem = fmt(memory.get((layout, backend, mode), "-"), 1.0)
            if isinstance(secs, str):
                print(f"| {layout} + {backend} | {mode} | {secs} | | | {mem} |")
                continue
            speed = tokens / secs
            base.setdefault(mode, speed)  # vs the first row of the same mode
            print(
                f"| {layout} + {backend} | {mode} | {1e3 * secs:.0f} | {speed:,.0f} |"
                f" {speed / base[mode]:.2f}x | {mem} |"
            )

    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")
    if "packed + varlen" in grads:
        print("\nagreement with packed + varlen (same weights, same examples, last timed step):")
        print(
            "| run | loss | abs loss diff | max grad diff / max grad | grad diff norm / grad norm |"
        )
        print("|---|---:|---:|---:|---:|")
        for name, dl, dmax, dnorm in agreement(grads):
            loss = float(grads[name]["loss"])
            print(f"| {name} | {loss:.7f} | {dl:.2e} | {dmax:.2e} | {dnorm:.2e} |")


if __name__ == "__main__":
    main()
