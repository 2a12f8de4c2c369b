"""``import seqpack.hf`` registers ``"seqpack_varlen"`` without importing ``transformers``.

When ``transformers`` is already imported, :func:`install` registers now;
otherwise a one-shot import hook registers right after
``transformers.modeling_utils`` (which holds ``AttentionInterface``) has run,
so ``from_pretrained(..., attn_implementation="seqpack_varlen")`` finds it
while ``import seqpack.hf`` stays as light as it was.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Any

TARGET = "transformers.modeling_utils"


def _register() -> None:
    from seqpack.hf.attention_impl import register

    register()


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds :data:`TARGET` like the path finder and registers once it has executed."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != TARGET:
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


def install() -> None:
    """Register now if transformers is loaded, else when it loads (idempotent)."""
    if TARGET in sys.modules:
        _register()
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
