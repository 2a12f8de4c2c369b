"""The benchmark workloads W1-W3, generated exactly as DESIGN.md specifies.

Lengths are int64 arrays of tokens per example; each workload's sha256
prefix is checked so numbers compare with the reference runs.
"""

from __future__ import annotations

import hashlib
import math
import os
import sysconfig
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Workload:
    name: str
    lengths: np.ndarray  # int64 [n]
    capacity: int

    @property
    def tokens(self) -> int:
        return int(self.lengths.sum())

    @property
    def lower_bound(self) -> int:
        return -(-self.tokens // self.capacity)

    @property
    def sha(self) -> str:
        return digest(self.lengths)


def digest(lengths: np.ndarray) -> str:
    return hashlib.sha256(lengths.astype("<i8").tobytes()).hexdigest()[:16]


def w1_sft() -> Workload:
    rng = np.random.default_rng(20240601)
    mu = math.log(350) - 0.5
    lengths = np.clip(np.rint(rng.lognormal(mu, 1.0, 200_000)), 8, 4096).astype(np.int64)
    return Workload("W1 sft", lengths, 4096)


def w2_short() -> Workload:
    lengths = np.random.default_rng(20240602).integers(16, 513, size=1_000_000).astype(np.int64)
    return Workload("W2 short", lengths, 2048)


def stdlib_files() -> list[str]:
    """Every ``*.py`` under the stdlib, sorted walk, skipping site-/dist-packages."""
    root = sysconfig.get_paths()["stdlib"]
    out = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "dist-packages"))
        out.extend(os.path.join(folder, f) for f in sorted(files) if f.endswith(".py"))
    return out


def w3_real(limit: int = 8192) -> Workload:
    lengths = np.array([os.path.getsize(p) + 2 for p in stdlib_files()], dtype=np.int64)
    return Workload("W3 real", lengths[lengths <= limit], limit)


EXPECTED_SHA = {"W1 sft": "635b65bb03693f60", "W2 short": "1343900eef594bcc"}


def all_workloads() -> list[Workload]:
    out = [w1_sft(), w2_short(), w3_real()]
    for w in out:
        want = EXPECTED_SHA.get(w.name)
        if want is not None and w.sha != want:
            raise SystemExit(f"{w.name}: lengths sha {w.sha} != reference {want}")
    return out


if __name__ == "__main__":
    for w in all_workloads():
        print(
            f"{w.name}: n={w.lengths.size} tokens={w.tokens}"
            f" lower_bound={w.lower_bound} sha={w.sha}"
        )
