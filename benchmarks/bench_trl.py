"""TRL's DPOTrainer as shipped vs with ``exactpack.trl.pack``: step time, stored tokens, peak RSS.

    .venv/bin/python benchmarks/bench_trl.py                  # DPO, 1 thread, float32
    .venv/bin/python benchmarks/bench_trl.py --pairs 64 --steps 4

Each arm runs in a fresh process (its peak RSS is its own), the two arms alternated
``--rounds`` times: a tiny Llama (hidden 256, 4 layers, 8 heads, vocabulary 4,000)
through transformers on one thread, float32, prompts 256–1024 tokens and
chosen/rejected 32–256 (a word per token), ``per_device_train_batch_size`` 8, the
first step (imports, dataset preparation) not timed. Stored tokens: TRL's padded
``B × L`` cells of the log-probability forward against the tree rows' cells.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

VOCAB = 4000


def dataset(pairs: int, seed: int = 0):
    import numpy as np
    from datasets import Dataset

    rng = np.random.default_rng(seed)

    def words(n: int) -> str:
        return " ".join(f"t{i}" for i in rng.integers(3, VOCAB, n))

    rows = {"prompt": [], "chosen": [], "rejected": []}
    for _ in range(pairs):
        rows["prompt"].append(words(int(rng.integers(256, 1025))))
        rows["chosen"].append(" " + words(int(rng.integers(31, 256))) + " t2")
        rows["rejected"].append(" " + words(int(rng.integers(31, 256))) + " t2")
    return Dataset.from_dict(rows)


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(1, VOCAB)} | {"<pad>": 0}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="t1"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="t2")


def model():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=2048,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def child(packed: bool, pairs: int, steps: int) -> dict:
    import resource

    import torch
    from transformers import TrainerCallback
    from trl import DPOConfig, DPOTrainer

    torch.set_num_threads(1)
    times: list[float] = []
    cells = {"padded": 0, "tree": 0}

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter() - self.t0)

    with tempfile.TemporaryDirectory() as out:
        args = DPOConfig(
            output_dir=out, per_device_train_batch_size=8, max_steps=steps + 1,
            learning_rate=1e-5, report_to=[], use_cpu=True, save_strategy="no", seed=0,
            dataloader_num_workers=0, logging_steps=1000, gradient_checkpointing=False,
        )  # fmt: skip
        trainer = DPOTrainer(
            model=model(), ref_model=model(), args=args, train_dataset=dataset(pairs),
            processing_class=tokenizer(), callbacks=[Clock()],
        )  # fmt: skip
        if packed:
            import exactpack.trl

            exactpack.trl.pack(trainer)
        count_cells(trainer, cells)
        trainer.train()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"step_s": statistics.median(times[1:]), "peak_rss": peak, **cells}


def count_cells(trainer, cells: dict) -> None:
    """Count the padded cells TRL sends and the tree cells exactpack computes (both models)."""
    import exactpack.trl as ours

    inner = ours.pack_tree

    def counting(groups, width, **kwargs):
        epoch = inner(groups, width, **kwargs)
        cells["tree"] += sum(int(b.input_valid.sum()) for b in epoch.batches)
        return epoch

    ours.pack_tree = counting
    for lm in (trainer.model, trainer.ref_model):
        lm.forward = _counted(lm.forward, cells)


def _counted(forward, cells: dict):
    def padded(*args, **kwargs):
        if kwargs.get("fused_lm_head") and "input_ids" in kwargs:
            cells["padded"] += int(kwargs["input_ids"].numel())
        return forward(*args, **kwargs)

    return padded


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", choices=("plain", "packed"))
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child == "packed", args.pairs, args.steps)))
        return
    env = os.environ | {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    runs: dict[str, list[dict]] = {"plain": [], "packed": []}
    for _ in range(args.rounds):
        for arm in ("plain", "packed"):
            argv = [sys.executable, __file__, "--child", arm, "--pairs", str(args.pairs)]
            argv += ["--steps", str(args.steps)]
            out = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
            runs[arm].append(json.loads(out.stdout.strip().splitlines()[-1]))
    med = {a: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for a, rs in runs.items()}
    p, q = med["plain"], med["packed"]
    print("DPOTrainer (TRL 1.16), tiny Llama float32, 1 thread, batch 8 pairs, medians")
    print("| measure | as shipped | exactpack.trl.pack | ratio |")
    print("|---|---:|---:|---:|")
    print(
        f"| step (s) | {p['step_s']:.2f} | {q['step_s']:.2f} | {p['step_s'] / q['step_s']:.2f}x |"
    )
    stored = q["tree"] / max(q["padded"], 1)
    row = f"| stored tokens (log-prob forwards) | {q['padded']:,.0f} | {q['tree']:,.0f}"
    print(f"{row} | {stored:.2f} |")
    peak = q["peak_rss"] / p["peak_rss"]
    print(f"| peak RSS (MB) | {p['peak_rss'] / 1e6:.0f} | {q['peak_rss'] / 1e6:.0f} | {peak:.2f} |")


if __name__ == "__main__":
    main()
