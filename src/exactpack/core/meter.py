"""Progress inside one long step: ``with reporting(done):`` around it, ``report(fraction)``
deep inside (a tokenizer's batch loop), knowing nothing about bars. A context variable,
so threads and concurrent callers do not see each other's; a no-op outside a block."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_DONE: ContextVar[Callable[[float], None] | None] = ContextVar("exactpack_meter", default=None)


@contextmanager
def reporting(done: Callable[[float], None] | None) -> Iterator[None]:
    """Send :func:`report` calls made inside the block to ``done(fraction)``."""
    token = _DONE.set(done)
    try:
        yield
    finally:
        _DONE.reset(token)


def report(fraction: float) -> None:
    """``fraction`` (0..1) of the current step is done."""
    done = _DONE.get()
    if done is not None:
        done(fraction)
