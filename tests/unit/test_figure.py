import json
import subprocess
import sys

import numpy as np
import pytest

from exactpack import InvalidInput, PackConfig, Split, pack_examples
from exactpack.verify.figure import FIELDS, draw_batch, draw_fixture
from exactpack.verify.figure import PAD_COLOR as PAD_GREY
from exactpack.verify.fixture import fixture_batch, fixture_binding, fixture_examples

from support.reference import Layout, placed_from_records

pytest.importorskip("matplotlib")


@pytest.fixture
def drawn(monkeypatch):
    """The matplotlib Figure each draw saves (its artists are what the file shows)."""
    from matplotlib.figure import Figure

    figures = []
    real = Figure.savefig

    def keep(self, *args, **kwargs):
        figures.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return figures


def grid_texts(ax):
    """``{(line, column): text}`` of the texts an axes draws on its cell grid."""
    out = {}
    for t in ax.texts:
        x, y = t.get_position()
        out[round(y), round(x)] = t.get_text()
    return out


@pytest.mark.parametrize("policy", ["next-fit", "padded", "best-fit-decreasing"])
def test_the_drawn_cells_and_matrices_are_the_reference_permission(tmp_path, drawn, policy):
    examples = fixture_examples()
    width = 6 if policy != "padded" else 4
    batch = pack_examples(
        Split.TRAIN, examples, fixture_binding(), PackConfig(width, 3), policy=policy
    ).batches[0]
    draw_batch(batch, tmp_path / "layout.svg")
    [fig] = drawn
    layout = Layout.build(placed_from_records(batch.occurrences, examples), *batch.shape)
    cells = layout.cells()
    rows = batch.shape[0]
    assert len(fig.axes) == 2 * rows
    for r in range(rows):
        fields_ax, matrix_ax = fig.axes[2 * r], fig.axes[2 * r + 1]
        drawn_matrix = grid_texts(matrix_ax)
        assert sorted(drawn_matrix) == [(q, k) for q in range(width) for k in range(width)]
        for (q, k), text in drawn_matrix.items():
            assert text == ("1" if layout.allowed(r, q, k) else "·"), (r, q, k)
        # Permitted cells take their query's segment tint, forbidden pairs of real cells stay
        # white, pairs with a padding cell are grey.
        image = np.asarray(matrix_ax.images[0].get_array())
        for q in range(width):
            for k in range(width):
                real = layout.owner[r][q] is not None and layout.owner[r][k] is not None
                white = bool(np.allclose(image[q, k], 1.0))
                assert white == (real and not layout.allowed(r, q, k)), (r, q, k)
        fields = {
            (round(t.get_position()[1]), round(t.get_position()[0])): t.get_text()
            for t in fields_ax.texts
        }
        for line, (_, attr) in enumerate(FIELDS):
            for c in range(width):
                value = cells[attr][r][c]
                want = ("✓" if value else "✗") if isinstance(value, bool) else str(value)
                assert fields[(line, c)] == want, (attr, r, c)


def test_png_holds_the_figure_at_150_dpi_with_every_segment_tint(tmp_path, drawn):
    from matplotlib.image import imread

    path = draw_fixture(tmp_path / "layout.png")
    assert path == tmp_path / "layout.png"
    [fig] = drawn
    image = imread(path)[..., :3]  # (H, W, 3) floats in [0, 1]
    inches = fig.get_size_inches()
    assert image.shape[:2] == (round(inches[1] * 150), round(inches[0] * 150))
    # Every permitted cell's colour (its query's segment tint) is painted somewhere.
    pixels = np.unique((image.reshape(-1, 3) * 255).round().astype(int), axis=0)
    for ax in fig.axes[1::2]:
        tints = np.unique(
            (np.asarray(ax.images[0].get_array()) * 255).round().astype(int).reshape(-1, 3), axis=0
        )
        for tint in tints:
            assert (np.abs(pixels - tint).max(axis=1) <= 1).any(), tint
    assert [p.name for p in tmp_path.iterdir()] == ["layout.png"]  # no temporary left


def test_svg_holds_the_aligned_fields_and_permission_labels(tmp_path):
    svg = draw_fixture(tmp_path / "layout.SVG").read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    batch = fixture_batch()
    for label in ("input", "target", "segment", "position", "loss eligible", "key column"):
        assert f">{label}<" in svg, label
    # One query label per storage column: occupant and local position (B restarts at 0).
    for q, occupant, pos in ((0, "A", 0), (3, "B", 0), (4, "B", 1)):
        assert batch.positions[0, q] == pos
        assert f">q{q} {occupant}·p{pos}<" in svg
    assert svg.count(">q5 pad<") == 2 and svg.count(">q4 pad<") == 1  # rows 0 and 1
    # "1" is drawn once per permitted edge, once per numeric field cell holding 1, and as the
    # tick label of storage column 1 and key column 1 of each row.
    numbers = [getattr(batch, attr) for _, attr in FIELDS if getattr(batch, attr).dtype != bool]
    ones_in_fields = sum(int((cells == 1).sum()) for cells in numbers)
    ticks = 2 * batch.shape[0]
    assert svg.count(">1<") == len(batch.edges()) + ones_in_fields + ticks


