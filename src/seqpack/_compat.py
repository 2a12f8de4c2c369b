"""The module paths of seqpack 0.1 (a flat package), importable for one more release.

``import seqpack.batch`` now gives :mod:`seqpack.core.batch` itself (the same
module object, so ``isinstance`` checks and monkeypatches keep working) and
a :class:`DeprecationWarning` naming the new path. The aliases go away in
seqpack 0.3.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

#: Old module path -> where it lives now.
MOVED = {
    "seqpack.errors": "seqpack.core.errors",
    "seqpack.examples": "seqpack.core.examples",
    "seqpack.policies": "seqpack.core.policies",
    "seqpack.stream_packer": "seqpack.core.stream_packer",
    "seqpack.batch": "seqpack.core.batch",
    "seqpack.compact": "seqpack.core.compact",
    "seqpack.permission": "seqpack.core.permission",
    "seqpack.budget": "seqpack.core.budget",
    "seqpack.counts": "seqpack.core.counts",
    "seqpack.loss": "seqpack.core.loss",
    "seqpack.tokenizers": "seqpack.io.tokenizers",
    "seqpack.jsonl": "seqpack.io.jsonl",
    "seqpack.store": "seqpack.io.store",
    "seqpack.atomic": "seqpack.io.atomic",
    "seqpack.training.hf": "seqpack.hf.adapter",
    "seqpack.nn.hf_verify": "seqpack.hf.verify",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path and loads the module that now lives at the new one."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}; import it from there (the old path goes away in"
            " seqpack 0.3)",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module was imported at its new path."""


def install() -> None:
    """Put the finder on ``sys.meta_path`` once."""
    if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
        sys.meta_path.append(_MovedModules())
