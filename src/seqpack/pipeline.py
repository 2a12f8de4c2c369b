"""The packing pipeline: read -> plan -> materialise -> write, and the statistics report.

``pack_path`` is what ``seqpack pack`` runs; ``stats_path`` is ``seqpack
stats``. Both are plain functions over the library: readers from
:mod:`seqpack.io`, any policy of :func:`seqpack.plan_rows`, compact rows
from :mod:`seqpack.compact`, the atomic writer of :mod:`seqpack.store`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import budget
from .atomic import recover_output
from .batch import PackConfig
from .compact import CompactRows, compact_rows
from .errors import InvalidInput
from .examples import ExampleTable, Partition, long_ranges, split_long
from .io import Documents, read_documents, resolve_binding
from .policies import POLICIES, Plan, plan_rows
from .store import check_output, write_packed
from .tokenizers import Tokenizer, load_tokenizer

DEFAULT_POLICY = "best-fit-decreasing"
DEFAULT_ROWS_PER_BATCH = 8


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


def pack_table(
    table: ExampleTable,
    capacity: int,
    policy: str = DEFAULT_POLICY,
    labels: Callable[[int], str] | None = None,
    *,
    max_metadata_bytes: int | None = None,
    **options: Any,
) -> tuple[Plan, CompactRows]:
    """Plan ``table`` with ``policy`` and materialise it as compact rows (in memory).

    ``labels(i)`` names example ``i`` in errors (default: :meth:`ExampleTable.label`).
    With ``max_metadata_bytes``, :func:`packing_bytes` is checked against it
    first: :class:`~seqpack.errors.BudgetExceeded` before anything is allocated.
    """
    if max_metadata_bytes is not None:
        budget.enforce(packing_bytes(table, capacity, policy), max_metadata_bytes, "packing")
    plan = plan_rows(table.lengths, capacity, policy, labels=labels or table.label, **options)
    return plan, compact_rows(table, plan)


def duplicate_ids(ids: np.ndarray) -> tuple[int, int, int]:
    """Rows whose id repeats an earlier row's: ``(count, first such row, the row it repeats)``.

    ``(0, -1, -1)`` when every id is distinct. Arrow hashes the strings; the
    rest is vectorised (a row is a repeat unless its value's code is new).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = pa.array(ids, type=pa.string())
    if pc.count_distinct(arr).as_py() == len(arr):
        return 0, -1, -1
    codes = pc.index_in(arr, value_set=pc.unique(arr)).to_numpy(zero_copy_only=False)
    seen = np.maximum.accumulate(codes)
    new = np.ones(codes.shape[0], dtype=bool)
    new[1:] = codes[1:] > seen[:-1]
    repeat = int(np.argmax(~new))
    return int((~new).sum()), repeat, int(np.argmax(codes == codes[repeat]))


def duplicate_report(ids: Any, locate: Callable[[int], str]) -> dict[str, Any]:
    """``duplicate_ids`` and, when some repeat, ``duplicate_first`` (its id, where, first seen).

    ``ids``: every input row's id in order (NumPy or Arrow strings);
    ``locate(row)`` names an input row (file and line, or block and row).
    """
    count, row, first = duplicate_ids(ids)
    if not count:
        return {"duplicate_ids": 0}
    return {
        "duplicate_ids": count,
        "duplicate_first": {"id": str(ids[row]), "at": locate(row), "first_seen": locate(first)},
    }


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
    """Raise :class:`~seqpack.errors.BudgetExceeded` before planning when packing ``table``
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


def _tokenizer(spec: str | Tokenizer | None) -> Tokenizer | None:
    return load_tokenizer(spec) if isinstance(spec, (str, Path)) else spec


def _status(enabled: bool) -> Callable[[str], None]:
    def say(message: str) -> None:
        if enabled:
            print(f"seqpack: {message}", file=sys.stderr, flush=True)

    return say


def _progress_bar(total: int, show: bool) -> Any:
    """A tqdm bar over rows written (stderr), or None when not shown."""
    if not show:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="seqpack: writing", unit="row", file=sys.stderr)


def pack_path(
    source: str | Path | Any,
    out: str | Path,
    *,
    capacity: int,
    policy: str = DEFAULT_POLICY,
    vocab_size: int | None = None,
    tokenizer: str | Tokenizer | None = None,
    partition: Partition | str = "train",
    split_long_sources: bool = False,
    overwrite: bool = False,
    max_rows_per_batch: int = DEFAULT_ROWS_PER_BATCH,
    text_field: str = "text",
    tokenizer_id: str | None = None,
    split_id: str | None = None,
    policy_options: dict[str, Any] | None = None,
    progress: bool | None = None,
    max_metadata_bytes: int | None = None,
) -> dict[str, Any]:
    """Pack ``source`` into the packed directory ``out``; return the statistics.

    Statistics: ``examples``, ``tokens`` (prediction pairs), ``rows``,
    ``lower_bound`` (``ceil(tokens / capacity)``), ``efficiency``
    (``tokens / (rows * capacity)``), ``sources``, ``split_sources``,
    ``eligible_targets``, ``batches``, ``shards``, ``seconds``,
    ``duplicate_ids`` (rows whose id repeats an earlier row's; each is still
    packed as its own occurrence; ``duplicate_first`` names the first) and
    ``recovered`` (notes on hidden folders of killed runs cleaned up at
    ``out``, see :func:`seqpack.atomic.recover_output`). Progress goes to
    stderr (a tqdm bar) when ``progress`` is True, or by default when stderr
    is a terminal. ``max_metadata_bytes`` bounds :func:`packing_bytes` plus
    one padded model call (:func:`model_call_bytes`), checked before planning.
    """
    started = time.perf_counter()
    config = PackConfig(capacity, max_rows_per_batch, max_metadata_bytes=max_metadata_bytes)
    recovered = recover_output(out)
    out = check_output(out, overwrite)
    show = sys.stderr.isatty() if progress is None else progress
    say = _status(show)
    tok = _tokenizer(tokenizer)
    say(f"reading {source}")
    docs = read_documents(source, tokenizer=tok, text_field=text_field, partition=partition)
    if not len(docs):
        raise InvalidInput(f"{source} holds no rows — nothing to pack")
    binding = resolve_binding(
        docs,
        partition,
        vocab_size=vocab_size,
        tokenizer=tok,
        tokenizer_id=tokenizer_id,
        split_id=split_id,
    )
    table = docs.to_table(binding, partition)
    split = 0
    if split_long_sources:
        table, split = split_long(table, config.capacity)
    check_budget(table, config, policy, max_metadata_bytes)
    say(f"planning {len(table):,} examples with {policy}")

    def name(i: int) -> str:
        return table.label(i) if split else f"{docs.origin.locate(i)}: {table.label(i)}"

    plan, rows = pack_table(table, config.capacity, policy, name, **(policy_options or {}))
    stats = plan.stats() | {
        "sources": len(docs),
        "split_sources": split,
        "eligible_targets": int(table.loss_mask.sum()),
        "batches": -(-plan.num_rows // config.max_rows_per_batch),
    }
    bar = _progress_bar(plan.num_rows, show)
    try:
        manifest = write_packed(
            rows,
            out,
            max_rows_per_batch=config.max_rows_per_batch,
            extra={
                "policy": {"name": policy, "options": policy_options or {}},
                "statistics": stats,
                "input": {"source": str(source), "text_field": text_field},
            },
            overwrite=overwrite,
            on_shard=None if bar is None else bar.update,
        )
    finally:
        if bar is not None:
            bar.close()
    return (
        stats
        | duplicate_report(docs.ids, docs.origin.locate)
        | {
            "shards": len(manifest["shards"]),
            "out": str(out),
            "recovered": recovered,
            "seconds": time.perf_counter() - started,
        }
    )


def example_lengths(docs: Documents, capacity: int, split: bool) -> tuple[np.ndarray, int]:
    """Prediction lengths as packed (after ``--split-long`` when ``split``), and sources split."""
    counts = np.diff(docs.offsets)
    if not split:
        return counts - 1, 0
    _, starts, ends = long_ranges(counts, capacity)
    return ends - starts - 1, int(np.count_nonzero(counts - 1 > capacity))


def compare_policies(
    lengths: np.ndarray,
    capacity: int,
    policies: Sequence[str] | None = None,
    labels: Callable[[int], str] | None = None,
) -> list[tuple[Plan, float]]:
    """Plan ``lengths`` with every policy (default: all registered); (plan, seconds) each.

    Each policy first plans a few examples, so compiled kernels are loaded
    before the clock starts.
    """
    out = []
    for name in policies or list(POLICIES):
        plan_rows(lengths[:8], capacity, name, labels=labels)
        t0 = time.perf_counter()
        plan = plan_rows(lengths, capacity, name, labels=labels)
        out.append((plan, time.perf_counter() - t0))
    return out


def stats_path(
    source: str | Path | Any,
    *,
    capacity: int,
    tokenizer: str | Tokenizer | None = None,
    partition: Partition | str = "train",
    text_field: str = "text",
    split_long_sources: bool = False,
    policies: Sequence[str] | None = None,
    plot: str | Path | None = None,
) -> dict[str, Any]:
    """Rows, lower bound, efficiency and planning time of every policy; no rows written."""
    docs = read_documents(
        source, tokenizer=_tokenizer(tokenizer), text_field=text_field, partition=partition
    )
    if not len(docs):
        raise InvalidInput(f"{source} holds no rows — nothing to plan")
    lengths, split = example_lengths(docs, capacity, split_long_sources)
    labels = None if split else (lambda i: f"{docs.origin.locate(i)} (id {docs.ids[i]!r})")
    results = compare_policies(lengths, capacity, policies, labels)
    report: dict[str, Any] = {
        "source": str(source),
        "capacity": capacity,
        "sources": len(docs),
        "split_sources": split,
        "examples": int(lengths.shape[0]),
        "tokens": int(lengths.sum()),
        "lower_bound": -(-int(lengths.sum()) // capacity),
        **duplicate_report(docs.ids, docs.origin.locate),
        "policies": [
            plan.stats() | {"rows_over_lower_bound": _ratio(plan), "seconds": seconds}
            for plan, seconds in results
        ],
    }
    if plot is not None:
        report["plot"] = str(plot_stats(lengths, [p for p, _ in results], capacity, plot))
    return report


def _ratio(plan: Plan) -> float:
    lower = plan.stats()["lower_bound"]
    return plan.num_rows / lower if lower else 0.0


def plot_stats(lengths: np.ndarray, plans: Sequence[Plan], capacity: int, path: str | Path) -> Path:
    """Left: histogram of prediction lengths. Right: each row's fill, fullest first, per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    left.hist(lengths, bins=min(80, max(10, int(np.sqrt(lengths.shape[0])))), color="#4c72b0")
    left.axvline(capacity, color="#c44e52", linestyle="--", label=f"capacity {capacity}")
    left.set(xlabel="prediction pairs per example", ylabel="examples", yscale="log")
    left.set_title(f"{lengths.shape[0]:,} examples, {int(lengths.sum()):,} pairs")
    left.legend()
    lower = -(-int(lengths.sum()) // capacity)
    for k, plan in enumerate(plans):
        fill = np.bincount(plan.row_of, weights=plan.lengths, minlength=plan.num_rows) / capacity
        fill = np.sort(fill)[::-1]
        eff = plan.stats()["efficiency"]
        style = ("-", "--", "-.", ":")[k % 4]
        label = f"{plan.policy} ({eff:.2%})"
        right.plot(np.arange(1, fill.shape[0] + 1), fill, style, label=label, linewidth=1.6)
    right.axvline(lower, color="gray", linestyle=":", label=f"lower bound {lower:,} rows")
    right.set(xlabel="rows, fullest first", ylabel="row fill", ylim=(0, 1.05))
    right.set_title("row fill by policy (efficiency)")
    right.legend(fontsize="small")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
