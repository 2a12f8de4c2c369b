"""The module paths of seqpack 0.1 (a flat package), importable for one more release.

``import seqpack.stream_packer`` now gives :mod:`seqpack.core.stream_packer`
itself (the same module object) and a :class:`DeprecationWarning` naming the
new path. Where a 0.1 module was split (``seqpack.store`` into
``seqpack.io.store`` and ``seqpack.io.shards``), the old path gives a module
holding the public names of all the new ones (the same objects, so
``isinstance`` checks keep working). The aliases go away in seqpack 0.3.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

#: Old module path -> the module(s) its names live in now.
MOVED: dict[str, tuple[str, ...]] = {
    "seqpack.errors": ("seqpack.core.errors",),
    "seqpack.examples": ("seqpack.core.examples", "seqpack.core.binding"),
    "seqpack.policies": ("seqpack.core.policies", "seqpack.core.plan", "seqpack.core.errors"),
    "seqpack.stream_packer": ("seqpack.core.stream_packer",),
    "seqpack.batch": ("seqpack.core.batch", "seqpack.core.compact", "seqpack.core.config"),
    "seqpack.compact": ("seqpack.core.compact",),
    "seqpack.permission": ("seqpack.core.permission",),
    "seqpack.budget": ("seqpack.core.config",),
    "seqpack.counts": ("seqpack.core.policies",),
    "seqpack.loss": ("seqpack.core.loss",),
    "seqpack.tokenizers": ("seqpack.io.tokenizers",),
    "seqpack.jsonl": ("seqpack.io.jsonl",),
    "seqpack.store": ("seqpack.io.store", "seqpack.io.shards"),
    "seqpack.atomic": ("seqpack.io.atomic",),
    "seqpack.training.hf": ("seqpack.hf.adapter", "seqpack.hf.collator"),
    "seqpack.nn.hf_verify": ("seqpack.verify.models", "seqpack.verify.layouts"),
    "seqpack.core.trie": ("seqpack.core.tree",),
    "seqpack.core.tree_input": ("seqpack.core.tree",),
    "seqpack.hf.tree_data": ("seqpack.hf.tree_inputs",),
    "seqpack.io.tree_files": ("seqpack.io.tree_store", "seqpack.pipeline.pack_tree"),
    "seqpack.io.tree_rows": ("seqpack.io.tree_store",),
    "seqpack.pipeline.tree_options": ("seqpack.pipeline.pack_tree",),
    "seqpack.hf.preflight": ("seqpack.hf.capability",),
    "seqpack.core.arith": ("seqpack.core.config",),
    "seqpack.core.arguments": ("seqpack.core.errors",),
    "seqpack.core.checks": ("seqpack.core.errors",),
    "seqpack.core.counts": ("seqpack.core.policies",),
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
            f"{spec.name} moved to {' and '.join(new)}; import it from there (the old path"
            " goes away in seqpack 0.3)",
            DeprecationWarning,
            stacklevel=2,
        )
        modules = [importlib.import_module(name) for name in new]
        if len(modules) == 1:
            return modules[0]
        merged = ModuleType(spec.name, modules[0].__doc__)
        for module in reversed(modules):  # the first module's names win
            public = {k: v for k, v in vars(module).items() if not k.startswith("_")}
            vars(merged).update(public)
        return merged

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module was imported at its new path."""


def install() -> None:
    """Put the finder on ``sys.meta_path`` once."""
    if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
        sys.meta_path.append(_MovedModules())
