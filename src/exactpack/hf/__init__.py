"""Hugging Face: ``datasets`` in and out, the ``transformers`` adapter and collators.

Names load on first use: ``import exactpack.hf`` imports neither ``transformers`` nor
``datasets``, and registers ``exactpack_varlen``, ``exactpack_tree`` and
``exactpack_tree_varlen`` (:mod:`exactpack.hf.attention_impl`) as soon as ``transformers``
loads, and adds :class:`CheckBatches` (:mod:`exactpack.hf.batch_check`) to every
``Trainer``'s callbacks as soon as ``transformers.trainer`` loads.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Any

from exactpack._lazy import lazy_exports

#: Submodule -> the names it exports here.
_BY_MODULE = {
    "datasets_io": "pack_dataset packed_metadata to_batches unpack_dataset",
    "adapter": "hf_inputs hf_loss",
    "collator": "HFInputs collator_for hf_collator",
    "trl_training": "load_trl per_example",
    "architectures": "UnsupportedArchitecture",
    "capabilities": "capability",
    "mixers": "restart_mixers",
    "batch_check": "check_batch CheckBatches",
}
_NAMES = {name: mod for mod, names in _BY_MODULE.items() for name in names.split()}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = lazy_exports(__name__, _NAMES)


def _register() -> None:
    from exactpack.hf.attention_impl import register

    register()


def _add_check() -> None:
    from exactpack.hf.batch_check import add_to_trainer_defaults

    add_to_trainer_defaults()


#: What runs right after a transformers module has executed: exactpack's attention
#: implementations once ``AttentionInterface`` exists, the first-batch check
#: (:class:`~exactpack.hf.batch_check.CheckBatches`) in ``Trainer``'s default callbacks.
_AFTER = {"transformers.modeling_utils": _register, "transformers.trainer": _add_check}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds the modules of :data:`_AFTER` like the path finder and runs each one's hook
    once it has executed."""

    def __init__(self, pending: dict[str, Any]) -> None:
        self.pending = pending

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        hook = self.pending.pop(name, None)
        if hook is None:
            return None
        if not self.pending and self in sys.meta_path:
            sys.meta_path.remove(self)  # done
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            hook()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _install() -> None:
    """Run each hook now if its module is loaded, else when it loads (idempotent)."""
    if any(isinstance(f, _AfterImport) for f in sys.meta_path):
        return
    pending = {}
    for name, hook in _AFTER.items():
        if name in sys.modules:
            hook()
        else:
            pending[name] = hook
    if pending:
        sys.meta_path.insert(0, _AfterImport(pending))


_install()
