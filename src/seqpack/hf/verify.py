"""Prove that a ``transformers`` causal LM (or the tiny decoder) honours packing.

:func:`verify_hf` runs the same examples twice with the same parameters:

    separate  each example alone, ``model(input_ids (1, L), use_cache=False)``
    packed    all of them packed next-fit into rows of ``capacity`` (one call)

and compares every vocabulary logit at every real cell, the token-weighted
loss (raw NLL sum over eligible targets / their count, computed with
:mod:`seqpack.loss` in the model's dtype) and every parameter-gradient
coordinate of that loss. The packed call is fed as ``mode`` says:

``adapter``    :func:`seqpack.training.hf.hf_inputs` (explicit mask or
               ``cu_seq_lens``, ``use_cache=False``); the model's own loss from
               its ``labels``/``shift_labels`` is checked too (``model_loss``)
``naive``      ``input_ids`` and ``position_ids`` only, default settings — what
               users commonly write; with the default ``use_cache=True`` a
               cache object exists, ``transformers`` skips its packed-position
               detection and the row attends across examples
``bool-mask``  a **boolean** 4-D block mask with ``use_cache=False``: right on
               ``sdpa``, silently wrong on ``eager`` (which adds it as numbers)

Tolerance ``|a-b| <= abs + rel*max(|a|,|b|)`` (:func:`tolerance`): the seed's
``1e-10 + 1e-9`` when the model is float64 and its softmax runs in float64;
``1e-5 + 1e-4`` when the model is float32 or the implementation is
``eager`` (its softmax runs in float32, so float64 agreement stops near
``1e-7``). ``model_loss`` is computed by ``transformers`` in float32 and
always gets the second. A leak moves logits by ``1e-1`` or more.

:func:`verify_tiny` runs :func:`seqpack.nn.verify.three_way` on the tiny
decoder (the fixture and a few random layouts); its ``naive`` mode uses
:func:`~seqpack.nn.probes.unguarded_causal_attention`, the control that fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seqpack.core.batch import PackedBatch, pack_examples
from seqpack.core.binding import Binding
from seqpack.core.config import PackConfig
from seqpack.core.errors import InvalidInput, NotAvailable
from seqpack.core.examples import SequenceExample
from seqpack.core.loss import masked_nll_sum
from seqpack.hf.adapter import IMPLEMENTATIONS, cell_logits, hf_allowed, hf_inputs, hf_loss_sum
from seqpack.nn.verify import ATOL, RTOL, occurrence_cells

MODES = ("adapter", "naive", "bool-mask")
DTYPES = {"float64": torch.float64, "float32": torch.float32}
#: Prediction pairs of the verification examples; at capacity 12 next-fit makes
#: rows [6, 3 | 3 padding], [8, 4] (an exact fill) and [5, 2 | 5 padding].
LENGTHS = (6, 3, 8, 4, 5, 2)
CAPACITY = 12
#: Targets of example 2 left out of the loss (a prompt), so ``-100`` labels are exercised.
PROMPT_TARGETS = 3
FLOAT32_TOLERANCE = (1e-5, 1e-4)


def tolerance(dtype: torch.dtype, attn_implementation: str) -> dict[str, Any]:
    """``abs``/``rel`` of the comparison for this dtype and implementation, and why."""
    if dtype == torch.float64 and attn_implementation != "eager":
        return {"abs": ATOL, "rel": RTOL, "why": "float64 throughout: the seed's tolerance"}
    why = (
        "eager's softmax runs in float32"
        if dtype == torch.float64
        else "float32 model: float32 rounding"
    )
    return {"abs": FLOAT32_TOLERANCE[0], "rel": FLOAT32_TOLERANCE[1], "why": why}


def _check_available(attn_implementation: str, device: torch.device) -> None:
    if attn_implementation not in IMPLEMENTATIONS:
        raise InvalidInput(
            f"--attn {attn_implementation!r} is not a transformers attention implementation"
            f" seqpack can feed; choose one of {', '.join(IMPLEMENTATIONS)}"
        )
    if device.type == "cuda" and not torch.cuda.is_available():
        raise NotAvailable("--device cuda: no CUDA device is available here — use --device cpu")
    if attn_implementation == "flex_attention" and device.type == "cpu":
        raise NotAvailable(
            f"flex_attention cannot run the verification on CPU: FlexAttention has no backward"
            f" there (torch {torch.__version__}) — run with --device cuda on a GPU machine, or"
            " verify --attn sdpa here"
        )
    if attn_implementation == "flash_attention_2":
        from transformers.utils import is_flash_attn_2_available

        if device.type != "cuda" or not is_flash_attn_2_available():
            raise NotAvailable(
                "flash_attention_2 needs a CUDA device and the flash-attn package"
                f" (device {device.type}, flash-attn"
                f" {'present' if is_flash_attn_2_available() else 'missing'}) — run with"
                " --device cuda where flash-attn is installed, or verify --attn sdpa here"
            )


def load_model(
    *,
    config: str | Path | None = None,
    model: str | Path | None = None,
    attn_implementation: str = "sdpa",
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> torch.nn.Module:
    """A causal LM from a local config (seeded random weights) or a local pretrained dir.

    Nothing is downloaded (``local_files_only=True``). Dropout is turned off
    (``eval()``); every parameter requires grad.
    """
    if (config is None) == (model is None):
        raise InvalidInput("pass exactly one of config= (a config file or dir) or model= (a dir)")
    device = torch.device(device)
    _check_available(attn_implementation, device)
    path = Path(config if config is not None else model)
    if not path.exists():
        raise InvalidInput(f"{path} does not exist — pass a local config.json or model folder")
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        if config is not None:
            # trust_remote_code=False: never run a folder's own Python code (an auto_map)
            # and never ask about it on stdin, which transformers does when it is unset
            cfg = AutoConfig.from_pretrained(
                str(path), local_files_only=True, trust_remote_code=False
            )
            torch.manual_seed(seed)
            built = AutoModelForCausalLM.from_config(
                cfg, attn_implementation=attn_implementation, dtype=dtype, trust_remote_code=False
            )
        else:
            built = AutoModelForCausalLM.from_pretrained(
                str(path),
                local_files_only=True,
                trust_remote_code=False,
                attn_implementation=attn_implementation,
                dtype=dtype,
            )
    except (OSError, ValueError, KeyError, TypeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InvalidInput(f"cannot build a causal LM from {path}: {first}") from err
    built = built.to(device).eval()
    for p in built.parameters():
        p.requires_grad_(True)
    return built


def verification_examples(
    vocab_size: int, seed: int, max_positions: int | None = None
) -> list[SequenceExample]:
    """Six examples of random ids (:data:`LENGTHS` pairs; example 2 has a 3-target prompt)."""
    if max_positions is not None and max_positions < CAPACITY:
        raise InvalidInput(
            f"the model has max_position_embeddings {max_positions}; the verification packs"
            f" rows of {CAPACITY} positions — use a config with at least {CAPACITY}"
        )
    rng = np.random.default_rng(seed)
    binding = Binding(vocab_size, "seqpack/verify-random-ids", f"verify-seed-{seed}")
    out = []
    for i, length in enumerate(LENGTHS):
        mask = np.arange(length) >= PROMPT_TARGETS if i == 2 else None
        out.append(
            SequenceExample.from_document(
                rng.integers(0, vocab_size, size=length + 1),
                source_id=f"random-{i}",
                partition="train",
                binding=binding,
                loss_mask=mask,
            )
        )
    return out


def packed_kwargs(
    batch: PackedBatch,
    mode: str,
    attn_implementation: str,
    dtype: torch.dtype,
    device: torch.device,
    pad_token_id: int = 0,
) -> dict[str, Any]:
    """What ``mode`` feeds the model for ``batch`` (see the module docstring)."""
    if mode == "adapter":
        return hf_inputs(
            batch, attn_implementation, dtype=dtype, device=device, pad_token_id=pad_token_id
        )
    if mode not in MODES:
        raise InvalidInput(f"--mode {mode!r} is not one of {', '.join(MODES)}")
    ids = np.where(batch.input_valid, batch.inputs, pad_token_id).astype(np.int64)
    out = {
        "input_ids": torch.as_tensor(ids, device=device),
        "position_ids": torch.as_tensor(batch.position_ids(), device=device),
    }
    if mode == "bool-mask":
        out["attention_mask"] = torch.as_tensor(hf_allowed(batch), device=device)[:, None]
        out["use_cache"] = False
    return out


def _params(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p for p in model.parameters() if p.requires_grad]


def _grad_vector(loss: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return torch.cat(
        [
            (torch.zeros_like(p) if g is None else g).reshape(-1)
            for p, g in zip(params, grads, strict=True)
        ]
    )


def _compare(a: torch.Tensor, b: torch.Tensor, tol: dict[str, Any]) -> dict[str, Any]:
    a, b = a.detach().double(), b.detach().double()
    ok = (a - b).abs() <= tol["abs"] + tol["rel"] * torch.maximum(a.abs(), b.abs())
    return {
        "comparisons": int(ok.numel()),
        "failures": int((~ok).sum()),
        "max_abs_diff": float((a - b).abs().max()) if a.numel() else 0.0,
    }


def _example_cells(batch: PackedBatch) -> torch.Tensor:
    """Flat cell indices of every occurrence, in example (ordinal) order, int64."""
    occ = batch.occurrences
    order = np.argsort(np.repeat(occ.ordinal, occ.col_end - occ.col_start), kind="stable")
    return torch.as_tensor(occurrence_cells(batch)[order])


def verify_hf(
    model: torch.nn.Module,
    examples: Sequence[SequenceExample],
    *,
    mode: str = "adapter",
    capacity: int = CAPACITY,
    pad_token_id: int | None = None,
) -> dict[str, Any]:
    """Separate vs packed for a ``transformers`` causal LM; a report dict with ``pass``."""
    if mode not in MODES:
        raise InvalidInput(f"--mode {mode!r} is not one of {', '.join(MODES)}")
    if not examples:
        raise InvalidInput("verify_hf needs at least one example")
    attn = model.config._attn_implementation
    param = next(model.parameters())
    dtype, device = param.dtype, param.device
    vocab = examples[0].binding.vocab_size
    pad = pad_token_id if pad_token_id is not None else model.config.pad_token_id
    pad = int(pad) if isinstance(pad, int) and 0 <= pad < vocab else 0
    tol = tolerance(dtype, attn)
    params = _params(model)
    eligible = sum(int(ex.loss_mask.sum()) for ex in examples)

    logits, total = [], 0
    for ex in examples:
        ids = torch.as_tensor(ex.inputs.astype(np.int64), device=device)[None]
        out = model(input_ids=ids, use_cache=False).logits[0]  # (L, V)
        logits.append(out)
        total = total + masked_nll_sum(out, ex.targets, ex.loss_mask).sum
    sep_mean = total / eligible
    sep_logits = torch.cat(logits).detach()
    sep_grads = _grad_vector(sep_mean, params)

    first = examples[0]
    config = PackConfig(capacity, len(examples))
    (batch,) = pack_examples(first.partition, examples, first.binding, config).batches
    out = model(**packed_kwargs(batch, mode, attn, dtype, device, pad))
    packed_sum = hf_loss_sum(out.logits, batch)
    packed_mean = packed_sum.sum / eligible
    cells = _example_cells(batch).to(device)
    flat = cell_logits(out.logits, batch).reshape(-1, out.logits.shape[-1])
    packed_logits = flat.index_select(0, cells).detach()
    compared = {
        "logits": _compare(sep_logits, packed_logits, tol),
        "loss": _compare(sep_mean.reshape(1), packed_mean.reshape(1), tol),
        "gradients": _compare(sep_grads, _grad_vector(packed_mean, params), tol),
    }
    tolerances = {"abs": tol["abs"], "rel": tol["rel"], "why": tol["why"]}
    if mode == "adapter":
        f32 = {"abs": FLOAT32_TOLERANCE[0], "rel": FLOAT32_TOLERANCE[1]}
        compared["model_loss"] = _compare(sep_mean.reshape(1), out.loss.reshape(1), f32)
        tolerances["model_loss"] = f32 | {"why": "transformers computes its loss in float32"}
    report = {
        "target": "transformers",
        "model": {
            "model_type": getattr(model.config, "model_type", type(model).__name__),
            "class": type(model).__name__,
            "parameters": sum(p.numel() for p in params),
            "dtype": str(dtype).removeprefix("torch."),
            "attn_implementation": attn,
            "device": str(device),
        },
        "mode": mode,
        "examples": len(examples),
        "rows": batch.shape[0],
        "capacity": capacity,
        "targets": int(sum(len(ex) for ex in examples)),
        "eligible_targets": eligible,
        "tolerance": tolerances,
        "loss": {"separate": float(sep_mean.detach()), "packed": float(packed_mean.detach())},
        "max_abs_diff": {name: c["max_abs_diff"] for name, c in compared.items()},
        "comparisons": {name: c["comparisons"] for name, c in compared.items()},
        "failures": {name: c["failures"] for name, c in compared.items()},
    }
    report["pass"] = not any(report["failures"].values())
    if not report["pass"]:
        report["hint"] = _hint(mode, attn)
    return report


def _hint(mode: str, attn_implementation: str) -> str:
    """Why a failing configuration leaks, and the fix."""
    fix = "feed the model seqpack.hf.hf_inputs(batch, attn_implementation)"
    if mode == "naive":
        return (
            "position_ids alone do not separate packed examples: with the default"
            " use_cache=True a cache exists and transformers skips its packed-position"
            f" detection (some older versions never detect) — {fix}"
        )
    if mode == "bool-mask" and attn_implementation == "eager":
        return f"eager adds a boolean 4-D mask to the scores as numbers (True = 1) — {fix}"
    return f"the model attends across packed examples or loses targets — {fix}"


__all__ = [
    "CAPACITY",
    "DTYPES",
    "LENGTHS",
    "MODES",
    "load_model",
    "packed_kwargs",
    "tolerance",
    "verification_examples",
    "verify_hf",
]
