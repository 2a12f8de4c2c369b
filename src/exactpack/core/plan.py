"""The plan: where each whole example goes (integers only, no tokens).

Example ``i`` sits in row ``row_of[i]`` at columns ``[start_of[i], start_of[i] +
lengths[i])``; lengths ``[3, 2, 4]`` at capacity 6, next-fit::

    row 0: A A A B B .
    row 1: C C C C . .

:meth:`Plan.save` / :meth:`Plan.load` keep it as one ``.npz`` file, validated on load
(sizes checked against the file before allocating, no pickles, :func:`validate_plan`).
"""

from __future__ import annotations

import json
import os
import struct
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from exactpack.core.binding import INT32_MAX
from exactpack.core.errors import FOREIGN, BudgetExceeded, InvalidInput, foreign, is_int

ARRAYS = ("lengths", "row_of", "start_of")
#: What zipfile, zlib and the .npy header parser raise on a damaged archive (an encrypted
#: or unknown-compression member is a RuntimeError / NotImplementedError).
_DAMAGED = (*FOREIGN, KeyError, RuntimeError, zipfile.BadZipFile, zlib.error, struct.error)
#: The most examples a plan may place (segment ids are int32 downstream).
MAX_PLAN_EXAMPLES = 1 << 31


@dataclass(frozen=True, eq=False)
class Plan:
    """Placements of whole examples: ``lengths``, ``row_of``, ``start_of`` int64 [n]; rows
    ``0..num_rows-1``, none empty."""

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
        meta = {"policy": self.policy, "capacity": self.capacity, "num_rows": self.num_rows}
        return meta | {name: getattr(self, name).tolist() for name in ARRAYS}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        """A plan from :meth:`to_dict` output (or a saved plan's arrays), validated."""
        if not isinstance(data, Mapping):
            raise InvalidInput(f"a plan is a mapping, not a {type(data).__name__}")
        missing = [k for k in ("policy", "capacity", "num_rows", *ARRAYS) if k not in data]
        if missing:
            raise InvalidInput(f"plan has no {', '.join(missing)} — save it with Plan.save")
        capacity = _plan_int(data["capacity"], "capacity", 1, INT32_MAX)
        num_rows = _plan_int(data["num_rows"], "num_rows", 0, MAX_PLAN_EXAMPLES)
        if not isinstance(data["policy"], str):
            raise InvalidInput(f"plan policy must be a name, got {data['policy']!r}")
        arrays = {name: _plan_array(data[name], name) for name in ARRAYS}
        plan = cls(**arrays, num_rows=num_rows, capacity=capacity, policy=data["policy"])
        validate_plan(plan)
        return plan

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the plan as one ``.npz`` file (int64 arrays plus a JSON header)."""
        header = {"policy": self.policy, "capacity": self.capacity, "num_rows": self.num_rows}
        raw = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
        with open(path, "wb") as fh:
            np.savez(fh, header=raw, **{name: getattr(self, name) for name in ARRAYS})

    @classmethod
    def load(cls, path: str | os.PathLike[str], max_bytes: int | None = None) -> Plan:
        """Read a plan written by :meth:`save`, validated; array sizes are checked against the
        file and ``max_bytes`` before allocating."""
        where = os.fspath(path)
        with foreign(f"{where}: not a exactpack plan", "save it again with Plan.save", _DAMAGED):
            with zipfile.ZipFile(path) as archive:
                header = _read_npy(archive, "header", np.uint8, 1 << 20)
                need = sum(_npy_bytes(archive, name) for name in ARRAYS)
                if max_bytes is not None and need > max_bytes:
                    raise BudgetExceeded(
                        f"{where}: the plan's arrays need {need:,} bytes but max_bytes is"
                        f" {max_bytes:,} — raise the budget"
                    )
                arrays = {k: _read_npy(archive, k, np.integer, need) for k in ARRAYS}
            meta = json.loads(header.tobytes().decode())
        if not isinstance(meta, dict):
            raise InvalidInput(f"{where}: the plan header is not a JSON object")
        return cls.from_dict({**meta, **arrays})


def _plan_int(value: Any, name: str, low: int, high: int) -> int:
    if not is_int(value):
        raise InvalidInput(f"plan {name} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise InvalidInput(f"plan {name} {value:,} lies outside [{low:,}, {high:,}]")
    return int(value)


def _plan_array(value: Any, name: str) -> np.ndarray:
    """``value`` as int64 [n]; floats, bools, objects and integers beyond int64 refused."""
    if isinstance(value, (list, tuple)) and any(isinstance(v, bool) for v in value):
        raise InvalidInput(f"plan {name} must hold integers, got a bool")
    ragged = (ValueError, TypeError, OverflowError)  # ragged or odd nesting
    with foreign(f"plan {name} is not an array of integers", kinds=ragged):
        arr = value if isinstance(value, np.ndarray) else np.asarray(value)
    if arr.ndim != 1:
        raise InvalidInput(f"plan {name} must be 1-D, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise InvalidInput(f"plan {name} must hold integers, got {arr.dtype}")
    if arr.size and arr.dtype == np.uint64 and int(arr.max()) > np.iinfo(np.int64).max:
        raise InvalidInput(f"plan {name} holds integers beyond int64")
    if arr.shape[0] > MAX_PLAN_EXAMPLES:
        raise InvalidInput(f"plan {name} has {arr.shape[0]:,} entries, above {MAX_PLAN_EXAMPLES:,}")
    return arr.astype(np.int64)


def _npy_header(f: Any, name: str) -> tuple[tuple[int, ...], np.dtype]:
    version = np.lib.format.read_magic(f)
    if version not in ((1, 0), (2, 0)):
        raise ValueError(f"{name}: unknown .npy version {version}")
    read = getattr(np.lib.format, f"read_array_header_{version[0]}_0")
    shape, _, dtype = read(f, max_header_size=10_000)
    return shape, dtype


def _npy_bytes(archive: zipfile.ZipFile, name: str) -> int:
    """Bytes array ``name`` of the archive declares (its header only is read)."""
    with archive.open(f"{name}.npy") as f:
        shape, dtype = _npy_header(f, name)
    return int(np.prod(shape, dtype=object)) * dtype.itemsize


def _read_npy(archive: zipfile.ZipFile, name: str, kind: Any, limit: int) -> np.ndarray:
    """Array ``name`` of an ``.npz``: 1-D, of ``kind``, at most ``limit`` bytes and what the
    member holds, checked from its header before reading."""
    info = archive.getinfo(f"{name}.npy")
    with archive.open(info) as f:
        shape, dtype = _npy_header(f, name)
        if len(shape) != 1 or dtype.hasobject or not np.issubdtype(dtype, kind):
            raise ValueError(f"{name} is a {dtype} array of shape {shape}, not 1-D integers")
        nbytes = shape[0] * dtype.itemsize
        if nbytes > min(limit, info.file_size):
            raise ValueError(f"{name} claims {nbytes:,} bytes; the file holds {info.file_size:,}")
        data = f.read(nbytes)
    if len(data) != nbytes:
        raise ValueError(f"{name} is cut short ({len(data):,} of {nbytes:,} bytes)")
    return np.frombuffer(data, dtype=dtype)


def validate_plan(plan: Plan) -> None:
    """Check a plan places every example once, whole, inside a row, without overlap (values
    bounded before any arithmetic: no int64 sum wraps)."""
    n = plan.lengths.shape[0]
    if plan.row_of.shape != (n,) or plan.start_of.shape != (n,):
        raise InvalidInput("plan arrays must have one entry per example")
    if not (is_int(plan.capacity) and 1 <= plan.capacity <= INT32_MAX):
        raise InvalidInput(f"plan capacity {plan.capacity!r} lies outside [1, {INT32_MAX:,}]")
    if n == 0:
        if plan.num_rows:
            raise InvalidInput("an empty plan has no rows")
        return
    if plan.lengths.min() < 1 or plan.lengths.max() > plan.capacity:
        raise InvalidInput(f"plan lengths must lie in [1, capacity {plan.capacity:,}]")
    if plan.start_of.min() < 0 or plan.start_of.max() >= plan.capacity:
        raise InvalidInput("plan places an example outside its row")
    if not 1 <= plan.num_rows <= n:
        raise InvalidInput(f"plan has {plan.num_rows:,} rows for {n:,} examples (no empty row)")
    ends = plan.start_of + plan.lengths
    if ends.max() > plan.capacity:
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
