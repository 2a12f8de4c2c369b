"""How closely packed and separate runs of a model must agree, derived from its real dtype path.

A float64 model is compared with the seed's ``|a-b| <= 1e-10 + 1e-9*max(|a|,|b|)``
only when its computation stays in float64. Many ``transformers`` models do
not: Gemma's RMSNorm casts to float32, eager attention takes its softmax in
float32, MoE routers take theirs in float32. Packed and separate runs reach
such a cast with float64 values that differ in the last bits (different
reduction shapes), and the cast can then round them to neighbouring float32
numbers: a ``6e-8`` relative step that the layers after it carry on (measured:
``4e-7`` relative on Gemma's norm-weight gradients, ``1.1e-8`` on eager's
loss on one CPU and ``1e-12`` on another).

So the islands are *observed*, not assumed: :func:`float32_islands` runs one
forward and backward under a ``TorchDispatchMode`` and follows the data that
leaves float64 (an op with a float64 input and a lower-precision output, and
everything computed from it at that precision). An island is a
lower-precision op on such data that **reduces across tokens or keys** —
softmax, matrix products, sums over any axis but the last — because that is
where packed and separate runs differ in shape and so in rounding: eager's
float32 softmax over a row of keys, Gemma's norm-weight gradient summed over
tokens in float32, an MoE router's float32 softmax. Per-token work at fixed
width (Llama's RMSNorm in float32, rotary tables built from integer
positions) is the same in both runs and keeps the seed's tolerance.
:func:`tolerance` takes the precision of the lowest island: float32 gets
``1e-5 + 1e-4*max`` (about ``840`` float32 epsilons relative, room for a
tiny model's depth and its gradient), while a leak between examples moves
logits by ``1e-2`` or more.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

#: ``(abs, rel)`` per lowest precision on the model's path.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-10, 1e-9),
    torch.float32: (1e-5, 1e-4),
    torch.float16: (1e-3, 1e-2),
    torch.bfloat16: (1e-2, 5e-2),
}
FLOAT32_TOLERANCE = TOLERANCES[torch.float32]


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
#: Elementwise transcendental ops whose CPU kernels round by position in the tensor
#: (vectorised body vs scalar tail), so the same value can round differently in packed
#: and separate runs of different lengths: laguna's float32 softplus gate, sigmoid routers.
LENGTH_ROUNDING_OPS = frozenset(
    {"softplus", "exp", "log", "log1p", "expm1", "sigmoid", "tanh", "silu", "gelu", "erf"}
)


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
            if _reduces_across_tokens(op, args):
                where = self.stack[-1] if self.stack else "backward"
                self.found[(where, op, lowered[0].dtype)] = None
        return out


def float32_islands(run: Callable[[], Any]) -> dict[str, list[str]]:
    """``{module class: [op (dtype), ...]}`` of the lower-precision reductions in ``run()``.

    ``run`` is one forward and backward of a float64 model (its result is
    discarded); ops in backward are attributed to ``"backward"``.
    """
    stack: list[str] = []
    module_hooks = torch.nn.modules.module

    def enter(module: torch.nn.Module, *_: Any) -> None:
        stack.append(type(module).__name__)

    def leave(module: torch.nn.Module, *_: Any) -> None:
        if stack:
            stack.pop()

    handles = [
        module_hooks.register_module_forward_pre_hook(enter),
        module_hooks.register_module_forward_hook(leave),
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
        islands.setdefault(where, []).append(f"{op} ({str(dtype).removeprefix('torch.')})")
    return islands


def lowest_dtype(dtype: torch.dtype, islands: dict[str, list[str]]) -> torch.dtype:
    """The lowest floating precision on the path: the model's, or its lowest island's."""
    lowest = dtype
    for ops in islands.values():
        for op in ops:
            name = op[op.rindex("(") + 1 : -1]
            island = getattr(torch, name)
            if island.itemsize < lowest.itemsize or island == torch.bfloat16:
                lowest = island
    return lowest


def tolerance(dtype: torch.dtype, islands: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """``abs``/``rel`` of the comparison for a model of ``dtype`` with these islands, and why."""
    islands = islands or {}
    lowest = lowest_dtype(dtype, islands)
    atol, rtol = TOLERANCES.get(lowest, FLOAT32_TOLERANCE)
    if lowest == torch.float64:
        why = "float64 throughout: the seed's tolerance"
    elif not islands:
        why = f"{str(dtype).removeprefix('torch.')} model: its own rounding"
    else:
        where = "; ".join(f"{m}: {', '.join(ops)}" for m, ops in islands.items())
        why = f"float64 model with lower-precision islands ({where})"
    return {"abs": atol, "rel": rtol, "why": why, "islands": islands}


__all__ = ["FLOAT32_TOLERANCE", "TOLERANCES", "float32_islands", "lowest_dtype", "tolerance"]
