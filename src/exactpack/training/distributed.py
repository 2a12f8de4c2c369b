"""Deterministic, balanced assignment of packed rows to ranks and micro-batches.

:func:`schedule_rows` gives every rank ``micro_batches`` slots per optimizer step and
every row exactly one slot; a short last step has fewer rows, or explicitly empty slots
(the rank still runs forward/backward). Rows go heaviest first to the least-loaded slot
(load: tokens or ``Σ l²``), ties by slot index. 5 rows, ``world_size=2``,
``micro_batches=1``, ``rows_per_micro_batch=2``::

    step 0: rank 0 <- rows {r_a, r_b}   rank 1 <- rows {r_c, r_d}
    step 1: rank 0 <- rows {r_e}        rank 1 <- {}  (explicitly empty)

:class:`RowSampler` yields one rank's :class:`Slot` objects, each with the eligible count
of its whole step (:mod:`exactpack.training.global_loss`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from exactpack.core.binding import INT32_MAX
from exactpack.core.errors import BudgetExceeded, InvalidInput, positive_int, state_int, state_value
from exactpack.training.balance import CostModel, balanced_groups, greedy_groups

Balance = Literal["tokens", "attention", "none"]
BALANCES = ("tokens", "attention", "none")
#: The most memory a schedule may take (bytes), checked before anything is allocated.
SCHEDULE_BYTES = 1 << 30
#: Bytes per slot: its load (float64) and offset (int64), its row list and heap entry
#: (CPython objects, about 144 bytes together).
SLOT_BYTES = 8 + 8 + 144
#: Bytes per row: its load, order and id (int64 each) and its entry in a slot's list.
ROW_BYTES = 3 * 8 + 40


def check_schedule(rows: int, world_size: Any, micro_batches: Any, per_micro: Any) -> None:
    """:class:`BudgetExceeded` for a schedule over :data:`SCHEDULE_BYTES` (every slot counts,
    even empty), after checking the three sizes (``per_micro``: rows per micro-batch) are
    integers in ``[1, 2**31-1]``."""
    world = positive_int("world_size", world_size, INT32_MAX)
    micro = positive_int("micro_batches", micro_batches, INT32_MAX)
    per = positive_int("rows_per_micro_batch", per_micro, INT32_MAX)
    slots = max(1, -(-int(rows) // (world * micro * per))) * world * micro
    need = slots * SLOT_BYTES + int(rows) * ROW_BYTES
    if need > SCHEDULE_BYTES:
        raise BudgetExceeded(
            f"a schedule of {rows:,} rows over world_size {world:,} x micro_batches {micro:,}"
            f" would take {need:,} bytes, over the {SCHEDULE_BYTES:,}-byte bound — check world_size"
            " and micro_batches (each slot is allocated, even when empty)"
        )


def check_balance(balance: str) -> None:
    if not isinstance(balance, str) or balance not in BALANCES:
        raise InvalidInput(
            f"unknown balance {balance!r}; use one of {', '.join(BALANCES)} or a CostModel"
        )


@dataclass(frozen=True, eq=False)
class StepSchedule:
    """Row ids per slot: ``row_ids`` int64 concatenated in (step, rank, micro) order,
    ``slot_offsets`` int64 [slots + 1] into it; ``loads`` each slot's load."""

    row_ids: np.ndarray
    slot_offsets: np.ndarray
    steps: int
    world_size: int
    micro_batches: int
    loads: np.ndarray  # float64 [steps, world_size, micro_batches]

    def slot(self, step: int, rank: int, micro: int) -> np.ndarray:
        """Row ids of one micro-batch (possibly empty), int64."""
        i = (step * self.world_size + rank) * self.micro_batches + micro
        return self.row_ids[self.slot_offsets[i] : self.slot_offsets[i + 1]]


