"""Arguments of the training API checked at the border, before anything is allocated: one
InvalidInput (BudgetExceeded for a size) naming the argument, the value and the fix."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from seqpack.core.binding import INT32_MAX
from seqpack.core.config import checked_add, checked_mul
from seqpack.core.errors import BudgetExceeded, InvalidInput, positive_int
from seqpack.core.stream_packer import DEFAULT_STATE_BYTES, stream_bytes

#: Documents a stream reads at a time, at most.
MAX_READ_CHUNK = 1 << 20
#: Bytes a closed row waiting for its step holds per cell: its token (int32) and flag.
WAITING_CELL_BYTES = 4 + 1


def bound(need: int, limit: int | None, what: str, fix: str) -> None:
    """Refuse ``need`` bytes over ``limit`` (:class:`BudgetExceeded` naming both and ``fix``)."""
    if limit is not None and need > limit:
        raise BudgetExceeded(
            f"{what} would take {need:,} bytes, over the {limit:,}-byte bound — {fix}"
        )


def default_world() -> tuple[int, int]:
    """(world_size, rank) of an initialised ``torch.distributed`` group, else (1, 0)."""
    try:
        import torch.distributed as dist
    except ImportError:
        return 1, 0
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def check_world(world_size: Any, rank: Any) -> tuple[int, int]:
    """``(world_size, rank)``: the given ones checked (integers, ``0 <= rank < world_size``),
    a missing one from :func:`default_world`."""
    world, rank0 = default_world()
    world = world if world_size is None else positive_int("world_size", world_size, INT32_MAX)
    if rank is None:
        rank = rank0
    elif isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
        raise InvalidInput(f"rank must be an integer, got {rank!r}")
    if not 0 <= rank < world:
        raise InvalidInput(f"rank {rank} outside 0..{world - 1} — pass a rank below world_size")
    return world, int(rank)


def check_flag(name: str, value: Any) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidInput(f"{name} must be True or False, got {value!r}")


def check_source(documents: Any) -> Any:
    """A stream's documents: an iterable (not a text or a mapping) or a function returning one."""
    if callable(documents):
        return documents
    if isinstance(documents, (str, bytes, Mapping)) or not isinstance(documents, Iterable):
        raise InvalidInput(
            f"documents must be an iterable of documents or a function returning one, got"
            f" {type(documents).__name__} — pass a list, a datasets.Dataset or a generator"
            " function"
        )
    return documents


def check_text_field(text_field: Any) -> str:
    if not isinstance(text_field, str) or not text_field:
        raise InvalidInput(f"text_field must be a column name, got {text_field!r}")
    return text_field


def check_stream_memory(capacity: int, window: int, max_open_rows: int, rows_per_step: int) -> None:
    """The packer's buffers and one optimizer step of closed rows within the budget
    (:data:`~seqpack.core.stream_packer.DEFAULT_STATE_BYTES`), before any is allocated."""
    packer = stream_bytes(capacity, window, max_open_rows)
    bound(
        packer,
        DEFAULT_STATE_BYTES,
        f"a stream-best-fit packer (capacity {capacity:,}, window {window:,}, max_open_rows"
        f" {max_open_rows:,})",
        "lower window or max_open_rows",
    )
    step = checked_mul(checked_mul(rows_per_step, capacity), WAITING_CELL_BYTES)
    bound(
        checked_add(packer, step),
        DEFAULT_STATE_BYTES,
        f"one optimizer step of {rows_per_step:,} rows of capacity {capacity:,} held while"
        " it is cut",
        "lower world_size, micro_batches or rows_per_micro_batch",
    )
