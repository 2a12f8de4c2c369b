"""Hugging Face: ``datasets`` in and out, the ``transformers`` adapter and collators.

``datasets_io`` (:func:`pack_dataset`, :func:`unpack_dataset`, :func:`to_batches`),
``streaming`` (a stream packed as it is read), ``adapter`` (:func:`hf_inputs`),
``architectures`` / ``capability`` / ``kinds`` (what a config can be made exact for),
``masks`` (the 4-D masks), ``attention_impl`` (``attn_implementation="seqpack_varlen"``),
``collator`` (:class:`HFCollator`), ``trl_training`` (:func:`load_trl`,
:class:`per_example`), ``tree_inputs`` (tree packing). Names load on first use;
``import seqpack.hf`` imports neither ``transformers`` nor ``datasets``, and registers
``seqpack_varlen`` as soon as ``transformers`` loads (:func:`_install`).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Any

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

#: Holds ``AttentionInterface``: ``seqpack_varlen`` is registered right after it has run.
_TARGET = "transformers.modeling_utils"


def _register() -> None:
    from seqpack.hf.attention_impl import register

    register()


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds :data:`_TARGET` like the path finder and registers once it has executed, so
    ``from_pretrained(..., attn_implementation="seqpack_varlen")`` finds the name while
    ``import seqpack.hf`` stays light."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != _TARGET:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # one shot, and no recursion below
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _register()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _install() -> None:
    """Register now if transformers is loaded, else when it loads (idempotent)."""
    if _TARGET in sys.modules:
        _register()
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


_install()
