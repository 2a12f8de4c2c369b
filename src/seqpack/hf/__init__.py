"""Hugging Face: ``datasets`` in and out, the ``transformers`` adapter, verification.

=====================  =========================================================
module                 holds
=====================  =========================================================
``data``               :func:`pack_dataset`, :func:`unpack_dataset`, :func:`to_batches`
``adapter``            :func:`hf_inputs`: the kwargs that keep examples apart
``architectures``      windows, layer types and refusals derived from a model config
``masks``              the 4-D masks (float, bool, BlockMask), per layer type
``kinds``              attention implementations by kind (flash, sdpa, eager, flex ...)
``attention``          ``attn_implementation="seqpack_varlen"`` (registered on import)
``collator``           :class:`HFCollator` for ``transformers.Trainer``
``trl``                :func:`load_trl`, :class:`per_example`: TRL-format rows in
                       TRL / ``transformers`` scripts
``verify``             ``seqpack verify``: packed == separate on a real model
                       (with ``loading``, ``tolerance``, ``diagnose``)
=====================  =========================================================

Names are loaded on first use; ``import seqpack.hf`` itself imports nothing heavy,
and registers ``attn_implementation="seqpack_varlen"`` with ``transformers`` (now if it
is loaded, else as soon as it is: :mod:`seqpack.hf._register`).
"""

from __future__ import annotations

from seqpack._lazy import lazy_exports

_NAMES = {
    "META_KEY": "data",
    "pack_dataset": "data",
    "packed_metadata": "data",
    "packed_rows": "data",
    "to_batches": "data",
    "unpack_dataset": "data",
    "hf_inputs": "adapter",
    "hf_labels": "adapter",
    "model_labels": "adapter",
    "shift_labels": "adapter",
    "attention_kind": "kinds",
    "hf_loss": "adapter",
    "hf_loss_sum": "adapter",
    "cell_logits": "adapter",
    "HFCollator": "collator",
    "load_trl": "trl",
    "per_example": "trl",
    "split_rows": "trl",
    "Architecture": "architectures",
    "capability": "capability",
    "UnsupportedArchitecture": "architectures",
    "describe": "architectures",
    "register_attention": "attention",
    "load_model": "verify",
    "verify_hf": "verify",
}
__all__ = sorted(_NAMES)

__getattr__, __dir__ = lazy_exports(__name__, _NAMES)

from seqpack.hf._register import install as _install  # noqa: E402

_install()
