"""Attention implementations by kind: what :func:`seqpack.hf.hf_inputs` feeds each one.

``transformers`` accepts any implementation registered in its
``AttentionInterface`` (and hub kernel names such as
``"kernels-community/flash-attn2"``, registered when a model loads them).
seqpack does not need the name, only what the implementation reads, its
**kind**:

================  ============================================================
kind              inputs
================  ============================================================
``flash``         valid cells flattened to ``(1, N)``, ``cu_seq_lens_q/k``,
                  ``max_length_q/k``, ``seq_idx``; no mask (the layer applies
                  its own window): ``flash_attention_2/3/4``, flash hub kernels
``seqpack_varlen``  the same inputs, run by :mod:`seqpack.hf.attention_impl`
``sdpa``          ``(R, T)`` rows and a 4-D mask (float additive, or bool)
``eager``         ``(R, T)`` rows and a float additive 4-D mask
``flex``          ``(R, T)`` rows and a FlexAttention ``BlockMask``
================  ============================================================

A name's kind is found without loading or downloading anything: the
built-in names; a registered implementation whose function is a built-in's,
or whose ``AttentionMaskInterface`` entry is a built-in mask function (that
is how ``transformers`` registers a hub kernel, and how a custom
implementation says which mask it reads); a hub name of a flash-attention
kernel repository ``transformers`` knows. Anything else is refused with
the accepted kinds, unless the caller states ``kind=`` itself.
``"paged|..."`` implementations serve generation with a paged cache, not
training, and are refused.
"""

from __future__ import annotations

import re
from typing import Any

from seqpack.core.errors import InvalidInput

FLASH, VARLEN, SDPA, EAGER, FLEX = "flash", "seqpack_varlen", "sdpa", "eager", "flex"
#: Every kind, and the ones fed the flattened valid cells (no mask).
KINDS = (FLASH, VARLEN, SDPA, EAGER, FLEX)
FLATTENED_KINDS = (FLASH, VARLEN)
#: Kinds that read a mask seqpack builds, so a model's windows must be known to it.
MASK_KINDS = (SDPA, EAGER, FLEX)

BUILTIN = {
    "eager": EAGER,
    "sdpa": SDPA,
    "flex_attention": FLEX,
    "flash_attention_2": FLASH,
    "flash_attention_3": FLASH,
    "flash_attention_4": FLASH,
    "seqpack_varlen": VARLEN,
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
    "seqpack feeds attention implementations by kind: flash (cu_seq_lens, e.g."
    " flash_attention_2 or kernels-community/flash-attn2), seqpack_varlen, sdpa, eager,"
    " flex (flex_attention)"
)


def _builtin_kind(function: Any) -> str | None:
    """The kind of a built-in ``transformers`` attention function object, if it is one."""
    from transformers.modeling_utils import AttentionInterface

    for name, builtin in AttentionInterface._global_mapping.items():
        if function is builtin and name in BUILTIN:
            return BUILTIN[name]
    return None


def _mask_kind(name: str) -> str | None:
    """The kind whose mask ``AttentionMaskInterface`` builds for ``name``, if one is registered."""
    from transformers.masking_utils import AttentionMaskInterface

    function = AttentionMaskInterface._global_mapping.get(name)
    if function is None:
        return None
    return MASK_FUNCTION_KINDS.get(getattr(function, "__name__", ""))


def _hub_flash_repos() -> set[str]:
    """Hub repositories ``transformers`` loads as flash-attention (varlen) kernels."""
    from transformers import modeling_flash_attention_utils as fa

    return set(fa.FLASH_ATTN_KERNEL_VERSIONS) | set(fa.FLASH_ATTN_KERNEL_FALLBACK.values())


def derived_kind(name: str) -> str | None:
    """The kind of ``name`` found from ``transformers``' registries (no download), or None."""
    if name in BUILTIN:
        return BUILTIN[name]
    from transformers.modeling_utils import AttentionInterface

    function = AttentionInterface._global_mapping.get(name)
    if function is not None:
        return _builtin_kind(function) or _mask_kind(name)
    if HUB_NAME.match(name) and ":" not in name:
        repo = name.partition("@")[0].strip()
        return FLASH if repo in _hub_flash_repos() else None
    return None


def _why_unknown(name: str) -> str:
    from transformers.modeling_utils import AttentionInterface

    if name in AttentionInterface._global_mapping:
        return "registered in AttentionInterface, but with no mask function it is known to read"
    if HUB_NAME.match(name):
        return "a hub kernel that is not a flash-attention repository transformers knows"
    return "not registered in transformers' AttentionInterface"


def attention_kind(attn_implementation: str, kind: str | None = None) -> str:
    """The kind (one of :data:`KINDS`) of ``attn_implementation``, or a clear error.

    ``kind`` states it for an implementation seqpack cannot classify (a custom
    function registered without a mask function); it must agree with the
    derived kind where there is one::

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
        raise InvalidInput(
            f"attention implementation {attn_implementation!r} is of no kind seqpack knows"
            f" ({_why_unknown(attn_implementation)}); {_HELP} — pass kind=..., or register its"
            " mask function with transformers' AttentionMaskInterface"
        )
    return found or kind


__all__ = [
    "BUILTIN",
    "EAGER",
    "FLASH",
    "FLATTENED_KINDS",
    "FLEX",
    "KINDS",
    "MASK_KINDS",
    "SDPA",
    "VARLEN",
    "attention_kind",
    "derived_kind",
]
