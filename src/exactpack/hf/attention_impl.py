"""``attn_implementation="exactpack_varlen"``, ``"exactpack_tree"``, ``"exactpack_tree_varlen"``:
packed rows without a mask, through one attention function.

:func:`exactpack_attention` runs every query against its path
(:func:`exactpack.nn.varlen.path_attention`; a flat example is its own path) with the layer's
window, by the plan it is given: a tree's (``hf_inputs(tree_batch, "exactpack_tree")``: the
plan as the keyword ``exactpack_tree``, run by a varlen kernel for ``exactpack_tree_varlen``), else
``cu_seq_lens_q``'s (``hf_inputs(batch, "exactpack_varlen")``: the valid cells flattened into
``(1, N)``), else one example a row. Refused: soft-capping, sinks, a mask that hides keys,
packed ``position_ids`` without a plan. Importing this module (``exactpack.hf`` does as soon
as ``transformers`` loads) registers all three names::

    import exactpack.hf.attention_impl  # registers "exactpack_varlen", "exactpack_tree", ...
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="exactpack_varlen")
    out = model(**hf_inputs(batch, "exactpack_varlen", config=model.config))
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from exactpack.core.errors import InvalidInput, NotAvailable
from exactpack.hf.kinds import TREE, TREE_NAMES, VARLEN
from exactpack.nn.tree_attention import tree_flash_attention
from exactpack.nn.varlen import PathPlan, as_tokens, path_attention, segment_plan

#: Plans of the last few ``cu_seq_lens_q`` tensors (one per forward, shared by every layer).
_PLANS: OrderedDict[int, tuple[weakref.ref, PathPlan]] = OrderedDict()
_PLAN_CACHE_SIZE = 8


def plan_of(cu_seqlens: torch.Tensor, tokens: int) -> PathPlan:
    """The varlen plan of ``cu_seqlens`` over ``tokens`` flattened cells, cached per tensor."""
    key = id(cu_seqlens)
    hit = _PLANS.get(key)
    if hit is not None and hit[0]() is cu_seqlens:
        _PLANS.move_to_end(key)
        return hit[1]
    cu = cu_seqlens.detach().cpu().numpy().astype(np.int64)
    if cu.ndim != 1 or cu.size < 1 or cu[0] != 0 or cu[-1] != tokens or (np.diff(cu) < 0).any():
        raise InvalidInput(
            f"cu_seq_lens_q {cu.tolist()[:8]}... does not split the {tokens} flattened tokens"
            " into examples — build the inputs with hf_inputs(batch, 'exactpack_varlen')"
        )
    lengths = np.diff(cu)
    keep = lengths > 0
    plan = segment_plan(cu[:-1][keep], lengths[keep], tokens, cu_seqlens.device)
    _PLANS[key] = (weakref.ref(cu_seqlens), plan)
    while len(_PLANS) > _PLAN_CACHE_SIZE:
        _PLANS.popitem(last=False)
    return plan


def layer_sliding_window(module: Any, passed: int | None) -> int | None:
    """The window of ``module``'s layer by its capability (checked for ``exactpack_varlen``);
    must agree with ``passed``."""
    from exactpack.hf.capabilities import capability_once

    config = getattr(module, "config", None)
    if config is None:
        return passed
    arch = capability_once(config).check(VARLEN)
    window = arch.layer_sliding_window(getattr(module, "layer_idx", None))
    if passed is not None and passed != window:
        raise InvalidInput(
            f"{type(module).__name__} (layer {getattr(module, 'layer_idx', '?')}) passes"
            f" sliding_window={passed} but its config gives {window}; exactpack follows the config"
            " and will not guess — report this architecture"
        )
    return window


def exactpack_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    s_aux: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``query`` (B, H, S, D), ``key``/``value`` (B, Hkv, S, D) -> ``(B, S, H, Dv)``, no
    weights, under the plan of the call (module docstring): the tree's (the keyword
    ``exactpack_tree``), ``cu_seq_lens_q``'s (one flattened row, B = 1), or one example a
    row."""
    name = type(module).__name__
    plan = kwargs.get(TREE)
    impl = getattr(getattr(module, "config", None), "_attn_implementation", None)
    if impl not in (VARLEN, *TREE_NAMES):  # the name the model runs under
        impl = VARLEN if plan is None else TREE
    feed = f"hf_inputs(batch, '{impl}', config=model.config)"
    refuse_unexpressible(impl, name, softcap, s_aux, f" with {feed}")
    refuse_mask(impl, name, attention_mask, feed)
    rows, _, width, _ = query.shape
    cu = kwargs.get("cu_seq_lens_q")
    if plan is None and cu is None:  # one example a row (e.g. a sequence run alone)
        check_unpacked(kwargs.get("position_ids"), name)
        cu = torch.arange(0, rows * width + 1, width, dtype=torch.int32)
    elif plan is None and rows != 1:
        raise InvalidInput(
            f"{VARLEN} takes cu_seq_lens_q with the flattened packed row (a batch of 1), got a"
            f" batch of {rows} — feed the model {feed}"
        )
    plan = plan_of(cu, rows * width) if plan is None else plan
    if not isinstance(plan, PathPlan) or rows * width != plan.cells:
        raise InvalidInput(
            f"{impl}: {name} got a plan that is not this call's — feed the model {feed}"
        )
    run = tree_flash_attention if plan.flash else path_attention
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    window = layer_sliding_window(module, sliding_window)
    q, k, v = (as_tokens(x) for x in (query, key, value))  # (B*S, H, D)
    out = run(q, k, v, plan, scale, window, dropout=dropout if module.training else 0.0)
    return out.view(rows, width, *out.shape[1:]), None  # (B, S, H, Dv), no weights


