"""TRL's DPOTrainer / GRPOTrainer as shipped vs with ``exactpack.trl.pack``: step time,
stored tokens, peak RSS.

    .venv/bin/python benchmarks/bench_trl.py                  # DPO, 1 thread, float32
    .venv/bin/python benchmarks/bench_trl.py --trainer grpo   # GRPO, accumulation 4
    .venv/bin/python benchmarks/bench_trl.py --quick          # lengths / 4, one round
    .venv/bin/python benchmarks/bench_trl.py --trainer grpo --steps 1 --rounds 1 --warmup 0

Each arm runs in a fresh process (its peak RSS is its own), the two arms alternated
``--rounds`` times: a tiny Llama (hidden 256, 4 layers, 8 heads, vocabulary 4,000)
through transformers on one thread, float32, the first step (imports, dataset
preparation) not timed (``--warmup``). A step's wall time and the process's CPU time
(one thread: the same on a quiet machine; on a shared one the CPU time is the fairer
ratio). DPO: prompts 256–1024 tokens, chosen/rejected 32–256 (a word
per token), ``per_device_train_batch_size`` 8 pairs. GRPO: prompts 256–1024, groups of
8 completions 32–512 (a fixed ``rollout_func`` in place of generation, so a step is the
reference and policy log-probabilities and the backward), ``beta`` 0.04,
``per_device_train_batch_size`` 8, ``gradient_accumulation_steps`` 4. Stored tokens:
TRL's padded ``B × L`` cells of the log-probability forwards against the tree rows'
cells.
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


def words(rng, low: int, high: int, scale: int) -> str:
    """``low..high`` (divided by ``scale``) random word tokens."""
    n = int(rng.integers(low // scale, high // scale + 1))
    return " ".join(f"t{i}" for i in rng.integers(3, VOCAB, n))


def dataset(rows: int, scale: int, columns=("prompt", "chosen", "rejected"), seed: int = 0):
    import numpy as np
    from datasets import Dataset

    rng = np.random.default_rng(seed)
    out = {c: [] for c in columns}
    for _ in range(rows):
        out["prompt"].append(words(rng, 256, 1024, scale))
        for answer in columns[1:]:
            out[answer].append(" " + words(rng, 31, 255, scale) + " t2")
    return Dataset.from_dict(out)


def by_length(completions, **kwargs) -> list[float]:
    """A reward: the completion's length in characters."""
    return [float(len(c)) for c in completions]


def rollout(scale: int, seed: int = 1):
    """A ``rollout_func`` that answers each prompt with 32–512 random tokens (eos last)."""
    import numpy as np

    rng = np.random.default_rng(seed)

    def func(prompts, trainer):
        tok = trainer.processing_class
        prompt_ids = tok(list(prompts))["input_ids"]
        completions = [tok(words(rng, 31, 511, scale) + " t2")["input_ids"] for _ in prompts]
        return {"prompt_ids": prompt_ids, "completion_ids": completions, "logprobs": None}

    return func


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


