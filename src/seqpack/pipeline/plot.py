"""The ``seqpack stats --plot`` figure: length histogram and row fill per policy."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from seqpack.core.plan import Plan


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
