"""What a packing run allocates, from all its options, checked before allocating: in
memory (:func:`packing_bytes`, :func:`check_budget`) and out of core
(:class:`StreamBudget`, what ``exactpack pack`` checks)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from exactpack.core import config as budget
from exactpack.core.config import PackConfig
from exactpack.core.examples import ExampleTable
from exactpack.core.stream_packer import DEFAULT_LOOKAHEAD, DEFAULT_MAX_OPEN_ROWS
from exactpack.io.files import ReadLimits
from exactpack.io.store import SHARDS_IN_FLIGHT
from exactpack.io.tokenizers import ENCODE_BATCH
from exactpack.pipeline.options import DEFAULT_POLICY, PackOptions

#: Per policy: bytes per example, per capacity unit, and whether windows are gathered
#: into a new order (upper bounds of tracemalloc's measures; tests/test_stress.py).
_POLICY_BYTES: dict[str, tuple[int, int, bool]] = {
    "next-fit": (64, 0, False),
    "padded": (64, 0, False),
    "first-fit-decreasing": (128, 16, True),
    "best-fit-decreasing": (128, 72, True),
    "stream-best-fit": (128, 128, True),
}
#: stream-best-fit: bytes per look-ahead slot, per open row, per kernel call's pushes.
STREAM_LOOKAHEAD_BYTES = 136
STREAM_ROW_BYTES = 64
STREAM_PUSH_BYTES = 24 * 65536
#: Fixed slack: Python objects, kernels' scalars, small temporaries.
_FIXED_BYTES = 1 << 20
#: Out-of-core file I/O buffers (checksum block, scan codes, a digest's block of ones).
IO_BYTES = 2 << 20
#: Bytes per document read: its token count, and its id's Arrow code and hash entry.
DOCUMENT_BYTES = 8 + 40
#: Bytes per example planned out of core (lengths, pieces, placements, order, sort key).
EXAMPLE_BYTES = 64
#: Bytes per token (int32, flag, bit-packed copy) and per occurrence of a shard being built.
SHARD_TOKEN_BYTES = 6
SHARD_OCCURRENCE_BYTES = 96
#: Read chunks in memory at once (the next one read while this one is tokenized).
CHUNKS_IN_FLIGHT = 2
#: Bytes held per byte of a read chunk, by input kind (docs/design-notes.d/pipeline.md).
CHUNK_FACTORS = {"jsonl": 12, "parquet": 4, "datasets": 2, "table": 2, "text": 6}
#: Rust-side bytes per character of a text sub-batch being encoded (45 measured, BPE).
TEXT_CHAR_BYTES = 64


def _policy_costs(policy: str) -> tuple[int, int, bool]:
    return _POLICY_BYTES.get(policy, (128, 128, True))


def policy_bytes(policy: str, capacity: int, options: Mapping[str, Any] | None = None) -> int:
    """The part of a policy's memory that does not grow with the examples: its index over
    capacities and, for ``stream-best-fit``, its look-ahead window and open rows."""
    need = int(capacity) * _policy_costs(policy)[1]
    if policy == "stream-best-fit":
        opts = dict(options or {})
        window = int(opts.get("lookahead") or DEFAULT_LOOKAHEAD)
        rows = int(opts.get("max_open_rows") or DEFAULT_MAX_OPEN_ROWS)
        need += window * STREAM_LOOKAHEAD_BYTES + rows * STREAM_ROW_BYTES + STREAM_PUSH_BYTES
    return need


def packing_bytes(
    table: ExampleTable,
    capacity: int,
    policy: str = DEFAULT_POLICY,
    options: Mapping[str, Any] | None = None,
) -> int:
    """Upper bound of the bytes :func:`pack_table` allocates: plan and per-occurrence arrays,
    :func:`policy_bytes` and, for policies that reorder, one gathered copy of the windows
    (4 bytes a token) and of non-uniform loss flags (1 byte a target)."""
    per_example, _, gathers = _policy_costs(policy)
    flags = table.loss_mask
    need = len(table) * per_example + policy_bytes(policy, capacity, options) + _FIXED_BYTES
    if gathers:
        uniform = flags.size == 0 or bool(flags.all()) or not bool(flags.any())
        need += int(table.windows.shape[0]) * 4 + (0 if uniform else int(flags.shape[0]))
    return need


def split_bytes(
    offsets: np.ndarray,
    capacity: int,
    policy: str = DEFAULT_POLICY,
    options: Mapping[str, Any] | None = None,
) -> int:
    """Upper bound of splitting sources (``offsets`` int64 [n+1]) with ``--cut-long`` and
    packing the pieces (21 bytes a token, 48 a piece, plus :func:`packing_bytes`)."""
    counts = np.diff(offsets)
    pieces = int(np.maximum(1, -(-(counts - 1) // capacity)).sum())
    tokens = int(counts.sum()) + pieces - counts.shape[0]  # one token shared per cut
    per_example, _, gathers = _policy_costs(policy)
    need = tokens * 21 + pieces * (48 + per_example) + policy_bytes(policy, capacity, options)
    return need + _FIXED_BYTES + (tokens * 5 if gathers else 0)


def model_call_bytes(config: PackConfig) -> int:
    """Bytes of one padded model call (:class:`~exactpack.PackedBatch` cells) when read back."""
    return int(config.max_rows_per_batch) * int(config.capacity) * budget.CELL_BYTES


def check_budget(
    table: ExampleTable,
    config: PackConfig,
    policy: str,
    limit: int | None,
    where: str = "",
    fix: str = "pack fewer examples per call",
    options: Mapping[str, Any] | None = None,
) -> None:
    """:class:`~exactpack.core.errors.BudgetExceeded` when packing ``table`` plus one model call
    needs more than ``limit`` bytes (None: no limit); ``where`` prefixes the message, ``fix``
    ends it."""
    if limit is None:
        return
    need = packing_bytes(table, config.capacity, policy, options) + model_call_bytes(config)
    what = (
        f"{where}packing {len(table):,} examples with {policy} (plus one model call of"
        f" {config.max_rows_per_batch} x {config.capacity:,} cells)"
    )
    budget.enforce(need, limit, what, fix)


@dataclass(frozen=True)
class StreamBudget:
    """The out-of-core pipeline's memory, from its options (see the module docstring)."""

    limit: int | None
    chunk: int
    shards: int
    policy: int
    per_example: int
    options: PackOptions

    @classmethod
    def of(cls, options: PackOptions, kind: str) -> StreamBudget:
        """The budget of packing an input of ``kind`` (:data:`CHUNK_FACTORS`) with ``options``."""
        chunk = options.chunk_bytes * CHUNKS_IN_FLIGHT * CHUNK_FACTORS.get(kind, 12)
        if kind == "text":
            chunk += min(ENCODE_BATCH, options.chunk_bytes) * TEXT_CHAR_BYTES
        config = PackConfig(options.capacity, options.max_rows_per_batch)
        shard_tokens = options.shard_tokens + config.max_rows_per_batch * config.capacity
        shards = SHARDS_IN_FLIGHT * shard_tokens * SHARD_TOKEN_BYTES
        fixed = policy_bytes(options.policy, options.capacity, options.policy_options)
        fixed += model_call_bytes(config) + _FIXED_BYTES + IO_BYTES
        per_example = _policy_costs(options.policy)[0] + EXAMPLE_BYTES
        return cls(options.max_metadata_bytes, chunk, shards, fixed, per_example, options)

    @property
    def fixed(self) -> int:
        return self.chunk + self.shards + self.policy

    def need(self, documents: int, examples: int = 0, occurrences: int = 0) -> int:
        """Bytes for ``documents`` read, ``examples`` planned and a shard of ``occurrences``."""
        need = self.fixed + int(documents) * DOCUMENT_BYTES + int(examples) * self.per_example
        return need + SHARDS_IN_FLIGHT * int(occurrences) * SHARD_OCCURRENCE_BYTES

    def check(
        self, documents: int = 0, examples: int = 0, occurrences: int = 0, what: str = ""
    ) -> None:
        """:class:`~exactpack.core.errors.BudgetExceeded` over the limit, naming every part."""
        opts = self.options
        parts = (
            f"plus one model call of {opts.max_rows_per_batch} x {opts.capacity:,} cells and the"
            f" policy's index {self.policy:,}, {CHUNKS_IN_FLIGHT} read chunks {self.chunk:,},"
            f" {SHARDS_IN_FLIGHT} output shards {self.shards:,}, {DOCUMENT_BYTES} bytes a"
            f" document and {self.per_example} an example"
        )
        budget.enforce(
            self.need(documents, examples, occurrences),
            self.limit,
            f"packing {what or 'this corpus'} with {opts.policy} ({parts})",
            "lower chunk_bytes=, shard_tokens=, max_rows_per_batch= or the policy's lookahead",
        )


def read_limits(options: PackOptions) -> ReadLimits:
    """What one read may decode: with ``max_metadata_bytes``, the budget's share of one read
    chunk (at least 64 MiB, at most the budget); else :class:`~exactpack.io.files.ReadLimits`'
    defaults."""
    limits = ReadLimits()
    if options.max_metadata_bytes is None:
        return limits
    share = options.chunk_bytes * CHUNK_FACTORS["parquet"]
    decoded = min(options.max_metadata_bytes, max(limits.floor, share))
    return ReadLimits(decoded_bytes=decoded, ratio=limits.ratio, floor=min(limits.floor, decoded))
