"""Races on the output path: two writers, a user's file appearing, stray folders, odd paths.

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

from seqpack.core.errors import InvalidInput
from seqpack.io import atomic, claim
from seqpack.io.lock import lock_path
from seqpack.io.store import load_packed
from seqpack.pipeline.local import pack_path

from packed_helpers import assert_same_batches, random_records, write_jsonl

PAUSED = r"""
import sys, time
from pathlib import Path
import seqpack.io.shards as shards
ready, go = Path(sys.argv[1]), Path(sys.argv[2])
real = shards._write_shard
def paused(table, path):
    real(table, path)
    ready.touch()
    deadline = time.monotonic() + 60
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
shards._write_shard = paused
from seqpack.cli import main
sys.exit(main(sys.argv[3:]))
"""
OPTIONS = ["--capacity", "16", "--vocab-size", "500", "--policy", "next-fit"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    records = random_records(np.random.default_rng(5), 40, vocab=500, max_len=12)
    return write_jsonl(tmp_path_factory.mktemp("races") / "d.jsonl", records)


def _cli(*argv, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "seqpack", *map(str, argv)],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
    )


class Paused:
    """``seqpack pack`` in a subprocess, stopped after its first shard until :meth:`resume`."""

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
    assert f"another seqpack run (pid {first.proc.pid} on {socket.gethostname()}" in second.stderr
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
    held = json.loads(lock_path(out).read_text())
    assert held["pid"] == first.proc.pid  # the lock file stays, but nobody holds it
    got = _cli("pack", data, "--out", out, *OPTIONS)
    assert got.returncode == 0, got.stderr
    assert f"the lock of a run that ended (pid {first.proc.pid} on" in got.stderr
    assert "temporary folder of a killed run" in got.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "ready"]
    load_packed(out, verify="full")


def test_another_thread_of_the_same_process_is_refused(data, tmp_path):
    out, errors = tmp_path / "out", []
    entered, leave = threading.Event(), threading.Event()

    def hold():
        with claim.claim_output(out, overwrite=False):
            entered.set()
            leave.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    entered.wait(30)
    try:
        pack_path(data, out, capacity=16, vocab_size=500)
    except InvalidInput as err:
        errors.append(str(err))
    leave.set()
    holder.join()
    assert len(errors) == 1 and "another thread" in errors[0]
    assert not out.exists()


def test_a_file_made_in_the_output_while_packing_survives(data, tmp_path):
    out = tmp_path / "out"
    pack_path(data, out, capacity=16, vocab_size=500, policy="padded")
    before = _fingerprint(out)
    first = Paused(tmp_path, data, out, "--overwrite")
    (out / "notes.txt").write_text("mine")  # while the pack runs
    code, err = first.resume()
    assert code == 2 and err.count("\n") == 1
    assert "holds 'notes.txt', which seqpack did not write; refusing to replace" in err
    assert (out / "notes.txt").read_text() == "mine"
    assert _fingerprint(out) == before  # the earlier output is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["go", "out", "ready"]


def test_a_folder_made_at_a_fresh_output_path_while_packing_is_not_replaced(data, tmp_path):
    out = tmp_path / "out"
    first = Paused(tmp_path, data, out)
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, err = first.resume()
    assert code == 2 and f"{out} appeared while packing — pass --overwrite" in err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_a_file_appearing_between_the_check_and_the_exchange_is_put_back(
    data, tmp_path, monkeypatch
):
    """The swap itself is undone when the replaced folder turns out to hold a new file."""
    out = tmp_path / "out"
    pack_path(data, out, capacity=16, vocab_size=500, policy="padded")
    before = _fingerprint(out)
    real = atomic.exchange

    def user_then_exchange(a, b):
        if not (out / "late.txt").exists():
            (out / "late.txt").write_text("mine")
        return real(a, b)

    monkeypatch.setattr(atomic, "exchange", user_then_exchange)
    with pytest.raises(InvalidInput, match=r"late\.txt appeared while packing"):
        pack_path(data, out, capacity=16, vocab_size=500, overwrite=True)
    assert (out / "late.txt").read_text() == "mine" and _fingerprint(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "rename-aside"])
def test_overwrite_removes_only_seqpack_files_of_the_replaced_output(
    data, tmp_path, monkeypatch, exchange
):
    out = tmp_path / "out"
    pack_path(data, out, capacity=16, vocab_size=500, policy="padded")
    if not exchange:
        monkeypatch.setattr(atomic, "exchange", lambda a, b: False)
    stats = pack_path(data, out, capacity=16, vocab_size=500, overwrite=True)
    assert stats["recovered"] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert load_packed(out).manifest["policy"]["name"] == "best-fit-decreasing"


# ---------------------------------------------------------------- stray hidden folders


def _stray_old(tmp_path: Path, data: Path, damage=None) -> Path:
    """A complete output renamed to ``.out.seqpack-old-*`` (what an interrupted replace
    leaves), optionally damaged."""
    folder = tmp_path / "src"
    pack_path(data, folder, capacity=16, vocab_size=500)
    if damage is not None:
        damage(folder)
    old = tmp_path / ".out.seqpack-old-0badc0de"
    folder.rename(old)
    return old


def _tamper_and_fix_the_checksum(folder: Path) -> None:
    """The catalogue's edit: token 9999 written into the last shard, its sha256 recomputed."""
    from integrity_cases import _edit_shard, _set_token

    manifest = json.loads((folder / "manifest.json").read_text())
    _edit_shard(_set_token(9999), k=len(manifest["shards"]) - 1)(folder)


