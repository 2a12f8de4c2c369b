"""Progress on stderr: one-line status notes, tqdm bars on a sized terminal, else a plain
line every :data:`LINE_SECONDS` while a stage runs and one when it ends, e.g.
``exactpack: reading: 96.5 MB of 300 MB (32%), 3.1 MB/s, 41,002 docs, ... 30 s``.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from exactpack.core.meter import reporting

#: Seconds between the plain progress lines (``EXACTPACK_PROGRESS_SECONDS`` overrides it).
LINE_SECONDS = 10.0
#: Seconds between redraws of a bar on a terminal while its count does not move.
BAR_SECONDS = 1.0


def line_seconds() -> float:
    try:
        value = float(os.environ.get("EXACTPACK_PROGRESS_SECONDS", LINE_SECONDS))
    except ValueError:
        return LINE_SECONDS
    return value if value > 0 else LINE_SECONDS


def sized_terminal(stream: Any) -> bool:
    """Whether ``stream`` is a terminal that reports a width (a bar can be drawn on it)."""
    try:
        return bool(stream.isatty()) and os.get_terminal_size(stream.fileno()).columns > 0
    except (AttributeError, OSError, ValueError):
        return False


#: Control characters (C0 but tab and newline, DEL, C1): a terminal would act on them.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` safe to print on a terminal: every control character (an ANSI escape in a
    file name, a carriage return) shown as ``\\xNN`` instead of acted on."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def status(enabled: bool) -> Callable[[str], None]:
    """A ``say(message)`` that prints ``exactpack: message`` to stderr when ``enabled``."""

    def say(message: str) -> None:
        if enabled:
            print(f"exactpack: {printable(message)}", file=sys.stderr, flush=True)

    return say


def _amount(n: float, unit: str, scale: bool) -> str:
    if not scale:
        return f"{int(n):,} {unit if unit.endswith('s') else unit + 's'}"
    for factor, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= factor:
            return f"{n / factor:.1f} {prefix}{unit}"
    return f"{int(n)} {unit}"


class Progress:
    """tqdm's ``update`` / ``set_postfix_str`` / ``close`` as plain lines on ``stream``, one
    every ``interval`` seconds and a last one at :meth:`close`; with ``bar`` (tqdm) the calls
    go to it, redrawn every :data:`BAR_SECONDS`. ``quiet``: no lines. Thread-safe."""

    def __init__(
        self, total: int | None, desc: str, unit: str, *, stream: Any, interval: float,
        unit_scale: bool = False, bar: Any = None, quiet: bool = False,
    ) -> None:  # fmt: skip
        self.total, self.desc, self.unit, self.scale = total, desc, unit, unit_scale
        self.stream, self.bar, self.n, self.postfix = stream, bar, 0.0, ""
        self.started = time.monotonic()
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._timer: threading.Thread | None = None
        if not quiet:  # a bar is redrawn every second (elapsed time, rate) even when idle
            self.interval = interval if bar is None else BAR_SECONDS
            self._timer = threading.Thread(
                target=self._tick, name="exactpack-progress", daemon=True
            )
            self._timer.start()

    def update(self, n: float = 1) -> None:
        with self._lock:
            self.n += n
            if self.bar is not None:
                self.bar.update(n)

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        with self._lock:
            self.postfix = s
            if self.bar is not None:
                self.bar.set_postfix_str(s, refresh=refresh)

    @contextmanager
    def chunk(self, size: int) -> Iterator[None]:
        """Count one chunk of ``size`` units: inside the block each
        :func:`exactpack.core.meter.report` moves the count to that fraction of it (never back);
        leaving the block counts the rest."""
        moved = [0]

        def done(fraction: float) -> None:
            step = int(max(0.0, min(1.0, fraction)) * size) - moved[0]
            if step > 0:
                moved[0] += step
                self.update(step)

        with reporting(done):
            yield
        self.update(size - moved[0])

    def line(self) -> str:
        elapsed = time.monotonic() - self.started
        text = f"exactpack: {self.desc}: {_amount(self.n, self.unit, self.scale)}"
        if self.total:
            text += f" of {_amount(self.total, self.unit, self.scale)} ({self.n / self.total:.0%})"
        if elapsed > 0:
            text += f", {_amount(self.n / elapsed, self.unit, self.scale)}/s"
        if self.postfix:
            text += f", {self.postfix}"
        return f"{text}, {elapsed:.0f} s"

    def _print(self) -> None:
        with self._lock:
            text = self.line()
        print(printable(text), file=self.stream, flush=True)

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            if self.bar is None:
                self._print()
            else:
                with self._lock:
                    self.bar.refresh()

    def close(self) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.join()
            if self.bar is None:
                self._print()
        if self.bar is not None:
            self.bar.close()


@contextmanager
def progress_bar(
    total: int | None, desc: str, unit: str, enabled: bool, **options: Any
) -> Iterator[Progress]:
    """Progress of one stage on stderr when ``enabled`` (see the module docstring), closed on
    exit; ``options`` go to tqdm (``unit_scale=True`` with ``unit="B"``: MB and MB/s)."""
    stream = sys.stderr
    bar = None
    if enabled and sized_terminal(stream):
        from tqdm import tqdm

        bar = tqdm(
            total=total, desc=f"exactpack: {desc}", unit=unit, file=stream, dynamic_ncols=True,
            **options,
        )  # fmt: skip
    progress = Progress(
        total, desc, unit, stream=stream, interval=line_seconds(),
        unit_scale=bool(options.get("unit_scale")), bar=bar, quiet=not enabled,
    )  # fmt: skip
    try:
        yield progress
    finally:
        progress.close()
