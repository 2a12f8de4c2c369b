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

Hybrids (:func:`hybrid_check`, ``--hybrids`` runs only this, about a minute): exactpack's
boundary-aware kernels (``exactpack.hf.mixers``: the path convolution, the Mamba scan, the
gated delta rule over whole rows) on CUDA in float32 and bfloat16 against themselves on CPU in
float64 (proven exact there by ``tests/integration/test_hf_mixers.py``), on rows whose
examples cross the 64-cell chunks and on a trie; where installed, the CUDA packages'
varlen routes that transformers takes (``causal_conv1d_fn(seq_idx=)``, fla's
``chunk_gated_delta_rule(cu_seqlens=)``, mamba-ssm's ``mamba_chunk_scan_combined(seq_idx=)``
against transformers' torch Mamba-2 scan per example, ``selective_scan_fn`` per example)
against them; then tiny LFM2, Mamba, Bamba and Qwen3.5 models: packed logits on CUDA
against CPU float64, and ``verify_hf`` on CUDA in float32.
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from exactpack import Binding, NotAvailable, PackConfig, SequenceExample, pack_examples
from exactpack.nn import AttentionLayout, attention
from exactpack.nn.auto import choose_backend
from exactpack.verify.fixture import fixture_batch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "support"))
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


#: Scaled tolerances of the hybrid kernels on CUDA against CPU float64.
HYBRID_TOL = {torch.float32: 1e-4, torch.bfloat16: 5e-2}


def hybrid_inputs(device: str, seed: int = 0) -> dict:
    """Two rows of 300 cells (examples of 70, 3, 130, 40 cells then padding; one of 300), a
    trie row (prompt 100, branches 90 and 60 from it), and random kernel inputs, float64."""
    from exactpack.hf.mixers import seq_idx_parents

    gen = torch.Generator().manual_seed(seed)
    first = torch.arange(-1, 5).repeat_interleave(torch.tensor([57, 70, 3, 130, 40, 0])).roll(-57)
    seq_idx = torch.stack([first, torch.full((300,), 4)])  # (2, 300)
    trie = list(range(-1, 189)) + [99] + list(range(190, 249)) + [-1] * 50  # 100 + 90, 100 + 60
    x = {n: torch.randn(2, *shape, generator=gen, dtype=torch.float64) for n, shape in [
        ("conv_x", (24, 300)), ("q", (300, 2, 16)), ("k", (300, 2, 16)), ("v", (300, 2, 16)),
        ("u", (8, 300)), ("dt", (8, 300)), ("B", (4, 300)), ("C", (4, 300)), ("z", (8, 300)),
    ]}  # fmt: skip
    x |= {
        "w": torch.randn(24, 4, generator=gen, dtype=torch.float64) / 2,
        "A": -torch.rand(8, 4, generator=gen),
    }
    x |= {
        "g": -torch.rand(2, 300, 2, generator=gen, dtype=torch.float64),
        "D": torch.randn(8, generator=gen),
    }
    x |= {
        "beta": torch.rand(2, 300, 2, generator=gen, dtype=torch.float64),
        "bias": torch.randn(8, generator=gen),
    }
    x |= {"seq_idx": seq_idx, "flat": seq_idx_parents(seq_idx), "trie": torch.tensor([trie] * 2)}
    return {k: v.to(device) for k, v in x.items()}


def hybrid_kernels(x: dict) -> dict:
    """Each boundary-aware kernel on ``x`` (flat rows; the scan and conv on the trie too)."""
    from exactpack.hf.mixers import _conv, chunk_gated_delta_rule, selective_scan

    scan = (x["u"], x["dt"], x["A"], x["B"], x["C"], x["D"], x["z"], x["bias"], True)
    return {
        "conv flat": _conv(x["conv_x"], x["w"], None, "silu", parents=x["flat"]),
        "conv trie": _conv(x["conv_x"], x["w"], None, "silu", parents=x["trie"]),
        "mamba scan flat": selective_scan(*scan, parents=x["flat"]),
        "mamba scan trie": selective_scan(*scan, parents=x["trie"]),
        "gated delta rule": chunk_gated_delta_rule(
            x["q"], x["k"], x["v"], x["g"], x["beta"], 64, True, parents=x["flat"]
        )[0],
    }


