"""Messages that send the user the right way, visible progress and versions (issue 23, 6-7).

Each test runs the real command line (``exactpack.cli.main`` or ``python -m
exactpack``) on files it writes, and checks the one line a user reads; the
Python API's lines are checked for its own words (keywords, not flags).
"""

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from exactpack.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from workloads import stdlib_texts, train_bpe


def run(*args, env=None, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "exactpack", *map(str, args)],
        capture_output=True, text=True, check=False, cwd=cwd,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def _texts(tmp_path, lengths):
    """JSON Lines of text documents of the given byte lengths (byte tokenizer: len + 1 pairs)."""
    path = tmp_path / "data.jsonl"
    with path.open("w") as f:
        for i, n in enumerate(lengths):
            f.write(json.dumps({"id": f"doc-{i}", "text": "x" * int(n)}) + "\n")
    return path


def _one_line(capsys):
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def test_out_on_a_folder_exactpack_did_not_write_never_suggests_overwrite(tmp_path, capsys):
    data = _texts(tmp_path, [5, 7, 9])
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    for extra in ([], ["--overwrite"]):
        argv = ["pack", str(data), "--tokenizer", "bytes", "--max-length", "64", "--out", str(mine)]
        assert main([*argv, *extra]) == 2
        err = _one_line(capsys)
        assert "not a exactpack output" in err and "choose another --out" in err
        assert "pass --overwrite" not in err
    assert (mine / "notes.txt").read_text() == "keep me"
    # a real exactpack output still says --overwrite, which then works
    out = tmp_path / "out"
    argv = ["pack", str(data), "--tokenizer", "bytes", "--max-length", "64", "--out", str(out)]
    assert main(argv) == 0
    capsys.readouterr()
    assert main(argv) == 2 and "pass --overwrite" in _one_line(capsys)
    assert main([*argv, "--overwrite"]) == 0


def test_a_packed_folder_given_as_input_is_recognised_as_packed(tmp_path, capsys):
    data = _texts(tmp_path, [5, 7, 9])
    out = tmp_path / "packed"
    assert (
        main(["pack", str(data), "--tokenizer", "bytes", "--max-length", "64", "--out", str(out)])
        == 0
    )
    capsys.readouterr()
    shard = next(out.glob("*.parquet"))
    for argv in (
        ["pack", str(out), "--max-length", "64", "--out", str(tmp_path / "again")],
        [
            "pack",
            str(shard),
            "--vocab-size",
            "300",
            "--max-length",
            "64",
            "--out",
            str(tmp_path / "x"),
        ],
        ["stats", str(out), "--max-length", "64"],
    ):
        assert main(argv) == 2
        err = _one_line(capsys)
        assert "is a exactpack output" in err and "already packed" in err and "load_packed" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.jsonl", "packed"]


def test_stats_counts_every_oversized_example_and_the_capacities_that_fit(tmp_path, capsys):
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 400, size=500)
    data = _texts(tmp_path, lengths)
    pairs = lengths + 1  # the byte tokenizer adds BOS and EOS: n bytes -> n + 1 pairs
    capacity = 300
    assert (
        main(["stats", str(data), "--tokenizer", "bytes", "--max-length", str(capacity), "--json"])
        == 0
    )
    captured = capsys.readouterr()
    report = json.loads(captured.out.strip().splitlines()[-1])
    over = report["oversized"]
    want_over = pairs > capacity
    assert over["examples"] == int(want_over.sum()) > 1 and over["of"] == 500
    assert over["first"].startswith(f"{data} line {int(np.argmax(want_over)) + 1} ")
    # the smallest capacity at which at least 99% / all examples fit, counted directly
    fits = [c for c in range(1, int(pairs.max()) + 1) if (pairs <= c).mean() >= 0.99]
    assert over["capacity_99"] == fits[0] and over["capacity_100"] == int(pairs.max())
    assert report["examples"] == int((~want_over).sum())  # the policies plan those that fit
    assert report["tokens"] == int(pairs[~want_over].sum())
    err = captured.err
    assert err.count("\n") == 1 and err.startswith("exactpack stats: warning: ")
    assert f"{over['examples']} of 500 examples are longer than capacity 300" in err
    assert f"capacity {fits[0]} fits 99%" in err and "--cut-long" in err
    # nothing fits: one error line, exit 2, still counting them all
    assert main(["stats", str(data), "--tokenizer", "bytes", "--max-length", "1"]) == 2
    err = _one_line(capsys)
    assert "500 of 500 examples are longer than capacity 1" in err and "none fits" in err


