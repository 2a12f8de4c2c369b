"""``exactpack stats``: rows, lower bound, efficiency and time of every policy, nothing written;
``--plot``: the length histogram and row fill per policy."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from exactpack.core.errors import InvalidInput, NotAvailable, OversizedExample
from exactpack.core.examples import long_ranges
from exactpack.core.plan import Plan
from exactpack.core.policies import POLICIES, plan_rows
from exactpack.core.supervision import Objective
from exactpack.io.integrity import refuse_packed
from exactpack.io.readers import read_documents
from exactpack.pipeline.local import duplicate_report
from exactpack.pipeline.options import PackOptions, policy_name


def compare_policies(
    lengths: np.ndarray,
    capacity: int,
    policies: Sequence[str] | None = None,
    labels: Callable[[int], str] | None = None,
) -> list[tuple[Plan, float]]:
    """Plan ``lengths`` with every policy (default: all); (plan, seconds) each, after a warm-up."""
    out = []
    for name in [policy_name(p) for p in policies] if policies else list(POLICIES):
        plan_rows(lengths[:8], capacity, name, labels=labels)
        t0 = time.perf_counter()
        plan = plan_rows(lengths, capacity, name, labels=labels)
        out.append((plan, time.perf_counter() - t0))
    return out


def stats_path(
    source: str | Path | Any,
    options: PackOptions | None = None,
    /,
    *,
    policies: Sequence[str] | None = None,
    plot: str | Path | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """Rows, lower bound, efficiency and planning time of every policy; no rows written.

    With ``format="trl"`` lengths, capacity and statistics count tokens (TRL's unit)."""
    opts = PackOptions.of(options, **overrides)
    if opts.tree is not None:  # tree vs flat under one policy (docs/tree.md)
        from exactpack.pipeline.pack_tree import tree_stats

        policy = policies[0] if policies else opts.policy
        return tree_stats(source, opts, policy)
    if plot is not None:
        check_plot_path(plot)
    capacity = opts.capacity
    if isinstance(source, (str, Path)) and os.path.exists(source):
        refuse_packed(Path(source))
    docs = read_documents(
        source,
        tokenizer=opts.load_tokenizer(),
        text_field=opts.text_field,
        partition=opts.split,
        objective=Objective.of(opts),
    )
    if not len(docs):
        raise InvalidInput(f"{source} holds no rows — nothing to plan")
    counts = np.diff(docs.offsets)
    lengths, split = counts - 1, 0
    if opts.cut_long:  # lengths as packed: the pieces of the longer ones
        _, starts, ends = long_ranges(counts, opts.pair_capacity)
        lengths, split = ends - starts - 1, int(np.count_nonzero(lengths > opts.pair_capacity))
    shift = 1 if opts.format == "trl" else 0  # TRL's unit: tokens (pairs + 1) per example
    lengths = lengths + shift
    located = lambda i: f"{docs.origin.locate(i)} (id {docs.ids[i]!r})"  # noqa: E731
    named = (lambda i: f"example {i}") if split else located
    labels = None if split else located
    over = oversized(lengths, capacity, named, "tokens" if shift else "prediction pairs")
    every = lengths
    if over is not None:  # plan the examples that fit; report the others
        keep = np.flatnonzero(lengths <= capacity)
        lengths = lengths[keep]
        labels = lambda i: named(int(keep[i]))  # noqa: E731
    results = compare_policies(lengths, capacity, policies, labels)
    lower = -(-int(lengths.sum()) // capacity)
    report: dict[str, Any] = {
        "source": str(source),
        "format": opts.format,
        "capacity": capacity,
        "sources": len(docs),
        "split_sources": split,
        "examples": int(lengths.shape[0]),
        "tokens": int(lengths.sum()),
        "lower_bound": lower,
        **({"oversized": over} if over is not None else {}),
        **duplicate_report(docs.ids, docs.origin.locate),
        "policies": [
            plan.stats()
            | {"rows_over_lower_bound": plan.num_rows / max(lower, 1), "seconds": seconds}
            for plan, seconds in results
        ],
    }
    if plot is not None:
        unit = "tokens" if shift else "prediction pairs"
        plans = [p for p, _ in results]
        report["plot"] = str(plot_stats(every, plans, capacity, plot, unit))
    return report


def oversized(
    lengths: np.ndarray, capacity: int, label: Callable[[int], str], unit: str = "prediction pairs"
) -> dict | None:
    """Every example longer than ``capacity`` (lengths in the capacity's unit), counted, with
    the capacities that would fit 99% and 100% of all examples; None when all fit. Raises
    :class:`~exactpack.core.errors.OversizedExample` (saying the same) when none fits."""
    over = lengths > capacity
    count = int(np.count_nonzero(over))
    if not count:
        return None
    ordered = np.sort(lengths)
    first = int(np.argmax(over))
    found = {
        "examples": count,
        "of": int(lengths.shape[0]),
        "first": label(first),
        "first_length": int(lengths[first]),
        "unit": unit,
        "longest": int(ordered[-1]),
        "capacity_99": int(ordered[-(-99 * ordered.shape[0] // 100) - 1]),
        "capacity_100": int(ordered[-1]),
    }
    if count == lengths.shape[0]:
        raise OversizedExample(oversized_line(found, capacity).replace(" — ", "; none fits — "))
    return found


def oversized_line(found: dict, capacity: int) -> str:
    """One line for :func:`oversized`'s report: how many, the first, what capacity fits."""
    return (
        f"{found['examples']:,} of {found['of']:,} examples are longer than capacity"
        f" {capacity:,} (first: {found['first']}, {found['first_length']:,} {found['unit']};"
        f" longest {found['longest']:,}): capacity {found['capacity_99']:,} fits 99% of the"
        f" examples, {found['capacity_100']:,} fits all — raise max_length= or pass cut_long=True"
    )


def check_plot_path(path: str | os.PathLike[str]) -> Path:
    """``path`` when matplotlib can write a figure there (a format it writes, not a folder,
    under a writable folder), checked before any input is read; else InvalidInput."""
    out = Path(path)
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError as err:
        raise NotAvailable("--plot needs matplotlib: pip install 'exactpack[plot]'") from err
    formats = FigureCanvasBase.get_supported_filetypes()
    suffix = out.suffix.lower().lstrip(".")
    if suffix not in formats:
        raise InvalidInput(
            f"--plot {str(path)!r}: {f'.{suffix} is not' if suffix else 'no suffix names'} an"
            " image format matplotlib writes — end the path with one of"
            f" {', '.join('.' + f for f in sorted(formats))} (e.g. stats.png)"
        )
    if out.is_dir():
        raise InvalidInput(f"--plot {str(path)!r} is a folder — name an image file in it")
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise InvalidInput(
            f"--plot {str(path)!r}: cannot write under {str(parent)!r} (not a writable folder)"
            " — choose another path"
        )
    return out


def plot_stats(
    lengths: np.ndarray,
    plans: Sequence[Plan],
    max_length: int,
    path: str | Path,
    unit: str = "prediction pairs",
) -> Path:
    """Left: histogram of every example's length in ``unit``, the ones over ``max_length``
    (not packed) in red beside the cut line. Right: each row's fill, fullest first, per
    policy (of the examples that fit)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    fits = lengths <= max_length
    over = int((~fits).sum())
    bins = np.histogram_bin_edges(lengths, bins=min(80, max(10, int(np.sqrt(lengths.shape[0])))))
    left.hist(
        [lengths[fits], lengths[~fits]], bins=bins, stacked=True, color=["#4c72b0", "#c44e52"],
        label=["packed", f"over max_length: {over:,} (not packed)"],
    )  # fmt: skip
    left.axvline(max_length, color="#c44e52", linestyle="--", label=f"max_length {max_length}")
    left.set(xlabel=f"{unit} per example", ylabel="examples", yscale="log")
    left.set_title(f"{lengths.shape[0]:,} examples, {int(lengths.sum()):,} {unit}")
    left.legend(fontsize="small")
    lengths, capacity = lengths[fits], max_length
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
