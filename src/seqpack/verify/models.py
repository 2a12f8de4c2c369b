"""Prove that a ``transformers`` causal LM honours packing, or show where it leaks.

:func:`verify_hf` runs the same examples twice with the same parameters:

    separate  each example alone, ``model(input_ids (1, L), use_cache=False)``
    packed    all of them packed next-fit into rows of ``capacity`` (one call)

and compares every vocabulary logit at every real cell, the token-weighted
loss (raw NLL sum over eligible targets / their count, computed with
:mod:`seqpack.loss` in the model's dtype) and every parameter-gradient
coordinate of that loss. The packed call is fed as ``mode`` says:

``adapter``    :func:`seqpack.hf.adapter.hf_inputs` with the model's config
               (per-layer-type windowed masks, or ``cu_seq_lens``,
               ``use_cache=False``); the model's own loss from its
               ``labels``/``shift_labels`` is checked too (``model_loss``)
``naive``      ``input_ids`` and ``position_ids`` only, default settings — what
               users commonly write; with the default ``use_cache=True`` a
               cache object exists, ``transformers`` skips its packed-position
               detection and the row attends across examples
``bool-mask``  **boolean** 4-D block masks with ``use_cache=False``: right on
               ``sdpa``, silently wrong on ``eager`` (which adds them as numbers)

An architecture seqpack cannot make exact (:mod:`seqpack.hf.architectures`)
is refused before anything runs; a crash inside the model is a
:class:`ModelCrashed` (both: ``seqpack verify`` exit 2, one line). Exit 1
means only that the model mixed examples: the report's ``hint`` names the
first layer whose output diverged (:mod:`seqpack.verify.diagnose`).

Tolerances follow the model's real dtype path (:mod:`seqpack.verify.tolerance`);
``model_loss`` is computed by ``transformers`` in float32 and always gets float32's.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np
import torch

from seqpack.core.batch import PackedBatch
from seqpack.core.compact import pack_examples
from seqpack.core.config import PackConfig
from seqpack.core.errors import InvalidInput
from seqpack.core.examples import SequenceExample
from seqpack.core.loss import masked_nll_sum
from seqpack.hf.adapter import build_inputs, cell_logits, hf_loss_sum
from seqpack.hf.architectures import Architecture
from seqpack.hf.capability import architecture_of
from seqpack.hf.kinds import MASK_KINDS, attention_kind
from seqpack.verify.diagnose import ModelCrashed, culprit, example_tokens, guarded, hint
from seqpack.verify.loading import (
    CAPACITY,
    DTYPES,
    LENGTHS,
    VerifyCase,
    load_model,
    verification_examples,
    verification_layout,
)
from seqpack.verify.tolerance import (
    FLOAT32_TOLERANCE,
    compare,
    grad_vector,
    observe,
    tolerance,
)

MODES = ("adapter", "naive", "bool-mask")


def packed_kwargs(
    batch: PackedBatch,
    mode: str,
    attn_implementation: str,
    dtype: torch.dtype,
    device: torch.device,
    pad_token_id: int = 0,
    arch: Architecture | None = None,
) -> dict[str, Any]:
    """What ``mode`` feeds the model for ``batch`` (see the module docstring)."""
    if mode == "adapter":
        return build_inputs(
            batch, attn_implementation, arch, dtype=dtype, device=device, pad_token_id=pad_token_id
        )
    if mode == "bool-mask":
        if attn_implementation not in ("eager", "sdpa"):
            raise InvalidInput("--mode bool-mask feeds 4-D masks: use --attn eager or sdpa")
        # The sdpa form (boolean) handed to whichever implementation runs: the control.
        return build_inputs(
            batch, "sdpa", arch, mask="bool", device=device, pad_token_id=pad_token_id, labels=False
        )
    ids = np.where(batch.input_valid, batch.inputs, pad_token_id).astype(np.int64)
    return {
        "input_ids": torch.as_tensor(ids, device=device),
        "position_ids": torch.as_tensor(batch.position_ids(), device=device),
    }


def _params(model: torch.nn.Module) -> list[torch.Tensor]:
    """The model's own trainable set (roformer's sinusoidal table stays frozen)."""
    return [p for p in model.parameters() if p.requires_grad]


def reference_implementation(model: torch.nn.Module, attn: str) -> str:
    """The implementation the separate runs use: ``attn`` when it is the model's own
    (sdpa, eager, flex), else the model's sdpa, or its eager where it has no sdpa.

    ``seqpack_varlen`` (or a flash kernel) checked against itself would pass a
    window or a causality the model does not have; the model's own attention is
    the reference.
    """
    kind = attention_kind(attn) if isinstance(attn, str) else None
    if kind in MASK_KINDS:
        return attn
    return "sdpa" if getattr(model, "_supports_sdpa", False) else "eager"


@contextmanager
def running(model: torch.nn.Module, attn: str) -> Iterator[None]:
    """Run ``model`` on ``attn`` inside the block, back to its own implementation after."""
    previous = model.config._attn_implementation
    if attn != previous:
        model.set_attn_implementation(attn)
    try:
        yield
    finally:
        if attn != previous:
            model.set_attn_implementation(previous)


def _separate(
    model: torch.nn.Module, examples: Sequence[SequenceExample], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of every example run alone, concatenated ``(Σl, V)``, and their loss sum."""
    logits, total = [], 0
    for ex in examples:
        ids = torch.as_tensor(ex.inputs.astype(np.int64), device=device)[None]
        out = model(input_ids=ids, use_cache=False).logits[0]  # (L, V)
        logits.append(out)
        total = total + masked_nll_sum(out, ex.targets, ex.loss_mask).sum
    return torch.cat(logits), total