def test_one_oversized_example_in_each_callers_words(tmp_path, capsys):
    """The library says max_length= / cut_long=True; the command line, its flags."""
    from exactpack import BudgetExceeded, OversizedExample
    from exactpack.pipeline import pack_path, stats_path

    data = _texts(tmp_path, [3, 40])
    py = r"raise max_length= \(.*\), cut them with cut_long=True, or truncate them with trunc"
    with pytest.raises(OversizedExample, match=py):
        pack_path(data, tmp_path / "out", max_length=8, tokenizer="bytes")
    report = stats_path(data, max_length=8, tokenizer="bytes")
    assert report["oversized"]["examples"] == 1
    with pytest.raises(BudgetExceeded) as err:
        pack_path(data, tmp_path / "out", max_length=64, tokenizer="bytes", max_metadata_bytes=1024)
    assert "lower chunk_bytes=, shard_tokens=, max_rows_per_batch=" in str(err.value)
    assert " --" not in str(err.value)
    argv = [str(data), "--tokenizer", "bytes", "--max-length", "8"]
    assert main(["pack", *argv, "--out", str(tmp_path / "out")]) == 2
    line = _one_line(capsys)
    assert (
        "— raise --max-length (the longest, 42 tokens, needs 41), cut them with --cut-long" in line
    )
    assert line.endswith("truncate them with --truncation-mode ('keep_start' or 'keep_end')\n")
    assert main(["stats", *argv]) == 0
    warning = capsys.readouterr().err
    assert warning.rstrip().endswith("— raise --max-length or pass --cut-long"), warning


def test_python_callers_get_a_did_you_mean_for_a_mistyped_keyword():
    """Not 'policy X takes no option cut_lng': the keyword meant, or the keywords there are."""
    import datasets

    from exactpack import InvalidInput, PackOptions
    from exactpack.hf import pack_dataset

    ds = datasets.Dataset.from_dict({"input_ids": [[0, 5, 6, 1], [0, 7, 1]]})
    for typo, meant in (("cut_lng", "cut_long"), ("max_rows_per_batc", "max_rows_per_batch")):
        with pytest.raises(InvalidInput, match=rf"unknown keyword {typo} — did you mean {meant}\?"):
            pack_dataset(ds, 64, vocab_size=10, **{typo: True})
        with pytest.raises(InvalidInput, match=rf"option\(s\) {typo} — did you mean {meant}\?"):
            PackOptions.of(max_length=64, **{typo: True})
    with pytest.raises(InvalidInput, match=r"lookahed — did you mean lookahead\?"):
        pack_dataset(ds, 64, "stream-best-fit", vocab_size=10, lookahed=8)
    with pytest.raises(InvalidInput, match=r"lookahead is stream-best-fit's"):
        pack_dataset(ds, 64, "next-fit", vocab_size=10, lookahead=8)
    with pytest.raises(InvalidInput, match=r"unknown keyword zzz; its keywords are PackOptions"):
        pack_dataset(ds, 64, vocab_size=10, zzz=1)
    assert len(pack_dataset(ds, 64, "stream-best-fit", vocab_size=10, lookahead=8)) == 1


def test_version_and_trl_s_policy_name(tmp_path, capsys):
    from exactpack import __version__, plan_rows

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.strip() == f"exactpack {__version__}"
    data = _texts(tmp_path, [5, 30, 7, 9, 50, 2])
    assert main(["pack", str(data), "--tokenizer", "bytes", "--max-length", "64", "--policy", "bfd",
                 "--out", str(tmp_path / "o"), "--json"]) == 0  # fmt: skip
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    want = plan_rows(np.array([5, 30, 7, 9, 50, 2]) + 1, 64, "best-fit-decreasing")
    assert stats["policy"] == "best-fit-decreasing" and stats["rows"] == want.num_rows


