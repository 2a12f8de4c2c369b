"""The packing pipeline: read -> plan -> materialise -> write, on one machine: ``options``
(:class:`PackOptions`), ``budget``, ``local`` (:func:`pack_path`, :func:`pack_table`),
``stats`` (:func:`stats_path`), ``progress``. Names are loaded on first use (pyarrow).
"""

from __future__ import annotations

from seqpack._lazy import lazy_exports

_NAMES = {
    "PackOptions": "options",
    "DEFAULT_POLICY": "options",
    "DEFAULT_ROWS_PER_BATCH": "options",
    "packing_bytes": "budget",
    "check_budget": "budget",
    "model_call_bytes": "budget",
    "pack_path": "local",
    "pack_table": "local",
    "stats_path": "stats",
    "compare_policies": "stats",
    "example_lengths": "stats",
    "plot_stats": "stats",
    "duplicate_ids": "local",
    "duplicate_report": "local",
}

__getattr__, __dir__ = lazy_exports(__name__, _NAMES)
