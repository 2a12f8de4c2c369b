"""Hugging Face: ``datasets`` in and out, the ``transformers`` adapter, verification.

=====================  =========================================================
module                 holds
=====================  =========================================================
``data``               :func:`pack_dataset`, :func:`unpack_dataset`, :func:`to_batches`
``adapter``            :func:`hf_inputs`: the kwargs that keep examples apart
``collator``           :class:`HFCollator` for ``transformers.Trainer``
``verify``             ``seqpack verify``: packed == separate on a real model
=====================  =========================================================

Names are loaded on first use; ``import seqpack.hf`` itself imports nothing heavy.
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
    "hf_loss": "adapter",
    "hf_loss_sum": "adapter",
    "cell_logits": "adapter",
    "HFCollator": "collator",
}
__all__ = sorted(_NAMES)

__getattr__, __dir__ = lazy_exports(__name__, _NAMES)