def child(
    trainer_name: str, packed: bool, groups: int, steps: int, scale: int, warmup: int = 1
) -> dict:
    import resource

    import torch
    from transformers import TrainerCallback

    torch.set_num_threads(1)
    times: list[float] = []
    cpu: list[float] = []
    cells = {"padded": 0, "tree": 0}

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter() - self.t0)
            cpu.append(time.process_time() - self.c0)

    common = dict(
        per_device_train_batch_size=8, max_steps=steps + warmup, learning_rate=1e-5,
        report_to=[], use_cpu=True, save_strategy="no", seed=0, dataloader_num_workers=0,
        logging_steps=1000, gradient_checkpointing=False,
        bf16=False,  # TRL's configs default to bf16=True: CPU autocast, ~25x slower matmuls (#36)
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as out:
        if trainer_name == "dpo":
            from trl import DPOConfig, DPOTrainer

            trainer = DPOTrainer(
                model=model(), ref_model=model(), args=DPOConfig(output_dir=out, **common),
                train_dataset=dataset(groups, scale), processing_class=tokenizer(),
                callbacks=[Clock()],
            )  # fmt: skip
        else:
            from trl import GRPOConfig, GRPOTrainer

            args = GRPOConfig(
                output_dir=out, num_generations=8, gradient_accumulation_steps=4, beta=0.04,
                max_completion_length=512, **common,
            )  # fmt: skip
            model().save_pretrained(f"{out}/llama")  # GRPO loads its reference from the path
            trainer = GRPOTrainer(
                model=f"{out}/llama", reward_funcs=by_length,
                args=args, train_dataset=dataset(groups, scale, ("prompt",)),
                processing_class=tokenizer(), callbacks=[Clock()], rollout_func=rollout(scale),
            )  # fmt: skip
        if packed:
            import exactpack.trl

            exactpack.trl.pack(trainer)
        count_cells(trainer, cells)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # models, data
        trainer.train()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    timed = {"step_s": statistics.median(times[warmup:]), "cpu_s": statistics.median(cpu[warmup:])}
    return {**timed, "peak_rss": peak, "training_rss": peak - before, **cells}


def count_cells(trainer, cells: dict) -> None:
    """Count the padded cells TRL sends and the tree cells exactpack computes (both models)."""
    import exactpack.trl as ours

    inner = ours.pack_tree

    def counting(groups, width, **kwargs):
        epoch = inner(groups, width, **kwargs)
        cells["tree"] += sum(int(b.input_valid.sum()) for b in epoch.batches)
        return epoch

    ours.pack_tree = counting
    for lm in (trainer.model, getattr(trainer, "ref_model", None)):
        if lm is not None:
            lm.forward = _counted(lm.forward, cells)


def _counted(forward, cells: dict):
    def padded(*args, **kwargs):
        if kwargs.get("fused_lm_head") and "input_ids" in kwargs:
            cells["padded"] += int(kwargs["input_ids"].numel())
        return forward(*args, **kwargs)

    return padded


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trainer", choices=("dpo", "grpo"), default="dpo")
    ap.add_argument("--steps", type=int, default=4, help="timed optimizer steps")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="lengths / 4, one round, 2 steps")
    ap.add_argument("--scale", type=int, default=1, help="lengths divided by this")
    ap.add_argument("--warmup", type=int, default=1, help="untimed first steps (0: time all)")
    ap.add_argument("--child", choices=("plain", "packed"))
    args = ap.parse_args()
    scale = 4 if args.quick else args.scale
    steps, rounds = (2, 1) if args.quick else (args.steps, args.rounds)
    # DPO: 8 pairs a step; GRPO: 4 groups (prompts) a step, 8 completions each
    groups = (steps + args.warmup) * (8 if args.trainer == "dpo" else 4)
    if args.child:
        packed = args.child == "packed"
        print(json.dumps(child(args.trainer, packed, groups, steps, scale, args.warmup)))
        return
    env = os.environ | {
        "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "TRL_EXPERIMENTAL_SILENCE": "1"
    }  # fmt: skip
    runs: dict[str, list[dict]] = {"plain": [], "packed": []}
    for _ in range(rounds):
        for arm in ("plain", "packed"):
            argv = [sys.executable, __file__, "--child", arm, "--trainer", args.trainer]
            argv += ["--steps", str(steps), "--scale", str(scale), "--warmup", str(args.warmup)]
            argv += ["--quick"] if args.quick else []
            out = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
            runs[arm].append(json.loads(out.stdout.strip().splitlines()[-1]))
    med = {a: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for a, rs in runs.items()}
    p, q = med["plain"], med["packed"]
    name = {"dpo": "DPOTrainer, 8 pairs", "grpo": "GRPOTrainer, 4 groups of 8, accumulation 4"}
    print(f"{name[args.trainer]} a step (TRL 1.16), tiny Llama float32, 1 thread, lengths"
          f" / {scale}, {groups} groups, medians of {rounds}")  # fmt: skip
    print("| measure | as shipped | exactpack.trl.pack | ratio |")
    print("|---|---:|---:|---:|")
    for key, what in (("step_s", "step (s, wall)"), ("cpu_s", "step (s, CPU of the process)")):
        print(f"| {what} | {p[key]:.2f} | {q[key]:.2f} | {p[key] / q[key]:.2f}x |")
    stored = q["tree"] / max(q["padded"], 1)
    row = f"| stored tokens (log-prob forwards) | {q['padded']:,.0f} | {q['tree']:,.0f}"
    print(f"{row} | {stored:.2f} |")
    peak = q["peak_rss"] / p["peak_rss"]
    print(f"| peak RSS (MB) | {p['peak_rss'] / 1e6:.0f} | {q['peak_rss'] / 1e6:.0f} | {peak:.2f} |")
    grown = q["training_rss"] / max(p["training_rss"], 1)
    print(
        f"| peak RSS grown in training (MB) | {p['training_rss'] / 1e6:.0f} |"
        f" {q['training_rss'] / 1e6:.0f} | {grown:.2f} |"
    )


if __name__ == "__main__":
    main()
