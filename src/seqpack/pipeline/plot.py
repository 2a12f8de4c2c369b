"""The ``seqpack stats --plot`` figure: length histogram and row fill per policy.

:func:`check_plot_path` runs before any input is read, so a path matplotlib
cannot write (an unknown format, a folder, an unwritable place) is one line,
not a traceback after the planning.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from seqpack.core.errors import InvalidInput, NotAvailable
from seqpack.core.plan import Plan


def check_plot_path(path: str | os.PathLike[str]) -> Path:
    """``path`` when matplotlib can write a figure there; else :class:`InvalidInput`.

    The suffix must name a format matplotlib writes (``.png``, ``.svg``,
    ``.pdf``...); the path must not be a folder; its nearest existing parent
    must be a writable folder (missing folders are created when drawing).
    """
    out = Path(path)
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError as err:
        raise NotAvailable("--plot needs matplotlib: pip install 'seqpack[plot]'") from err
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