def schedule_rows(
    loads: np.ndarray,
    *,
    world_size: int,
    micro_batches: int,
    rows_per_micro_batch: int,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
    method: str = "greedy",
) -> StepSchedule:
    """Assign rows (per-row ``loads``, float [n]) to steps, ranks and micro-batches, each
    row once; only the last step may be short (each slot then takes at most
    ``ceil(rows / slots)``). Over :data:`SCHEDULE_BYTES`: refused (:func:`check_schedule`).
    ``method``: ``"greedy"`` (heaviest row to the least-loaded slot) or ``"balanced"``
    (:func:`~exactpack.training.balance.balanced_groups`: Karmarkar–Karp or greedy,
    whichever gives the smaller largest slot)."""
    try:
        loads = np.asarray(loads, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidInput(
            f"loads must be numbers, one per row, got {type(loads).__name__}"
        ) from None
    if loads.ndim != 1:
        raise InvalidInput(f"loads must be one number per row (1-D), got shape {loads.shape}")
    n = loads.shape[0]
    check_schedule(n, world_size, micro_batches, rows_per_micro_batch)
    for name, v in (("seed", seed), ("epoch", epoch)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise InvalidInput(f"{name} must be a non-negative integer, got {v!r}")
    if method not in ("greedy", "balanced"):
        raise InvalidInput(f"unknown method {method!r}; use 'greedy' or 'balanced'")
    order = np.random.default_rng([seed, epoch]).permutation(n) if shuffle else np.arange(n)
    slots_per_step = world_size * micro_batches
    per_step = slots_per_step * rows_per_micro_batch
    steps = -(-n // per_step)
    groups: list[list[int]] = []
    slot_loads = np.zeros((steps, world_size, micro_batches), dtype=np.float64)
    for step in range(steps):
        rows = order[step * per_step : (step + 1) * per_step]
        step_groups, step_loads = _balance_step(
            rows, loads[rows], slots_per_step, rows_per_micro_batch, method
        )
        groups.extend(step_groups)
        slot_loads[step] = step_loads.reshape(world_size, micro_batches)
    offsets = np.r_[0, np.cumsum([len(g) for g in groups], dtype=np.int64)]
    flat = np.array([r for g in groups for r in g], dtype=np.int64)
    return StepSchedule(flat, offsets, steps, world_size, micro_batches, slot_loads)


def _balance_step(
    rows: np.ndarray, loads: np.ndarray, slots: int, per_slot: int, method: str = "greedy"
) -> tuple[list[list[int]], np.ndarray]:
    """Each row (heaviest first, stable) into the open slot of least load (ties: lowest
    index), at most ``min(per_slot, ceil(len(rows) / slots))`` rows a slot."""
    cap = min(per_slot, -(-rows.shape[0] // slots)) if rows.size else 0
    pick = balanced_groups if method == "balanced" else greedy_groups
    picked = pick(loads, slots, cap) if rows.size else [[] for _ in range(slots)]
    totals = [sum((float(loads[i]) for i in g), 0.0) for g in picked]  # in placing order
    return [sorted(int(rows[i]) for i in g) for g in picked], np.array(totals, np.float64)


@dataclass(frozen=True, eq=False)
class RowStats:
    """Per packed row, arrays of shape [rows]: ``tokens`` int64 (valid cells, Σl over its
    segments), ``eligible`` int64 (loss-eligible targets), ``attention`` float64 (Σl²).

    Fixture (rows ``[A A A B B .]`` and ``[C C C C . .]``): tokens ``[5, 4]``,
    eligible ``[5, 4]``, attention ``[3²+2², 4²] = [13, 16]``.
    """

    tokens: np.ndarray
    eligible: np.ndarray
    attention: np.ndarray

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @classmethod
    def from_segments(
        cls, lengths: np.ndarray, row_of: np.ndarray, eligible: np.ndarray
    ) -> RowStats:
        """From per-occurrence ``lengths`` and ``row_of`` (int [k]) and per-row ``eligible``."""
        eligible = np.asarray(eligible, dtype=np.int64)
        row_of, lengths = np.asarray(row_of, np.int64), np.asarray(lengths, np.float64)
        tokens = np.bincount(row_of, lengths, minlength=eligible.shape[0]).astype(np.int64)
        attention = np.bincount(row_of, lengths**2, minlength=eligible.shape[0])
        return cls(tokens=tokens, eligible=eligible, attention=attention)

    @classmethod
    def stacked(cls, parts: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> RowStats:
        """From ``(lengths, row_of, eligible)`` of each group of rows, in row order."""
        empty = (np.zeros(0, np.int64),) * 3
        return cls.from_segments(*map(np.concatenate, zip(empty, *parts, strict=True)))

    @classmethod
    def from_batches(cls, batches: Any) -> RowStats:
        """Rows of ``batches`` (:class:`PackedBatch` objects) numbered consecutively in
        order; a forest row's segments are its nodes and its eligible count ``Σ weights``."""
        parts, first = [], 0
        for batch in batches:
            occ = batch.occurrences
            eligible = batch.loss_mask if batch.weights is None else batch.weights
            parts.append((occ.lengths, occ.row + first, eligible.sum(axis=1, dtype=np.int64)))
            first += batch.shape[0]
        return cls.stacked(parts)

    def costs(self, balance: Balance) -> np.ndarray:
        """Load per row for :func:`schedule_rows`: tokens, attention (Σl²) or none (zeros)."""
        if balance == "tokens":
            return self.tokens.astype(np.float64)
        if balance == "attention":
            return self.attention.copy()
        check_balance(balance)
        return np.zeros(len(self), dtype=np.float64)


def step_eligible_counts(schedule: StepSchedule, eligible: np.ndarray) -> np.ndarray:
    """Eligible targets of every optimizer step over all ranks and micro-batches, int64 [steps]:
    the denominator of the step's token-weighted mean, known before any forward pass."""
    per_step = schedule.world_size * schedule.micro_batches
    cum = np.r_[0, np.cumsum(np.asarray(eligible, dtype=np.int64)[schedule.row_ids])]
    return np.diff(cum[schedule.slot_offsets[::per_step]])  # a step's rows are contiguous


def check_world(world_size: Any, rank: Any) -> tuple[int, int]:
    """``(world_size, rank)``: the given ones checked (integers, ``0 <= rank < world_size``),
    a missing one from an initialised ``torch.distributed`` group (else 1 and 0)."""
    world, rank0 = 1, 0
    try:
        import torch.distributed as dist
    except ImportError:
        dist = None
    if dist is not None and dist.is_available() and dist.is_initialized():
        world, rank0 = dist.get_world_size(), dist.get_rank()
    world = world if world_size is None else positive_int("world_size", world_size, INT32_MAX)
    rank = rank0 if rank is None else rank
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
        raise InvalidInput(f"rank must be an integer, got {rank!r}")
    if not 0 <= rank < world:
        raise InvalidInput(f"rank {rank} outside 0..{world - 1} — pass a rank below world_size")
    return world, int(rank)


def check_flag(name: str, value: Any) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidInput(f"{name} must be True or False, got {value!r}")


def check_saved(
    state: Any, fmt: str, what: str, owner: str, obj: Any, keys: tuple[str, ...]
) -> None:
    """Refuse a saved ``what`` state of another format or whose ``keys`` differ from ``obj``'s."""
    found = state_value(state, "format", what)
    if found != fmt:
        raise InvalidInput(f"not a {what} state (format {found!r})")
    for key in keys:
        if state_value(state, key, what) != getattr(obj, key):
            raise InvalidInput(
                f"{owner} state has {key}={state[key]!r} but this {owner} has"
                f" {getattr(obj, key)!r} — build the {owner} with the saved settings"
            )


@dataclass(frozen=True)
class Slot:
    """One micro-batch of one rank: the global ``rows`` it holds (possibly none).

    ``step_eligible``: N of the whole step (divide the raw loss sum by it); ``index``: the
    slot's place in this rank's epoch (resume after it with ``position = index + 1``).
    """

    epoch: int
    step: int
    rank: int
    micro: int
    micro_batches: int
    rows: tuple[int, ...]
    step_eligible: int
    index: int

    @property
    def last_micro(self) -> bool:
        """True on the micro-batch whose backward should synchronise gradients."""
        return self.micro == self.micro_batches - 1


SAMPLER_FORMAT = "exactpack.row-sampler/1"
_SAMPLER_CONFIG = ("rows", "world_size", "rank", "micro_batches", "rows_per_micro_batch", "seed")
_SAMPLER_CONFIG += ("balance", "cost", "shuffle")


class RowSampler:
    """This rank's :class:`Slot` objects of an epoch (``steps * micro_batches``, a short
    last step's empty ones included), from :func:`schedule_rows`: a ``DataLoader`` sampler
    with ``batch_size=None`` over :class:`~exactpack.training.packed_data.PackedBatches`.
    ``world_size``/``rank`` default to the ``torch.distributed`` group (else 1 and 0).
    ``state_dict()`` (epoch, slots yielded) lets a fresh sampler continue exactly.
    ``balance``: ``"tokens"`` (Σl), ``"attention"`` (Σl²), ``"none"``, or a
    :class:`~exactpack.training.balance.CostModel` (FLOPs from the model's config:
    ``CostModel.from_config(model.config)``), then partitioned by balanced Karmarkar–Karp.
    """

    def __init__(
        self,
        stats: RowStats,
        *,
        rows_per_micro_batch: int,
        micro_batches: int = 1,
        world_size: int | None = None,
        rank: int | None = None,
        seed: int = 0,
        balance: Balance | CostModel = "tokens",
        shuffle: bool = True,
    ) -> None:
        if not isinstance(stats, RowStats):
            raise InvalidInput(
                f"stats must be a RowStats (e.g. PackedBatches.row_stats()), got"
                f" {type(stats).__name__}"
            )
        self.world_size, self.rank = check_world(world_size, rank)
        check_schedule(len(stats), self.world_size, micro_batches, rows_per_micro_batch)
        check_flag("shuffle", shuffle)
        self.stats, self.rows, self.seed, self.shuffle = stats, len(stats), seed, shuffle
        self.micro_batches, self.rows_per_micro_batch = micro_batches, rows_per_micro_batch
        if isinstance(balance, CostModel):
            self.balance, self.cost = "compute", [balance.linear, balance.quadratic]
            self._costs = balance.row_costs(stats)
        else:
            self.balance, self.cost = balance, None
            self._costs = stats.costs(balance)
        self.epoch, self.position = 0, 0
        self._cache: tuple[int, StepSchedule, np.ndarray] | None = None
        self._scheduled()  # validates the arguments now

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its first slot (a new seeded order)."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise InvalidInput(f"epoch must be a non-negative integer, got {epoch!r}")
        self.epoch = int(epoch)
        self.position = 0

    @property
    def schedule(self) -> StepSchedule:
        """The whole epoch's schedule (every rank), computed once per epoch."""
        return self._scheduled()[0]

    def _scheduled(self) -> tuple[StepSchedule, np.ndarray]:
        if self._cache is None or self._cache[0] != self.epoch:
            schedule = schedule_rows(
                self._costs,
                world_size=self.world_size,
                micro_batches=self.micro_batches,
                rows_per_micro_batch=self.rows_per_micro_batch,
                seed=self.seed,
                epoch=self.epoch,
                shuffle=self.shuffle,
                method="greedy" if self.cost is None else "balanced",
            )
            counts = step_eligible_counts(schedule, self.stats.eligible)
            self._cache = (self.epoch, schedule, counts)
        return self._cache[1], self._cache[2]

    def __len__(self) -> int:
        return self.schedule.steps * self.micro_batches

    def slot(self, index: int) -> Slot:
        """This rank's ``index``-th slot of the epoch."""
        schedule, counts = self._scheduled()
        step, micro = divmod(index, self.micro_batches)
        rows = tuple(schedule.slot(step, self.rank, micro).tolist())
        count = int(counts[step])
        return Slot(self.epoch, step, self.rank, micro, self.micro_batches, rows, count, index)

    def __iter__(self):
        for index in range(self.position, len(self)):
            self.position = index + 1
            yield self.slot(index)
        self.position = 0

    def state_dict(self) -> dict[str, Any]:
        """Configuration, epoch and position (slots yielded so far), as plain data."""
        return {
            "format": SAMPLER_FORMAT,
            "epoch": self.epoch,
            "position": self.position,
            **{key: getattr(self, key) for key in _SAMPLER_CONFIG},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state`` was taken; the configuration must match."""
        check_saved(state, SAMPLER_FORMAT, "row-sampler", "sampler", self, _SAMPLER_CONFIG)
        epoch = state_int(state, "epoch", "row-sampler")  # integers only: no 1.5, no "2"
        position = state_int(state, "position", "row-sampler")
        if position > len(self):
            raise InvalidInput(f"sampler position {position} outside 0..{len(self)}")
        self.epoch, self.position = epoch, position
