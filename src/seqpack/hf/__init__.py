"""Hugging Face: ``datasets`` in and out, the ``transformers`` adapter and collators.

``datasets_io`` (:func:`pack_dataset`, :func:`unpack_dataset`, :func:`to_batches`),
``streaming`` (a stream packed as it is read), ``adapter`` (:func:`hf_inputs`),
``architectures`` / ``capability`` / ``kinds`` (what a config can be made exact for),
``masks`` (the 4-D masks), ``attention_impl`` (``attn_implementation="seqpack_varlen"``),
``collator`` (:class:`HFCollator`), ``trl_training`` (:func:`load_trl`,
:class:`per_example`), ``tree_inputs`` (tree packing). Names load on first use;
``import seqpack.hf`` imports neither ``transformers`` nor ``datasets``, and registers
``seqpack_varlen`` as soon as ``transformers`` loads (:mod:`seqpack.hf._register`).
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
