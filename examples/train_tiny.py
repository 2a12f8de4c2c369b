"""Train the tiny decoder on packed Python source, and show what packing changes and what not.

The Python standard library's ``*.py`` files (sorted walk), cut before each
top-level definition into units of varied length, go through the built-in
byte tokenizer; units longer than ``--max-length`` prediction pairs are split
into ranges (every pair kept once) or, with ``--long drop``, left out. They
are packed best-fit-decreasing into a packed directory and trained through
the whole exactpack data path:
``PackedBatches`` -> ``RowSampler`` (micro-batches) -> ``PackedCollator``
-> ``TinyDecoder`` -> ``micro_batch_loss`` (divided by the step's count).

It prints and plots three things:

1. tokens per second, packed rows vs one example per padded row
   (same model, same rows per step, float32);
2. packed and separate training in float64 with the same optimizer (AdamW)
   from the same initialisation, for ``--compare-steps`` steps: the loss of
   every step and the largest parameter difference after it;
3. the loss curve of ``--steps`` packed training steps (float32).

    .venv/bin/python examples/train_tiny.py --steps 300 --out out/train_tiny.png
"""

from __future__ import annotations

import argparse
import os
import re
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from exactpack import ByteTokenizer, ExampleTable, Split, cut_long, data_digest
from exactpack.core.binding import Binding
from exactpack.core.loss import masked_nll_sum
from exactpack.io.store import write_packed
from exactpack.pipeline.local import pack_table
from exactpack.training import (
    PackedBatches,
    PackedCollator,
    RowSampler,
    decoder_inputs,
    micro_batch_loss,
)
from exactpack.verify.decoder import DecoderConfig, TinyDecoder


def stdlib_texts(max_files: int) -> list[tuple[str, str]]:
    """The first ``max_files`` ``*.py`` files of the standard library, sorted walk."""
    root = sysconfig.get_paths()["stdlib"]
    out = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "dist-packages"))
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    out.append((os.path.relpath(path, root), f.read()))
                if len(out) == max_files:
                    return out
    return out


#: A new unit starts at every top-level ``def``, ``class``, decorator or main guard.
UNIT_START = re.compile(r"\n(?=(?:async def |def |class |@|if __name__))")


