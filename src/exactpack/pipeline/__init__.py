"""The packing pipeline: read -> plan -> materialise -> write, on one machine: ``options``
(:class:`PackOptions`), ``budget``, ``local`` (:func:`pack_path`, :func:`pack_table`),
``stats`` (:func:`stats_path`), ``progress``. Names are loaded on first use (pyarrow).
"""

from __future__ import annotations

from exactpack._lazy import lazy_exports

_MODULES = {
    "options": ["PackOptions", "DEFAULT_POLICY", "DEFAULT_ROWS_PER_BATCH"],
    "budget": ["packing_bytes", "check_budget", "model_call_bytes"],
    "local": ["pack_path", "pack_table", "duplicate_ids", "duplicate_report"],
    "stats": ["stats_path", "compare_policies", "example_lengths", "plot_stats"],
}
_NAMES = {name: module for module, names in _MODULES.items() for name in names}

__getattr__, __dir__ = lazy_exports(__name__, _NAMES)
