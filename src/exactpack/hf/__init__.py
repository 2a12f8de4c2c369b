"""Hugging Face: ``datasets`` in and out, the ``transformers`` adapter and collators.

Names load on first use: ``import exactpack.hf`` imports neither ``transformers`` nor
``datasets``, and registers ``exactpack_varlen``, ``exactpack_tree`` and
``exactpack_tree_varlen`` (:mod:`exactpack.hf.attention_impl`) as soon as ``transformers``
loads.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Any

from exactpack._lazy import lazy_exports

#: Submodule -> the names it exports here.
_BY_MODULE = {
    "datasets_io": "META_KEY pack_dataset packed_metadata packed_rows to_batches unpack_dataset",
    "adapter": "hf_inputs model_labels shift_labels hf_loss hf_loss_sum cell_logits",
    "kinds": "attention_kind",
    "collator": "HFCollator",
    "trl_training": "load_trl per_example split_rows",
    "architectures": "Architecture UnsupportedArchitecture describe",
    "capabilities": "capability",
    "attention_impl": "register_attention",
    "mixers": "restart_mixers",
}
_NAMES = {name: mod for mod, names in _BY_MODULE.items() for name in names.split()}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = lazy_exports(__name__, _NAMES)

#: Holds ``AttentionInterface``: exactpack's implementations are registered right after it has run.
_TARGET = "transformers.modeling_utils"


def _register() -> None:
    from exactpack.hf.attention_impl import register

    register()


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds :data:`_TARGET` like the path finder and registers exactpack's attention
    implementations once it has executed."""

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