def source_units(texts: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Each file cut before its top-level definitions: varied lengths, like SFT examples."""
    units = []
    for name, text in texts:
        parts = [p for p in UNIT_START.split(text) if p.strip()]
        units.extend((f"{name}#{k}", part) for k, part in enumerate(parts))
    return units


def example_table(units: list[tuple[str, str]], capacity: int, long: str) -> ExampleTable:
    """Byte-tokenized units; longer than ``capacity`` pairs: split (every pair kept) or dropped."""
    tok = ByteTokenizer()
    tokens, offsets = tok.encode_batch([t for _, t in units])
    ids = np.array([n for n, _ in units], dtype=object)
    binding = Binding(tok.vocab_size, tok.identity, data_digest(*ids))
    counts = np.diff(offsets)
    table = ExampleTable(
        windows=tokens,
        offsets=offsets,
        loss_mask=np.ones(tokens.shape[0] - counts.shape[0], dtype=bool),
        source_ids=ids,
        example_ids=ids.copy(),
        range_starts=np.zeros(counts.shape[0], dtype=np.int64),
        range_ends=counts,
        partition=Split.TRAIN,
        binding=binding,
    )
    if long == "drop":
        return table.take(np.flatnonzero(table.lengths <= capacity))
    return cut_long(table, capacity)[0]


def packed_dir(table: ExampleTable, capacity: int, policy: str, rows: int, root: Path) -> Path:
    _, compact = pack_table(table, capacity, policy)
    path = root / policy
    write_packed(compact, path, max_rows_per_batch=rows, overwrite=True)
    return path


def make_model(args: argparse.Namespace, dtype: torch.dtype) -> TinyDecoder:
    config = DecoderConfig(
        vocab_size=266,
        width=args.width,
        heads=args.heads,
        ff=args.ff,
        layers=args.layers,
        max_len=args.capacity,
    )
    return TinyDecoder(config=config, seed=args.seed, dtype=dtype, attention=args.attention)


def train(model, ds, sampler, steps: int, lr: float, desc: str, show: bool = True):
    """Packed training through the data path; returns (per-step losses, valid tokens, seconds)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    collate = PackedCollator()
    losses, tokens, epoch = [], 0, 0
    running = 0.0
    bar = tqdm(total=steps, desc=desc, unit="step", disable=not show)
    started = time.perf_counter()
    while len(losses) < steps:
        sampler.set_epoch(epoch)
        for slot in sampler:
            features = collate(ds[slot])
            logits = model(*decoder_inputs(features))
            loss = micro_batch_loss(logits, features, parameters=model.parameters())
            loss.backward()
            running += float(loss.detach())
            tokens += int(features["valid_index"].shape[0])
            if slot.last_micro:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                losses.append(running)
                bar.set_postfix(loss=f"{running:.3f}")
                bar.update()
                running = 0.0
                if len(losses) == steps:
                    break
        epoch += 1
    bar.close()
    return losses, tokens, time.perf_counter() - started


def throughput(args, dirs: dict[str, Path]) -> dict[str, float]:
    """Valid tokens per second, packed vs padded rows, float32, same rows per step.

    The layouts alternate ``--bench-repeats`` times (a fresh model each) and
    the median counts, so load from other processes hits both alike.
    """
    runs: dict[str, list[float]] = {name: [] for name in dirs}
    for repeat in range(args.bench_repeats):
        for name, path in dirs.items():
            ds = PackedBatches(path)
            sampler = RowSampler(
                ds.row_stats(),
                rows_per_micro_batch=args.rows,
                micro_batches=args.micro,
                seed=args.seed + repeat,
            )
            model = make_model(args, torch.float32)
            train(model, ds, sampler, 2, args.lr, "warm-up", show=False)
            _, tokens, seconds = train(model, ds, sampler, args.bench_steps, args.lr, name)
            runs[name].append(tokens / seconds)
    out = {}
    for name, path in dirs.items():
        out[name] = float(np.median(runs[name]))
        rows = PackedBatches(path).num_rows
        print(f"{name:>7}: {rows:,} rows, median {out[name]:,.0f} tokens/s")
    return out


def packed_vs_separate(args, table: ExampleTable, path: Path) -> tuple[list, list, list]:
    """float64, AdamW: the same steps trained packed and one example at a time."""
    ds = PackedBatches(path)
    sampler = RowSampler(
        ds.row_stats(), rows_per_micro_batch=args.rows, micro_batches=args.micro, seed=args.seed
    )
    packed, separate = make_model(args, torch.float64), make_model(args, torch.float64)
    opt_p = torch.optim.AdamW(packed.parameters(), lr=args.lr)
    opt_s = torch.optim.AdamW(separate.parameters(), lr=args.lr)
    collate = PackedCollator()
    curve_p, curve_s, param_diff = [], [], []
    step_examples: list[int] = []
    loss_p = 0.0
    for slot in sampler:
        item = ds[slot]
        features = collate(item)
        loss = micro_batch_loss(packed(*decoder_inputs(features)), features)
        loss.backward()
        loss_p += float(loss.detach())
        step_examples.extend(item.batch.occurrences.ordinal.tolist())
        if not slot.last_micro:
            continue
        n = slot.step_eligible
        total = 0.0
        for i in step_examples:  # the same examples, each alone in its own call
            ex = table.example(i)
            nll = masked_nll_sum(separate.forward_separate(ex), ex.targets, ex.loss_mask).sum / n
            nll.backward()
            total += float(nll.detach())
        opt_p.step()
        opt_s.step()
        opt_p.zero_grad(set_to_none=True)
        opt_s.zero_grad(set_to_none=True)
        with torch.no_grad():
            diff = max(
                float((a - b).abs().max())
                for a, b in zip(packed.parameters(), separate.parameters(), strict=True)
            )
        curve_p.append(loss_p)
        curve_s.append(total)
        param_diff.append(diff)
        print(
            f"step {len(curve_p):3d}: packed {loss_p:.12f}  separate {total:.12f}"
            f"  |loss diff| {abs(loss_p - total):.1e}  max |param diff| {diff:.1e}"
        )
        loss_p, step_examples = 0.0, []
        if len(curve_p) == args.compare_steps:
            break
    return curve_p, curve_s, param_diff


def plot(path: Path, compare: tuple[list, list, list], long_run: list, speed: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    packed, separate, diff = compare
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), constrained_layout=True)
    steps = np.arange(1, len(packed) + 1)
    axes[0].plot(steps, separate, "o", color="#dd8452", label="separate (one example per call)")
    axes[0].plot(steps, packed, "-", color="#4c72b0", label="packed")
    axes[0].set(xlabel="optimizer step", ylabel="token-weighted loss (nats)")
    axes[0].set_title("float64, AdamW, same initialisation")
    axes[0].legend()
    loss_diff = np.maximum(np.abs(np.array(packed) - np.array(separate)), 1e-18)
    axes[1].semilogy(steps, loss_diff, "o-", label="|loss packed - separate| (0 drawn at 1e-18)")
    axes[1].semilogy(steps, np.maximum(diff, 1e-18), "s-", label="max |parameter difference|")
    axes[1].axhline(1e-10, color="gray", linestyle=":", label="absolute tolerance 1e-10")
    axes[1].set(xlabel="optimizer step", ylabel="difference")
    axes[1].set_title("packed vs separate: differences per step")
    axes[1].legend(fontsize="small", loc="center right")
    axes[2].plot(np.arange(1, len(long_run) + 1), long_run, color="#4c72b0")
    ratio = speed["packed"] / speed["padded"]
    axes[2].set(xlabel="optimizer step", ylabel="loss (nats)")
    axes[2].set_title(f"packed training, float32\n{ratio:.2f}x the tokens/s of padded rows")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300, help="packed float32 training steps")
    p.add_argument("--compare-steps", type=int, default=20, help="float64 packed-vs-separate")
    p.add_argument("--bench-steps", type=int, default=10, help="steps timed per layout and run")
    p.add_argument("--bench-repeats", type=int, default=3, help="timed runs per layout")
    p.add_argument("--max-files", type=int, default=300, help="stdlib files to read")
    p.add_argument(
        "--max-length", dest="capacity", type=int, default=512,
        help="tokens per row, the input_ids width",
    )  # fmt: skip
    p.add_argument(
        "--long", choices=("split", "drop"), default="split", help="units over the capacity"
    )
    p.add_argument("--rows", type=int, default=4, help="rows per micro-batch")
    p.add_argument("--micro", type=int, default=2, help="micro-batches per optimizer step")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ff", type=int, default=160)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--attention", default="auto", help="attention backend (exactpack.nn)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("out/train_tiny.png"), help="plot path")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    texts = stdlib_texts(args.max_files)
    units = source_units(texts)
    table = example_table(units, args.capacity, args.long)
    print(
        f"{len(texts)} stdlib files -> {len(units):,} top-level units -> {len(table):,} examples"
        f" ({args.long} long ones), {int(table.lengths.sum()):,} prediction pairs,"
        f" capacity {args.capacity}"
    )
    with tempfile.TemporaryDirectory(prefix="exactpack-train-tiny-") as tmp:
        rows = args.rows * args.micro
        dirs = {
            name: packed_dir(table, args.capacity, policy, rows, Path(tmp))
            for name, policy in (("packed", "best-fit-decreasing"), ("padded", "padded"))
        }
        print("\n(a) throughput, float32, same rows per step")
        speed = throughput(args, dirs)
        print(f"packed / padded tokens per second: {speed['packed'] / speed['padded']:.2f}x")
        print("\n(b) packed vs separate, float64, AdamW")
        compare = packed_vs_separate(args, table, dirs["packed"])
        worst = max(abs(a - b) for a, b in zip(*compare[:2], strict=True))
        print(f"largest |loss diff| {worst:.1e}, largest |param diff| {max(compare[2]):.1e}")
        print(f"\n(c) {args.steps} packed training steps, float32")
        ds = PackedBatches(dirs["packed"])
        sampler = RowSampler(
            ds.row_stats(), rows_per_micro_batch=args.rows, micro_batches=args.micro, seed=args.seed
        )
        model = make_model(args, torch.float32)
        losses, tokens, seconds = train(model, ds, sampler, args.steps, args.lr, "training")
        print(
            f"loss {losses[0]:.3f} -> {np.mean(losses[-10:]):.3f} (mean of the last 10 steps);"
            f" {tokens:,} tokens in {seconds:.1f} s"
        )
    plot(args.out, compare, losses, speed)
    print(f"plot: {args.out}")


if __name__ == "__main__":
    main()
