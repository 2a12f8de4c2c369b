"""TRL's DPOTrainer and GRPOTrainer with ``exactpack.trl.pack`` on 2 gloo ranks (two
processes on 127.0.0.1, ``accelerate`` on CPU) equal TRL's own step on the same 2 ranks:
every parameter gradient (averaged over the ranks by DDP) and every parameter after the
step, float64, within ``1e-10 + 1e-9*max(|a|,|b|)``. Each rank holds 2 micro-batches
(accumulated); DPO's micro-batches share a prompt between pairs, GRPO's are whole groups
on tree rows where TRL's are shuffled rows — the step's objective is the same. GRPO's
and RLOO's ranks generate completions of different lengths (rank 1's longer): packed, the
ranks exchange whole groups after generation so that their compute is balanced.

The suite runs GRPO; ``scripts/trl_ranks.py`` runs DPO, GRPO, RLOO and RewardTrainer.
This file is also the worker: ``python tests/integration/test_trl_ranks.py RANK PORT OUT
NAMES``.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

import torch

WORLD = 2
TIMEOUT_S = 300  # a shared, loaded machine; about 20 s on a quiet one

#: Eight pairs (prompts shared), two a micro-batch: 2 ranks x 2 micro-batches.
PROMPTS = ["t3 t4 t5 t6", "t7 t8", "t3 t4 t5 t6", "t9 t10 t11"]
REJECTED = [" t20 t2", " t21 t22 t23 t2", " t24 t2", " t25 t26 t2", " t27 t2", " t28 t2"]
DPO = {
    "prompt": PROMPTS * 2,
    "chosen": [" t12 t13 t2", " t14 t2", " t15 t16 t17 t18 t2", " t19 t2"] * 2,
    "rejected": [*REJECTED, " t29 t30 t2", " t31 t32 t33 t2"],
}
#: GRPO: fixed completions (in place of sampling) and rewards, per rank's generation batch;
#: rank 1's are longer, so the ranks' compute is imbalanced until they exchange groups.
COMPLETIONS = (
    [[10, 2], [2], [12, 2], [16, 2], [2], [18, 2], [11, 2], [2]],
    [[10, 11, 2], [12, 13, 14, 2], [13, 14, 15, 2], [16, 17, 2], [17, 18, 19, 2]] * 2,
)
REWARDS = [0.5, -1.0, 2.0, 0.0, 1.0, -0.5] * 2


def _common(out: str) -> dict:
    return dict(
        output_dir=out, per_device_train_batch_size=2, gradient_accumulation_steps=2,
        max_steps=1, learning_rate=0.5, optim="sgd", lr_scheduler_type="constant",
        max_grad_norm=0.0, report_to=[], use_cpu=True, bf16=False, save_strategy="no",
        seed=0, dataloader_num_workers=0, gradient_checkpointing=False,
    )  # fmt: skip


def _dpo(out: str, callback):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from support.trl_helpers import llama, word_tokenizer

    return DPOTrainer(
        model=llama(), ref_model=llama(), args=DPOConfig(**_common(out)),
        train_dataset=Dataset.from_dict(DPO), processing_class=word_tokenizer(),
        callbacks=[callback],
    )  # fmt: skip


def _rl(name: str, out: str, callback):
    """GRPO (``loss_type="dapo"``) or RLOO, a reference model (``beta``), fixed rollouts."""
    import trl
    from datasets import Dataset

    from support.trl_helpers import word_tokenizer

    extra = {"loss_type": "dapo"} if name == "GRPO" else {}
    args = getattr(trl, f"{name}Config")(
        **_common(out) | {"per_device_train_batch_size": 4}, num_generations=2,
        max_completion_length=4, beta=0.1, model_init_kwargs={"dtype": torch.float64}, **extra,
    )  # fmt: skip
    trainer = getattr(trl, f"{name}Trainer")(
        model=f"{out}/llama{os.environ['RANK']}", args=args, callbacks=[callback],
        reward_funcs=lambda completions, **kw: REWARDS[: len(completions)],
        processing_class=word_tokenizer(),
        train_dataset=Dataset.from_dict({"prompt": ["t3 t4 t5", "t6 t7", "t8", "t9 t4"] * 2}),
    )  # fmt: skip
    fixed = COMPLETIONS[int(os.environ["RANK"])].__getitem__
    trainer._generate_single_turn = (
        (lambda ids, *a: (fixed(slice(len(ids))), None))  # GRPO: sampling log-probs too
        if name == "GRPO" else lambda ids, *a: fixed(slice(len(ids)))
    )  # fmt: skip
    return trainer


def _reward(out: str, callback):
    from datasets import Dataset
    from trl import RewardConfig, RewardTrainer

    from support.trl_helpers import reward_llama, word_tokenizer

    model = reward_llama()
    return RewardTrainer(
        model=model, args=RewardConfig(**_common(out), center_rewards_coefficient=0.1),
        train_dataset=Dataset.from_dict(DPO), processing_class=word_tokenizer(),
        callbacks=[callback],
    )  # fmt: skip


TRAINERS = {
    "dpo": _dpo,
    "grpo": functools.partial(_rl, "GRPO"),
    "rloo": functools.partial(_rl, "RLOO"),
    "reward": _reward,
}


def worker(rank: int, port: int, out: str, names: list[str]) -> None:
    """This rank's gradients and parameters after one step of each trainer, plain and packed."""
    os.environ |= {
        "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(WORLD),
        "LOCAL_WORLD_SIZE": str(WORLD), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
    }  # fmt: skip
    torch.set_num_threads(1)
    import trl.trainer.utils

    import exactpack.trl
    from exactpack.verify.tolerances import Float64Islands

    from support.trl_helpers import Float64Head, grad_recorder, llama

    trl.trainer.utils._ChunkedLogProbFunction = Float64Head  # the head in float64
    llama().save_pretrained(f"{out}/llama{rank}")  # GRPO / RLOO load their models by path
    results = {}
    for name in names:
        for packed in (False, True):
            record, grads = grad_recorder()
            trainer = TRAINERS[name](out, record)
            assert trainer.accelerator.num_processes == WORLD
            if packed:
                exactpack.trl.pack(trainer)
            with Float64Islands():
                trainer.train()
            assert (trainer.model.config._attn_implementation == "exactpack_tree") == packed
            if packed and name in ("dpo", "reward"):  # the pairs were dealt by compute
                sampler = trainer.get_train_dataloader().batch_sampler.batch_sampler.sampler
                assert type(sampler).__name__ == "_Dealt"
            params = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
            # GRPO / RLOO: the completion tokens this rank trained on (its rows after generation)
            held = [
                int(b["completion_mask"].sum())
                for b in getattr(trainer, "_buffered_inputs", None) or ()
            ]
            results[f"{name}-{'packed' if packed else 'plain'}"] = (grads, params, sum(held))
    torch.save(results, Path(out) / f"rank{rank}.pt")
    torch.distributed.destroy_process_group()


