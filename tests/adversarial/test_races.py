"""Races on the output path: two writers, a killed writer, a user's file appearing, odd paths.

A writer is paused inside its write (after its first shard, holding the
lock) by a subprocess that waits for a file, so each race is replayed
deterministically: the second writer, or the user's action, happens while
the first is certainly in the middle of its pack.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from exactpack.core.errors import InvalidInput
from exactpack.io import atomic
from exactpack.io.atomic import LOCK
from exactpack.io.store import load_packed
from exactpack.pipeline.local import pack_path

from support.packed_helpers import assert_same_batches, random_records, write_jsonl

PAUSED = r"""
import sys, time
from pathlib import Path
import exactpack.io.shards as shards
ready, go = Path(sys.argv[1]), Path(sys.argv[2])
real = shards._write_shard
def paused(table, path):
    real(table, path)
    ready.touch()
    deadline = time.monotonic() + 60
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
shards._write_shard = paused
from exactpack.cli import main
sys.exit(main(sys.argv[3:]))
"""
OPTIONS = ["--max-length", "16", "--vocab-size", "500", "--policy", "next-fit"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    records = random_records(np.random.default_rng(5), 40, vocab=500, max_len=12)
    return write_jsonl(tmp_path_factory.mktemp("races") / "d.jsonl", records)


def _cli(*argv, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "exactpack", *map(str, argv)],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
    )


class Paused:
    """``exactpack pack`` in a subprocess, stopped after its first shard until :meth:`resume`."""

    def __init__(self, tmp_path: Path, data: Path, out: Path, *extra: str) -> None:
        self.ready, self.go = tmp_path / "ready", tmp_path / "go"
        argv = ["pack", str(data), "--out", str(out), *OPTIONS, *extra]
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PAUSED, str(self.ready), str(self.go), *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        while not self.ready.exists():
            assert self.proc.poll() is None, self.proc.communicate()
            assert time.monotonic() < deadline, "the paused writer never wrote a shard"
            time.sleep(0.02)

    def resume(self) -> tuple[int, str]:
        self.go.touch()
        _, err = self.proc.communicate(timeout=120)
        return self.proc.returncode, err


def _fingerprint(out: Path) -> list[str]:
    return [s["sha256"] for s in load_packed(out).manifest["shards"]]


@pytest.mark.parametrize("overwrite", [False, True], ids=["plain", "overwrite"])
def test_a_second_writer_is_refused_naming_the_first(data, tmp_path, overwrite):
    out = tmp_path / "out"
    extra = ("--overwrite",) if overwrite else ()
    first = Paused(tmp_path, data, out, *extra)
    second = _cli("pack", data, "--out", out, *OPTIONS, "--policy", "padded", *extra)
    assert second.returncode == 2 and second.stdout == ""
    assert second.stderr.count("\n") == 1
    assert f"another exactpack run (pid {first.proc.pid} on {socket.gethostname()}" in second.stderr
    assert f"is writing {out} — wait for it to finish, or choose another --out" in second.stderr
    code, err = first.resume()
    assert code == 0, err
    assert load_packed(out).manifest["policy"]["name"] == "next-fit"  # the first one's output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["go", "out", "ready"]


def test_a_lock_left_by_a_killed_writer_is_taken_over(data, tmp_path):
    out = tmp_path / "out"
    first = Paused(tmp_path, data, out)
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait()
    held = json.loads((out / LOCK).read_text())
    assert held["pid"] == first.proc.pid  # the lock file stays, but nobody holds it
    assert not (out / "manifest.json").exists()
    got = _cli("pack", data, "--out", out, *OPTIONS)
    assert got.returncode == 0, got.stderr
    assert f"left by a run that ended (pid {first.proc.pid} on" in got.stderr
    assert "removed 1 file(s) it wrote" in got.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "ready"]
    assert sorted(p.name for p in out.iterdir()) == sorted(["manifest.json", *_listed(out)])
    load_packed(out, integrity="full")


def test_another_thread_of_the_same_process_is_refused(data, tmp_path):
    out, errors = tmp_path / "out", []
    entered, leave = threading.Event(), threading.Event()

    def hold():
        with atomic.open_output(out, overwrite=False):
            entered.set()
            leave.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    entered.wait(30)
    try:
        pack_path(data, out, max_length=16, vocab_size=500)
    except InvalidInput as err:
        errors.append(str(err))
    leave.set()
    holder.join()
    assert len(errors) == 1 and "another thread" in errors[0]
    assert not out.exists()


def _listed(out: Path) -> list[str]:
    return [s["file"] for s in json.loads((out / "manifest.json").read_text())["shards"]]


@pytest.mark.parametrize("target", ["fresh", "overwrite"])
def test_a_file_made_in_the_output_while_packing_survives_with_a_note(data, tmp_path, target):
    out = tmp_path / "out"
    if target == "overwrite":
        pack_path(data, out, max_length=16, vocab_size=500, policy="padded")
    first = Paused(tmp_path, data, out, *(["--overwrite"] if target == "overwrite" else []))
    (out / "notes.txt").write_text("mine")  # while the pack runs
    code, err = first.resume()
    assert code == 0, err
    assert f"note: left 'notes.txt' in {out}: the manifest does not list it" in err
    assert (out / "notes.txt").read_text() == "mine"
    assert load_packed(out).manifest["policy"]["name"] == "next-fit"  # the new output
    assert sorted(p.name for p in out.iterdir()) == sorted(["manifest.json", "notes.txt",
                                                             *_listed(out)])  # fmt: skip


def test_overwrite_removes_only_the_shards_the_previous_manifest_listed(data, tmp_path):
    out = tmp_path / "out"
    pack_path(data, out, max_length=16, vocab_size=500, policy="padded")
    old = _listed(out)
    (out / "shard-0009-00000.parquet").write_bytes(b"the user's, named like a shard")
    (out / "notes.txt").write_text("mine")
    stats = pack_path(data, out, max_length=16, vocab_size=500, overwrite=True)
    assert stats["recovered"] == [
        f"left 'notes.txt', 'shard-0009-00000.parquet' in {out}: the manifest does not list"
        " them and exactpack removes only its own shards"
    ]
    new = _listed(out)
    assert not set(old) & {p.name for p in out.iterdir()}  # the old shards are gone
    assert all(n.startswith("shard-0010-") for n in new)  # past every generation there
    assert (out / "shard-0009-00000.parquet").read_bytes() == b"the user's, named like a shard"
    assert load_packed(out).manifest["policy"]["name"] == "best-fit-decreasing"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_manifest_listing_the_users_files_never_deletes_them(data, tmp_path):
    """An edited manifest naming other files: only names of exactpack's own shards go."""
    out = tmp_path / "out"
    pack_path(data, out, max_length=16, vocab_size=500)
    (out / "notes.txt").write_text("mine")
    (tmp_path / "outside.txt").write_text("mine too")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["shards"] += [{"file": "notes.txt"}, {"file": "../outside.txt"}]
    (out / "manifest.json").write_text(json.dumps(manifest))
    pack_path(data, out, max_length=16, vocab_size=500, overwrite=True)
    assert (out / "notes.txt").read_text() == "mine"
    assert (tmp_path / "outside.txt").read_text() == "mine too"


