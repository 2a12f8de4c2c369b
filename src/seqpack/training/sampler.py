"""Which rows each rank trains on: :class:`RowSampler` over :func:`schedule_rows`.

A :class:`Slot` is one micro-batch of one rank (its rows, possibly none,
and the whole optimizer step's eligible count); the sampler yields this
rank's slots of an epoch and resumes from ``state_dict``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from seqpack.core.errors import InvalidInput, state_int, state_value
from seqpack.training.api_checks import check_flag, check_world
from seqpack.training.distributed import (
    Balance,
    RowStats,
    StepSchedule,
    check_schedule,
    schedule_rows,
    step_eligible_counts,
)


@dataclass(frozen=True)
class Slot:
    """One micro-batch of one rank: the global ``rows`` it holds (possibly none).

    ``step_eligible`` is N of the whole optimizer step (every rank, every
    micro-batch): divide this micro-batch's raw loss sum by it.
    ``index`` is the slot's place in this rank's sequence for the epoch;
    resume after it with ``position = index + 1``.
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


SAMPLER_FORMAT = "seqpack.row-sampler/1"
_SAMPLER_CONFIG = (
    "rows",
    "world_size",
    "rank",
    "micro_batches",
    "rows_per_micro_batch",
    "seed",
    "balance",
    "shuffle",
)


class RowSampler:
    """This rank's micro-batches of an epoch, from :func:`schedule_rows`.

    Use it as a ``DataLoader`` sampler with ``batch_size=None``: it yields
    :class:`Slot` objects, the dataset turns each into its rows
    (:class:`seqpack.training.packed_data.PackedBatches`), the collator into tensors.
    Every rank yields exactly ``steps * micro_batches`` slots; a short final
    step holds explicitly empty slots rather than dropping or repeating rows.
    ``world_size``/``rank`` default to the initialised ``torch.distributed``
    group (else 1 and 0).

    Resumable: ``state_dict()`` records the epoch and how many slots this
    iterator has yielded; a fresh sampler given ``load_state_dict(state)``
    continues with exactly the remaining slots.
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
        balance: Balance = "tokens",
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
        self.stats = stats
        self.rows = len(stats)
        self.micro_batches = micro_batches
        self.rows_per_micro_batch = rows_per_micro_batch
        self.seed = seed
        self.balance = balance
        self.shuffle = shuffle
        self._costs = stats.costs(balance)
        self.epoch = 0
        self.position = 0
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

    @property
    def step_eligible(self) -> np.ndarray:
        """Eligible targets per optimizer step over all ranks, int64 [steps]."""
        return self._scheduled()[1]

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
            )
            self._cache = (
                self.epoch,
                schedule,
                step_eligible_counts(schedule, self.stats.eligible),
            )
        return self._cache[1], self._cache[2]

    def __len__(self) -> int:
        return self.schedule.steps * self.micro_batches

    def slot(self, index: int) -> Slot:
        """This rank's ``index``-th slot of the epoch."""
        schedule, counts = self._scheduled()
        step, micro = divmod(index, self.micro_batches)
        rows = schedule.slot(step, self.rank, micro)
        return Slot(
            self.epoch,
            step,
            self.rank,
            micro,
            self.micro_batches,
            tuple(rows.tolist()),
            int(counts[step]),
            index,
        )

    def __iter__(self):
        start = self.position
        for index in range(start, len(self)):
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
        fmt = state_value(state, "format", "row-sampler")
        if fmt != SAMPLER_FORMAT:
            raise InvalidInput(f"not a row-sampler state (format {fmt!r})")
        for key in _SAMPLER_CONFIG:
            if state_value(state, key, "row-sampler") != getattr(self, key):
                raise InvalidInput(
                    f"sampler state has {key}={state[key]!r} but this sampler has"
                    f" {getattr(self, key)!r} — build the sampler with the saved settings"
                )
        epoch = state_int(state, "epoch", "row-sampler")  # integers only: no 1.5, no "2"
        position = state_int(state, "position", "row-sampler")
        if position > len(self):
            raise InvalidInput(f"sampler position {position} outside 0..{len(self)}")
        self.epoch, self.position = epoch, position
