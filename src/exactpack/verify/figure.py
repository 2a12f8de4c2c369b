"""Draw a packed batch: each row's cell fields above its permission matrix.

One panel per storage row: the :data:`FIELDS` one line each, column by column, and under
them the row's permission matrix (a row per **query** column, a column per **key**
column). Cells are tinted by occurrence, so on the fixture B's 2x2 causal block at
columns 3-4 stands beside A's 3x3 block::

    q\\k 0 1 2 3 4 5
    3    . . . 1 . .      B's first query: only itself
    4    . . . 1 1 .      B's second query: B only, never A

PNG or SVG by the file extension; the file is written whole or not at all.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from exactpack.core.batch import PackedBatch
from exactpack.core.errors import InvalidInput, NotAvailable
from exactpack.io.atomic import write_file

FORMATS = {".png": "png", ".svg": "svg"}
_NO_STAMP = {"png": {"Software": None}, "svg": {"Date": None}}
FIELDS = (
    ("input", "inputs"),
    ("target", "targets"),
    ("segment", "segments"),
    ("position", "positions"),
    ("input valid", "input_valid"),
    ("target valid", "target_valid"),
    ("loss eligible", "loss_mask"),
)
PAD_COLOR = (0.86, 0.86, 0.86)  # RGB
CELL_INCHES = 0.5
MAX_ROWS = 8
MAX_COLUMNS = 48
CENTRED = {"ha": "center", "va": "center", "fontsize": 9}


def _figure(path: str | os.PathLike[str], figsize: tuple[float, float]) -> tuple[Any, Path]:
    """A constrained-layout matplotlib figure on the Agg canvas for ``path`` (checked first)."""
    path = Path(path)
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise InvalidInput(
            f"figure path {str(path)!r} has extension {path.suffix or '(none)'!r}; use .png or .svg"
        )
    if not path.parent.is_dir():
        raise InvalidInput(f"folder {str(path.parent)!r} for the figure does not exist — create it")
    os.environ.setdefault("MPLCONFIGDIR", str(Path(tempfile.gettempdir()) / "exactpack-matplotlib"))
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise NotAvailable(
            "drawing figures needs matplotlib — pip install 'exactpack[plot]'"
        ) from None
    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, path


def _cell_colors(batch: PackedBatch, row: int) -> np.ndarray:
    """RGB (T, 3) of row ``row``'s cells: one colour per occurrence, padding grey."""
    from matplotlib import colormaps

    palette = colormaps["tab10"]
    colors = {int(s): palette(i % 10)[:3] for i, s in enumerate(batch.occurrences.segment)}
    return np.array([colors[int(s)] if s >= 0 else PAD_COLOR for s in batch.segments[row]])


def _tint(rgb: np.ndarray, strength: float) -> np.ndarray:
    """Blend colours (..., 3) towards white; ``strength`` 1 keeps them."""
    return 1.0 - strength * (1.0 - rgb)


def _permission_image(allowed: np.ndarray, valid: np.ndarray, query_rgb: np.ndarray) -> np.ndarray:
    """RGB (Q, K, 3): permitted cells in the query's colour, pairs touching padding grey."""
    image = np.ones((*allowed.shape, 3))
    image[~(valid[:, None] & valid[None, :])] = _tint(np.array(PAD_COLOR), 0.6)
    image[allowed] = np.broadcast_to(query_rgb[:, None], image.shape)[allowed]
    return image


