"""TRL's DPOTrainer with ``exactpack.trl.pack``: a training step on tree rows equals
TRL's own unpacked step — the loss, every parameter gradient, the metrics — in float64
(tolerance: the seed's ``1e-10 + 1e-9*max(|a|,|b|)``).

TRL's fused head computes its tiles in float32 (``trl.kernels.chunked_logprob``), which
would cap any comparison near float32 rounding; :func:`float64_head` swaps in the same
quantities in the model's dtype for both runs, so what is compared is the backbone's
work, packed or not. With TRL's own head the two runs agree to float32 rounding
(:func:`test_with_trls_float32_head_the_runs_agree_to_its_rounding`).
"""

from __future__ import annotations

import contextlib
import copy

import pytest

pytest.importorskip("trl")

import torch
from datasets import Dataset

import exactpack.trl
from exactpack.core.errors import InvalidInput, NotAvailable
from exactpack.verify.tolerances import Float64Islands

from support.trl_helpers import (
    PAIRS,
    Float64Head,
    grad_recorder,
    llama,
    reward_llama,
    word_tokenizer,
    worst_ratio,
)

torch.set_num_threads(1)


@pytest.fixture
def float64_head(monkeypatch):
    import trl.trainer.utils

    monkeypatch.setattr(trl.trainer.utils, "_ChunkedLogProbFunction", Float64Head)


def _dpo_step(tmp_path, packed: bool, wide: bool = True, **config):
    """One DPO step (two micro-batches of two pairs); ``wide``: the model's float32
    islands (RMSNorm upcasts to float32) kept in float64 (:class:`Float64Islands`), else
    a shared prompt's summed gradient rounds differently in them than its parts do."""
    from trl import DPOConfig, DPOTrainer

    record, grads = grad_recorder()
    args = DPOConfig(
        output_dir=str(tmp_path / ("packed" if packed else "plain")),
        per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=1,
        learning_rate=0.5, optim="sgd", lr_scheduler_type="constant", max_grad_norm=0.0,
        report_to=[], use_cpu=True, bf16=False, save_strategy="no", seed=0,
        dataloader_num_workers=0, logging_steps=1, **{"gradient_checkpointing": False, **config},
    )  # fmt: skip
    trainer = DPOTrainer(
        model=llama(), ref_model=llama(), args=args, train_dataset=Dataset.from_dict(PAIRS),
        processing_class=word_tokenizer(), callbacks=[record],
    )  # fmt: skip
    if packed:
        assert exactpack.trl.pack(trainer) is trainer
    with Float64Islands() if wide else contextlib.nullcontext():
        trainer.train()
    logs = {k: v for k, v in trainer.state.log_history[0].items() if isinstance(v, float)}
    return grads[0], logs


@pytest.mark.parametrize("loss_type, precompute", [("sigmoid", False), ("ipo", True)])
def test_a_dpo_step_on_tree_rows_equals_trls_own_step(
    tmp_path, loss_type, precompute, float64_head
):
    """Two micro-batches accumulated; ``precompute_ref_log_probs``: the reference
    log-probabilities computed (packed) before training and carried as columns. The
    packed step deals its pairs to the micro-batches by compute, so the logged loss —
    summed over micro-batches in ``Trainer``'s float32 accumulator — agrees to float32
    rounding; the metrics (float64 means) and every gradient to the seed's tolerance."""
    config = {"loss_type": [loss_type], "precompute_ref_log_probs": precompute}
    plain_grads, plain_logs = _dpo_step(tmp_path, False, **config)
    packed_grads, packed_logs = _dpo_step(tmp_path, True, **config)
    assert worst_ratio(packed_grads, plain_grads) <= 1.0
    assert max(float(g.abs().max()) for g in plain_grads.values()) > 0
    a, b = packed_logs["loss"], plain_logs["loss"]
    assert abs(a - b) <= 1e-6 * max(abs(a), abs(b))
    for key in ("logps/chosen", "logps/rejected", "rewards/margins"):
        if key in plain_logs:
            a, b = packed_logs[key], plain_logs[key]
            assert abs(a - b) <= 1e-10 + 1e-9 * max(abs(a), abs(b)), key


