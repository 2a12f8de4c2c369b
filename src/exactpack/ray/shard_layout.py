"""Where the blocks' rows go: global row numbers, output shards, merged statistics.

Pure bookkeeping on the driver (no Ray, no tokens). Blocks' rows are laid
end to end in block order — block 0's rows, then block 1's — so global row
``r`` of block ``b`` is ``first_row[b] + r`` and its occurrences' ordinals
move up by ``first_example[b]``. With 3 blocks of 10, 5 and 9 rows and 4 rows
per model call::

    blocks   [0 ........ 10)[10 ... 15)[15 ......... 24)
    shards   [0 ....... 8)[8 ...... 12)[12 .......... 24)

Each block's end (and each of its own ``shard_tokens`` cuts) is rounded down
to a model-call boundary, so every shard but the last holds whole model
calls, as :func:`exactpack.io.store.load_packed` requires.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from exactpack.core.config import check_segment_namespace
from exactpack.core.errors import ExactpackError


class RayTaskFailed(ExactpackError, RuntimeError):
    """A Ray task failed for a reason other than bad input (e.g. it ran out of retries)."""


@dataclass(frozen=True)
class Shard:
    index: int
    first_row: int
    spans: tuple[tuple[int, int, int, int], ...]  # (block, first local row, stop, first example)


class ShardCuts:
    """The blocks' rows end to end in block order, cut into shards on model-call boundaries.

    A shard is handed out once all its rows are known (writing overlaps planning);
    ``num_blocks`` may be set (from None) once blocks streamed end, before the last is
    added. Cuts:
    each block's own shard bounds and its end, rounded down to a multiple of
    ``max_rows_per_batch``; one block gives exactly the local pipeline's cuts.
    """

    def __init__(self, num_blocks: int | None, max_rows_per_batch: int) -> None:
        self.num_blocks = num_blocks
        self.step = max_rows_per_batch
        self.blocks: list[dict[str, Any]] = []
        self.rows = 0
        self.examples = 0
        self._cut = 0
        self._shards = 0
        self._next = 0

    def add(self, stats: dict[str, Any]) -> list[Shard]:
        first = self.rows
        laid = {"first_example": self.examples, "examples": stats["examples"], "first_row": first}
        self.blocks.append(laid | {"rows": stats["rows"], "tokens": stats["tokens"]})
        self.rows += stats["rows"]
        self.examples += stats["examples"]
        check_segment_namespace(self.examples)
        last = len(self.blocks) == self.num_blocks
        ends = [first + c for c in stats["cuts"]] + ([] if last else [self.rows])
        shards = []
        for end in ends:
            end -= end % self.step
            if end > self._cut:
                shards.append(self._take(end))
        if last and self.rows > self._cut:
            shards.append(self._take(self.rows))
        return shards

    @property
    def consumed(self) -> int:
        """Blocks ``0 .. consumed - 1`` lie wholly in shards already handed out."""
        return self._next

    def _take(self, end: int) -> Shard:
        spans = []
        for j in range(self._next, len(self.blocks)):
            b = self.blocks[j]
            if b["first_row"] >= end:
                break
            lo = max(self._cut, b["first_row"]) - b["first_row"]
            hi = min(end, b["first_row"] + b["rows"]) - b["first_row"]
            spans.append((j, lo, hi, b["first_example"]))
            if b["first_row"] + b["rows"] <= end:
                self._next = j + 1
        shard = Shard(self._shards, self._cut, tuple(spans))
        self._shards += 1
        self._cut = end
        return shard


def check_written(layout: ShardCuts, shards: list[dict[str, Any]], tmp: Path) -> None:
    """Every example exactly once: the shards hold each row and occurrence once."""
    rows = sum(s["rows"] for s in shards)
    occurrences = sum(s["occurrences"] for s in shards)
    firsts = [s["first_row"] for s in shards]
    expected = [0, *np.cumsum([s["rows"] for s in shards])[:-1].tolist()]
    sizes_ok = all((tmp / s["file"]).stat().st_size == s["bytes"] for s in shards)
    if rows != layout.rows or occurrences != layout.examples or firsts != expected or not sizes_ok:
        raise RayTaskFailed(
            f"the shards hold {rows:,} rows and {occurrences:,} occurrences, the plan"
            f" {layout.rows:,} and {layout.examples:,} — nothing was published; run again"
        )


#: The block statistics that add up as they are.
SUMMED = ("sources", "split_sources", "eligible_targets")


def merge_statistics(
    block_stats: list[dict[str, Any]], layout: ShardCuts, max_rows_per_batch: int
) -> dict[str, Any]:
    """One statistics record for all blocks, against the global lower bound."""
    total = {k: sum(s[k] for s in block_stats) for k in ("tokens", *SUMMED)}
    tokens, rows, capacity = total.pop("tokens"), layout.rows, block_stats[0]["capacity"]
    return {
        "policy": block_stats[0]["policy"],
        "capacity": capacity,
        "examples": layout.examples,
        "tokens": tokens,
        "rows": rows,
        "lower_bound": -(-tokens // capacity),
        "efficiency": tokens / (rows * capacity) if rows else 0.0,
        **total,
        "batches": -(-rows // max_rows_per_batch),
    }