@pytest.mark.parametrize(
    ("name", "damage"),
    [
        ("manifest-only", None),
        ("tampered", _tamper_and_fix_the_checksum),
        ("foreign-file", lambda f: (f / "notes.txt").write_text("mine")),
    ],
)
def test_a_stray_old_folder_is_never_moved_into_place_unchecked(data, tmp_path, name, damage):
    if name == "manifest-only":
        old = tmp_path / ".out.seqpack-old-0badc0de"
        old.mkdir()
        (old / "manifest.json").write_text(json.dumps({"kept": True}))
    else:
        old = _stray_old(tmp_path, data, damage)
    got = _cli("pack", data, "--out", tmp_path / "out", *OPTIONS)
    assert got.returncode == 0, got.stderr
    assert f"note: left {old.name} where it is: it " in got.stderr
    assert "seqpack restores only an output it can verify" in got.stderr
    assert old.is_dir()  # left for the user, not moved, not removed
    assert load_packed(tmp_path / "out").manifest["policy"]["name"] == "next-fit"  # packed anew


def test_a_verified_old_folder_is_restored(data, tmp_path):
    old = _stray_old(tmp_path, data)
    want = [s["sha256"] for s in json.loads((old / "manifest.json").read_text())["shards"]]
    notes = atomic.recover_output(tmp_path / "out")
    out = tmp_path / "out"
    assert notes == [f"restored {out} from {old.name}, left by an interrupted --overwrite"]
    assert _fingerprint(out) == want and not old.exists()


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
        (".out.seqpack-tmp-h-1-0123abcd", "names a temporary seqpack file"),
        (".out.seqpack-lock", "names a temporary seqpack file"),
        ("x" * 250, "is too long for its temporary sibling"),
    ],
)
@pytest.mark.parametrize("overwrite", [False, True], ids=["plain", "overwrite"])
def test_output_paths_that_name_no_new_folder_are_one_line(
    data, tmp_path, monkeypatch, capsys, out, needle, overwrite
):
    from seqpack.cli import main

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
    pack_path(data, target, capacity=16, vocab_size=500, policy="padded")
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
        pack_path(data, tmp_path / "a\0b", capacity=16, vocab_size=500)


def test_missing_parent_folders_are_removed_again_when_nothing_is_published(tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"input_ids": [0, 600, 1]}])
    got = _cli("pack", bad, "--out", tmp_path / "a" / "b" / "out", *OPTIONS)
    assert got.returncode == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]


def test_the_ray_driver_claims_its_output(tmp_path, monkeypatch):
    """The Ray engine refuses a held output before it starts Ray (no cluster needed)."""
    pytest.importorskip("ray")
    from seqpack import ray as ray_engine

    out = tmp_path / "out"
    with claim.claim_output(out, overwrite=False):
        done = []

        def other():
            try:
                ray_engine.pack(tmp_path / "none.parquet", out, capacity=8, vocab_size=10)
            except InvalidInput as err:
                done.append(str(err))

        thread = threading.Thread(target=other)
        thread.start()
        thread.join(60)
    assert len(done) == 1 and "another thread" in done[0]
    assert list(tmp_path.iterdir()) == []
