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
def progress_bar(
    total: int | None, desc: str, unit: str, enabled: bool, **options: Any
) -> Iterator[Any]:
    """A tqdm bar on stderr (``bar.update(n)``), closed on exit; silent when not ``enabled``.

    ``options`` go to tqdm (``unit_scale=True`` with ``unit="B"`` shows MB and MB/s).
    """
    from tqdm import tqdm

    bar = tqdm(
        total=total,
        desc=f"seqpack: {desc}",
        unit=unit,
        file=sys.stderr,
        disable=not enabled,
        dynamic_ncols=True,
        **options,
    )
    try:
        yield bar
    finally:
        bar.close()


def counts(documents: int, tokens: int, **more: float) -> str:
    """The postfix of a bar: ``1,234 docs, 5,678,901 tokens`` (and any ``more``)."""
    extra = "".join(f", {name.replace('_', ' ')} {value:,.1f}" for name, value in more.items())
    return f"{documents:,} docs, {tokens:,} tokens{extra}"