def run_ranks(out: Path, names: list[str]) -> dict[str, float]:
    """Two worker processes, each running ``names``; the worst gradient / parameter
    ratio to the tolerance of each trainer, packed against plain (<= 1 passes). GRPO and
    RLOO: the ranks' completion tokens, imbalanced as generated, are balanced packed."""
    from support.ranks import free_port, start_ranks, wait_ranks
    from support.trl_helpers import worst_ratio

    argv = [str(free_port()), str(out), ",".join(names)]
    silence = {"TRL_EXPERIMENTAL_SILENCE": "1", "TOKENIZERS_PARALLELISM": "false"}
    procs = start_ranks([[__file__, str(r), *argv] for r in range(WORLD)], **silence)
    wait_ranks(procs, TIMEOUT_S)
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    worst = {}
    for name in names:
        (plain_grads,), plain_params, _ = ranks[0][f"{name}-plain"]
        if name in ("grpo", "rloo"):
            held = {
                run: [rank[f"{name}-{run}"][2] for rank in ranks] for run in ("plain", "packed")
            }
            assert held == {"plain": [13, 29], "packed": [21, 21]}, held
        assert max(float(g.abs().max()) for g in plain_grads.values()) > 0, name
        worst[name] = 0.0
        for rank in ranks:  # DDP: each rank holds the gradient averaged over both
            (grads,), params, _ = rank[f"{name}-packed"]
            ratios = worst_ratio(grads, plain_grads), worst_ratio(params, plain_params)
            worst[name] = max(worst[name], *ratios)
    return worst


@pytest.mark.timeout(330)  # TIMEOUT_S for the ranks, and their start
def test_a_grpo_step_on_two_gloo_ranks_equals_trls_own(tmp_path):
    """The suite's slice; ``scripts/trl_ranks.py`` runs DPO, GRPO, RLOO and reward."""
    assert run_ranks(tmp_path, ["grpo"])["grpo"] <= 1.0


if __name__ == "__main__":
    worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4].split(","))
