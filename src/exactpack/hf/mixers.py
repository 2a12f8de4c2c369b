"""Mixers that restart at every example: short convolutions, Mamba scans, gated delta rules.

Attention keeps packed examples apart through its mask. A layer that carries state along
the row instead (a short causal convolution's last ``k - 1`` inputs, a Mamba / Mamba-2
selective scan's state, a gated delta rule's memory) has no mask to read: it must start
every example from zero, as the example run alone does. Fixture row 0 (A = columns 0-2,
B = 3-4, padding at 5), a width-3 convolution and a scan::

    column         0          1          2       |     3          4      |    5
    seq_idx        0          0          0       |     1          1      |   -1
    conv window  [. . A0]  [. A0 A1]  [A0 A1 A2]  |  [. . B0]  [. B0 B1]  |  [. . pad]
    scan state   0 -> s(A0) -> s(A0..1) -> s(A0..2)
                                       0 -> s(B0) -> s(B0..1)    (not s(A0..2))
                                       ^ the boundary: conv history and state reset

:func:`restart_mixers` makes a model's mixers do that: each mixer module (a class in
:data:`RESTARTABLE`) runs its own forward on each example's columns alone, ``(1, L, H)``
with no cache, whenever the call carries ``seq_idx`` (the per-cell example index
:func:`exactpack.hf.hf_inputs` gives: ``(R, T)`` padded, ``(1, N)`` flattened), and as
before without one. The same code on the same columns with the same zero state: exact
by construction, in every dtype, on the model's own kernels where it has them. A mixer
module's forward is ``forward(hidden_states, cache=None, attention_mask=None, **kwargs)
-> (B, T, H)`` in every family below (transformers 5). LFM2's short convolutions
(:data:`VECTORISED`) restart in one call instead, their window masked by ``seq_idx``
(:func:`segment_conv1d`).
"""

from __future__ import annotations

import types
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from exactpack.core.errors import InvalidInput

#: Mixer classes that restart exactly per example (each verified by ``exactpack verify``):
#: short convolutions, Mamba and Mamba-2 selective scans, gated delta rules.
RESTARTABLE = {
    "Lfm2ShortConv": "short convolution",
    "Lfm2MoeShortConv": "short convolution",
    "MambaMixer": "Mamba selective scan",
    "FalconMambaMixer": "Mamba selective scan",
    "JambaMambaMixer": "Mamba selective scan",
    "Mamba2Mixer": "Mamba-2 selective scan",
    "BambaMixer": "Mamba-2 selective scan",
    "NemotronHMamba2Mixer": "Mamba-2 selective scan",
    "FalconH1Mixer": "Mamba-2 selective scan",
    "GraniteMoeHybridMambaLayer": "Mamba-2 selective scan",
    "Qwen3NextGatedDeltaNet": "gated delta rule",
    "Qwen3_5GatedDeltaNet": "gated delta rule",
    "Qwen3_5MoeGatedDeltaNet": "gated delta rule",
    "OlmoHybridGatedDeltaNet": "gated delta rule",
}
#: The attribute a restarted mixer (and its model) carries.
_MARK = "_exactpack_restarts"
#: ``id(config)`` -> config of every model whose mixers restart (hf_inputs checks it).
_PREPARED: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def mixer_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """``(name, module)`` of every module of ``model`` whose class is in :data:`RESTARTABLE`."""
    return [(n, m) for n, m in model.named_modules() if type(m).__name__ in RESTARTABLE]


def cell_seq_idx(
    lengths: np.ndarray, valid_index: np.ndarray, shape: tuple[int, int]
) -> np.ndarray:
    """Each cell's example index (occurrence order), ``-1`` at padding: int32 ``shape``.

    >>> cell_seq_idx(np.array([3, 2, 4]), np.array([0, 1, 2, 3, 4, 6, 7, 8, 9]), (2, 6))
    array([[ 0,  0,  0,  1,  1, -1],
           [ 2,  2,  2,  2, -1, -1]], dtype=int32)
    """
    out = np.full(shape[0] * shape[1], -1, dtype=np.int32)
    out[valid_index] = np.repeat(np.arange(len(lengths), dtype=np.int32), lengths)
    return out.reshape(shape)


def segment_conv1d(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, seq_idx: torch.Tensor
) -> torch.Tensor:
    """The depthwise causal convolution of ``x`` ``(B, C, T)`` by ``weight`` ``(C, K)``
    (``F.conv1d(..., groups=C, padding=K - 1)[..., :T]``), restarting at every change of
    ``seq_idx`` ``(B, T)``: column ``t`` reads only its own example's columns among
    ``t - K + 1 .. t``, zeros before the example's first, as the example alone does."""
    k = weight.shape[-1]
    window = F.pad(x, (k - 1, 0)).unfold(-1, k, 1)  # (B, C, T, K): columns t-K+1 .. t
    outside = torch.iinfo(torch.int64).min  # before column 0: nobody's example
    ids = F.pad(seq_idx.long(), (k - 1, 0), value=outside).unfold(-1, k, 1)  # (B, T, K)
    same = (ids == seq_idx.long()[..., None]).to(x.dtype)  # (B, T, K): own example only
    out = torch.einsum("bctk,btk,ck->bct", window, same, weight.to(x.dtype))  # (B, C, T)
    return out if bias is None else out + bias.to(x.dtype)[:, None]


def _short_conv(module: torch.nn.Module, hidden_states: torch.Tensor, seq_idx: torch.Tensor) -> Any:
    """LFM2's ``ShortConv`` forward (no cache, no padding mask) with :func:`segment_conv1d`:
    one call for the whole row, no loop over its examples."""
    bcx = module.in_proj(hidden_states).transpose(-1, -2)  # (B, 3H, T)
    b, c, x = bcx.chunk(3, dim=-2)
    conv = segment_conv1d(b * x, module.conv.weight.squeeze(1), module.conv.bias, seq_idx)
    return module.out_proj((c * conv).to(hidden_states.dtype).transpose(-1, -2).contiguous())