def foreign_kernels(x: dict, ours: dict) -> None:
    """The CUDA packages' varlen routes (float32) against exactpack's kernels, where installed."""
    valid = x["seq_idx"] >= 0
    try:
        from causal_conv1d import causal_conv1d_fn

        cl = x["conv_x"].float().transpose(1, 2).contiguous().transpose(1, 2)  # channel-last
        got = causal_conv1d_fn(cl, x["w"].float(), None, seq_idx=x["seq_idx"].where(valid, 5).int(),
                               activation="silu")  # fmt: skip
        err = scaled_error(got[..., valid[0]][:1], ours["conv flat"][..., valid[0]][:1])
        check("causal_conv1d seq_idx", err <= 1e-4, f"scaled error {err:.1e} (tol 1e-04)")
    except ImportError as err:
        print(f"  skip causal_conv1d: {err}")
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        lengths = torch.unique_consecutive(x["seq_idx"][valid], return_counts=True)[1]
        cu = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
        q, k, v, g, beta = (
            t[valid][None].float() for t in (x["q"], x["k"], x["v"], x["g"], x["beta"])
        )
        got, _ = chunk_gated_delta_rule(
            q, k, v, g, beta, cu_seqlens=cu, use_qk_l2norm_in_kernel=True
        )
        err = scaled_error(got[0], ours["gated delta rule"][valid])
        check(
            "fla chunk_gated_delta_rule cu_seqlens",
            err <= 1e-3,
            f"scaled error {err:.1e} (tol 1e-03)",
        )
    except ImportError as err:
        print(f"  skip fla: {err}")
    try:
        from mamba_ssm.ops.selective_scan_interface import selective_scan_fn
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
        from transformers.models.mamba2.modeling_mamba2 import mamba2_chunk_scan
    except ImportError as err:
        print(f"  skip mamba_ssm: {err}")
        return
    worst = 0.0
    for row, values in enumerate(x["seq_idx"].tolist()):
        for i in sorted(set(values) - {-1}):
            cols = x["seq_idx"][row] == i
            part = [t[row : row + 1][..., cols].float() for t in (x["u"], x["dt"])]
            part += [x["A"].float()] + [
                t[row : row + 1][..., cols].float() for t in (x["B"], x["C"])
            ]
            got = selective_scan_fn(*part, x["D"].float(), x["z"][row : row + 1][..., cols].float(),
                                    x["bias"].float(), delta_softplus=True)  # fmt: skip
            worst = max(worst, scaled_error(got, ours["mamba scan flat"][row : row + 1][..., cols]))
    check("mamba_ssm selective_scan_fn per example", worst <= 1e-4, f"scaled error {worst:.1e}")
    # Mamba-2 (run per example by exactpack): the seq_idx kernel against transformers' torch scan
    hs = x["q"].float().reshape(2, 300, 4, 8)
    dt, A = F.softplus(x["g"].float().repeat(1, 1, 2)), -torch.rand(4, device=hs.device)
    B, C = x["k"].float()[:, :, :1], x["v"].float()[:, :, :1]  # one group, state 16
    got = mamba_chunk_scan_combined(hs, dt, A, B, C, 64, seq_idx=x["seq_idx"].where(valid, 5).int())
    torch_scan = inspect.unwrap(mamba2_chunk_scan)
    worst = 0.0
    for row, values in enumerate(x["seq_idx"].tolist()):
        for i in sorted(set(values) - {-1}):
            cols = x["seq_idx"][row] == i
            want = torch_scan(*(t[row : row + 1, cols] for t in (hs, dt)), A,
                              *(t[row : row + 1, cols] for t in (B, C)), 64)  # fmt: skip
            want = want[0] if isinstance(want, tuple) else want
            worst = max(worst, scaled_error(got[row : row + 1, cols], want.double()))
    check("mamba_ssm mamba_chunk_scan_combined seq_idx", worst <= 1e-3, f"scaled error {worst:.1e}")


def hybrid_models(device: str) -> None:
    """Tiny LFM2, Mamba, Bamba, Qwen3.5: packed logits on ``device`` (float32, bfloat16)
    against CPU float64, and ``verify_hf`` (packed == separate) on ``device`` in float32."""
    from architecture_tiny import tiny_config
    from transformers import AutoModelForCausalLM

    from exactpack.hf import hf_inputs, restart_mixers
    from exactpack.verify.models import VerifyCase, verification_examples, verify_hf

    examples = verification_examples(266, 0, layout=VerifyCase((30, 3, 20, 9, 40), 64))
    (batch,) = pack_examples("train", examples, examples[0].binding, PackConfig(64, 2)).batches
    for model_type in ("lfm2", "mamba", "bamba", "qwen3_5"):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(tiny_config(model_type), dtype=torch.float64)
        model = restart_mixers(model.eval())
        with torch.no_grad():
            ref = model(**hf_inputs(batch, "sdpa", config=model.config, dtype=torch.float64)).logits
            for dtype, tol in HYBRID_TOL.items():
                inputs = hf_inputs(batch, "sdpa", config=model.config, dtype=dtype, device=device)
                got = model.to(device, dtype)(**inputs).logits.cpu()
                err = scaled_error(got[batch.input_valid], ref[batch.input_valid])
                check(
                    f"{model_type} packed {str(dtype)[6:]}",
                    err <= tol,
                    f"logits scaled error {err:.1e} vs CPU float64",
                )
        report = verify_hf(model.to(device, torch.float32), examples, max_length=64)
        diffs = " ".join(f"{k} {v:.1e}" for k, v in report["max_abs_diff"].items())
        check(f"{model_type} verify_hf float32", report["pass"], diffs)


def hybrid_check(device: str = "cuda") -> None:
    print(f"\nhybrids: boundary-aware kernels on {device} against CPU float64")
    ref = hybrid_kernels(hybrid_inputs("cpu"))
    for dtype, tol in HYBRID_TOL.items():
        x = {
            k: v.to(dtype) if v.is_floating_point() else v for k, v in hybrid_inputs(device).items()
        }
        for name, out in hybrid_kernels(x).items():
            err, finite = scaled_error(out.cpu(), ref[name]), bool(torch.isfinite(out).all())
            check(
                f"{name} {str(dtype)[6:]}",
                err <= tol and finite,
                f"scaled error {err:.1e} (tol {tol:.0e})",
            )
    x = {k: v.float() if v.is_floating_point() else v for k, v in hybrid_inputs(device).items()}
    foreign_kernels(x, hybrid_kernels(x))
    hybrid_models(device)


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
    p.add_argument("--hybrids", action="store_true", help="only the hybrid section")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA: nothing to check here (flash needs CUDA; run this on a GPU machine)")
        return
    args.deadline = time.monotonic() + args.budget
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    if args.hybrids:
        hybrid_check()
        print(f"\n{len(failures)} failure(s)" + "".join(f"\n  {f}" for f in failures))
        sys.exit(1 if failures else 0)
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
    hybrid_check()
    if not args.quick:
        timings(args)
    print(f"\n{len(failures)} failure(s)" + "".join(f"\n  {f}" for f in failures))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