def test_unknown_extension_is_a_clear_error_and_writes_nothing(tmp_path):
    with pytest.raises(InvalidInput, match=r"extension '\.jpg'; use \.png or \.svg"):
        draw_fixture(tmp_path / "layout.jpg")
    with pytest.raises(InvalidInput, match=r"extension '\(none\)'"):
        draw_fixture(tmp_path / "layout")
    with pytest.raises(InvalidInput, match="does not exist"):
        draw_fixture(tmp_path / "missing" / "layout.png")
    assert list(tmp_path.iterdir()) == []


def test_too_large_batches_are_refused():
    ex = fixture_examples()
    wide = pack_examples(Split.TRAIN, ex, fixture_binding(), PackConfig(64, 1)).batches[0]
    with pytest.raises(InvalidInput, match="too large to draw legibly"):
        draw_batch(wide, "unused.png")


def test_padded_layout_draws_too(tmp_path):
    batch = pack_examples(
        Split.TRAIN, fixture_examples(), fixture_binding(), PackConfig(4, 3), policy="padded"
    ).batches[0]
    assert np.array_equal(batch.occurrences.row, [0, 1, 2])
    svg = draw_batch(batch, tmp_path / "padded.svg").read_text()
    for r in range(3):  # one example per row, each at column 0
        assert f">row {r}: storage column / occupant<" in svg


def test_cli_demo_figure(tmp_path):
    out = tmp_path / "fixture.png"
    proc = subprocess.run(
        [sys.executable, "-m", "exactpack.cli", "demo", "--figure", str(out), "--compact"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["figure"] == str(out)
    # The command draws exactly the fixture figure (PNGs are written without a time stamp).
    assert out.read_bytes() == draw_fixture(tmp_path / "same.png").read_bytes()
    bad = subprocess.run(
        [sys.executable, "-m", "exactpack.cli", "demo", "--figure", str(tmp_path / "x.gif")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "use .png or .svg" in bad.stderr


def test_a_wide_row_draws_its_permission_from_the_predicate(tmp_path, drawn):
    """`draw_row` on a row wider than MAX_COLUMNS: the image's coloured pixels are exactly
    the permitted (query, key) pairs at the sampled columns, by `allowed_key`."""
    from exactpack.core.permission import allowed_key
    from exactpack.verify.figure import MAX_COLUMNS, WIDE_BINS, draw_row

    rng = np.random.default_rng(5)
    width = 3 * WIDE_BINS // 2  # sampled, not every column
    assert width > MAX_COLUMNS
    lengths = [int(n) for n in rng.integers(2, 80, size=9)]  # at most 720 pairs: one row
    records = [(f"d{i}", [0, *(int(t) for t in rng.integers(2, 200, n - 1)), 1])
               for i, n in enumerate(lengths)]  # fmt: skip
    from exactpack import Binding, SequenceExample

    binding = Binding(vocab_size=266, tokenizer_id="t", split_id="s")
    examples = [SequenceExample.from_document(t, source_id=n, partition="train", binding=binding)
                for n, t in records]  # fmt: skip
    batch = pack_examples("train", examples, binding, PackConfig(width, 1), policy="next-fit")
    batch = batch.batches[0]
    draw_row(batch, tmp_path / "row.png")
    [fig] = drawn
    image = fig.axes[2].images[0].get_array()
    idx = np.unique(np.linspace(0, width - 1, WIDE_BINS).round().astype(np.int64))
    assert image.shape[:2] == (idx.shape[0], idx.shape[0])
    colours = {tuple(np.round(image[i, i], 6)) for i in range(idx.shape[0])}
    white, grey = (1.0, 1.0, 1.0), tuple(np.round(1 - 0.6 * (1 - np.array(PAD_GREY)), 6))
    for qi in range(0, idx.shape[0], 7):
        for ki in range(0, idx.shape[0], 5):
            q, k = int(idx[qi]), int(idx[ki])
            pixel = tuple(np.round(image[qi, ki], 6))
            if allowed_key(batch, 0, q, k):
                assert pixel not in (white, grey) and pixel in colours
            else:
                assert pixel in (white, grey)
    assert (tmp_path / "row.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(InvalidInput, match="draw_row draws one row"):
        draw_row(pack_examples("train", examples, binding, PackConfig(100, 4)).batches[0],
                 tmp_path / "two.png")  # fmt: skip