#: Mixers restarted in one vectorised call (the rest run per example): class -> forward.
VECTORISED = {"Lfm2ShortConv": _short_conv, "Lfm2MoeShortConv": _short_conv}


def runs(seq_idx: torch.Tensor) -> list[list[tuple[int, int]]]:
    """Per row, the ``(start, end)`` column spans of equal ``seq_idx`` (each example, and the
    padding): ``[[0, 0, 0, 1, 1, -1]]`` -> ``[[(0, 3), (3, 5), (5, 6)]]``."""
    ids = seq_idx.detach().cpu().numpy()
    out = []
    for row in ids:  # one loop per row; the spans come from one vectorised comparison
        cut = np.flatnonzero(row[1:] != row[:-1]) + 1
        edges = np.r_[0, cut, row.shape[0]]
        out.append(list(zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True)))
    return out


@dataclass
class _Call:
    """The spans of the model call in progress (set by the root's pre-hook)."""

    spans: list[list[tuple[int, int]]] | None = None
    seq_idx: torch.Tensor | None = None  # the tensor the spans were read from
    checkpointing: bool = False


def _restarted_forward(module: torch.nn.Module, call: _Call, name: str) -> Any:
    own = type(module).forward

    def forward(
        self: torch.nn.Module,
        hidden_states: torch.Tensor,
        cache: Any = None,
        attention_mask: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        seq_idx = kwargs.get("seq_idx")
        spans = call.spans  # read once per call: runs() copies seq_idx to the host
        if isinstance(seq_idx, torch.Tensor) and seq_idx is not call.seq_idx:
            spans = runs(seq_idx)  # a recompute after the call (checkpointing), or a layer alone
        if spans is None:  # not a packed call: the module's own forward
            return own(self, hidden_states, cache=cache, attention_mask=attention_mask, **kwargs)
        if seq_idx is None and call.checkpointing:
            raise InvalidInput(
                f"{name} ({type(self).__name__}) is not handed seq_idx by its model, and"
                " gradient (activation) checkpointing would recompute it after the packed call,"
                " where exactpack cannot restart it — turn checkpointing off for this model"
            )
        rows, width = hidden_states.shape[:2]
        if len(spans) != rows or (spans and spans[0][-1][1] != width):
            raise InvalidInput(
                f"{name} got hidden states of {rows} x {width} columns but seq_idx of"
                f" {len(spans)} rows — feed the model exactly hf_inputs(batch, ...)"
            )
        if cache is not None:
            raise InvalidInput(
                f"{name} got a cache on a packed call; packed rows are for training"
                " — pass use_cache=False (hf_inputs does)"
            )
        ids = seq_idx if isinstance(seq_idx, torch.Tensor) else call.seq_idx
        if type(self).__name__ in VECTORISED and ids is not None:
            return VECTORISED[type(self).__name__](
                self, hidden_states, ids.to(hidden_states.device)
            )
        # each example alone: (1, L, H) through the module's own forward, no cache, no mask
        out = [
            torch.cat([own(self, hidden_states[r : r + 1, s:e]) for s, e in row], dim=1)
            for r, row in enumerate(spans)
        ]
        return torch.cat(out, dim=0)

    return types.MethodType(forward, module)


def restart_mixers(model: torch.nn.Module) -> torch.nn.Module:
    """Make every :data:`RESTARTABLE` mixer of ``model`` restart at each example of a packed
    call (one that carries ``seq_idx``, as :func:`exactpack.hf.hf_inputs` gives); other
    calls run as before. Idempotent; returns ``model``.

    >>> # model = AutoModelForCausalLM.from_pretrained(...)   # e.g. LFM2, Mamba, Qwen3-Next
    >>> # restart_mixers(model)
    >>> # out = model(**hf_inputs(batch, "sdpa", config=model.config))
    """
    if getattr(model, _MARK, None) is not None:
        return model
    call = _Call()

    def before(module: Any, args: tuple, kwargs: dict) -> None:
        seq_idx = kwargs.get("seq_idx")
        if isinstance(seq_idx, torch.Tensor):
            call.spans, call.seq_idx = runs(seq_idx), seq_idx
            checkpointing = bool(getattr(model, "is_activation_checkpointing", False))
            call.checkpointing = checkpointing and model.training  # recomputes only in training
        else:
            call.spans = call.seq_idx = None

    def after(module: Any, args: tuple, kwargs: dict, out: Any) -> None:
        call.spans = call.seq_idx = None  # a later direct call of a layer is not this one

    for name, module in mixer_modules(model):
        if getattr(module, _MARK, None) is None:
            module.forward = _restarted_forward(module, call, name)
            setattr(module, _MARK, True)
    model.register_forward_pre_hook(before, with_kwargs=True)
    model.register_forward_hook(after, with_kwargs=True, always_call=True)
    setattr(model, _MARK, call)
    config = getattr(model, "config", None)
    if config is not None:
        _PREPARED[id(config)] = config
        text = getattr(config, "get_text_config", lambda: config)()
        _PREPARED[id(text)] = text
    return model


def restarts(config: Any) -> bool:
    """True when ``config`` belongs to a model :func:`restart_mixers` has prepared."""
    return _PREPARED.get(id(config)) is config


__all__ = [
    "RESTARTABLE",
    "VECTORISED",
    "cell_seq_idx",
    "mixer_modules",
    "restart_mixers",
    "restarts",
    "runs",
    "segment_conv1d",
]
