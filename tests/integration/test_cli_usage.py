"""Command lines refused before any input is read (tests/support/hostile_cases.py ``USAGE``).

Every one: exit code 2, one line on stderr ``exactpack CMD: error: ...`` naming
the flag and the fix (argparse's usage block is not printed), nothing on
stdout, nothing written.
"""

import subprocess
import sys

import pytest

from support.hostile_cases import DATA, USAGE, Usage, lines, run_usage


@pytest.mark.parametrize("case", USAGE, ids=lambda c: c.name)
def test_a_refused_command_line_is_one_line_exit_2_and_nothing_written(case: Usage, tmp_path):
    got = run_usage(case, tmp_path)
    command = f"exactpack {case.argv[0]}" if case.argv else "exactpack"
    assert got.cli_code == 2, got.cli_stderr
    assert got.cli_stdout == "" and got.cli_written == []
    assert got.cli_stderr.count("\n") == 1 and got.cli_stderr.startswith(f"{command}: error: ")
    for needle in case.needles:
        assert needle in got.cli_stderr, (needle, got.cli_stderr)


def test_the_real_entry_point_prints_the_same_line(tmp_path):
    case = next(c for c in USAGE if c.name == "capacity-inf")
    want = run_usage(case, tmp_path).cli_stderr
    proc = subprocess.run(
        [sys.executable, "-m", "exactpack", *case.argv],
        capture_output=True, text=True, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr == want


def test_help_still_prints_the_usage_and_exits_0(capsys):
    from exactpack.cli import main

    with pytest.raises(SystemExit) as info:
        main(["pack", "--help"])
    assert info.value.code == 0
    assert "--max-length N" in capsys.readouterr().out


def test_a_tokenizer_folder_s_code_never_runs_and_nothing_is_asked(tmp_path):
    """The real CLI, with 'y' waiting on stdin: refused in one line, the marker never made."""
    from support.hostile_cases import _remote_code_tokenizer

    _remote_code_tokenizer(tmp_path)
    (tmp_path / DATA).write_bytes(lines({"text": "hi"}))
    for command in (["pack", DATA, "--out", "out"], ["stats", DATA]):
        proc = subprocess.run(
            [sys.executable, "-m", "exactpack", *command, "--max-length", "8",
             "--tokenizer", "tok"],
            input="y\ny\n", capture_output=True, text=True, check=False, cwd=tmp_path,
        )  # fmt: skip
        assert proc.returncode == 2 and proc.stdout == ""
        assert (
            proc.stderr.count("\n") == 1 and "never runs a tokenizer folder's code" in proc.stderr
        )
        assert not (tmp_path / "tok" / "RAN").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [DATA, "tok"]


def test_a_model_folder_s_code_never_runs_and_nothing_is_asked(tmp_path):
    """``exactpack verify`` on a config that maps the model to code of its own ('y' on stdin):
    refused in one line; transformers' module cache (under HF_HOME here) stays empty."""
    import os

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(
        '{"model_type": "evil", "vocab_size": 10, "auto_map": {"AutoConfig":'
        ' "evil.EvilConfig", "AutoModelForCausalLM": "evil.Evil"}}'
    )
    (model / "evil.py").write_text(
        "import pathlib\npathlib.Path(__file__).with_name('RAN').write_text('ran')\n"
    )
    env = os.environ | {"HF_HOME": str(tmp_path / "hf")}
    for flag in ("--hf-config", "--hf-model"):
        proc = subprocess.run(
            [sys.executable, "-m", "exactpack", "verify", flag, str(model)],
            input="y\ny\n", capture_output=True, text=True, check=False, env=env,
        )  # fmt: skip
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        assert proc.stderr.count("\n") == 1 and "contains custom code" in proc.stderr
    assert list(tmp_path.rglob("RAN")) == []
