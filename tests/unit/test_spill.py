"""The token spill exists only while a pack runs: after success, failure, SIGTERM or SIGKILL
nothing of it is left (a ``tempfile.TemporaryFile``: no name), nor the folders made for it."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from exactpack.core.errors import InvalidInput
from exactpack.io.documents import Origin, TokenChunk
from exactpack.io.spill import Spill
from exactpack.io.store import load_packed
from exactpack.pipeline.local import pack_path

from support.packed_helpers import random_records, write_jsonl


def _open_spills(folder: Path) -> list[str]:
    """This process's open descriptors on files in ``folder`` (named or not)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(folder) + "/"):
            found.append(target)
    return found


@pytest.fixture(autouse=True)
def always_spill(monkeypatch):
    """Every corpus here is spilled (small ones are otherwise kept in memory)."""
    monkeypatch.setattr("exactpack.pipeline.corpus.KEEP_BYTES", 0)


@pytest.fixture
def corpus(tmp_path):
    (tmp_path / "in").mkdir()
    records = random_records(np.random.default_rng(5), 200, vocab=300, max_len=50)
    return write_jsonl(tmp_path / "in" / "d.jsonl", records)


def test_the_spill_has_no_name_while_it_is_read_and_is_gone_after(tmp_path, corpus, monkeypatch):
    spill_dir = tmp_path / "spill"
    seen = []
    real = Spill.open

    def watching(self, *args):
        seen.append((sorted(os.listdir(spill_dir)), _open_spills(spill_dir)))
        return real(self, *args)

    monkeypatch.setattr(Spill, "open", watching)
    pack_path(corpus, tmp_path / "out", max_length=64, vocab_size=300, chunk_bytes=500,
              spill_dir=spill_dir)  # fmt: skip
    ((names, open_files),) = seen
    assert names == []  # nothing in the folder has a name
    assert open_files and all("(deleted)" in f for f in open_files)  # yet the file is open
    assert not spill_dir.exists() and _open_spills(spill_dir) == []  # made for it, removed


def test_a_failure_after_spilling_leaves_nothing(tmp_path, corpus):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(corpus.read_bytes() + b'{"input_ids": [0, -4]}\n')
    with pytest.raises(InvalidInput, match=r"bad\.jsonl line 201: token id -4"):
        pack_path(bad, tmp_path / "out", max_length=64, vocab_size=300, chunk_bytes=500,
                  spill_dir=tmp_path / "spill")  # fmt: skip
    assert not (tmp_path / "spill").exists()  # the refused run made it, and removed it
    assert _open_spills(tmp_path / "spill") == []
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_chunks_read_back_from_the_spill_equal_the_chunks_written(tmp_path, rng):
    import pyarrow as pa

    origin = Origin((("x", 0, "row"),))
    chunks = [
        TokenChunk(rng.integers(0, 9, 10), np.array([0, 3, 10]), None, None, origin, 0),
        TokenChunk(
            np.arange(6, dtype=np.int32),
            np.array([0, 2, 6]),
            np.array([1, 0, 1, 1], bool),
            pa.array(["a", "b"]),
            origin,
            2,
        ),
    ]
    spill = Spill(tmp_path)
    for chunk in chunks:
        spill.append(chunk)
    back = spill.open([origin, origin], [0, 2])
    for a, b in zip(chunks, back, strict=True):
        assert np.array_equal(a.tokens, b.tokens) and b.tokens.dtype == np.int32
        assert np.array_equal(a.offsets, b.offsets)
        assert (a.flags is None) == (b.flags is None)
        assert a.flags is None or np.array_equal(a.flags, b.flags)
        assert (a.ids is None and b.ids is None) or a.ids.equals(b.ids)
    spill.release()
    assert np.array_equal(back[0].tokens, chunks[0].tokens)  # still readable: pages come back
    del back
    spill.close()
    assert os.listdir(tmp_path) == []


KILLED = r"""
import os, signal, sys
import exactpack.io.shards as shards
real = shards._write_shard
def dying(table, path):
    real(table, path)
    os.kill(os.getpid(), getattr(signal, sys.argv[4]))
shards._write_shard = dying
import exactpack.pipeline.corpus
exactpack.pipeline.corpus.KEEP_BYTES = 0  # spilled, however small
from exactpack.cli import main
sys.exit(main(["pack", sys.argv[1], "--out", sys.argv[2], "--max-length", "64",
               "--vocab-size", "300", "--chunk-bytes", "500", "--spill-dir", sys.argv[3],
               "--shard-tokens", "300"]))
"""


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_a_killed_pack_leaves_no_spill_behind(tmp_path, corpus, how):
    spill_dir, out = tmp_path / "spill", tmp_path / "out"
    spill_dir.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", KILLED, str(corpus), str(out), str(spill_dir), how],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    sig = getattr(signal, how)
    assert proc.returncode in (-sig, 128 + sig), proc.stderr
    assert os.listdir(spill_dir) == []  # unnamed: the kernel freed it
    stats = pack_path(corpus, out, max_length=64, vocab_size=300, spill_dir=spill_dir)
    assert load_packed(out).num_rows == stats["rows"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out", "spill"]
    assert os.listdir(spill_dir) == []


def test_a_full_spill_disk_names_the_spill_folder(tmp_path, corpus, monkeypatch, capsys):
    import errno
    import io
    import tempfile as tempfile_mod

    from exactpack.cli import main
    from exactpack.io import spill as spill_mod

    real = tempfile_mod.TemporaryFile

    class Full(io.RawIOBase):
        """A spill file on a full disk: every write fails as the kernel says it."""

        def __init__(self, *args, **kwargs):
            self.inner = real(*args, **kwargs)

        def writable(self):
            return True

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def fileno(self):
            return self.inner.fileno()

        def close(self):
            self.inner.close()
            super().close()

    monkeypatch.setattr(spill_mod.tempfile, "TemporaryFile", Full)
    spill_dir = tmp_path / "spill"
    argv = ["pack", str(corpus), "--out", str(tmp_path / "out"), "--max-length", "64",
            "--vocab-size", "300", "--chunk-bytes", "500",
            "--spill-dir", str(spill_dir)]  # fmt: skip
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1, err
    assert "No space left on device" in err and f"{spill_dir} (--spill-dir)" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]  # nothing left behind
