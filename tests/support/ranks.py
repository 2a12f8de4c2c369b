"""Worker processes on loopback for the multi-rank tests (gloo): a free port, the workers
started with the tests folder importable, and a bounded wait (a hung rank fails the test)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(argvs: list[list[str]], **env: str) -> list[subprocess.Popen]:
    """One process per argv (after ``python``), one thread each, gloo on loopback."""
    full = os.environ | {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"} | env
    tests = str(Path(__file__).parents[1])
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [tests, full.get("PYTHONPATH")]))
    return [
        subprocess.Popen(
            [sys.executable, *argv],
            env=full,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for argv in argvs
    ]


def wait_ranks(procs: list[subprocess.Popen], timeout_s: float) -> list[str]:
    """Each process's output once all exited 0; any still running after ``timeout_s`` is
    killed and the test fails with every log."""
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=timeout_s)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    return logs