def test_a_dpo_steps_pairs_are_dealt_to_micro_batches_by_compute(tmp_path):
    """Packed, each step's pairs (TRL's own draw) go to the micro-batches so that the
    largest one's compute (each pair's trie) is the least any split reaches; every
    micro-batch keeps its number of pairs."""
    import itertools

    from trl import DPOConfig, DPOTrainer

    from exactpack.training.balance import CostModel, causal_pairs

    def batches():
        args = DPOConfig(
            output_dir=str(tmp_path), per_device_train_batch_size=2,
            gradient_accumulation_steps=2, report_to=[], use_cpu=True, seed=1,
            gradient_checkpointing=False,
        )  # fmt: skip
        trainer = DPOTrainer(
            model=llama(), ref_model=llama(), args=args, processing_class=word_tokenizer(),
            train_dataset=Dataset.from_dict(PAIRS),
        )  # fmt: skip
        exactpack.trl.pack(trainer)
        return trainer, [list(b) for b in trainer.get_train_dataloader().batch_sampler]

    trainer, dealt = batches()
    assert [len(b) for b in dealt] == [2, 2] and sorted(i for b in dealt for i in b) == [0, 1, 2, 3]
    ds, cost = trainer.train_dataset, CostModel.from_config(trainer.model.config)

    def load(i):
        p, c, r = (len(ds[i][k]) for k in ("prompt_ids", "chosen_ids", "rejected_ids"))
        return float(
            cost.costs(p + c + r, causal_pairs(p) + causal_pairs(c, p) + causal_pairs(r, p))
        )

    splits = [max(sum(map(load, s)), sum(map(load, set(range(4)) - set(s))))
              for s in itertools.combinations(range(4), 2)]  # fmt: skip
    assert max(sum(map(load, b)) for b in dealt) == pytest.approx(min(splits), rel=1e-12)
    drawn = list(trainer.get_train_dataloader().batch_sampler.sampler.inner)  # TRL's order
    assert max(sum(map(load, drawn[:2])), sum(map(load, drawn[2:]))) > min(splits) * (1 + 1e-6)


def test_with_trls_float32_head_the_runs_agree_to_its_rounding(tmp_path):
    """TRL's defaults, gradient checkpointing included: the layers recompute in the
    backward, after the packed call returned, and must still attend with the tree kernel."""
    plain_grads, plain_logs = _dpo_step(tmp_path, False, wide=False, gradient_checkpointing=True)
    packed_grads, packed_logs = _dpo_step(tmp_path, True, wide=False, gradient_checkpointing=True)
    # float32 tiles and norms: a gradient's relative error of a few float32 ulps (2**-23)
    for name, g in plain_grads.items():
        gap = float((packed_grads[name] - g).abs().max())
        assert gap <= 1e-6 * float(g.abs().max()) + 1e-12, name
    assert abs(packed_logs["loss"] - plain_logs["loss"]) <= 1e-6 * abs(plain_logs["loss"])


def _packed_with_reference(model):
    """``model`` given TRL's fused head and packed as a trainer's model; an untouched copy."""
    from trl.trainer.utils import add_fused_lm_head

    reference = copy.deepcopy(model)
    add_fused_lm_head(model)

    class Trainer:  # the one attribute pack() reads
        pass

    trainer = Trainer()
    trainer.model = model
    exactpack.trl.pack(trainer)
    return reference


