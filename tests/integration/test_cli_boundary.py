"""The public boundary (issue 21, "weak"): wrong-type API arguments and hostile file names.

A Python caller passing an argument of the wrong type to ``pack_path``,
``pack_dataset``, ``stats_path`` or ``load_packed`` gets one
:class:`~exactpack.ExactpackError` line naming the argument and what to pass —
never a ``TypeError`` / ``AttributeError`` from deep inside, and never a
wrong type silently taken as true (``overwrite="no"``). A file name holding
control characters (an ANSI escape) is printed escaped, never sent to the
terminal as is.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from exactpack import ExactpackError
from exactpack.io.store import load_packed
from exactpack.pipeline.local import pack_path
from exactpack.pipeline.stats import stats_path


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text(
        "".join(json.dumps({"id": f"d{i}", "text": "abc" * i}) + "\n" for i in range(1, 6))
    )
    return path


OK = {"max_length": 64, "tokenizer": "bytes"}

#: (argument, value, what the one line must say)
OPTION_CASES = [
    ("overwrite", "no", "overwrite must be True or False, got str 'no'"),
    ("cut_long", 1, "cut_long must be True or False, got int 1"),
    ("progress", "yes", "progress must be True, False or None"),
    ("policy_options", [1], "policy_options must be a mapping of option names to values"),
    ("policy", 3, "policy must be a policy name, got int 3"),
    ("spill_dir", 5, "spill_dir must be a folder path or None, got int 5"),
    ("chat_template", 1, "chat_template must be a template file, the template text or None"),
    ("tokenizer", 5, "tokenizer must be 'bytes', a local path or a loaded tokenizer, got int 5"),
    ("tokenizer_id", 5, "tokenizer_id must be a string or None, got int 5"),
    ("split_id", b"x", "split_id must be a string or None, got bytes"),
]


@pytest.mark.parametrize(
    ("name", "value", "needle"), OPTION_CASES, ids=[c[0] for c in OPTION_CASES]
)
def test_a_wrong_type_option_is_one_line_naming_it(tmp_path, data, name, value, needle):
    for call in (
        lambda: pack_path(data, tmp_path / "out", **(OK | {name: value})),
        lambda: stats_path(data, **(OK | {name: value})),
    ):
        with pytest.raises(ExactpackError) as info:
            call()
        assert needle in str(info.value) and "\n" not in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.jsonl"]


def test_wrong_type_paths_and_option_objects(tmp_path, data):
    import datasets

    from exactpack.hf import pack_dataset

    cases = [
        (lambda: pack_path(data, 5, **OK), "out must be a path (str or os.PathLike), got int 5"),
        (
            lambda: pack_path(data, None, **OK),
            "out must be a path (str or os.PathLike), got NoneType",
        ),
        (lambda: pack_path(data, tmp_path / "o", {"capacity": 8}), "options must be a PackOptions"),
        (lambda: load_packed(5), "path must be a path (str or os.PathLike), got int 5"),
        (lambda: load_packed(None), "path must be a path"),
        (
            lambda: load_packed([str(tmp_path)]),
            "path must be a path (str or os.PathLike), got list",
        ),
        (
            lambda: load_packed(tmp_path, expected_binding="x"),
            "expected_binding must be a exactpack.Binding",
        ),
        (
            lambda: pack_dataset(
                datasets.Dataset.from_dict({"input_ids": [[0, 5, 1]]}), 8, options={}
            ),
            "options must be a PackOptions",
        ),
    ]
    for call, needle in cases:
        with pytest.raises(ExactpackError) as info:
            call()
        assert needle in str(info.value), (needle, str(info.value))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.jsonl"]


def test_control_characters_of_a_file_name_are_escaped_on_the_terminal(tmp_path):
    evil = "e\x1b[31mvil\x07.jsonl"
    rows = ("abcdefgh", "ab")
    (tmp_path / evil).write_text("".join(json.dumps({"text": t}) + "\n" for t in rows))
    out = "o\x1b[2Jut"
    env = {**os.environ, "EXACTPACK_PROGRESS_SECONDS": "0.001"}  # progress lines name it too

    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "exactpack", *args, "--tokenizer", "bytes"],
            capture_output=True, cwd=tmp_path, env=env, check=False,
        )  # fmt: skip

    refused = run("pack", evil, "--max-length", "3", "--out", out)
    packed = run("pack", evil, "--max-length", "64", "--out", out, "--progress")
    stats = run("stats", evil, "--max-length", "3")
    assert refused.returncode == 2 and packed.returncode == 0 and stats.returncode == 0
    assert b"e\\x1b[31mvil\\x07.jsonl" in refused.stderr
    assert b"wrote o\\x1b[2Jut:" in packed.stdout and b"e\\x1b[31mvil\\x07.jsonl" in packed.stderr
    assert b"e\\x1b[31mvil\\x07.jsonl line 1" in stats.stderr
    for proc in (refused, packed, stats):
        assert b"\x1b" not in proc.stdout + proc.stderr and b"\x07" not in proc.stderr
    assert Path(tmp_path / out / "manifest.json").is_file()  # the name itself is kept as given


def test_one_border_translates_foreign_errors_and_lets_bugs_through(tmp_path, monkeypatch, capsys):
    """``foreign`` turns an OS, json, msgspec or any pyarrow error into one InvalidInput line
    naming the input and the fix; the command line's border makes one no reader translated
    one line, exit 2. A bug (a TypeError) stays a traceback."""
    import msgspec
    import pyarrow as pa

    from exactpack import cli
    from exactpack.core.errors import InvalidInput, foreign

    arrow = r"^x: cannot read \(no\) — redo$"
    with pytest.raises(InvalidInput, match=arrow), foreign("x: cannot read", "redo", kinds=()):
        raise pa.ArrowNotImplementedError("no")  # pyarrow's, though kinds lists none
    with (
        pytest.raises(InvalidInput, match=r"^y \(No such file or directory\)$"),
        foreign(lambda: "y"),
    ):
        (tmp_path / "absent").read_bytes()
    with pytest.raises(TypeError), foreign("z"):
        raise TypeError("a bug")
    help_text, (add, _) = cli.COMMANDS["stats"]
    for error in (msgspec.DecodeError("torn"), TypeError("a bug")):

        def run(args, error=error):
            raise error

        monkeypatch.setitem(cli.COMMANDS, "stats", (help_text, (add, run)))
        try:
            code = cli.main(["stats", "d.jsonl", "--max-length", "4"])
        except TypeError:
            assert isinstance(error, TypeError)
            continue
        assert code == 2, error
        assert capsys.readouterr().err == "exactpack stats: error: DecodeError: torn\n"
