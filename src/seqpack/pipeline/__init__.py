"""The packing pipeline: read -> plan -> materialise -> write, on one machine.

=====================  =========================================================
module                 holds
=====================  =========================================================
``options``            :class:`PackOptions`, every option of a packing run, once
``budget``             what packing allocates, checked before allocating
``local``              :func:`pack_path` (``seqpack pack``), :func:`pack_table`, repeated ids
``stats``              :func:`stats_path` (``seqpack stats``), policies compared, figure
``progress``           status lines and progress bars on stderr
=====================  =========================================================

Names are loaded on first use (the package needs pyarrow).
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
