"""Progress inside one long step: ``reporting(done)`` around it, ``report(fraction)`` inside.

The reading loop (:mod:`seqpack.pipeline.corpus`) wraps the tokenizing of
each chunk in ``with reporting(done):``; code deep inside (a tokenizer's
batch loop) calls ``report(fraction)`` with how much of its current job is
done, knowing nothing about bars. Outside any ``reporting`` block
``report`` does nothing. The hook is a context variable, so threads and
concurrent callers do not see each other's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_DONE: ContextVar[Callable[[float], None] | None] = ContextVar("seqpack_meter", default=None)


@contextmanager
def reporting(done: Callable[[float], None] | None) -> Iterator[None]:
    """Send :func:`report` calls made inside the block to ``done(fraction)``."""
    token = _DONE.set(done)
    try:
        yield
    finally:
        _DONE.reset(token)


def report(fraction: float) -> None:
    """``fraction`` (0..1) of the current step is done; a no-op outside :func:`reporting`."""
    done = _DONE.get()
    if done is not None:
        done(fraction)
