"""What a packing run allocates, computed and checked before anything is allocated.

:func:`packing_bytes` bounds what :func:`seqpack.pipeline.local.pack_table`
allocates for a table, per policy; :func:`check_budget` adds one padded
model call and compares the sum with ``--max-metadata-bytes``.
"""

from __future__ import annotations

from seqpack.core import budget
from seqpack.core.config import PackConfig
from seqpack.core.examples import ExampleTable
from seqpack.pipeline.options import DEFAULT_POLICY

#: Bytes per example, per capacity unit, and whether the windows may be gathered
#: into a new order, for each policy: upper bounds of what tracemalloc measures
#: (next-fit 33-48 bytes an example, the decreasing policies 80-87 plus their
#: capacity index; tests/test_stress.py holds them to it).
_POLICY_BYTES: dict[str, tuple[int, int, bool]] = {
    "next-fit": (64, 0, False),
    "padded": (64, 0, False),
    "first-fit-decreasing": (128, 16, True),
    "best-fit-decreasing": (128, 72, True),
    "stream-best-fit": (128, 128, True),
}
#: Fixed slack: Python objects, kernels' scalars, small temporaries.
_FIXED_BYTES = 1 << 20


def packing_bytes(table: ExampleTable, capacity: int, policy: str = DEFAULT_POLICY) -> int:
    """Upper bound of the bytes :func:`pack_table` allocates, computed before allocating.

    Plan and per-occurrence arrays (per example), the policy's index over
    capacities, and, for policies that reorder, one gathered copy of the
    windows (4 bytes a token) and of non-uniform loss flags (1 byte a target).
    The stream policy's look-ahead buffers are covered for its default window.
    """
    per_example, per_capacity, gathers = _POLICY_BYTES.get(policy, (128, 128, True))
    n, tokens, flags = len(table), table.windows.shape[0], table.loss_mask
    need = budget.checked_add(
        budget.checked_mul(n, per_example),
        budget.checked_mul(capacity, per_capacity),
        _FIXED_BYTES,
    )
    if gathers:
        uniform = flags.size == 0 or bool(flags.all()) or not bool(flags.any())
        need = budget.checked_add(
            need, budget.checked_mul(tokens, 4), 0 if uniform else int(flags.shape[0])
        )
    return need


def model_call_bytes(config: PackConfig) -> int:
    """Bytes of one padded model call (:class:`~seqpack.PackedBatch` cells) when read back."""
    cells = budget.checked_mul(config.max_rows_per_batch, config.capacity)
    return budget.checked_mul(cells, budget.CELL_BYTES)


def check_budget(
    table: ExampleTable,
    config: PackConfig,
    policy: str,
    limit: int | None,
    where: str = "",
    fix: str = "pack fewer examples per call",
) -> None:
    """Raise :class:`~seqpack.core.errors.BudgetExceeded` before planning when packing ``table``
    (:func:`packing_bytes`) plus one model call (:func:`model_call_bytes`) needs more
    than ``limit`` bytes; ``where`` prefixes the message, ``fix`` ends it. No-op without a limit.
    """
    if limit is None:
        return
    need = budget.checked_add(
        packing_bytes(table, config.capacity, policy), model_call_bytes(config)
    )
    what = (
        f"{where}packing {len(table):,} examples with {policy} (plus one model call of"
        f" {config.max_rows_per_batch} x {config.capacity:,} cells)"
    )
    budget.enforce(need, limit, what, fix)
