"""Prove that a model computes the same thing on separate, padded and packed layouts.

:func:`three_way` runs one set of examples three ways with the same parameters:

    separate  one example per model call, a row of exactly its length
    padded    one example per row, right padding (policy "padded")
    packed    several examples per row (next-fit by default)

and compares, against separate execution, every vocabulary logit at every valid cell, the
raw token-summed loss and every parameter-gradient coordinate, with the seed's float64
tolerance ``|a-b| <= 1e-10 + 1e-9*max(|a|,|b|)`` (on the A/B/C fixture with the large
profile, 2 x 2394 logit and 2 x 3448 gradient comparisons).

The model is duck-typed: ``forward_separate(example) -> (L, V)``, ``forward_padded`` /
``forward_packed(batch) -> (R, T, V)`` and ``parameters()`` (as
:class:`~exactpack.verify.decoder.TinyDecoder`). :func:`verify_tiny` is ``exactpack verify``
without ``--hf-*``: the fixture and random layouts (:func:`tiny_layouts`) through
:func:`three_way`; ``mode="naive"`` swaps in
:func:`~exactpack.verify.probes.unguarded_causal_attention`, the control that must fail.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from exactpack.core.compact import pack_examples
from exactpack.core.config import PackConfig
from exactpack.core.errors import InvalidInput
from exactpack.core.examples import SequenceExample
from exactpack.core.loss import masked_nll_sum
from exactpack.verify.decoder import TinyDecoder
from exactpack.verify.fixture import FIXTURE_MAX_LENGTH, fixture_binding, fixture_examples
from exactpack.verify.probes import unguarded_causal_attention
from exactpack.verify.tolerances import SEED_TOLERANCE, combine, compare, grad_vector, tally

QUANTITIES = ("logits", "loss_sum", "gradients")


def _finish(model: torch.nn.Module, logits: torch.Tensor, total: torch.Tensor) -> dict:
    """One layout's ``logits`` (Σlen, V) in example order, ``loss_sum`` and ``gradients``."""
    params = [p for p in model.parameters() if p.requires_grad]
    return {
        "logits": logits.detach(),
        "loss_sum": total.detach(),
        "gradients": grad_vector(total, params),
    }


