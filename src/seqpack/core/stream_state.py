"""Saved :class:`~seqpack.core.stream_packer.StreamPacker` states: format, size, checks.

A state is plain data (ints and lists); :func:`check_state` holds it to every
invariant the packer relies on before anything is allocated, and
:func:`stream_bytes` says what restoring it allocates.
"""

from __future__ import annotations

from typing import Any

from seqpack.core.binding import INT32_MAX
from seqpack.core.checks import MAX_TREE_CAPACITY, state_int, state_ints, state_value
from seqpack.core.errors import InvalidInput

STATE_FORMAT = "seqpack.stream-best-fit/2"
CHUNK = 1 << 16  # examples per kernel call: bounds the output and record arrays
#: What :meth:`StreamPacker.from_state_dict` lets a state allocate unless told otherwise.
DEFAULT_STATE_BYTES = 4 << 30


def stream_bytes(capacity: int, window: int, max_open_rows: int) -> int:
    """Bytes a packer's buffers take: the look-ahead ring, open rows, the length and
    remaining-capacity trees, and one kernel call's output (int64 each)."""
    return 8 * (7 * window + 5 * max_open_rows + 12 * (capacity + 1)) + 24 * CHUNK


def check_state(state: Any) -> None:
    """Refuse a state that could not come from :meth:`StreamPacker.state_dict`.

    Types first (integers are ints, not bools or floats; lists of ints), then
    bounds (capacity, window and open rows as the constructor takes them, no
    negative counter), then the accounting: every example pushed is either in
    a returned row (``examples_emitted``), waiting in the buffer (among the
    last ``window`` pushed, in arrival order) or in an open row, exactly once;
    open rows are non-empty and not full.
    """
    what = "stream-best-fit"
    fmt = state_value(state, "format", what)
    if fmt != STATE_FORMAT:
        raise InvalidInput(
            f"not a {what} state of this seqpack (format {fmt!r}, expected {STATE_FORMAT!r})"
            " — save it again with state_dict(), or start the stream again"
        )
    cap = state_int(state, "capacity", what, 1, MAX_TREE_CAPACITY)
    window = state_int(state, "window", what, 1, INT32_MAX)
    open_max = state_int(state, "max_open_rows", what, 1, INT32_MAX)
    seed = state_value(state, "seed", what)
    if isinstance(seed, bool) or not isinstance(seed, int):  # any int, as the constructor takes
        raise InvalidInput(f"the {what} state's seed must be an integer, got {seed!r}")
    pushed = state_int(state, "examples_pushed", what)
    emitted = state_int(state, "examples_emitted", what, 0, pushed)
    # every returned row holds at least one example, and examples come out in rows
    state_int(state, "rows_emitted", what, 1 if emitted else 0, emitted)
    if not isinstance(state_value(state, "finished", what), bool):
        raise InvalidInput(f"the {what} state's finished must be true or false")
    buf = state_value(state, "buffer", what)
    examples = state_ints(buf, "example", f"{what} buffer", max(pushed - window, 0), pushed - 1)
    lengths = state_ints(buf, "length", f"{what} buffer", 1, cap)
    rows = state_value(state, "open_rows", what)
    if not isinstance(rows, list) or len(rows) > open_max:
        raise InvalidInput(f"the {what} state's open_rows must be a list of at most {open_max:,}")
    problems = []
    if len(examples) != len(lengths):
        problems.append("buffer examples and lengths differ in count")
    if examples != sorted(examples):
        problems.append("buffered examples are not in arrival order")
    seen = list(examples)
    for row in rows:
        members = state_ints(row, "example", f"{what} open row", 0, pushed - 1)
        sizes = state_ints(row, "length", f"{what} open row", 1, cap)
        if not members or len(members) != len(sizes) or sum(sizes) >= cap:
            problems.append("an open row is empty, full, or its lists differ in length")
        seen += members
    if len(set(seen)) != len(seen):
        problems.append("an example is both waiting and placed, or placed twice")
    if emitted + len(seen) != pushed:
        problems.append(
            f"{pushed:,} examples pushed but {emitted:,} returned and {len(seen):,} held"
            " (an example removed or added)"
        )
    if state["finished"] and seen:
        problems.append("a finished packer holds examples")
    if problems:
        raise InvalidInput(f"inconsistent {what} state: {'; '.join(problems)}")