# ---------------------------------------------------------------- odd output paths


@pytest.mark.parametrize(
    ("out", "needle"),
    [
        (".", "--out '.' names an existing folder by '.', '..' or '/'"),
        ("..", "--out '..' names an existing folder"),
        ("/", "--out '/' names an existing folder"),
        ("sub/..", "--out 'sub/..' names an existing folder"),
        ("", "--out is empty — name the output folder"),
        ("  ", "--out is empty"),
    ],
)
@pytest.mark.parametrize("overwrite", [False, True], ids=["plain", "overwrite"])
def test_output_paths_that_name_no_new_folder_are_one_line(
    data, tmp_path, monkeypatch, capsys, out, needle, overwrite
):
    from exactpack.cli import main

    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    monkeypatch.chdir(work)
    extra = ["--overwrite"] if overwrite else []
    code = main(["pack", str(data), "--out", out, *OPTIONS, *extra])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert needle in err
    assert sorted(p.name for p in work.iterdir()) == ["sub"]
    assert list((work / "sub").iterdir()) == []


def test_an_output_symlink_is_followed_and_kept(data, tmp_path):
    target = tmp_path / "real"
    pack_path(data, target, max_length=16, vocab_size=500, policy="padded")
    link = tmp_path / "link"
    link.symlink_to("real")
    got = _cli("pack", data, "--out", link, *OPTIONS, "--overwrite")
    assert got.returncode == 0, got.stderr
    assert f"wrote {target}:" in got.stdout
    assert link.is_symlink() and os.readlink(link) == "real"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]  # nothing hidden
    assert_same_batches(load_packed(link), load_packed(target))
    assert load_packed(link).manifest["policy"]["name"] == "next-fit"