def _draw_row(fig_axes: tuple[Any, Any], batch: PackedBatch, row: int) -> None:
    fields_ax, matrix_ax = fig_axes
    width = batch.shape[1]
    seg = batch.segments[row]
    occ = batch.occurrences
    names = {int(s): str(n) for s, n in zip(occ.segment, occ.source_ids, strict=True)}
    cell_rgb = _cell_colors(batch, row)  # (T, 3)
    fields_ax.imshow(np.broadcast_to(_tint(cell_rgb, 0.35), (len(FIELDS), width, 3)))
    for line, (_, attr) in enumerate(FIELDS):
        for col, value in enumerate(getattr(batch, attr)[row].tolist()):  # bool: ✓ / ✗
            text = ("✓" if value else "✗") if isinstance(value, bool) else str(value)
            fields_ax.text(col, line, text, **CENTRED)
    fields_ax.set_yticks(range(len(FIELDS)), [label for label, _ in FIELDS], fontsize=9)
    occupant = [names.get(int(s), "pad") for s in seg]
    fields_ax.set_xticks(range(width), [f"{c}\n{o}" for c, o in enumerate(occupant)], fontsize=9)
    fields_ax.xaxis.set_ticks_position("top")
    fields_ax.set_title(f"row {batch.first_row + row}: storage column / occupant", fontsize=10)

    allowed = batch.dense_mask()[row]  # (T, T): query, key
    matrix_ax.imshow(_permission_image(allowed, batch.input_valid[row], _tint(cell_rgb, 0.75)))
    for q in range(width):
        for k in range(width):
            bold = "bold" if allowed[q, k] else "normal"
            matrix_ax.text(k, q, "1" if allowed[q, k] else "·", fontweight=bold, **CENTRED)
    matrix_ax.set_xticks(range(width), [str(k) for k in range(width)], fontsize=9)
    ylabels = [
        f"q{q} {occupant[q]}·p{batch.positions[row, q]}"
        if batch.input_valid[row, q]
        else f"q{q} pad"
        for q in range(width)
    ]
    matrix_ax.set_yticks(range(width), ylabels, fontsize=9)
    matrix_ax.set_xlabel("key column", fontsize=9)
    matrix_ax.set_ylabel("query column · occupant · local position", fontsize=9)
    for ax, n in ((fields_ax, len(FIELDS)), (matrix_ax, width)):
        ax.set_xticks(np.arange(-0.5, width), minor=True)
        ax.set_yticks(np.arange(-0.5, n), minor=True)
        ax.grid(which="minor", color="white", linewidth=1.5)
        ax.tick_params(which="both", length=0)
        ax.spines[:].set_visible(False)


def draw_batch(batch: PackedBatch, path: str | os.PathLike[str], title: str | None = None) -> Path:
    """Draw every row of ``batch`` (fields above permission matrix) to ``path`` (.png/.svg)."""
    rows, width = batch.shape
    if rows > MAX_ROWS or width > MAX_COLUMNS:
        raise InvalidInput(
            f"a batch of {rows} rows x {width} columns is too large to draw legibly"
            f" (at most {MAX_ROWS} rows x {MAX_COLUMNS} columns) — draw a smaller batch"
        )
    panel_w = CELL_INCHES * width + 2.4
    panel_h = CELL_INCHES * (len(FIELDS) + width) + 1.6
    fig, target = _figure(path, (max(panel_w * rows, 8.0), panel_h + 0.9))
    grid = fig.add_gridspec(2, rows, height_ratios=[len(FIELDS), width])
    for r in range(rows):
        _draw_row((fig.add_subplot(grid[0, r]), fig.add_subplot(grid[1, r])), batch, r)
    fig.suptitle(
        title or "packed rows: cell fields aligned with each row's permission matrix",
        fontsize=12,
    )
    fig.supxlabel(
        "matrix: row = query column, column = key column; 1 = permitted"
        " (both valid, same occurrence, key position ≤ query position)",
        fontsize=9,
    )
    return _save(fig, target)


#: Bins across a wide row's permission image (columns sampled evenly, one pixel each).
WIDE_BINS = 512