def observed(model: torch.nn.Module, tokens: np.ndarray, backward: bool = True) -> tuple:
    """``(islands, casts)`` (:func:`~seqpack.verify.tolerance.observe`) of one forward (and
    backward) of ``tokens`` alone through a float64 model; ``({}, [])`` for any other dtype.

    FlexAttention is a higher-order op that dispatch modes cannot follow (and
    a failed trace would leave it uncompiled), so a flex model is observed on
    ``sdpa``: the same layers around the same attention in the model's dtype.
    """
    param = next(model.parameters())
    if param.dtype != torch.float64:
        return {}, []
    ids = torch.as_tensor(tokens.astype(np.int64), device=param.device)[None]
    flex = model.config._attn_implementation == "flex_attention"

    def run() -> None:
        logits = model(input_ids=ids, use_cache=False).logits
        if backward:
            logits.sum().backward()

    with running(model, "sdpa") if flex else nullcontext():
        found = observe(run)
    model.zero_grad(set_to_none=True)
    return found


def _prepare(model: torch.nn.Module, mode: str, allow_unsupported: bool) -> Architecture:
    if mode not in MODES:
        raise InvalidInput(f"--mode {mode!r} is not one of {', '.join(MODES)}")
    arch = architecture_of(model)
    if mode == "adapter" and not allow_unsupported:
        arch.check(attention_kind(model.config._attn_implementation))
    dtype = next(model.parameters()).dtype
    experts = getattr(model.config, "_experts_implementation", None)
    if dtype == torch.float64 and experts == "grouped_mm":
        model.set_experts_implementation("eager")  # grouped_mm has no float64 kernel
    return arch


def verify_hf(
    model: torch.nn.Module,
    examples: Sequence[SequenceExample],
    *,
    mode: str = "adapter",
    capacity: int | None = None,
    pad_token_id: int | None = None,
    gradients: bool = True,
    allow_unsupported: bool = False,
) -> dict[str, Any]:
    """Separate vs packed for a ``transformers`` causal LM; a report dict with ``pass``.

    ``capacity``: the row width (default :data:`CAPACITY`, or the longest
    example + 3). ``gradients=False`` compares logits and losses only (for
    implementations without a backward here, e.g. FlexAttention on CPU).
    ``allow_unsupported`` runs a refused architecture anyway, to measure its
    leak; its report says ``"supported": False`` and never passes.
    """
    if not examples:
        raise InvalidInput("verify_hf needs at least one example")
    # gradients=False, e.g. FlexAttention on CPU: no backward, so no graph at all
    with nullcontext() if gradients else torch.no_grad():
        return _verify(model, examples, mode, capacity, pad_token_id, gradients, allow_unsupported)


