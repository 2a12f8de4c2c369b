"""Progress on stderr: one-line status notes and tqdm bars, shown or silent as asked."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


def status(enabled: bool) -> Callable[[str], None]:
    """A ``say(message)`` that prints ``seqpack: message`` to stderr when ``enabled``."""

    def say(message: str) -> None:
        if enabled:
            print(f"seqpack: {message}", file=sys.stderr, flush=True)

    return say


@contextmanager
def progress_bar(total: int, desc: str, unit: str, enabled: bool) -> Iterator[Any]:
    """A tqdm bar on stderr (``bar.update(n)``), closed on exit; silent when not ``enabled``."""
    from tqdm import tqdm

    bar = tqdm(
        total=total, desc=f"seqpack: {desc}", unit=unit, file=sys.stderr, disable=not enabled
    )
    try:
        yield bar
    finally:
        bar.close()
