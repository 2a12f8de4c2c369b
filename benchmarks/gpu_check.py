"""GPU check of the attention backends: agreement with ``ranges`` and timings (< 5 minutes).

    python benchmarks/gpu_check.py            # on a CUDA machine; prints "no CUDA" elsewhere
    python benchmarks/gpu_check.py --quick    # agreement only, no timings

Agreement, per layout (the fixture, random small layouts with segments
crossing FlexAttention's 128-cell tiles, padding-only rows, W1 rows), per
window (none, and 37 cells: inside a tile) and per backend and dtype (flash:
bfloat16/float16; flex: float32/bfloat16; varlen: float64/float32/bfloat16;
dense: float32): outputs and dq, dk, dv against ``ranges`` with the same
window in float64 on the same (rounded) inputs, scaled error
``max|a-b| / max|ref|``; padding queries exactly zero; the gradient of one
segment's outputs with respect to every other cell's q, k, v exactly zero;
nothing NaN. transformers: ``exactpack verify``'s comparison (packed ==
separate, logits, loss, gradients) of a tiny windowed Mistral on CUDA for
``exactpack_varlen``, ``sdpa``, ``flex_attention`` and ``flash_attention_2``
where installed. Timings: one layer's attention, forward and forward+backward,
on W1 rows (``--rows`` x ``--capacity``), CUDA events, median of 10 after
warm-up (the warm-up includes FlexAttention's compile). Exit code 1 when a
check fails.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from exactpack import Binding, NotAvailable, PackConfig, SequenceExample, pack_examples
from exactpack.nn import AttentionLayout, attention
from exactpack.nn.auto import choose_backend
from exactpack.verify.fixture import fixture_batch

sys.path.insert(0, str(Path(__file__).parent))
from bench_attention import layouts

CHECKS = [  # (backend, dtype, scaled tolerance)
    ("flash", torch.bfloat16, 3e-2),
    ("flash", torch.float16, 5e-3),
    ("flex", torch.float32, 1e-4),
    ("flex", torch.bfloat16, 3e-2),
    ("varlen", torch.float64, 1e-12),
    ("varlen", torch.float32, 1e-4),
    ("varlen", torch.bfloat16, 3e-2),
    ("dense", torch.float32, 1e-4),
]
BINDING = Binding(266, "gpu-check", "sha256:gpu-check")
failures: list[str] = []


def small_layouts(seed: int = 0) -> list:
    """Random packed batches: segments of 1..300 cells in rows of 260-700, some padding rows."""
    rng = np.random.default_rng(seed)
    out = []
    for capacity, rows in ((260, 4), (700, 3), (129, 6)):
        lengths = rng.integers(1, capacity + 1, size=3 * rows)
        examples = [
            SequenceExample.from_document(
                rng.integers(0, 266, n + 1).tolist(),
                source_id=f"s{i}",
                partition="train",
                binding=BINDING,
            )
            for i, n in enumerate(lengths)
        ]
        out.append(pack_examples("train", examples, BINDING, PackConfig(capacity, rows)).batches[0])
    return out


def scaled_error(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def check(name: str, ok: bool, detail: str) -> None:
    print(f"  {'ok  ' if ok else 'FAIL'} {name}: {detail}")
    if not ok:
        failures.append(f"{name}: {detail}")


#: Windows checked: none, and one shorter than FlexAttention's 128-cell tile.
WINDOWS = (None, 37)


def agreement(label: str, layout: AttentionLayout, heads: int, dim: int, seed: int) -> None:
    for window in WINDOWS:
        agreement_at(label, layout, heads, dim, seed, window)


def agreement_at(
    label: str, layout: AttentionLayout, heads: int, dim: int, seed: int, window: int | None
) -> None:
    print(
        f"{label}: {layout.shape[0]}x{layout.shape[1]} cells, {len(layout.lengths)} segments,"
        f" window {window}"
    )
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape = (layout.shape[0], heads, layout.shape[1], dim)
    base = [torch.randn(shape, generator=gen, device="cuda", dtype=torch.float64) for _ in range(4)]
    valid = layout.valid[:, None, :, None]
    seg = layout.segments[:, None, :, None]
    first = int(layout.segments[layout.valid][0]) if layout.valid.any() else -1
    for backend, dtype, tol in CHECKS:
        name = f"{backend} {str(dtype).removeprefix('torch.')}"
        q, k, v = (x.detach().to(dtype).requires_grad_(True) for x in base[:3])
        weight = base[3].to(dtype)
        try:
            out = attention(q, k, v, layout, backend, sliding_window=window)
            grads = torch.autograd.grad((out * weight).sum(), (q, k, v))
        except NotAvailable as err:
            print(f"  skip {name}: {err}")
            continue
        except Exception as err:
            check(name, False, f"{type(err).__name__}: {str(err).splitlines()[0][:200]}")
            continue
        ref_in = [x.detach().double().requires_grad_(True) for x in (q, k, v)]
        ref = attention(*ref_in, layout, "ranges", sliding_window=window)
        ref_grads = torch.autograd.grad((ref * weight.double()).sum(), ref_in)
        errors = [scaled_error(out, ref)] + [
            scaled_error(g, r) for g, r in zip(grads, ref_grads, strict=True)
        ]
        finite = all(bool(torch.isfinite(t).all()) for t in (out, *grads))
        zero_pad = int(torch.count_nonzero(out * ~valid)) == 0
        check(
            name,
            max(errors) <= tol and finite and zero_pad,
            "scaled error out/dq/dk/dv "
            + " ".join(f"{e:.1e}" for e in errors)
            + f" (tol {tol:.0e}), finite {finite}, zero padding {zero_pad}",
        )
        if first >= 0:
            inside = seg == first
            cross = torch.autograd.grad(
                (attention(q, k, v, layout, backend, sliding_window=window) * inside).sum(),
                (q, k, v),
            )
            leaks = sum(int(torch.count_nonzero(g * ~inside)) for g in cross)
            check(f"{name} isolation", leaks == 0, f"{leaks} nonzero cross-segment grad entries")


def transformers_check() -> None:
    """verify_hf on a tiny windowed Mistral (window 16, examples of 35 pairs) on CUDA."""
    import json
    import tempfile

    from exactpack.verify.models import (
        load_model,
        verification_examples,
        verification_layout,
        verify_hf,
    )

    config = json.loads((Path(__file__).parent.parent / "tests/data/tiny_llama.json").read_text())
    config |= {"model_type": "mistral", "sliding_window": 16}
    print("\ntransformers: tiny Mistral, window 16")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        for attn, dtype in [
            ("exactpack_varlen", torch.float64),
            ("sdpa", torch.float64),
            ("flex_attention", torch.float32),
            ("flash_attention_2", torch.bfloat16),
        ]:
            name = f"hf {attn} {str(dtype).removeprefix('torch.')}"
            try:
                model = load_model(config=tmp, attn_implementation=attn, dtype=dtype, device="cuda")
            except NotAvailable as err:
                print(f"  skip {name}: {err}")
                continue
            layout = verification_layout(16, 64)
            examples = verification_examples(266, 0, layout=layout)
            try:
                report = verify_hf(model, examples, max_length=layout.capacity)
            except Exception as err:
                check(name, False, f"{type(err).__name__}: {str(err).splitlines()[0][:200]}")
                continue
            # bfloat16 models compare at float32's tolerance: report the differences only.
            diffs = " ".join(f"{k} {v:.1e}" for k, v in report["max_abs_diff"].items())
            ok = report["pass"] or dtype == torch.bfloat16
            check(name, ok, f"pass {report['pass']}: {diffs}")


def cuda_ms(fn, iters: int = 10) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def timings(args: argparse.Namespace) -> None:
    batch = layouts(args.rows, args.capacity)["packed"]
    layout = AttentionLayout.from_batch(batch, "cuda")
    lengths = layout.lengths
    print(
        f"\ntimings: W1 rows {layout.shape[0]}x{layout.shape[1]}, {len(lengths)} segments,"
        f" {int(lengths.sum())} tokens, heads {args.heads} x {args.dim}; median ms"
    )
    print("| backend | dtype | forward | forward + backward |\n|---|---|---:|---:|")
    shape = (layout.shape[0], args.heads, layout.shape[1], args.dim)
    for backend, dtype in [
        ("flash", torch.bfloat16),
        ("flex", torch.bfloat16),
        ("varlen", torch.bfloat16),
        ("dense", torch.bfloat16),
        ("flex", torch.float32),
        ("varlen", torch.float32),
        ("dense", torch.float32),
    ]:
        if time.monotonic() > args.deadline:
            print(f"| {backend} | skipped: time budget | | |")
            continue
        q, k, v, g = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(4))
        leaves = [x.requires_grad_(True) for x in (q, k, v)]

        def forward(leaves=leaves, backend=backend):
            with torch.no_grad():
                attention(*leaves, layout, backend)

        def train(leaves=leaves, backend=backend, g=g):
            attention(*leaves, layout, backend).backward(g)

        cells = []
        for fn in (forward, train):
            try:
                cells.append(f"{cuda_ms(fn):.2f}")
            except Exception as err:  # not available here, out of memory, ...: report, go on
                cells.append(f"n/a: {type(err).__name__}: {str(err).splitlines()[0][:60]}")
        print(f"| {backend} | {str(dtype).removeprefix('torch.')} | {cells[0]} | {cells[1]} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--capacity", type=int, default=4096)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--budget", type=float, default=240.0, help="seconds before timings stop")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA: nothing to check here (flash needs CUDA; run this on a GPU machine)")
        return
    args.deadline = time.monotonic() + args.budget
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    for dtype in (torch.bfloat16, torch.float32, torch.float64):
        pick = choose_backend(torch.zeros(1, 1, 1, 64, device="cuda", dtype=dtype))
        print(f"auto picks {pick} for {dtype}")
    cases = [("fixture", fixture_batch())] + [
        (f"random {i}", b) for i, b in enumerate(small_layouts())
    ]
    cases.append(("W1 rows", layouts(2, 2048)["packed"]))
    for i, (label, batch) in enumerate(cases):
        agreement(label, AttentionLayout.from_batch(batch, "cuda"), heads=2, dim=64, seed=i)
    transformers_check()
    if not args.quick:
        timings(args)
    print(f"\n{len(failures)} failure(s)" + "".join(f"\n  {f}" for f in failures))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