def draw_row(batch: PackedBatch, path: str | os.PathLike[str], title: str | None = None) -> Path:
    """Draw the one row of ``batch`` (``exactpack show DIR --row N --figure PATH``).

    Up to :data:`MAX_COLUMNS` cells it is :func:`draw_batch`'s panel. A wider row is an
    overview: occupants along the columns, local positions and loss-eligible targets under
    them, and the permission matrix (from the key ranges) at :data:`WIDE_BINS` columns.
    """
    if batch.shape[0] != 1:
        raise InvalidInput(f"draw_row draws one row; this batch has {batch.shape[0]}")
    if batch.shape[1] <= MAX_COLUMNS:
        return draw_batch(batch, path, title)
    fig, target = _figure(path, (11, 13))
    grid = fig.add_gridspec(3, 1, height_ratios=[1.1, 1.6, 7])
    _draw_wide(batch, [fig.add_subplot(grid[i, 0]) for i in range(3)])
    fig.suptitle(title or f"packed row {batch.first_row}", fontsize=12)
    return _save(fig, target)


def _draw_wide(batch: PackedBatch, axes: list[Any]) -> None:
    strip_ax, pos_ax, matrix_ax = axes
    width = batch.shape[1]
    pos, cell_rgb = batch.positions[0], _cell_colors(batch, 0)  # (T,), (T, 3)
    occ = batch.occurrences
    strip_ax.imshow(cell_rgb[None], aspect="auto", interpolation="nearest")
    for a, b, name in zip(occ.col_start, occ.col_end, occ.source_ids, strict=True):
        if (b - a) * 40 >= width:  # room for a label
            strip_ax.text((a + b - 1) / 2, 0, f"{name}\n{b - a}", **CENTRED | {"fontsize": 8})
    strip_ax.set_yticks([])
    strip_ax.set_title(
        f"{len(occ)} examples in {width:,} cells ({int(batch.input_valid[0].sum()):,} used);"
        " grey = padding",
        fontsize=10,
    )
    cols = np.arange(width)
    pos_ax.scatter(cols, pos, c=cell_rgb, s=2, marker="s", linewidths=0)
    unsupervised = cols[batch.input_valid[0] & ~batch.loss_mask[0]]
    below = np.full(unsupervised.shape[0], -0.04 * max(1, int(pos.max())))
    pos_ax.scatter(unsupervised, below, c="black", s=8, marker="|", linewidths=0.6)
    pos_ax.set_xlim(-0.5, width - 0.5)
    pos_ax.set_ylabel("local position", fontsize=9)
    pos_ax.set_title(
        "local positions (restart at 0 per example); black ticks: target not supervised",
        fontsize=10,
    )
    idx = np.unique(np.linspace(0, width - 1, min(width, WIDE_BINS)).round().astype(np.int64))
    ranges = batch.key_ranges()
    starts, ends = ranges.starts[0][idx], ranges.ends[0][idx]
    allowed = (idx[None, :] >= starts[:, None]) & (idx[None, :] < ends[:, None])  # (q, k)
    image = _permission_image(allowed, batch.input_valid[0][idx], cell_rgb[idx])
    extent = (-0.5, width - 0.5, width - 0.5, -0.5)
    matrix_ax.imshow(image, extent=extent, interpolation="nearest")
    matrix_ax.set_xlabel("key column", fontsize=9)
    matrix_ax.set_ylabel("query column", fontsize=9)
    matrix_ax.set_title(
        "permission (coloured = permitted: same example, key position <= query position;"
        f" sampled at {idx.shape[0]} columns)",
        fontsize=10,
    )


def _save(fig: Any, target: Path) -> Path:
    """Write ``fig`` to ``target`` whole or not at all (:func:`~exactpack.io.atomic.write_file`)."""
    from matplotlib import rc_context

    fmt = FORMATS[target.suffix.lower()]
    with rc_context({"svg.fonttype": "none", "svg.hashsalt": "exactpack"}):
        write_file(target, lambda f: fig.savefig(f, format=fmt, dpi=150, metadata=_NO_STAMP[fmt]))
    return target


def draw_fixture(path: str | os.PathLike[str]) -> Path:
    """Draw the seed's A/B/C fixture batch (``exactpack demo --figure PATH``)."""
    from exactpack.verify.fixture import fixture_batch

    return draw_batch(
        fixture_batch(),
        path,
        title="A=[0,99,100,1]  B=[0,101,1]  C=[0,102,103,104,1]  packed next-fit at capacity 6",
    )