def test_the_packed_model_still_generates_and_runs_padded_batches_unpacked(float64_head):
    """Only TRL's fused log-probability call is packed: a plain left-padded forward and
    generate() run on the model's own attention, as before."""

    model = llama()
    reference = _packed_with_reference(model)
    ids = torch.tensor([[0, 0, 5, 6, 7], [3, 4, 5, 6, 7]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=mask).logits
        want = reference(input_ids=ids, attention_mask=mask).logits
        assert torch.equal(got, want)
        out = model.generate(ids[1:], max_new_tokens=3, do_sample=False, pad_token_id=0)
        assert torch.equal(out, reference.generate(ids[1:], max_new_tokens=3, do_sample=False,
                                                   pad_token_id=0))  # fmt: skip
        labels = ids.masked_fill(mask == 0, -100)
        fused = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
        again = model(input_ids=ids, attention_mask=mask).logits  # back on its own attention
    assert torch.equal(again, want)
    alone = torch.log_softmax(reference(input_ids=ids[:1, 2:]).logits[0, :-1], -1)
    want_lp = alone.gather(1, ids[0, 3:, None])[:, 0]
    assert torch.allclose(fused.log_probs[0, 2:], want_lp, rtol=1e-12, atol=1e-12)


def test_refusals_are_up_front(tmp_path):
    model = llama()

    class Trainer:
        pass

    trainer = Trainer()
    trainer.model = model
    with pytest.raises(InvalidInput, match="no fused LM head"):
        exactpack.trl.pack(trainer)
    from trl.trainer.utils import add_fused_lm_head

    add_fused_lm_head(model)
    exactpack.trl.pack(trainer)
    ids = torch.tensor([[3, 0, 5]])
    with pytest.raises(InvalidInput, match="a hole in its real tokens"):
        model(input_ids=ids, attention_mask=torch.tensor([[1, 0, 1]]), labels=ids,
              fused_lm_head=True)  # fmt: skip
    other = llama()
    add_fused_lm_head(other)
    trainer.model = other
    with pytest.raises(NotAvailable, match="cannot run tree-packed rows"):
        exactpack.trl.pack(trainer, attn_implementation="flash_attention_2")
    with pytest.raises(NotAvailable, match="token ids only"):
        model(input_ids=ids, labels=ids, fused_lm_head=True, inputs_embeds=torch.zeros(1, 3, 16))


@pytest.mark.parametrize("name", ["GRPO", "RLOO"])
def test_grpo_per_token_log_probs_and_entropies_on_tree_rows_equal_trls(
    tmp_path, name, float64_head
):
    """GRPOTrainer's / RLOOTrainer's one log-probability call (left-padded prompts +
    right-padded completions, groups of completions sharing a prompt): log-probs,
    entropies and the gradient of a weighted sum, packed vs as shipped, float64."""
    import trl

    config, trainer_class = getattr(trl, f"{name}Config"), getattr(trl, f"{name}Trainer")

    def build():
        args = config(
            output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2,
            max_completion_length=4, report_to=[], use_cpu=True, bf16=False,
            save_strategy="no", gradient_checkpointing=False, beta=0.0,
        )  # fmt: skip
        prompts = Dataset.from_dict({"prompt": ["t3 t4 t5", "t6 t7"] * 2})
        return trainer_class(
            model=llama(), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
            args=args, train_dataset=prompts, processing_class=word_tokenizer(),
        )  # fmt: skip

    # two groups of two: prompts left-padded to 3, completions right-padded to 4
    ids = torch.tensor([
        [3, 4, 5, 10, 11, 2, 0], [3, 4, 5, 12, 2, 0, 0],
        [0, 6, 7, 13, 14, 15, 2], [0, 6, 7, 16, 2, 0, 0],
    ])  # fmt: skip
    mask = (ids != 0).long()
    weights = torch.tensor([[1.0, -2.0, 0.5, 1.5]], dtype=torch.float64).T
    results = []
    for packed in (False, True):
        trainer = build()
        if packed:
            exactpack.trl.pack(trainer)
        model = trainer.model
        with Float64Islands():
            logps, entropy, _ = trainer._get_per_token_logps_and_entropies(
                model, ids, mask, logits_to_keep=4, compute_entropy=True
            )
            ((logps * mask[:, 3:]) * weights).sum().backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        results.append((logps.detach(), entropy.detach(), grads))
    (lp0, en0, g0), (lp1, en1, g1) = results
    keep = mask[:, 3:].bool()
    assert torch.all((lp0 - lp1)[keep].abs() <= 1e-10 + 1e-9 * lp0[keep].abs())
    assert torch.all((en0 - en1)[keep].abs() <= 1e-10 + 1e-9 * en0[keep].abs())
    assert worst_ratio(g1, g0) <= 1.0


def _reward_step(tmp_path, packed: bool):
    """One RewardTrainer step (two micro-batches of two pairs, accumulated) of a float64
    Llama reward model (``num_labels=1``): chosen and rejected rows in one forward."""
    from trl import RewardConfig, RewardTrainer

    model = reward_llama()
    record, grads = grad_recorder()
    args = RewardConfig(
        output_dir=str(tmp_path / ("packed" if packed else "plain")),
        per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=1,
        learning_rate=0.5, optim="sgd", lr_scheduler_type="constant", max_grad_norm=0.0,
        report_to=[], use_cpu=True, save_strategy="no", seed=0, logging_steps=1,
        center_rewards_coefficient=0.1, gradient_checkpointing=False,
    )  # fmt: skip
    trainer = RewardTrainer(
        model=model, args=args, train_dataset=Dataset.from_dict(PAIRS),
        processing_class=word_tokenizer(), callbacks=[record],
    )  # fmt: skip
    if packed:
        exactpack.trl.pack(trainer)
        assert trainer.model.config._attn_implementation != "exactpack_tree"  # until called
    with Float64Islands():
        trainer.train()
    assert (trainer.model.config._attn_implementation == "exactpack_tree") == packed  # it ran
    return grads[0], trainer.state.log_history[0]


def test_a_reward_step_on_tree_rows_equals_trls_own_step(tmp_path):
    """Each pair's prompt computed once for both answers; the score at each sequence's
    last token; the loss, the reward metrics and every gradient as TRL's (float64)."""
    plain_grads, plain_logs = _reward_step(tmp_path, False)
    packed_grads, packed_logs = _reward_step(tmp_path, True)
    assert worst_ratio(packed_grads, plain_grads) <= 1.0
    assert float(plain_grads["score.weight"].abs().max()) > 0
    for key in ("loss", "mean_reward", "margin"):
        a, b = packed_logs[key], plain_logs[key]
        assert abs(a - b) <= 1e-10 + 1e-9 * max(abs(a), abs(b)), key


def test_grpo_micro_batches_hold_whole_groups_balanced_by_compute(tmp_path):
    """TRL shuffles a generation batch row by row before cutting it into micro-batches;
    packed, it moves groups whole (each micro-batch: whole groups, a prompt stored once),
    every per-row column moves with its row, and the groups are placed so that the
    largest micro-batch's compute (tokens and attention pairs of its tries) is the
    least any split into whole groups reaches."""
    import itertools

    from trl import GRPOConfig, GRPOTrainer

    from exactpack.training.balance import CostModel, causal_pairs

    args = GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2,
        gradient_accumulation_steps=3, max_completion_length=4, report_to=[], use_cpu=True,
        bf16=False, save_strategy="no", gradient_checkpointing=False,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=llama(), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args, train_dataset=Dataset.from_dict({"prompt": ["t3 t4"] * 6}),
        processing_class=word_tokenizer(),
    )  # fmt: skip
    prompts = torch.arange(6).repeat_interleave(2)[:, None] * torch.ones(1, 3, dtype=torch.long)
    done = torch.tensor([9, 1, 7, 8, 1, 1, 6, 2, 3, 3, 5, 1])  # completion tokens per row
    rows = {
        "prompt_ids": prompts, "prompt_mask": torch.ones(12, 3, dtype=torch.long),
        "completion_mask": (torch.arange(9) < done[:, None]).long(), "row": torch.arange(12),
        "ids": [f"r{i}" for i in range(12)],
    }  # fmt: skip
    trainer._generate_and_score_completions = lambda batch: dict(rows)
    exactpack.trl.pack(trainer)
    torch.manual_seed(1)
    trainer.model.train()
    micro = [trainer._prepare_inputs(None)]
    micro += [trainer._buffered_inputs[i] for i in (1, 2)]
    seen = torch.cat([m["row"] for m in micro])
    assert sorted(seen.tolist()) == list(range(12)) and seen.tolist() != list(range(12))
    for m in micro:  # two whole groups (rows 2g, 2g+1), the columns in step
        assert torch.equal(m["row"].view(2, 2) % 2, torch.tensor([[0, 1], [0, 1]]))
        assert m["ids"] == [f"r{i}" for i in m["row"].tolist()]
        assert torch.equal(m["prompt_ids"][:, 0], m["row"] // 2)
    cost = CostModel.from_config(trainer.model.config)
    pairs = causal_pairs(3) + causal_pairs(done, 3).reshape(6, 2).sum(1)
    group = cost.costs(3 + done.view(6, 2).sum(1).numpy(), pairs)  # (6,) each group's trie
    got = max(sum(group[g] for g in set((m["row"] // 2).tolist())) for m in micro)
    splits = (
        max(group[list(p[i : i + 2])].sum() for i in (0, 2, 4))
        for p in itertools.permutations(range(6))
    )
    assert got == pytest.approx(min(splits), rel=1e-12)


@pytest.mark.parametrize("name", ["GRPO", "RLOO"])
def test_a_grpo_step_on_tree_rows_equals_trls_own_step(tmp_path, name, float64_head):
    """A whole step (fixed rollouts in place of sampling, reference model, two micro-batches
    accumulated): every gradient as TRL's own step in float64. The packed step's
    micro-batches hold whole groups where TRL's hold shuffled rows; the step's objective
    (``loss_type="dapo"``: tokens over the generation batch; RLOO: sequences) is the same."""
    import trl

    completions = [[10, 11, 2], [12, 2], [13, 14, 15, 2], [16, 2], [17, 2], [18, 19, 2]] * 2
    rewards = [0.5, -1.0, 2.0, 0.0, 1.0, -0.5] * 2

    path = tmp_path / "llama"  # GRPO loads its reference model from the policy's path
    llama().save_pretrained(path)

    def step(packed: bool):
        record, grads = grad_recorder()
        extra = {"loss_type": "dapo"} if name == "GRPO" else {}
        args = getattr(trl, f"{name}Config")(
            output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2,
            gradient_accumulation_steps=2, max_completion_length=4, max_steps=1, beta=0.1,
            learning_rate=0.5, optim="sgd", max_grad_norm=0.0, report_to=[], use_cpu=True,
            bf16=False, save_strategy="no", gradient_checkpointing=False, seed=0,
            model_init_kwargs={"dtype": torch.float64}, **extra,
        )  # fmt: skip
        trainer = getattr(trl, f"{name}Trainer")(
            model=str(path), reward_funcs=lambda completions, **kw: rewards[: len(completions)],
            args=args, processing_class=word_tokenizer(), callbacks=[record],
            train_dataset=Dataset.from_dict({"prompt": ["t3 t4 t5", "t6 t7", "t8", "t9 t4"]}),
        )  # fmt: skip
        # fixed completions in place of sampling (GRPO also returns sampling log-probs)
        fixed = (lambda ids, *a: (completions[: len(ids)], None)) if name == "GRPO" else (
            lambda ids, *a: completions[: len(ids)]
        )  # fmt: skip
        trainer._generate_single_turn = fixed
        if packed:
            exactpack.trl.pack(trainer)
        with Float64Islands():
            trainer.train()
        return grads[0]

    plain, packed = step(False), step(True)
    assert max(float(g.abs().max()) for g in plain.values()) > 0
    assert worst_ratio(packed, plain) <= 1.0


@pytest.mark.parametrize("model_type", ["lfm2", "qwen3_next"])
def test_a_hybrids_fused_log_probs_on_tree_rows_fork_each_branch(model_type, float64_head):
    """exactpack.trl restarts a hybrid's mixers and runs the backbone inside packed_call:
    two rows sharing a prompt (one trie, its mixer state forked) give the log-probs each
    row gives alone."""

    from support.architecture_cases import CASES, build

    case = next(c for c in CASES if c.model_type == model_type and c.restarts)
    model = build(case, "sdpa")
    reference = _packed_with_reference(model)
    ids = torch.tensor([[3, 4, 5, 6, 7, 8, 9], [3, 4, 5, 6, 10, 11, 12]])  # a shared prompt
    fused = model(input_ids=ids, labels=ids, fused_lm_head=True)
    for row in range(2):
        with torch.no_grad():
            alone = torch.log_softmax(reference(input_ids=ids[row : row + 1]).logits[0, :-1], -1)
        want = alone.gather(1, ids[row, 1:, None])[:, 0]
        got = fused.log_probs[row].detach()  # (L - 1,): the targets ids[row, 1:]
        assert torch.allclose(got, want, rtol=1e-9, atol=1e-10), (row, (got - want).abs().max())
