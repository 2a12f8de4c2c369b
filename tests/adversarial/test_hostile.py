"""The hostile-input catalogue (tests/support/hostile_cases.py) through the CLI and the API.

Every bad input: exit code 2 and one line naming the file/line/example and the
fix, the same words as the API's typed exception, and nothing written.
"""

import json
import subprocess
import sys

import pytest

from exactpack.cli.flags import in_flags
from exactpack.io.store import load_packed

from support.hostile_cases import CASES, DATA, OUT, Case, run_case
from support.packed_helpers import recovered_examples

ERRORS = [c for c in CASES if c.error is not None]


@pytest.mark.parametrize("case", ERRORS, ids=lambda c: c.name)
def test_bad_input_is_one_clear_line_a_typed_error_and_nothing_written(case: Case, tmp_path):
    got = run_case(case, tmp_path)
    assert got.api_error is case.error, (got.api_error, got.api_message)
    for needle in case.needles:
        assert needle in got.api_message, (needle, got.api_message)
    assert any(m in got.api_message for m in (" — ", "; use ")), "it says what to do"
    assert got.api_written == []
    if case.argv is not None:
        assert got.cli_code == 2
        assert got.cli_stdout == ""
        # the same words, the API's keywords (cut_long=True) as their flags (--cut-long)
        assert got.cli_stderr == f"exactpack pack: error: {in_flags(got.api_message)}\n"
        assert got.cli_written == []


def test_duplicate_ids_are_packed_as_occurrences_and_reported(tmp_path):
    case = next(c for c in CASES if c.name == "duplicate-ids")
    got = run_case(case, tmp_path)
    assert got.cli_code == 0 and got.api_error is None
    warning = [line for line in got.cli_stderr.splitlines() if "warning" in line]
    assert len(warning) == 1 and all(n in warning[0] for n in case.needles)
    stats = got.api_result
    assert stats["duplicate_ids"] == 1 and stats["examples"] == 2
    assert stats["duplicate_first"] == {
        "id": "a",
        "at": f"{DATA} line 2",
        "first_seen": f"{DATA} line 1",
    }
    store = load_packed(tmp_path / OUT)
    examples = recovered_examples(store)
    assert [examples[i]["source_id"] for i in (0, 1)] == ["a", "a"]
    assert examples[0]["tokens"] != examples[1]["tokens"]  # two occurrences, both kept


def test_a_users_file_in_the_output_stays_with_a_note(tmp_path):
    case = next(c for c in CASES if c.name == "out-holds-a-user-file")
    got = run_case(case, tmp_path)
    assert got.cli_code == 0 and got.api_error is None, got.cli_stderr
    assert all(n in got.cli_stderr for n in case.needles), got.cli_stderr
    assert (tmp_path / OUT / "notes.txt").read_text() == "the user's"
    assert got.api_result["recovered"][0].startswith("left 'notes.txt' in")
    listed = [s["file"] for s in load_packed(tmp_path / OUT).manifest["shards"]]
    assert sorted(p.name for p in (tmp_path / OUT).iterdir()) == sorted(
        ["manifest.json", "notes.txt", *listed]
    )


def test_json_output_carries_the_duplicate_count(tmp_path):
    path = tmp_path / DATA
    path.write_text('{"id": 1, "input_ids": [0, 5, 1]}\n' * 3)
    proc = subprocess.run(
        [sys.executable, "-m", "exactpack", "stats", path, "--max-length", "8", "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])["duplicate_ids"] == 2
    assert "warning: 2 row(s) repeat an earlier id" in proc.stderr


def test_an_oversized_example_packs_with_split_long(tmp_path):
    case = next(c for c in CASES if c.name == "oversized-split-long")
    got = run_case(case, tmp_path)
    assert got.cli_code == 0 and got.cli_stderr == "" and "1 sources split" in got.cli_stdout
    assert got.api_error is None and got.api_result["split_sources"] == 1
    pieces = recovered_examples(load_packed(tmp_path / OUT))
    ranges = sorted(p["range"] for p in pieces.values())
    assert ranges == [(0, 5), (4, 9), (8, 10)]
    for p in pieces.values():
        assert p["tokens"] == list(range(10))[p["range"][0] : p["range"][1]]


@pytest.mark.parametrize("name", ["null-line", "negative-id", "budget-too-small"])
def test_the_real_entry_point_agrees_with_the_in_process_cli(name, tmp_path):
    case = next(c for c in CASES if c.name == name)
    got = run_case(case, tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "exactpack", *case.argv],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert proc.stderr == got.cli_stderr
    assert not (tmp_path / OUT).exists()


def test_argparse_refuses_a_non_integer_capacity_in_one_line(tmp_path, capsys):
    from exactpack.cli import main

    code = main(["pack", "x.jsonl", "--out", str(tmp_path / "o"), "--max-length", "lots"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("exactpack pack: error: --max-length 'lots' is not a whole number")
    assert not (tmp_path / "o").exists()


def test_docs_reliability_lists_every_case_as_generated():
    """Inputs and expectations match; observed words may vary with pyarrow/tokenizers versions."""
    from gen_reliability import DOC, render

    def rows(text):
        return [line.split(" | ")[:3] for line in text.splitlines() if line.startswith("| ")]

    assert rows(DOC.read_text()) == rows(render()), "run .venv/bin/python tests/gen_reliability.py"


@pytest.mark.parametrize(
    ("text", "size"), [("123", 123), ("1K", 1024), ("1.5M", 3 << 19), ("2GiB", 2 << 30)]
)
def test_byte_sizes_on_the_command_line(text, size):
    from exactpack.cli.flags import parse_byte_size

    assert parse_byte_size(text, "--max-metadata-bytes") == size


def test_a_bad_byte_size_is_refused(capsys):
    from exactpack.cli import main

    code = main(["pack", "x", "--out", "o", "--max-length", "4", "--max-metadata-bytes", "lots"])
    assert code == 2
    assert "'lots' is not a byte size like 512M or 2G" in capsys.readouterr().err
