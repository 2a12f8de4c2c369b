"""The packing pipeline: read -> plan -> materialise -> write, on one machine: ``options``
(:class:`PackOptions`), ``budget``, ``local`` (:func:`pack_path`, :func:`pack_table`),
``stats`` (:func:`stats_path`), ``progress``. Names are loaded on first use (pyarrow).
"""

from __future__ import annotations

from exactpack._lazy import lazy_exports

_MODULES = {"local": ["pack_path", "pack_table"], "stats": ["stats_path", "plot_stats"]}
_NAMES = {name: module for module, names in _MODULES.items() for name in names}

__getattr__, __dir__ = lazy_exports(__name__, _NAMES)