def refuse_unexpressible(impl: str, name: str, softcap: Any, s_aux: Any, hint: str) -> None:
    """Refuse attention-logit soft-capping (Gemma 2) and sinks (GPT-OSS): SDPA has neither."""
    if softcap is not None:
        raise NotAvailable(
            f"{impl}: {name} soft-caps its attention logits (softcap={softcap}), which SDPA"
            f" cannot express — use attn_implementation='eager'{hint} (or set"
            " attn_logit_softcapping=None)"
        )
    if s_aux is not None:
        raise NotAvailable(
            f"{impl}: {name} has attention sinks, which SDPA cannot express —"
            f" use attn_implementation='eager'{hint}"
        )


def _hides_no_key(mask: torch.Tensor) -> bool:
    """True for a 2-D padding mask whose zeros all follow a row's ones: none (what tokenizers
    and pipelines pass), or right padding, which no real query reaches under causal attention."""
    if mask.dim() != 2:
        return False
    keep = mask != 0
    return not bool((keep[:, 1:] & ~keep[:, :-1]).any())


def refuse_mask(impl: str, name: str, attention_mask: Any, feed: str) -> None:
    """Refuse an ``attention_mask`` that hides a key from a real query: left padding
    (generation, a padded eval) or a model's own bias. These kinds see only the packing's
    boundaries, so a mask they ran without would give wrong logits with no error."""
    if attention_mask is None or (
        isinstance(attention_mask, torch.Tensor) and _hides_no_key(attention_mask)
    ):
        return
    shape = tuple(getattr(attention_mask, "shape", ()))
    raise NotAvailable(
        f"{impl}: {name} got an attention_mask of shape {shape} that hides keys (a left-padded"
        f" batch, or the model's own bias), which {impl} cannot apply — run padded batches on"
        f" sdpa or eager (model.set_attn_implementation('sdpa')); packed rows need no mask:"
        f" {feed}"
    )


def padding_mask(
    *args: Any, attention_mask: torch.Tensor | None = None, **kwargs: Any
) -> torch.Tensor | None:
    """``transformers``' mask function for exactpack's kinds: the caller's 2-D padding mask
    when it hides a key from a real query (so the attention sees it and refuses it), else
    None. Without a registered mask function ``transformers`` drops the padding mask before
    attention, and a left-padded batch would run as if unpadded. (transformers passes every
    argument by keyword; only ``attention_mask`` is read.)"""
    if attention_mask is None or _hides_no_key(attention_mask):
        return None
    return attention_mask


def check_unpacked(position_ids: torch.Tensor | None, name: str) -> None:
    """Refuse rows whose ``position_ids`` restart (packed) when no ``cu_seq_lens_q`` came."""
    if position_ids is None:
        return
    steps = torch.arange(position_ids.shape[-1], device=position_ids.device)
    if not bool((position_ids == position_ids[..., :1] + steps).all()):
        raise InvalidInput(
            f"{VARLEN}: {name} got packed position_ids (they restart inside a row) but no"
            f" cu_seq_lens_q, so the examples would be joined — build the inputs with"
            f" hf_inputs(batch, '{VARLEN}', config=model.config); if you did, this model's"
            " layers drop the attention kwargs before attention: use sdpa or eager for it"
        )


def register() -> None:
    """Register :func:`exactpack_attention` as ``exactpack_varlen``, ``exactpack_tree`` and
    ``exactpack_tree_varlen`` with ``transformers.AttentionInterface``, each with
    :func:`padding_mask` in ``AttentionMaskInterface`` (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    for name in (VARLEN, *TREE_NAMES):
        AttentionInterface.register(name, exactpack_attention)
        AttentionMaskInterface.register(name, padding_mask)


register()
