import json
import subprocess
import sys

import numpy as np
import pytest

from seqpack import InvalidInput, PackConfig, Partition, pack_examples
from seqpack.core.fixture import fixture_batch, fixture_binding, fixture_examples
from seqpack.figure import draw_batch, draw_fixture

pytest.importorskip("matplotlib")


def test_png_renders_with_both_rows(tmp_path):
    from matplotlib.image import imread

    path = draw_fixture(tmp_path / "layout.png")
    assert path == tmp_path / "layout.png"
    image = imread(path)
    assert image.ndim == 3 and image.shape[0] > 600 and image.shape[1] > 1000
    assert image[..., :3].std() > 0.05  # not a blank canvas
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
    # Permitted cells are drawn as "1": one per permitted edge of the batch.
    assert svg.count(">1<") >= len(batch.edges())


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
    wide = pack_examples(Partition.TRAIN, ex, fixture_binding(), PackConfig(64, 1)).batches[0]
    with pytest.raises(InvalidInput, match="too large to draw legibly"):
        draw_batch(wide, "unused.png")


def test_padded_layout_draws_too(tmp_path):
    batch = pack_examples(
        Partition.TRAIN, fixture_examples(), fixture_binding(), PackConfig(4, 3), policy="padded"
    ).batches[0]
    assert np.array_equal(batch.occurrences.row, [0, 1, 2])
    assert draw_batch(batch, tmp_path / "padded.svg").stat().st_size > 0


def test_cli_demo_figure(tmp_path):
    out = tmp_path / "fixture.png"
    proc = subprocess.run(
        [sys.executable, "-m", "seqpack.cli", "demo", "--figure", str(out), "--compact"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["figure"] == str(out) and out.stat().st_size > 10_000
    bad = subprocess.run(
        [sys.executable, "-m", "seqpack.cli", "demo", "--figure", str(tmp_path / "x.gif")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "use .png or .svg" in bad.stderr