def _verify(
    model: torch.nn.Module,
    examples: Sequence[SequenceExample],
    mode: str,
    capacity: int | None,
    pad_token_id: int | None,
    gradients: bool,
    allow_unsupported: bool,
) -> dict[str, Any]:
    arch = _prepare(model, mode, allow_unsupported)
    attn = model.config._attn_implementation
    param = next(model.parameters())
    dtype, device = param.dtype, param.device
    vocab = examples[0].binding.vocab_size
    own_pad = getattr(model.config, "pad_token_id", None)  # codegen, cpmant: none at all
    pad = pad_token_id if pad_token_id is not None else own_pad
    pad = int(pad) if isinstance(pad, int) and 0 <= pad < vocab else 0
    longest = max(len(ex) for ex in examples)
    capacity = capacity or (CAPACITY if longest <= CAPACITY else longest + 3)
    params = _params(model)
    eligible = sum(int(ex.loss_mask.sum()) for ex in examples)
    reference = reference_implementation(model, attn)
    with running(model, reference):
        islands, _ = guarded(
            model, "forward", lambda: observed(model, examples[0].inputs, gradients)
        )
        sep_logits, total = guarded(model, "forward", lambda: _separate(model, examples, device))
    tol = tolerance(dtype, islands)

    sep_mean = total / eligible
    first = examples[0]
    (batch,) = pack_examples(
        first.partition, examples, first.binding, PackConfig(capacity, len(examples))
    ).batches
    kwargs = packed_kwargs(batch, mode, attn, dtype, device, pad, arch)
    out = _packed_forward(model, kwargs, mode)
    packed_mean = hf_loss_sum(out.logits, batch).sum / eligible
    cells = example_tokens(batch, flattened=False).to(device)
    flat = cell_logits(out.logits, batch).reshape(-1, out.logits.shape[-1])
    compared = {
        "logits": compare(sep_logits, flat.index_select(0, cells), tol),
        "loss": compare(sep_mean.reshape(1), packed_mean.reshape(1), tol),
    }
    if gradients:
        sep_grads = guarded(model, "backward", lambda: grad_vector(sep_mean, params))
        packed_grads = guarded(model, "backward", lambda: grad_vector(packed_mean, params))
        compared["gradients"] = compare(sep_grads, packed_grads, tol)
    f32 = {"abs": FLOAT32_TOLERANCE[0], "rel": FLOAT32_TOLERANCE[1]}
    if mode == "adapter":
        compared["model_loss"] = compare(sep_mean.reshape(1), out.loss.reshape(1), f32)
    report = _report(model, arch, batch, examples, mode, capacity, eligible, tol, compared)
    report["reference"] = reference
    report["loss"] = {"separate": float(sep_mean.detach()), "packed": float(packed_mean.detach())}
    if mode == "adapter":
        report["tolerance"]["model_loss"] = f32 | {
            "why": "transformers computes its loss in float32"
        }
    if not gradients:
        report["note"] = "gradients not compared (no backward for this implementation here)"
    report["pass"] = not any(report["failures"].values()) and arch.refusal is None
    # Mixed examples: the logits, the loss or the gradients disagree. The model's own
    # loss alone disagreeing is how it reads labels, not a leak (whisper shifts none).
    report["mixed"] = any(n for k, n in report["failures"].items() if k != "model_loss")
    if any(report["failures"].values()) and not report["mixed"]:
        report["hint"] = (
            f"packed == separate (logits, loss and gradients agree), but {type(model).__name__}"
            " computes its own loss without transformers' ForCausalLMLoss (it does not read"
            " labels / shift_labels as causal LMs do) — train it with"
            " seqpack.hf.hf_loss(logits, batch), not the model's loss"
        )
    elif report["mixed"]:
        found = culprit(model, examples, kwargs, batch, attn, tol)
        report["first_divergence"] = found
        report["hint"] = hint(mode, attn, found)
    elif arch.refusal is not None:
        report["hint"] = f"unsupported: {arch.refusal}"
    return report


def _packed_forward(model: torch.nn.Module, kwargs: dict[str, Any], mode: str) -> Any:
    """``model(**kwargs)``; where only its own loss crashes (git cuts its image columns off
    the logits), the logits alone with a NaN loss: a ``model_loss`` failure, not a crash."""
    try:
        return guarded(model, "forward", lambda: model(**kwargs))
    except ModelCrashed:
        if mode != "adapter":
            raise
    unlabelled = {k: v for k, v in kwargs.items() if k not in ("labels", "shift_labels")}
    out = guarded(model, "forward", lambda: model(**unlabelled))
    out.loss = torch.full((1,), torch.nan)
    return out


def _report(
    model: torch.nn.Module,
    arch: Architecture,
    batch: PackedBatch,
    examples: Sequence[SequenceExample],
    mode: str,
    capacity: int,
    eligible: int,
    tol: dict[str, Any],
    compared: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    longest = max(len(ex) for ex in examples)
    return {
        "target": "transformers",
        "model": model_facts(model),
        "architecture": {
            "layer_types": list(arch.mask_types),
            "windows": {k or "all": v for k, v in arch.windows.items()},
            "window_exercised": arch.window is None or longest > arch.window,
            "supported": arch.refusal is None,
            "refusal": arch.refusal,
            "positions": arch.positions,
            "position_offset": arch.position_offset,
            "conditions": [c.text() for c in arch.conditions],
            "verdict": arch.verdict,
        },
        "mode": mode,
        "examples": len(examples),
        "lengths": [len(ex) for ex in examples],
        "rows": batch.shape[0],
        "capacity": capacity,
        "targets": int(sum(len(ex) for ex in examples)),
        "eligible_targets": eligible,
        "tolerance": dict(tol),
        **tally(compared),
    }


def model_facts(model: torch.nn.Module) -> dict[str, Any]:
    """The report's ``model`` section: type, class, trainable parameters, dtype, attention."""
    param = next(model.parameters())
    return {
        "model_type": getattr(model.config, "model_type", type(model).__name__),
        "class": type(model).__name__,
        "parameters": sum(p.numel() for p in _params(model)),
        "dtype": str(param.dtype).removeprefix("torch."),
        "attn_implementation": model.config._attn_implementation,
        "device": str(param.device),
    }


def tally(compared: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``max_abs_diff``, ``comparisons`` and ``failures``, each per compared quantity."""
    keys = ("max_abs_diff", "comparisons", "failures")
    return {key: {name: c[key] for name, c in compared.items()} for key in keys}


__all__ = [
    "CAPACITY",
    "DTYPES",
    "FLOAT32_TOLERANCE",
    "LENGTHS",
    "MODES",
    "ModelCrashed",
    "VerifyCase",
    "load_model",
    "packed_kwargs",
    "tolerance",
    "verification_examples",
    "verification_layout",
    "verify_hf",
]
