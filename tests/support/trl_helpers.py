"""A tiny float64 Llama, a word-level tokenizer and a separate-example reference trainer,
shared by the TRL-format training tests (``tests/unit/test_trl_format.py``)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

VOCAB = 48
LR = 0.5  # large enough that a gradient difference shows in the parameters too


def tokenizer() -> Any:
    """A fast transformers tokenizer over ``t0..t47`` (pad ``<pad>`` = 0, eos ``t2``)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(1, VOCAB)} | {"<pad>": 0}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="t1"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="t2")


def reward_llama() -> Any:
    """A 2-layer Llama reward model (``num_labels=1``) in float64, seeded 0."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, num_labels=1, pad_token_id=0,
        eos_token_id=2,
    )  # fmt: skip
    return LlamaForSequenceClassification(config).to(torch.float64)


def llama(seed: int = 0) -> Any:
    """A 2-layer Llama in float64 (2 heads of width 8), seeded."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).to(torch.float64)


def examples(seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """Eight examples of 2..7 tokens; in every other one the first two labels are -100."""
    rng = np.random.default_rng(seed)
    ids = [rng.integers(3, VOCAB, n).tolist() for n in (5, 3, 7, 4, 6, 2, 5, 3)]
    labels = [
        [-100 if (j < 2 and k % 2 == 0) else x for j, x in enumerate(e)] for k, e in enumerate(ids)
    ]
    return ids, labels


def float64_loss(outputs: Any, labels: torch.Tensor, num_items_in_batch: Any = None) -> Any:
    """The causal LM loss in the model's dtype: transformers' own ``ForCausalLMLoss`` and
    TRL's fused head compute it in float32, which would cap agreement near 1e-7."""
    logits = outputs.logits[:, :-1]
    target = labels[:, 1:].to(logits.device)
    total = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100, reduction="sum"
    )
    n = num_items_in_batch if num_items_in_batch is not None else (target != -100).sum()
    return total / n


def separate_training(
    model: Any, ids: list[list[int]], labels: list[list[int]], steps: int
) -> tuple[Any, list[dict[str, torch.Tensor]]]:
    """``steps`` SGD steps on every example at once, each example run alone (no packing):
    the token-weighted mean over all supervised targets. Returns the model and each
    step's gradients."""
    model = copy.deepcopy(model)
    model.config._attn_implementation = "sdpa"
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    count = sum(sum(x != -100 for x in lab[1:]) for lab in labels)
    grads = []
    for _ in range(steps):
        optimizer.zero_grad()
        total = 0.0
        for e, lab in zip(ids, labels, strict=True):
            logits = model(input_ids=torch.tensor([e]), use_cache=False).logits[0, :-1]
            total = total + F.cross_entropy(
                logits, torch.tensor(lab[1:]), ignore_index=-100, reduction="sum"
            )
        (total / count).backward()
        grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
        optimizer.step()
    return model, grads


def grad_recorder() -> tuple[Any, list[dict[str, torch.Tensor]]]:
    """A ``TrainerCallback`` that keeps each optimizer step's gradients, and their list."""
    from transformers import TrainerCallback

    seen: list[dict[str, torch.Tensor]] = []

    class Record(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            seen.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})

    return Record(), seen


def training_args(rows: int, output_dir: str) -> dict[str, Any]:
    """Two SGD steps, each over every row (two micro-batches, accumulated): the step's
    objective does not depend on the order the sampler draws the rows in."""
    return {
        "output_dir": output_dir,
        "per_device_train_batch_size": -(-rows // 2),
        "gradient_accumulation_steps": 2,
        "max_steps": 2,
        "learning_rate": LR,
        "optim": "sgd",
        "lr_scheduler_type": "constant",
        "max_grad_norm": 0.0,
        "report_to": [],
        "use_cpu": True,
        "bf16": False,
        "save_strategy": "no",
        "dataloader_num_workers": 0,
        "seed": 0,
    }


def worst_ratio(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest ``|a-b| / (1e-10 + 1e-9*max(|a|,|b|))`` over every coordinate (<= 1 passes)."""
    worst = 0.0
    for name, x in a.items():
        y = b[name]
        tol = 1e-10 + 1e-9 * torch.maximum(x.abs(), y.abs())
        worst = max(worst, float(((x - y).abs() / tol).max()))
    return worst


def relative_gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest ``|a-b|`` over the largest ``|b|`` of each tensor."""
    return max(float((a[n] - b[n]).abs().max() / b[n].abs().max().clamp(min=1e-30)) for n in a)


def parameters(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach() for n, p in model.named_parameters()}


Loss = Callable[..., Any]


class Float64Head(torch.autograd.Function):
    """TRL's ``ChunkedLogProbFunction`` contract in the input dtype, by autograd."""

    @staticmethod
    def apply(hidden, weight, bias, targets, temperature, chunk, softcap, scale, outputs):
        logits = torch.nn.functional.linear(hidden, weight, bias) * scale
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        logits = logits / temperature
        log_p = torch.log_softmax(logits, dim=-1)
        entropy = -(log_p.exp() * log_p).sum(-1)
        extra = (
            torch.logsumexp(2 * log_p, dim=-1).detach(),
            logits.mean(-1).detach(),
            logits.argmax(-1) == targets,
        )
        return log_p.gather(1, targets[:, None])[:, 0], entropy, *extra


def word_tokenizer():
    """``t0..t47`` split on spaces (pad ``<pad>`` = 0, eos ``t2``)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(1, 48)} | {"<pad>": 0}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="t1"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="t2")


#: Four pairs; two share a prompt, answers of different lengths (right padding differs).
PAIRS = {
    "prompt": ["t3 t4 t5 t6", "t7 t8", "t3 t4 t5 t6", "t9 t10 t11"],
    "chosen": [" t12 t13 t2", " t14 t2", " t15 t16 t17 t18 t2", " t19 t2"],
    "rejected": [" t20 t2", " t21 t22 t23 t2", " t24 t2", " t25 t26 t2"],
}