def test_a_pipe_gets_periodic_plain_lines_with_progress_and_nothing_without(tmp_path):
    data = _texts(tmp_path, np.arange(1, 400))
    args = ("pack", data, "--tokenizer", "bytes", "--max-length", "512", "--chunk-bytes", "4000")
    often = {"EXACTPACK_PROGRESS_SECONDS": "0.001"}
    quiet = run(*args, "--out", tmp_path / "a", env=often)
    assert quiet.returncode == 0 and quiet.stderr == ""  # a pipe, not asked: stderr stays clean
    shown = run(*args, "--out", tmp_path / "b", "--progress", env=often)
    assert shown.returncode == 0
    lines = [ln for ln in shown.stderr.splitlines() if ln.startswith("exactpack: reading: ")]
    assert len(lines) >= 2 and "\r" not in shown.stderr  # lines, not a redrawn bar
    size = f"{data.stat().st_size / 1e3:.1f} kB"
    assert lines[-1].startswith(f"exactpack: reading: {size} of {size} (100%), ")
    assert "399 docs" in lines[-1]
    assert any(
        ln.startswith("exactpack: writing: ") and " rows, " in ln
        for ln in shown.stderr.splitlines()
    )


def _on_a_pty(argv, columns):
    """Run ``argv`` with stderr on a new pty of ``columns`` columns (0: no size); its output."""
    import fcntl
    import struct
    import termios

    master, slave = pty.openpty()
    try:
        if columns:
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=slave, check=False)
        os.close(slave)
        chunks = []
        while True:
            try:
                part = os.read(master, 65536)
            except OSError:
                break
            if not part:
                break
            chunks.append(part)
    finally:
        os.close(master)
    return proc, b"".join(chunks).decode().replace("\r\n", "\n")  # a pty writes \r\n


def test_a_pty_without_a_size_gets_plain_lines_and_a_sized_one_a_bar(tmp_path):
    data = _texts(tmp_path, [5, 7, 9])
    argv = [sys.executable, "-m", "exactpack", "pack", str(data), "--tokenizer", "bytes",
            "--max-length", "64", "--out"]  # fmt: skip
    proc, err = _on_a_pty([*argv, str(tmp_path / "a")], 0)  # a new pty reports 0 columns
    assert proc.returncode == 0
    assert "exactpack: reading: " in err and "exactpack: writing: " in err
    assert "\r" not in err  # lines, no bar redraws
    proc, err = _on_a_pty([*argv, str(tmp_path / "b")], 100)
    assert proc.returncode == 0
    assert "\r" in err and "exactpack: reading:" in err and "%|" in err  # tqdm's bar


def test_the_reading_bar_moves_while_a_chunk_is_tokenized(tmp_path, monkeypatch):
    from exactpack.io import tokenizers
    from exactpack.pipeline.progress import progress_bar

    texts = [t for _, t in stdlib_texts(200, 2000)[:40]]
    tok = tokenizers.load_tokenizer(train_bpe(texts, 300, tmp_path / "tokenizer.json"))
    monkeypatch.setattr(tokenizers, "ENCODE_BATCH", 4000)  # several batches in one chunk
    seen = []
    with progress_bar(1000, "reading", "B", False) as bar:
        original = bar.update

        def update(n=1):
            original(n)
            seen.append(bar.n)

        bar.update = update
        with bar.chunk(1000):
            _, offsets = tok.encode_batch(texts)
    batches = len(tokenizers.text_spans(texts, 4000))
    assert batches >= 3 and len(seen) >= batches - 1
    assert seen == sorted(seen) and seen[0] < 1000 and seen[-1] == 1000
    assert offsets.shape[0] == len(texts) + 1
