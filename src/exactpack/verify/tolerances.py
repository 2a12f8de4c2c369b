"""How closely packed and separate runs of a model must agree, from its real dtype path.

A float64 model gets the seed's ``|a-b| <= 1e-10 + 1e-9*max(|a|,|b|)`` only while it stays
in float64. :func:`observe` follows (a ``TorchDispatchMode``, one forward and backward) the
data that leaves float64; an *island* is a lower-precision op on it that reduces across
tokens or keys. :func:`tolerance` takes the lowest island's precision (float32:
``1e-5 + 1e-4*max``); :func:`compare` counts the elements outside a tolerance.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from exactpack.core.errors import InvalidInput

#: ``(abs, rel)`` per lowest precision on the model's path.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-10, 1e-9),
    torch.float32: (1e-5, 1e-4),
    torch.float16: (1e-3, 1e-2),
    torch.bfloat16: (1e-2, 5e-2),
}
FLOAT32_TOLERANCE = TOLERANCES[torch.float32]
ATOL, RTOL = TOLERANCES[torch.float64]
SEED_TOLERANCE = {"abs": ATOL, "rel": RTOL, "why": "float64 throughout: the seed's tolerance"}


#: Ops that reduce over a varying extent (keys of a row, tokens of a batch) or contract
#: over one; ``sum``/``mean`` count when they reduce any axis but the last.
REDUCING_OPS = frozenset(
    {
        "_softmax",
        "softmax",
        "_log_softmax",
        "logsumexp",
        "mm",
        "bmm",
        "addmm",
        "baddbmm",
        "matmul",
        "_grouped_mm",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_cudnn_attention",
    }
)
AXIS_OPS = frozenset({"sum", "mean"})
#: Elementwise ops whose CPU kernels round by position in the tensor (vectorised body vs
#: scalar tail): the same value can round differently in runs of different lengths.
LENGTH_ROUNDING_OPS = frozenset(
    {"softplus", "exp", "log", "log1p", "expm1", "sigmoid", "tanh", "silu", "gelu", "erf"}
)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _low(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.dtype.is_floating_point and x.dtype.itemsize < 8


def _reduces_across_tokens(op: str, args: tuple) -> bool:
    if op in REDUCING_OPS or op in LENGTH_ROUNDING_OPS:
        return True
    if op not in AXIS_OPS:
        return False
    dims = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else None
    if not dims:  # sum/mean of everything
        return True
    ndim = args[0].dim()
    return any(d % ndim != ndim - 1 for d in dims)


class _IslandRecorder(TorchDispatchMode):
    """Follows data that left float64 and records ``(module, op, dtype)`` where it is reduced."""

    def __init__(self, stack: list[str]) -> None:
        super().__init__()
        self.stack = stack
        self.tainted: dict[int, Any] = {}  # id -> weakref of lower-precision derived tensors
        self.found: dict[tuple[str, str, torch.dtype], None] = {}
        self.casts: dict[str, None] = {}  # every op turning float64 into a lower precision

    def _is_tainted(self, x: Any) -> bool:
        ref = self.tainted.get(id(x))
        return ref is not None and ref() is x

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        wide = any(x.dtype == torch.float64 for x in inputs)
        derived = any(_low(x) and self._is_tainted(x) for x in inputs)
        lowered = [x for x in tree_leaves(out) if _low(x)]
        if lowered and (wide or derived):
            for x in lowered:
                self.tainted[id(x)] = weakref.ref(x)
            op = func.__name__.split(".")[0]
            if wide:
                self.casts[f"{op} ({_name(lowered[0].dtype)})"] = None
            if _reduces_across_tokens(op, args):
                where = self.stack[-1] if self.stack else "backward"
                self.found[(where, op, lowered[0].dtype)] = None
        return out


def observe(run: Callable[[], Any]) -> tuple[dict[str, list[str]], list[str]]:
    """``(islands, casts)`` of ``run()``, one forward and backward of a float64 model:
    ``{module class (or "backward"): [op (dtype), ...]}`` of the lower-precision reductions,
    and every ``op (dtype)`` that turned float64 data into a lower precision."""
    stack: list[str] = []
    hooks = torch.nn.modules.module

    def enter(module: torch.nn.Module, *_: Any) -> None:
        stack.append(type(module).__name__)

    def leave(module: torch.nn.Module, *_: Any) -> None:  # returns None: output unchanged
        if stack:
            stack.pop()

    handles = [
        hooks.register_module_forward_pre_hook(enter),
        hooks.register_module_forward_hook(leave),
    ]
    recorder = _IslandRecorder(stack)
    try:
        with recorder:
            run()
    finally:
        for h in handles:
            h.remove()
    islands: dict[str, list[str]] = {}
    for where, op, dtype in recorder.found:
        islands.setdefault(where, []).append(f"{op} ({_name(dtype)})")
    return islands, list(recorder.casts)


def tolerance(dtype: torch.dtype, islands: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """``abs``/``rel`` of the comparison for a model of ``dtype`` with these islands, and why:
    the lowest floating precision on the path (the model's, or its lowest island's; an
    island reads ``op (dtype)``; bfloat16 is the lowest)."""
    islands = islands or {}
    found = [getattr(torch, op[op.rindex("(") + 1 : -1]) for ops in islands.values() for op in ops]
    lowest = min([dtype, *found], key=lambda d: (d != torch.bfloat16, d.itemsize))
    atol, rtol = TOLERANCES.get(lowest, FLOAT32_TOLERANCE)
    if lowest == torch.float64:
        why = SEED_TOLERANCE["why"]
    elif not islands:
        why = f"{_name(dtype)} model: its own rounding"
    else:
        where = "; ".join(f"{m}: {', '.join(ops)}" for m, ops in islands.items())
        why = f"float64 model with lower-precision islands ({where})"
    return {"abs": atol, "rel": rtol, "why": why, "islands": islands}


def compare(a: torch.Tensor, b: torch.Tensor, tol: dict[str, Any]) -> dict[str, Any]:
    """Element comparisons, failures outside ``tol`` (``abs``/``rel``) and the max abs diff."""
    if a.numel() != b.numel():
        raise InvalidInput(f"shapes {tuple(a.shape)} and {tuple(b.shape)} differ")
    a, b = a.detach().double().reshape(-1), b.detach().double().reshape(-1)
    ok = within_tolerance(a, b, tol)
    diff = float((a - b).abs().max()) if a.numel() else 0.0
    return {"comparisons": int(ok.numel()), "failures": int((~ok).sum()), "max_abs_diff": diff}


def within_tolerance(
    a: torch.Tensor, b: torch.Tensor, tol: dict[str, Any] = SEED_TOLERANCE
) -> torch.Tensor:
    """Elementwise ``|a-b| <= abs + rel*max(|a|,|b|)`` (bool, same shape; the seed's by default)."""
    return (a - b).abs() <= tol["abs"] + tol["rel"] * torch.maximum(a.abs(), b.abs())


def tally(compared: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``max_abs_diff``, ``comparisons`` and ``failures``, each per compared quantity."""
    return {key: {name: c[key] for name, c in compared.items()} for key in TOTALS}


#: How :func:`combine` joins tallies: the largest difference, the summed counts.
TOTALS = {"max_abs_diff": max, "comparisons": sum, "failures": sum}


def combine(tallies: list[dict[str, Any]], names: dict[str, str]) -> dict[str, dict[str, Any]]:
    """:func:`tally` sections joined over ``tallies`` (:data:`TOTALS`); quantity ``names[out]``
    of the result is quantity ``out`` of each tally's."""
    return {
        key: {out: join(t[key][name] for t in tallies) for out, name in names.items()}
        for key, join in TOTALS.items()
    }


def grad_vector(loss: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
    """Every coordinate of ``d loss / d params``, flat (zeros for unused parameters)."""
    grads = torch.autograd.grad(loss, params, materialize_grads=True)
    return torch.cat([g.reshape(-1) for g in grads])


LOW = (torch.float32, torch.float16, torch.bfloat16)
WIDE = torch.float64


class Float64Islands(TorchFunctionMode):
    """Inside: float64 data the model casts to a lower float precision stays float64.

    Casts (``.to``, ``.float()``, ``.type_as``, ``dtype=`` keywords) of float64 data keep
    float64, and a lower-precision tensor meeting float64 data in an op is widened, so
    the model's float32 islands run in float64 for the check. In-place ops and tensors
    made without float64 inputs are left as they are.
    """

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        kwargs = kwargs or {}
        leaves = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        name = getattr(func, "__name__", "")
        if name.endswith("_") or "out" in kwargs or not any(x.dtype == WIDE for x in leaves):
            return func(*args, **kwargs)
        first = args[0]
        casts = (torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16, torch.Tensor.type_as)
        if func in casts and first.dtype == WIDE:
            return first
        if func is torch.Tensor.to and len(args) > 1 and isinstance(args[1], torch.Tensor):
            args = (first, args[1].device, *args[2:])  # .to(other): its device, not its dtype
        args, kwargs = tree_map(_widen, (args, kwargs))
        return func(*args, **kwargs)


def _widen(x: Any) -> Any:
    if isinstance(x, torch.dtype):
        return WIDE if x in LOW else x
    if isinstance(x, torch.Tensor) and x.dtype in LOW:
        return x.to(WIDE)
    return x
