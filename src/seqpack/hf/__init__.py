"""Hugging Face: ``datasets`` in and out, the ``transformers`` adapter and collators.

=====================  =========================================================
module                 holds
=====================  =========================================================
``datasets_io``        :func:`pack_dataset`, :func:`unpack_dataset`, :func:`to_batches`
``adapter``            :func:`hf_inputs`: the kwargs that keep examples apart
``architectures``      windows, layer types and refusals derived from a model config
``masks``              the 4-D masks (float, bool, BlockMask), per layer type
``kinds``              attention implementations by kind (flash, sdpa, eager, flex ...)
``attention_impl``     ``attn_implementation="seqpack_varlen"`` (registered on import)
``collator``           :class:`HFCollator` for ``transformers.Trainer``
``trl_training``       :func:`load_trl`, :class:`per_example`: TRL-format rows in
                       TRL / ``transformers`` scripts
=====================  =========================================================

Names are loaded on first use; ``import seqpack.hf`` itself imports nothing heavy,
and registers ``attn_implementation="seqpack_varlen"`` with ``transformers`` (now if it
is loaded, else as soon as it is: :mod:`seqpack.hf._register`).
"""

from __future__ import annotations

from seqpack._lazy import lazy_exports

_NAMES = {
    "META_KEY": "datasets_io",
    "pack_dataset": "datasets_io",
    "packed_metadata": "datasets_io",
    "packed_rows": "datasets_io",
    "to_batches": "datasets_io",
    "unpack_dataset": "datasets_io",
    "hf_inputs": "adapter",
    "hf_labels": "adapter",
    "model_labels": "adapter",
    "shift_labels": "adapter",
    "attention_kind": "kinds",
    "hf_loss": "adapter",
    "hf_loss_sum": "adapter",
    "cell_logits": "adapter",
    "HFCollator": "collator",
    "load_trl": "trl_training",
    "per_example": "trl_training",
    "split_rows": "trl_training",
    "Architecture": "architectures",
    "capability": "capability",
    "UnsupportedArchitecture": "architectures",
    "describe": "architectures",
    "register_attention": "attention_impl",
}
__all__ = sorted(_NAMES)

#: Proof tooling lives in :mod:`seqpack.verify` now.
_MOVED = {"load_model": "seqpack.verify.models", "verify_hf": "seqpack.verify.models"}
__getattr__, __dir__ = lazy_exports(__name__, _NAMES, _MOVED)

from seqpack.hf._register import install as _install  # noqa: E402

_install()
