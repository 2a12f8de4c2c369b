"""``exactpack show DIR --row N [--figure PATH]``: a user's own packed row, printed and drawn."""

import json

import numpy as np
import pytest

from exactpack.cli import main
from exactpack.verify.fixture import fixture_batch


@pytest.fixture
def packed(tmp_path):
    """The seed's A/B/C fixture packed by the real CLI, next-fit at capacity 6."""
    data = tmp_path / "abc.jsonl"
    docs = {"A": [0, 99, 100, 1], "B": [0, 101, 1], "C": [0, 102, 103, 104, 1]}
    data.write_text("".join(json.dumps({"id": k, "input_ids": v}) + "\n" for k, v in docs.items()))
    out = tmp_path / "abc"
    argv = ["pack", str(data), "--vocab-size", "266", "--max-length", "6", "--policy", "next-fit"]
    assert main([*argv, "--out", str(out)]) == 0
    return out


def test_show_prints_each_row_s_occupants(packed, capsys):
    capsys.readouterr()
    want = fixture_batch()
    for row in (0, 1):
        assert main(["show", str(packed), "--row", str(row), "--json"]) == 0
        got = json.loads(capsys.readouterr().out)
        occ = want.occurrences
        mine = np.flatnonzero(occ.row == row)
        assert [e["source_id"] for e in got["examples"]] == [str(occ.source_ids[i]) for i in mine]
        assert [e["columns"] for e in got["examples"]] == [
            [int(occ.col_start[i]), int(occ.col_end[i])] for i in mine
        ]
        assert got["used"] == int(want.input_valid[row].sum()) and got["cells"] == 6
    assert main(["show", str(packed), "--row", "1"]) == 0
    text = capsys.readouterr().out
    assert "row 1 of 2: 6 cells, 4 used" in text and "'C'[0:5]" in text and "padding" in text


def test_show_draws_the_row_as_the_demo_draws_the_fixture(packed, tmp_path, capsys):
    from exactpack.verify.figure import draw_batch

    png = tmp_path / "row0.png"
    assert main(["show", str(packed), "--row", "0", "--figure", str(png)]) == 0
    assert f"figure: {png}" in capsys.readouterr().out
    # the same drawing as draw_batch of the fixture's first row with that title
    from exactpack.cli.show import load_row

    batch = fixture_batch()
    _, row = load_row(packed, 0)  # read back from disk: the fixture's first row
    for field in ("inputs", "targets", "segments", "positions", "loss_mask"):
        assert np.array_equal(getattr(row, field), getattr(batch, field)[:1]), field
    one = tmp_path / "want.png"
    draw_batch(row, one, title=f"{packed} row 0 of 2")
    assert png.read_bytes() == one.read_bytes()


def test_show_refuses_a_row_outside_the_output_in_one_line(packed, capsys):
    capsys.readouterr()
    assert main(["show", str(packed), "--row", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has rows 0..1; --row 2 is outside them" in err


@pytest.mark.parametrize("fmt", ["exactpack", "trl"])
def test_show_prints_each_example_as_text_with_its_supervised_tokens_marked(tmp_path, capsys, fmt):
    """SFT rows (labels -100 on the prompt): the prompt outside the brackets, the answer
    inside, in both formats; the text decoded by the tokenizer the rows were packed with."""
    from exactpack.io.tokenizers import ByteTokenizer

    tok = ByteTokenizer()
    data = tmp_path / "sft.jsonl"
    rows = []
    for prompt, answer in (("Q: 2+2?", " A: 4"), ("Hi", " there")):
        ids = tok.encode(prompt + answer).tolist()  # BOS, bytes, EOS
        cut = 1 + len(prompt.encode())
        rows.append({"input_ids": ids, "labels": [-100] * cut + ids[cut:]})
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    argv = ["pack", str(data), "--tokenizer", "bytes", "--max-length", "64", "--out", str(out)]
    assert main([*argv, "--format", fmt]) == 0
    capsys.readouterr()
    assert main(["show", str(out), "--text", "--tokenizer", "bytes", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    texts = sorted(e["text"] for e in got["examples"])
    assert texts == ["Hi[[ there]]", "Q: 2+2?[[ A: 4]]"]
    assert main(["show", str(out), "--text"]) == 0  # no tokenizer: the ids, marked the same way
    printed = capsys.readouterr().out
    marked = " ".join(map(str, tok.encode(" there").tolist()[1:]))  # the bytes, EOS included
    assert f"[[{marked}]]" in printed
