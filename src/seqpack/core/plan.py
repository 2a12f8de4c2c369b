"""The plan: where each whole example goes (integers only, no tokens).

A plan places example ``i`` in row ``row_of[i]`` at columns
``[start_of[i], start_of[i] + lengths[i])``. For lengths ``[3, 2, 4]`` at
capacity 6 next-fit gives ``row_of [0, 0, 1]``, ``start_of [0, 3, 0]``::

    row 0: A A A B B .
    row 1: C C C C . .

:meth:`Plan.save` / :meth:`Plan.load` keep it as one ``.npz`` file;
whatever is loaded is validated before use.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from seqpack.core.errors import InvalidInput


@dataclass(frozen=True, eq=False)
class Plan:
    """Placements of whole examples: example ``i`` occupies row ``row_of[i]``,
    columns ``[start_of[i], start_of[i] + lengths[i])``.

    Shapes: ``lengths``, ``row_of``, ``start_of`` int64 [n]. Rows are
    numbered ``0..num_rows-1`` with no empty row.
    """

    lengths: np.ndarray
    row_of: np.ndarray
    start_of: np.ndarray
    num_rows: int
    capacity: int
    policy: str

    def stats(self) -> dict[str, Any]:
        """examples, tokens (prediction pairs), rows, lower bound, efficiency."""
        tokens = int(self.lengths.sum())
        lower = -(-tokens // self.capacity)
        cells = self.num_rows * self.capacity
        return {
            "policy": self.policy,
            "capacity": self.capacity,
            "examples": int(self.lengths.shape[0]),
            "tokens": tokens,
            "rows": self.num_rows,
            "lower_bound": lower,
            "efficiency": tokens / cells if cells else 0.0,
        }

    def row_order(self) -> np.ndarray:
        """Example indices sorted by (row, start): storage order, int64 [n]."""
        return np.lexsort((self.start_of, self.row_of)).astype(np.int64)

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "capacity": self.capacity,
            "num_rows": self.num_rows,
            "lengths": self.lengths.tolist(),
            "row_of": self.row_of.tolist(),
            "start_of": self.start_of.tolist(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        plan = cls(
            lengths=np.asarray(data["lengths"], dtype=np.int64),
            row_of=np.asarray(data["row_of"], dtype=np.int64),
            start_of=np.asarray(data["start_of"], dtype=np.int64),
            num_rows=int(data["num_rows"]),
            capacity=int(data["capacity"]),
            policy=str(data["policy"]),
        )
        validate_plan(plan)
        return plan

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the plan as one ``.npz`` file (int64 arrays plus a JSON header)."""
        header = {"policy": self.policy, "capacity": self.capacity, "num_rows": self.num_rows}
        with open(path, "wb") as fh:
            np.savez(
                fh,
                header=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8),
                lengths=self.lengths,
                row_of=self.row_of,
                start_of=self.start_of,
            )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Plan:
        """Read a plan written by :meth:`save`; it is validated before use."""
        with np.load(path, allow_pickle=False) as data:
            header = json.loads(data["header"].tobytes().decode())
            arrays = {k: data[k].astype(np.int64) for k in ("lengths", "row_of", "start_of")}
        return cls.from_dict({**header, **arrays})


def validate_plan(plan: Plan) -> None:
    """Check a plan places every example once, whole, inside a row, without overlap."""
    n = plan.lengths.shape[0]
    if plan.row_of.shape != (n,) or plan.start_of.shape != (n,):
        raise InvalidInput("plan arrays must have one entry per example")
    if n == 0:
        if plan.num_rows:
            raise InvalidInput("an empty plan has no rows")
        return
    ends = plan.start_of + plan.lengths
    if plan.start_of.min() < 0 or ends.max() > plan.capacity:
        raise InvalidInput("plan places an example outside its row")
    if plan.row_of.min() < 0 or plan.row_of.max() >= plan.num_rows:
        raise InvalidInput("plan refers to a row outside 0..num_rows-1")
    order = plan.row_order()
    r, s, e = plan.row_of[order], plan.start_of[order], ends[order]
    same = r[1:] == r[:-1]
    if np.any(same & (s[1:] < e[:-1])):
        raise InvalidInput("plan places two examples on the same cells")
    if np.unique(plan.row_of).shape[0] != plan.num_rows:
        raise InvalidInput("plan has an empty row")