def test_a_dangling_symlink_creates_the_folder_it_names(data, tmp_path):
    link = tmp_path / "link"
    link.symlink_to("made")
    got = _cli("pack", data, "--out", link, *OPTIONS)
    assert got.returncode == 0, got.stderr
    assert link.is_symlink() and load_packed(tmp_path / "made").num_rows > 0


def test_a_symlink_loop_is_one_line(data, tmp_path):
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    got = _cli("pack", data, "--out", tmp_path / "a", *OPTIONS)
    assert got.returncode == 2 and got.stderr.count("\n") == 1, got.stderr
    assert "is a symbolic link that names no folder" in got.stderr


def test_a_nul_byte_in_the_output_path_is_one_error(data, tmp_path):
    with pytest.raises(InvalidInput, match="holds a NUL byte"):
        pack_path(data, tmp_path / "a\0b", max_length=16, vocab_size=500)


def test_missing_parent_folders_are_removed_again_when_nothing_is_published(tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"input_ids": [0, 600, 1]}])
    got = _cli("pack", bad, "--out", tmp_path / "a" / "b" / "out", *OPTIONS)
    assert got.returncode == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]


def test_the_ray_driver_claims_its_output(tmp_path, monkeypatch):
    """The Ray engine refuses a held output before it starts Ray (no cluster needed)."""
    pytest.importorskip("ray")
    from exactpack import ray as ray_engine

    out = tmp_path / "out"
    with atomic.open_output(out, overwrite=False):
        done = []

        def other():
            try:
                ray_engine.pack(tmp_path / "none.parquet", out, max_length=8, vocab_size=10)
            except InvalidInput as err:
                done.append(str(err))

        thread = threading.Thread(target=other)
        thread.start()
        thread.join(60)
    assert len(done) == 1 and "another thread" in done[0]
    assert list(tmp_path.iterdir()) == []  # the output folder made for the hold is gone


# ---------------------------------------------------------------- the user's files are sacred


@pytest.mark.parametrize("where", ["the-input-folder", "inside-it", "its-parent"])
@pytest.mark.parametrize("overwrite", [False, True], ids=["plain", "overwrite"])
def test_an_output_over_its_input_is_refused(tmp_path, where, overwrite):
    """``--out`` the input folder, a folder inside it, or a folder holding it: refused."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    pq_table = {"input_ids": [[0, 5, 1], [0, 6, 7, 1]]}
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(pq_table), inputs / "part-0.parquet")
    before = sorted(p.name for p in inputs.iterdir())
    source, out = {
        "the-input-folder": (inputs, inputs),
        "inside-it": (inputs, inputs / "packed"),
        "its-parent": (inputs / "part-0.parquet", inputs),
    }[where]
    got = _cli("pack", source, "--out", out, *OPTIONS, *(["--overwrite"] if overwrite else []))
    assert got.returncode == 2 and got.stderr.count("\n") == 1, got.stderr
    assert "exactpack never publishes over its input — choose another --out" in got.stderr
    assert sorted(p.name for p in inputs.iterdir()) == before


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
@pytest.mark.parametrize("what", [LOCK, "manifest.json"])
def test_a_lock_or_manifest_that_is_a_link_is_never_written_through(data, tmp_path, link, what):
    out = tmp_path / "out"
    pack_path(data, out, max_length=16, vocab_size=500)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    precious = tmp_path / "precious.txt"
    precious.write_text("the user's")
    target = out / what
    target.unlink(missing_ok=True)
    if link == "symlink":
        target.symlink_to(precious)
    else:
        os.link(precious, target)
    got = _cli("pack", data, "--out", out, *OPTIONS, "--overwrite")
    assert got.returncode == 2 and got.stderr.count("\n") == 1, got.stderr
    assert "exactpack never writes through a link — remove it" in got.stderr
    assert precious.read_text() == "the user's"
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.name != what}
    assert after == {k: v for k, v in before.items() if k != what}  # nothing else changed
