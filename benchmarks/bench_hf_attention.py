"""A transformers model on packed rows: ``exactpack_varlen`` vs sdpa with dense 4-D masks.

    .venv/bin/python benchmarks/bench_hf_attention.py              # docs/transformers.md table
    .venv/bin/python benchmarks/bench_hf_attention.py --quick      # smoke run: T=512, 1 thread

Workload: W1 lengths (benchmarks/workloads.py) clipped to the row, in
supplied order, packed next-fit; the first ``--rows`` (4) rows of width T
(4096 and 8192) are one micro-batch. Model: a tiny Llama built from a config
(hidden 64, 4 heads of 16 / 2 KV heads, SwiGLU 128, 2 layers, vocabulary
266, float32, seed 0), the same weights everywhere. A step is what a
training loop does per micro-batch:
``hf_inputs(batch, ..., config=model.config)`` (the masks are built here, on
the CPU) + forward + ``loss.backward()``.

Variants (all compute the same loss; the run checks it):

* ``sdpa + float mask``: ``attn_implementation="sdpa"``, the additive float
  ``(R, 1, T, T)`` mask — the baseline;
* ``sdpa + bool mask``: the same, ``mask="bool"`` (a quarter of the bytes);
* ``exactpack_varlen``: the registered attention function on the flattened
  valid cells with ``cu_seq_lens`` — no mask at all.

Each (variant, T, threads) runs in a fresh subprocess: one warm-up step,
then ``--repeats`` timed steps (best shown). Memory: the bytes of the
``attention_mask`` argument, and the peak resident memory one step adds
(``/proc/self/clear_refs`` resets VmHWM). Ratios are against the baseline of
the same T and threads, measured in the same run; the load average is
printed before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_attention import peak_mib, trim_heap
from workloads import w1_sft

VARIANTS = {  # name -> (attn_implementation, mask)
    "sdpa + float mask": ("sdpa", "float"),
    "sdpa + bool mask": ("sdpa", "bool"),
    "exactpack_varlen": ("exactpack_varlen", "float"),
}
BASELINE = "sdpa + float mask"
CONFIG = {
    "model_type": "llama",
    "vocab_size": 266,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 8192,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 2,
}


def batch_of(rows: int, width: int):
    """The first ``rows`` next-fit rows of W1 (lengths clipped to the row), random ids."""
    from exactpack import Binding, PackConfig, SequenceExample, pack_examples

    binding = Binding(266, "exactpack/bytes-266", "sha256:bench-hf-attention")
    lengths = np.minimum(w1_sft().lengths, width)
    rng = np.random.default_rng(0)
    examples, filled, row = [], 0, 0
    for n in lengths:  # next-fit, stopping once `rows` rows are full
        if filled + n > width:
            row, filled = row + 1, 0
            if row == rows:
                break
        filled += int(n)
        examples.append(
            SequenceExample.from_document(
                rng.integers(0, 266, int(n) + 1), source_id=f"w1-{len(examples)}",
                partition="train", binding=binding,
            )
        )  # fmt: skip
    (batch,) = pack_examples("train", examples, binding, PackConfig(width, rows)).batches
    return batch


def worker(variant: str, width: int, rows: int, threads: int, repeats: int) -> dict:
    from transformers import AutoConfig, AutoModelForCausalLM

    import exactpack.hf.attention_impl  # noqa: F401  (registers exactpack_varlen)
    from exactpack.hf import hf_inputs

    torch.set_num_threads(threads)
    attn, mask = VARIANTS[variant]
    config = AutoConfig.for_model(**CONFIG)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn).train()
    batch = batch_of(rows, width)
    losses, mask_bytes = [], 0

    def step() -> None:
        nonlocal mask_bytes
        kwargs = hf_inputs(batch, attn, config=model.config, mask=mask)
        m = kwargs.get("attention_mask")
        masks = m.values() if isinstance(m, dict) else [m]
        mask_bytes = sum(x.nelement() * x.element_size() for x in masks if x is not None)
        loss = model(**kwargs).loss
        loss.backward()
        model.zero_grad(set_to_none=True)
        losses.append(float(loss))

    step()  # warm-up
    trim_heap()
    peak = peak_mib(step, "cpu")
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return {
        "variant": variant,
        "width": width,
        "threads": threads,
        "seconds": min(times),
        "peak_mib": peak,
        "mask_mib": mask_bytes / 2**20,
        "loss": losses[-1],
        "tokens": int(batch.input_valid.sum()),
        "segments": int(batch.occurrences.row.shape[0]),
    }


def measure(variant: str, width: int, rows: int, threads: int, repeats: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", variant, str(width), str(rows), str(threads)]
    done = subprocess.run(
        [*cmd, "--repeats", str(repeats)],
        capture_output=True,
        text=True,
        env=os.environ | {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(threads)},
    )
    if done.returncode != 0:
        raise RuntimeError(f"{variant} T={width} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="T=512, 1 thread, 1 repeat")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--widths", default="4096,8192")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker", nargs=4, metavar=("VARIANT", "T", "ROWS", "THREADS"))
    args = parser.parse_args()
    if args.worker:
        variant, width, rows, threads = args.worker
        print(json.dumps(worker(variant, int(width), int(rows), int(threads), args.repeats)))
        return
    widths = [512] if args.quick else [int(w) for w in args.widths.split(",")]
    threads = [1] if args.quick else [int(t) for t in args.threads.split(",")]
    repeats = 1 if args.quick else args.repeats
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        "| T | threads | variant | step s | speed-up | mask MiB | less mask memory"
        " | step peak MiB | loss |\n|---|---|---|---|---|---|---|---|---|"
    )
    for width in widths:
        for n in threads:
            results = {v: measure(v, width, args.rows, n, repeats) for v in VARIANTS}
            base = results[BASELINE]
            for variant, r in results.items():
                assert abs(r["loss"] - base["loss"]) <= 1e-4 * abs(base["loss"]), (variant, r)
                less = base["mask_mib"] / r["mask_mib"] if r["mask_mib"] else float("inf")
                print(
                    f"| {width} | {n} | {variant} | {r['seconds']:.2f} |"
                    f" {base['seconds'] / r['seconds']:.2f}x | {r['mask_mib']:.0f} |"
                    f" {'no mask' if less == float('inf') else f'{less:.0f}x'} |"
                    f" {r['peak_mib']:.0f} | {r['loss']:.4f} |",
                    flush=True,
                )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        f"({base['tokens']:,} tokens in {base['segments']} examples per micro-batch at the last T)"
    )


if __name__ == "__main__":
    main()
