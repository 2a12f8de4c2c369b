"""Attention implementations by kind: what :func:`exactpack.hf.hf_inputs` feeds each one.

An implementation's **kind** is what it reads: ``flash`` (valid cells flattened to
``(1, N)``, ``cu_seq_lens_q/k``, ``max_length_q/k``, ``seq_idx``, no mask),
``exactpack_varlen`` (the same), ``sdpa`` (``(R, T)`` rows, a float or bool 4-D mask),
``eager`` (a float 4-D mask) and ``flex`` (a ``BlockMask``). It is found without a
download: the built-in names, a registered function or mask function of a built-in, or a
hub flash-attention repository ``transformers`` knows; else ``kind=`` must state it.
``"paged|..."`` implementations (generation) are refused.
"""

from __future__ import annotations

import re

from exactpack.core.errors import InvalidInput
from exactpack.core.tree import refuse_flattened

FLASH, VARLEN, SDPA, EAGER, FLEX = "flash", "exactpack_varlen", "sdpa", "eager", "flex"
#: Tree rows' own implementations (:mod:`exactpack.hf.attention_impl`): the tree plan as a
#: keyword, SDPA per node / a varlen kernel per path ("flash" in a name goes to the hub).
TREE, TREE_VARLEN = "exactpack_tree", "exactpack_tree_varlen"
TREE_NAMES = (TREE, TREE_VARLEN)
#: Every kind, and the ones fed the flattened valid cells (no mask).
KINDS = (FLASH, VARLEN, SDPA, EAGER, FLEX)
FLATTENED_KINDS = (FLASH, VARLEN)
#: Kinds that read a mask exactpack builds, so a model's windows must be known to it.
MASK_KINDS = (SDPA, EAGER, FLEX)

BUILTIN = {
    "eager": EAGER,
    "sdpa": SDPA,
    "flex_attention": FLEX,
    "exactpack_varlen": VARLEN,
    **{f"flash_attention_{v}": FLASH for v in (2, 3, 4)},
}
#: ``transformers``' mask function names (``masking_utils``) -> the kind that reads that mask.
MASK_FUNCTION_KINDS = {
    "sdpa_mask": SDPA,
    "eager_mask": EAGER,
    "flash_attention_mask": FLASH,
    "flex_attention_mask": FLEX,
}
#: ``transformers.integrations.hub_kernels.is_kernel``'s pattern: ``org/repo[@rev][:function]``.
HUB_NAME = re.compile(r"^[^/:|]+/[^/:]+(?:@[^/:]+)?(?::[^/:]+)?$")

_HELP = (
    "exactpack feeds attention implementations by kind: flash (cu_seq_lens, e.g."
    " flash_attention_2 or kernels-community/flash-attn2), exactpack_varlen, sdpa, eager,"
    " flex (flex_attention)"
)


def derived_kind(name: str) -> str | None:
    """The kind of ``name`` found from ``transformers``' registries (no download), or None."""
    if name in BUILTIN:
        return BUILTIN[name]
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    registered = AttentionInterface._global_mapping
    function = registered.get(name)
    if function is not None:  # a built-in's function, or a built-in mask function
        same = [BUILTIN[n] for n, f in registered.items() if f is function and n in BUILTIN]
        mask = getattr(AttentionMaskInterface._global_mapping.get(name), "__name__", "")
        return same[0] if same else MASK_FUNCTION_KINDS.get(mask)
    if HUB_NAME.match(name) and ":" not in name:
        from transformers import modeling_flash_attention_utils as fa

        repos = set(fa.FLASH_ATTN_KERNEL_VERSIONS) | set(fa.FLASH_ATTN_KERNEL_FALLBACK.values())
        return FLASH if name.partition("@")[0].strip() in repos else None
    return None


def attention_kind(attn_implementation: str, kind: str | None = None) -> str:
    """The kind (one of :data:`KINDS`) of ``attn_implementation``, or a clear error;
    ``kind`` states it where exactpack cannot tell and must agree where it can::

        attention_kind("sdpa") == "sdpa"
        attention_kind("kernels-community/flash-attn2") == "flash"   # nothing downloaded
    """
    if not isinstance(attn_implementation, str) or not attn_implementation:
        raise InvalidInput(f"attn_implementation must be a name, got {attn_implementation!r}")
    if kind is not None and kind not in KINDS:
        raise InvalidInput(f"kind={kind!r} is not one of {', '.join(KINDS)}")
    if attn_implementation.startswith("paged|"):
        raise InvalidInput(
            f"attention implementation {attn_implementation!r} serves generation with a paged"
            f" cache, not packed training; {_HELP}"
        )
    found = derived_kind(attn_implementation)
    if found is not None and kind is not None and kind != found:
        raise InvalidInput(
            f"attention implementation {attn_implementation!r} is of kind {found!r}"
            f" (from transformers' registries), not kind={kind!r}"
        )
    if found is None and kind is None:
        from transformers.modeling_utils import AttentionInterface

        if attn_implementation in AttentionInterface._global_mapping:
            why = "registered in AttentionInterface, but with no mask function it is known to read"
        elif HUB_NAME.match(attn_implementation):
            why = "a hub kernel that is not a flash-attention repository transformers knows"
        else:
            why = "not registered in transformers' AttentionInterface"
        raise InvalidInput(
            f"attention implementation {attn_implementation!r} is of no kind exactpack knows"
            f" ({why}); {_HELP} — pass kind=..., or register its"
            " mask function with transformers' AttentionMaskInterface"
        )
    return found or kind


def tree_kind(attn_implementation: str, kind: str | None = None) -> str:
    """The kind the capability check judges ``attn_implementation`` by on tree rows, and the
    one check that refuses a batch with parents to the flattened kinds (``cu_seqlens``
    cannot say "ancestor"): :data:`TREE_NAMES` are ``exactpack_varlen``'s (the plan rides
    the same attention kwargs)."""
    if attn_implementation in TREE_NAMES:
        return VARLEN
    kind = attention_kind(attn_implementation, kind)
    if kind in FLATTENED_KINDS:
        fix = f"use attn_implementation='{TREE}', 'sdpa', 'eager' or 'flex_attention'"
        refuse_flattened(attn_implementation, fix)
    return kind
