"""scripts/setup-venv.sh: installs once per pyproject.toml + lock, and says what it does.

Run in a copy of the files it reads, with a stand-in ``.venv/bin/python`` that records
each pip call instead of installing (no network, seconds).
"""

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INPUTS = (
    "scripts/setup-venv.sh",
    "pyproject.toml",
    "requirements/lock.txt",
    "requirements/torch.txt",
    "src/exactpack/core/native.c",
)


def _clone(tmp: Path) -> Path:
    for rel in INPUTS:
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp / rel)
    python = tmp / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\necho "$@" >> "{tmp}/pip.log"\n')
    python.chmod(0o755)
    return tmp


def _setup(clone: Path, **env: str) -> tuple[list[str], str]:
    proc = subprocess.run(
        ["bash", "scripts/setup-venv.sh", "dev"],
        cwd=clone, capture_output=True, text=True, check=True, env=os.environ | env,
    )  # fmt: skip
    log = clone / "pip.log"
    calls = log.read_text().splitlines() if log.exists() else []
    log.unlink(missing_ok=True)
    return calls, proc.stderr


def test_a_second_setup_installs_nothing_until_the_lock_or_pyproject_changes(tmp_path):
    clone = _clone(tmp_path)
    calls, notes = _setup(clone)
    assert len(calls) == 2 and "torch==2.13.0" in calls[0] and "-e .[dev]" in calls[1]
    lines = notes.splitlines()
    assert len(lines) == 3 and all(line.startswith("setup-venv: ") for line in lines), notes
    assert (
        "installing torch" in lines[0] and lines[-1] == "setup-venv: done: .venv has exactpack[dev]"
    )
    stamp = (clone / ".venv" / "exactpack-setup.sha256").read_text()
    assert "requirements/lock.txt" in stamp and "extras dev" in stamp
    calls, notes = _setup(clone)
    assert calls == [] and "nothing to install" in notes and notes.count("\n") == 1
    with (clone / "requirements" / "lock.txt").open("a") as f:
        f.write("six==1.16.0\n")
    calls, _ = _setup(clone)
    assert len(calls) == 2  # a new lock: installed again, then skipped again
    assert _setup(clone)[0] == []
    (clone / "pyproject.toml").write_text((clone / "pyproject.toml").read_text() + "\n")
    assert len(_setup(clone)[0]) == 2
    # the newest versions are never taken for the locked ones (nor skipped)
    calls, _ = _setup(clone, EXACTPACK_UNLOCKED="1")
    assert len(calls) == 2 and "--upgrade" in calls[1]
    assert not (clone / ".venv" / "exactpack-setup.sha256").exists()
    assert len(_setup(clone)[0]) == 2
