"""Where a model mixes packed examples: the first layer whose output diverges from separate runs.

When :func:`exactpack.verify.models.verify_hf` fails, both sides run again with a forward
hook on every module, comparing each module's first output at the examples' cells. The
culprit is the first module, in completion order, whose output diverges while its input
agrees. :func:`guarded` turns an exception inside the model into one :class:`ModelCrashed`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from exactpack.core.batch import PackedBatch
from exactpack.core.errors import ExactpackError
from exactpack.core.examples import SequenceExample
from exactpack.hf.adapter import FLATTENED
from exactpack.hf.mixers import RESTARTABLE

_LINEAR = ("Mamba", "GatedDeltaNet", "LinearAttention", "Lightning", "Recurrent", "Rwkv", "Mixer")
#: Class-name words -> layer kind, first match wins.
KINDS = (
    ("Conv", "convolution"),
    *((word, "linear attention") for word in _LINEAR),
    ("Attention", "attention"),
    ("Attn", "attention"),
)

Calls = dict[str, list[tuple[torch.Tensor | None, torch.Tensor | None]]]


def run_alone(model: torch.nn.Module, tokens: np.ndarray) -> Any:
    """``model`` on ``tokens`` alone: one row ``(1, L)``, no cache (the separate side)."""
    device = next(model.parameters()).device
    ids = torch.as_tensor(np.asarray(tokens, dtype=np.int64), device=device)[None]
    return model(input_ids=ids, use_cache=False)


def example_tokens(batch: PackedBatch, flattened: bool) -> torch.Tensor:
    """Index of every example cell into a packed run's token axis (the ``R*T`` cells, or the
    ``N`` valid cells of a flattened row), examples in ordinal order."""
    occ = batch.occurrences
    cells = batch.sequences()[0][np.argsort(np.repeat(occ.ordinal, occ.lengths), kind="stable")]
    if flattened:  # the rank of each (valid) cell among the sorted valid cells
        cells = np.searchsorted(batch.cu_seqlens().valid_index, cells)
    return torch.as_tensor(cells)


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
        value = value[0]
    found = value if isinstance(value, torch.Tensor) else getattr(value, "last_hidden_state", None)
    return None if found is None else found.detach()


def capture(model: torch.nn.Module, run: Callable[[], Any]) -> Calls:
    """Each module's ``(first input, first output)`` per call of ``run()``, the modules in
    completion order (dicts keep first insertion)."""
    calls: Calls = {}

    def hook(mod: Any, args: tuple, kwargs: dict, out: Any, name: str) -> None:
        first = args[0] if args else kwargs.get("hidden_states")
        calls.setdefault(name, []).append((_first_tensor(first), _first_tensor(out)))

    handles = [
        module.register_forward_hook(functools.partial(hook, name=name), with_kwargs=True)
        for name, module in model.named_modules()
        if name
    ]
    try:
        with torch.no_grad():
            run()
    finally:
        for h in handles:
            h.remove()
    return calls


def _tokens(x: torch.Tensor | None, count: int) -> torch.Tensor | None:
    """``x`` as ``(tokens, features)`` when its leading axes are ``(rows, width)`` of ``count``."""
    if x is None or x.dim() < 2 or not x.dtype.is_floating_point:
        return None
    return x.reshape(count, -1) if x.shape[0] * x.shape[1] == count else None


def _excess(a: torch.Tensor, b: torch.Tensor, tol: dict[str, Any]) -> float:
    """Largest ``|a-b| / (abs + rel*max(|a|,|b|))``: 1 is exactly at the tolerance."""
    a, b = a.double(), b.double()
    scale = tol["abs"] + tol["rel"] * torch.maximum(a.abs(), b.abs())
    return float(((a - b).abs() / scale).max()) if a.numel() else 0.0


def _culprit(model: torch.nn.Module, name: str) -> dict[str, str]:
    """Module ``name``, its class and the layer kind of :data:`KINDS` its class name says."""
    cls = type(model.get_submodule(name)).__name__
    kind = next((kind for word, kind in KINDS if word in cls), f"layer {cls}")
    return {"module": name, "class": cls, "kind": kind}


class ModelCrashed(ExactpackError):
    """The model raised inside its forward or backward (named, on one line)."""


def guarded(model: torch.nn.Module | None, what: str, fn: Any) -> Any:
    """``fn()``, with any exception from inside the model (its ``what``: forward, backward)
    turned into one clear line; ``model=None``: from anywhere in ``exactpack verify``."""
    try:
        return fn()
    except ExactpackError:
        raise
    except Exception as err:
        first = " ".join(str(err).split())[:300] or type(err).__name__
        hint = ""
        if "grouped_mm" in first or "mat_a to be Float32" in first:
            hint = " — MoE experts: load with experts_implementation='eager' for float64"
        where = "verify crashed"
        if model is not None:
            name = getattr(model.config, "model_type", type(model).__name__)
            where = f"{name} ({model.config._attn_implementation}) crashed in its {what}"
        raise ModelCrashed(f"{where}: {type(err).__name__}: {first}{hint}") from err


def culprit(
    model: torch.nn.Module,
    examples: Sequence[SequenceExample],
    kwargs: dict[str, Any],
    batch: PackedBatch,
    attn: str,
    tol: dict[str, Any],
) -> dict[str, str] | None:
    """``{"module", "class", "kind"}`` of the first module that mixed examples, or ``None``:
    each example run alone and ``model(**kwargs)`` (``batch``) captured (module docstring)."""
    flattened = "cu_seq_lens_q" in kwargs and attn in FLATTENED
    tokens = example_tokens(batch, flattened)  # the examples' cells on the packed token axis
    count = int(kwargs["input_ids"].numel())

    def find() -> dict[str, str] | None:
        per_example = [capture(model, lambda ex=ex: run_alone(model, ex.inputs)) for ex in examples]
        measured = []  # (name, excess of the input, excess of the output), in completion order
        for name, got in capture(model, lambda: model(**kwargs)).items():
            if any(len(calls.get(name, ())) != len(got) for calls in per_example):
                continue
            for k, (x_p, y_p) in enumerate(got):
                pairs = [
                    (_tokens(calls[name][k][0], len(ex)), _tokens(calls[name][k][1], len(ex)))
                    for calls, ex in zip(per_example, examples, strict=True)
                ]
                x_p, y_p = _tokens(x_p, count), _tokens(y_p, count)
                if x_p is None or y_p is None or any(x is None or y is None for x, y in pairs):
                    continue
                at = tokens.to(y_p.device)
                x_s, y_s = (torch.cat(side) for side in zip(*pairs, strict=True))
                measured.append((name, _excess(x_p[at], x_s, tol), _excess(y_p[at], y_s, tol)))
        # a mixer whose output moves >= 1% of the tolerance and 10x its input: a leak, even
        # below the tolerance; else the first module leaving the tolerance on agreeing input
        found = [_culprit(model, name) for name, x, y in measured if y >= 1e-2 and y > 10 * x]
        found = [c for c in found if not c["kind"].startswith("layer ")]
        found += [_culprit(model, name) for name, x, y in measured if x <= 1 < y]
        return found[0] if found else None

    return guarded(model, "forward", find)


def hint(mode: str, attn_implementation: str, culprit: dict[str, str] | None) -> str:
    """Why a failing configuration leaks, the layer kind that mixed examples, and the fix."""
    where = (
        f"first divergence in {culprit['module']} ({culprit['class']}): {culprit['kind']}"
        if culprit
        else "no single layer isolated"
    )
    fix = "feed the model exactpack.hf.hf_inputs(batch, attn_implementation, config=model.config)"
    if culprit and culprit["class"] in RESTARTABLE:
        return (
            f"the model mixed examples ({where}): that layer carries state along the row and"
            " restarts at each example only on a call with seq_idx, after"
            f" exactpack.hf.restart_mixers(model) — {fix}"
        )
    if mode == "naive":
        return (
            f"the model mixed examples ({where}): position_ids alone do not separate packed"
            " examples — with the default use_cache=True a cache exists and transformers skips"
            f" its packed-position detection (some older versions never detect) — {fix}"
        )
    if mode == "bool-mask" and attn_implementation == "eager":
        return (
            f"the model mixed examples ({where}): eager adds a boolean 4-D mask to the scores"
            f" as numbers (True = 1) — {fix}"
        )
    kind = culprit["kind"] if culprit else "attention"
    return f"the model mixed examples through its {kind} layers ({where}) — {fix}"