def separate(forward: Callable, seqs: Sequence[tuple]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Each ``(input, targets, loss_mask)`` of ``seqs`` run alone, ``forward(input) -> (L, V)``:
    the logits concatenated ``(ΣL, V)``, each one's supervised log-probability sum ``(S,)``
    and the targets in them (the separate side of every verifier)."""
    logits, sums, eligible = [], [], 0
    for inputs, targets, mask in seqs:
        out = forward(inputs)  # (L, V)
        nll = masked_nll_sum(out, targets, mask)
        logits.append(out)
        sums.append(-nll.sum)
        eligible += nll.count
    return torch.cat(logits), torch.stack(sums), eligible


def run_separate(model: torch.nn.Module, examples: Sequence[SequenceExample]) -> dict:
    """Each example in its own model call; loss = Σ per-example raw NLL sums."""
    seqs = [(ex, ex.targets, ex.loss_mask) for ex in examples]
    logits, sums, _ = separate(model.forward_separate, seqs)
    return _finish(model, logits, -sums.sum())


def run_epoch(
    model: torch.nn.Module, examples: Sequence[SequenceExample], config: PackConfig, policy: str
) -> dict:
    """The examples packed by ``policy`` (``padded``: one per row), batch by batch."""
    first = examples[0]
    epoch = pack_examples(first.partition, examples, first.binding, config, policy=policy)
    forward = model.forward_padded if policy == "padded" else model.forward_packed
    chunks, ordinals, sums = [], [], []
    for batch in epoch.batches:
        out = forward(batch)  # (R, T, V)
        sums.append(masked_nll_sum(out, batch.targets, batch.loss_mask).sum)
        cells = torch.as_tensor(batch.sequences()[0], device=out.device)  # by occurrence
        chunks.append(out.reshape(-1, out.shape[-1]).index_select(0, cells))
        occ = batch.occurrences
        ordinals.append(np.repeat(occ.ordinal, occ.col_end - occ.col_start))
    order = torch.as_tensor(np.argsort(np.concatenate(ordinals), kind="stable"))
    logits = torch.cat(chunks).index_select(0, order.to(chunks[0].device))
    return _finish(model, logits, torch.stack(sums).sum())


def three_way(
    model: torch.nn.Module,
    examples: Sequence[SequenceExample],
    capacity: int,
    *,
    padded_capacity: int | None = None,
    max_rows_per_batch: int | None = None,
    policy: str = "next-fit",
) -> dict[str, Any]:
    """Separate vs padded vs packed: loss sums, max abs diffs, comparison counts, pass/fail.

    ``examples`` share one partition and binding; packed rows are ``capacity`` wide, padded
    ones ``padded_capacity`` (default: the longest example).
    """
    if not examples:
        raise InvalidInput("three_way needs at least one example")
    width = padded_capacity or max(len(ex) for ex in examples)
    rows = max_rows_per_batch or len(examples)
    runs = {
        "separate": run_separate(model, examples),
        "padded": run_epoch(model, examples, PackConfig(width, len(examples)), "padded"),
        "packed": run_epoch(model, examples, PackConfig(capacity, rows), policy),
    }
    sep = runs["separate"]
    pairs = {
        name: {q: compare(sep[q], runs[name][q], SEED_TOLERANCE) for q in QUANTITIES}
        for name in ("padded", "packed")
    }
    totals = combine([tally(p) for p in pairs.values()], {q: q for q in QUANTITIES})
    return {
        "examples": len(examples),
        "targets": int(sum(len(ex) for ex in examples)),
        "eligible_targets": int(sum(int(ex.loss_mask.sum()) for ex in examples)),
        "tolerance": {k: SEED_TOLERANCE[k] for k in ("abs", "rel")},
        "loss_sum": {name: float(run["loss_sum"]) for name, run in runs.items()},
        **totals,
        "against_separate": pairs,
        "passed": not any(totals["failures"].values()),
    }


def describe(model: torch.nn.Module) -> dict[str, Any]:
    """Profile, parameter count, seed, dtype and attention backend of a TinyDecoder."""
    attention = model.attention
    return {
        "profile": getattr(model, "profile", type(model).__name__),
        "parameters": sum(p.numel() for p in model.parameters()),
        "seed": getattr(model, "seed", None),
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "attention": attention if isinstance(attention, str) else attention.__name__,
    }


def tiny_layouts(
    seed: int, count: int, max_len: int
) -> list[tuple[list[SequenceExample], int, int]]:
    """The fixture (capacity 6) and ``count`` random layouts: ``(examples, capacity, rows)``.

    Random layouts (``default_rng(seed)``): 2-6 examples of 1..``max_len`` pairs, some with
    a loss mask, capacity from the longest to ``2 * max_len``, 1-3 rows per model call.
    """
    binding = fixture_binding()
    layouts = [(fixture_examples(binding), FIXTURE_MAX_LENGTH, 2)]
    rng = np.random.default_rng(seed)
    for k in range(count):
        examples = []
        for i in range(int(rng.integers(2, 7))):
            length = int(rng.integers(1, max_len + 1))
            mask = rng.random(length) < 0.7 if rng.random() < 0.3 else None
            examples.append(
                SequenceExample.from_document(
                    rng.integers(0, binding.vocab_size, size=length + 1),
                    source_id=f"layout{k}-{i}",
                    partition="train",
                    binding=binding,
                    loss_mask=mask,
                )
            )
        longest = max(len(ex) for ex in examples)
        capacity = int(rng.integers(longest, 2 * max_len + 1))
        layouts.append((examples, capacity, int(rng.integers(1, 4))))
    return layouts


def verify_tiny(
    attention: str = "ranges", *, mode: str = "adapter", seed: int = 42, layouts: int = 4
) -> dict[str, Any]:
    """Separate vs padded vs packed on the tiny decoder (float64, the seed's tolerance);
    max abs diffs are the largest over every layout."""
    if mode not in ("adapter", "naive"):
        raise InvalidInput(
            f"--mode {mode!r} applies to transformers models only; the tiny decoder takes"
            " adapter or naive"
        )
    backend = unguarded_causal_attention if mode == "naive" else attention
    model = TinyDecoder("large", seed=seed, attention=backend)
    runs = [
        three_way(model, examples, capacity, max_rows_per_batch=rows)
        for examples, capacity, rows in tiny_layouts(seed, layouts, model.config.max_len)
    ]
    report = {
        "target": "tiny-decoder",
        "model": describe(model) | {"attention": attention},
        "mode": mode,
        "layouts": len(runs),
        "examples": sum(r["examples"] for r in runs),
        "targets": sum(r["targets"] for r in runs),
        "tolerance": dict(SEED_TOLERANCE),
        **combine(runs, {"logits": "logits", "loss": "loss_sum", "gradients": "gradients"}),
        "pass": all(r["passed"] for r in runs),
    }
    if not report["pass"]:
        report["hint"] = (
            "plain causal attention over storage columns crosses examples (the control)"
            if mode == "naive"
            else f"backend {attention!r} does not honour the packed layout"
        )
    return report
