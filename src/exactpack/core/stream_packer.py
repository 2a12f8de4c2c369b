"""Streaming best fit: bounded memory, complete rows as they close, resumable.

Examples wait in a look-ahead of ``lookahead``, at most ``max_open_rows`` rows are open;
example ``i`` is placed when example ``i + lookahead`` arrives, or earlier to fill a row:

1. the example whose time is up goes into the open row with the fewest
   cells left that fit it — a new row when none fits, closing the fullest
   open row first if ``max_open_rows`` are open;
2. that row then takes, while any fits, the longest waiting example that
   fits its cells left (among equal lengths, a seeded order);
3. an exactly full row closes. :meth:`StreamPacker.finish` places the
   examples still waiting, longest first, and closes every row.

Rows are numbered in closing order; every call returns only complete rows::

    packer = StreamPacker(4096, lookahead=4096, max_open_rows=64, seed=0)
    for chunk in chunks:                       # int arrays of prediction lengths
        write(packer.push(chunk))              # Placements(example, row, start)
    write(packer.finish())

``state_dict()`` is plain ints and lists; a packer restored from it with
``load_state_dict`` gives exactly the output of the uninterrupted run.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

import numpy as np

from exactpack.core import engine
from exactpack.core.binding import INT32_MAX
from exactpack.core.config import enforce
from exactpack.core.engine import (
    bucket_pop,
    bucket_push,
    kernel,
    tree_first_at_least,
    tree_last_at_most,
    tree_set,
)
from exactpack.core.errors import (
    MAX_TREE_CAPACITY,
    BindingMismatch,
    BudgetExceeded,
    InvalidInput,
    check_lengths,
    check_max_length,
    is_int,
    positive_int,
    state_int,
    state_ints,
    state_value,
)

DEFAULT_LOOKAHEAD = 4096
DEFAULT_MAX_OPEN_ROWS = 64
STATE_FORMAT = "exactpack.stream-best-fit/3"  # /3: the stream's identity (``stream``)
CHUNK = 1 << 16  # examples per kernel call: bounds the output and record arrays
#: What a :class:`StreamPacker` (or :meth:`StreamPacker.from_state_dict`'s state) may
#: allocate for its buffers unless told otherwise (``max_bytes=``).
DEFAULT_STATE_BYTES = 4 << 30


def stream_bytes(capacity: int, lookahead: int, max_open_rows: int) -> int:
    """Bytes a packer's buffers take (ring, open rows, both trees, one call's output)."""
    return 8 * (7 * lookahead + 5 * max_open_rows + 12 * (capacity + 1)) + 24 * CHUNK


def check_stream_bytes(
    capacity: int, lookahead: int, max_open_rows: int, max_bytes: int | None
) -> None:
    """Refuse settings whose buffers (:func:`stream_bytes`) exceed ``max_bytes`` (None: no
    limit), before anything is allocated."""
    need = stream_bytes(capacity, lookahead, max_open_rows)
    if max_bytes is not None and need > max_bytes:
        raise BudgetExceeded(
            f"a stream-best-fit packer of lookahead={lookahead:,} and"
            f" max_open_rows={max_open_rows:,} (capacity {capacity:,}) needs {need:,} bytes"
            f" of buffers but max_bytes is {max_bytes:,} — lower lookahead or max_open_rows"
            " (a few thousand is typical), or pass max_bytes="
        )


def check_state(state: Any) -> None:
    """Refuse a state :meth:`StreamPacker.state_dict` could not give: types, bounds, then
    every example pushed returned, waiting (last ``window``, arrival order) or in a
    non-empty, non-full open row, exactly once."""
    what = "stream-best-fit"
    fmt = state_value(state, "format", what)
    if fmt != STATE_FORMAT:
        raise InvalidInput(
            f"not a {what} state of this exactpack (format {fmt!r}, expected {STATE_FORMAT!r})"
            " — save it again with state_dict(), or start the stream again"
        )
    cap = state_int(state, "capacity", what, 1, MAX_TREE_CAPACITY)
    window = state_int(state, "window", what, 1, INT32_MAX)
    open_max = state_int(state, "max_open_rows", what, 1, INT32_MAX)
    seed = state_value(state, "seed", what)
    if isinstance(seed, bool) or not isinstance(seed, int):  # any int, as the constructor takes
        raise InvalidInput(f"the {what} state's seed must be an integer, got {seed!r}")
    stream = state_value(state, "stream", what)
    if stream is not None and (not isinstance(stream, str) or not stream):
        raise InvalidInput(f"the {what} state's stream must be a name or null, got {stream!r}")
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


# ------------------------------------------------------------ the kernels
# State is tuples of int64 arrays: ``buf`` (bex, blen, bprev, bnext, lhead, ltail, ltree):
# the ring (example ``i`` in slot ``i % window``, ``bex`` -1 when free), linked into
# buckets by length, leaf ``n`` of ``ltree`` ``n`` while one waits; ``rows`` (rrem, rnext,
# rhead, rtail, rstamp, qhead, qtail, qtree): open row slots (cells left, placement list,
# bucket link, entry stamp) in FIFO buckets by cells left; ``pool`` (pex, pstart, pnext):
# open rows' placements (free list via ``pnext``); ``out`` (oex, orow, ostart): placements
# closed this call; ``scalars``: the ``S_*`` counters.

S_PUSHED, S_ROWS, S_OPEN, S_FREE_ROW, S_FREE_REC, S_LIVE, S_STAMP, S_OUT = range(8)
N_SCALARS = 8


@kernel
def buffer_insert(buf, lleaves, slot, ex, n, front):
    """Example ``ex`` (length ``n``) into ring ``slot``, the ``front`` or back of bucket ``n``."""
    bex, blen, bprev, bnext, lhead, ltail, ltree = buf
    bex[slot] = ex
    blen[slot] = n
    if lhead[n] == -1:
        bprev[slot] = -1
        bnext[slot] = -1
        lhead[n] = slot
        ltail[n] = slot
        tree_set(ltree, lleaves, n, n)
    elif front:
        bprev[slot] = -1
        bnext[slot] = lhead[n]
        bprev[lhead[n]] = slot
        lhead[n] = slot
    else:
        bnext[slot] = -1
        bprev[slot] = ltail[n]
        bnext[ltail[n]] = slot
        ltail[n] = slot


@kernel
def buffer_remove(buf, lleaves, slot):
    """Take the example in ring ``slot`` out of the buffer."""
    bex, blen, bprev, bnext, lhead, ltail, ltree = buf
    n = blen[slot]
    before = bprev[slot]
    after = bnext[slot]
    if before == -1:
        lhead[n] = after
    else:
        bnext[before] = after
    if after == -1:
        ltail[n] = before
    else:
        bprev[after] = before
    if lhead[n] == -1:
        tree_set(ltree, lleaves, n, 0)
    bex[slot] = -1


@kernel
def row_close(rows, pool, out, scalars, slot):
    """Finalise open row ``slot``: number it, emit its placements, free it."""
    rnext, rhead = rows[1], rows[2]
    pex, pstart, pnext = pool
    oex, orow, ostart = out
    row = scalars[S_ROWS]
    scalars[S_ROWS] = row + 1
    k = scalars[S_OUT]
    rec = rhead[slot]
    while rec != -1:
        oex[k] = pex[rec]
        orow[k] = row
        ostart[k] = pstart[rec]
        k += 1
        following = pnext[rec]
        pnext[rec] = scalars[S_FREE_REC]
        scalars[S_FREE_REC] = rec
        scalars[S_LIVE] -= 1
        rec = following
    scalars[S_OUT] = k
    rnext[slot] = scalars[S_FREE_ROW]
    scalars[S_FREE_ROW] = slot
    scalars[S_OPEN] -= 1


@kernel
def row_open(rows, scalars):
    """Take a free row slot, empty, and count it open; return the slot."""
    rnext, rhead, rtail = rows[1], rows[2], rows[3]
    row = scalars[S_FREE_ROW]
    scalars[S_FREE_ROW] = rnext[row]
    scalars[S_OPEN] += 1
    rhead[row] = -1
    rtail[row] = -1
    return row


@kernel
def row_append(rows, pool, scalars, slot, ex, start):
    """Record example ``ex`` at column ``start`` of open row ``slot``."""
    rhead, rtail = rows[2], rows[3]
    pex, pstart, pnext = pool
    rec = scalars[S_FREE_REC]
    scalars[S_FREE_REC] = pnext[rec]
    scalars[S_LIVE] += 1
    pex[rec] = ex
    pstart[rec] = start
    pnext[rec] = -1
    if rtail[slot] == -1:
        rhead[slot] = rec
    else:
        pnext[rtail[slot]] = rec
    rtail[slot] = rec


@kernel
def place(buf, lleaves, rows, qleaves, pool, out, scalars, capacity, max_open, slot):
    """Place the example in ring ``slot`` and fill its row (the module docstring's 1-3)."""
    bex, blen, lhead, ltree = buf[0], buf[1], buf[4], buf[6]
    rrem, rnext, rstamp, qhead, qtail, qtree = rows[0], rows[1], rows[4], rows[5], rows[6], rows[7]
    ex = bex[slot]
    n = blen[slot]
    buffer_remove(buf, lleaves, slot)
    left = tree_first_at_least(qtree, qleaves, n)
    if left >= 0:
        row = bucket_pop(qtree, qleaves, qhead, qtail, rnext, left)
    else:
        if scalars[S_OPEN] == max_open:
            fullest = tree_first_at_least(qtree, qleaves, 1)
            row_close(
                rows, pool, out, scalars, bucket_pop(qtree, qleaves, qhead, qtail, rnext, fullest)
            )
        row = row_open(rows, scalars)
        left = capacity
    row_append(rows, pool, scalars, row, ex, capacity - left)
    left -= n
    while left > 0:
        fit = tree_last_at_most(ltree, lleaves, left)
        if fit <= 0:
            break
        filler = lhead[fit]
        row_append(rows, pool, scalars, row, bex[filler], capacity - left)
        buffer_remove(buf, lleaves, filler)
        left -= fit
    rrem[row] = left
    if left == 0:
        row_close(rows, pool, out, scalars, row)
    else:
        rstamp[row] = scalars[S_STAMP]
        scalars[S_STAMP] += 1
        bucket_push(qtree, qleaves, qhead, qtail, rnext, left, row)


@kernel
def stream_push(
    lengths, fronts, buf, lleaves, rows, qleaves, pool, out, scalars, capacity, max_open
):
    """Admit ``lengths`` (``fronts``: bucket ends); example ``i`` forces out ``i - window``."""
    bex = buf[0]
    window = len(bex)
    i = scalars[S_PUSHED]
    slot = i % window
    for j in range(len(lengths)):
        if bex[slot] >= 0:  # example i - window is still waiting: its time is up
            place(buf, lleaves, rows, qleaves, pool, out, scalars, capacity, max_open, slot)
        buffer_insert(buf, lleaves, slot, i, lengths[j], fronts[j])
        i += 1
        slot = slot + 1 if slot + 1 < window else 0
    scalars[S_PUSHED] = i


@kernel
def stream_drain(buf, lleaves, rows, qleaves, pool, out, scalars, capacity, max_open):
    """Place every waiting example, longest first, then close every row, fullest first."""
    lhead, ltree = buf[4], buf[6]
    rnext, qhead, qtail, qtree = rows[1], rows[5], rows[6], rows[7]
    while ltree[1] > 0:
        place(buf, lleaves, rows, qleaves, pool, out, scalars, capacity, max_open, lhead[ltree[1]])
    while scalars[S_OPEN] > 0:
        fullest = tree_first_at_least(qtree, qleaves, 1)
        row_close(
            rows, pool, out, scalars, bucket_pop(qtree, qleaves, qhead, qtail, rnext, fullest)
        )


@kernel
def stream_restore(
    examples, lengths, fronts, buf, lleaves, rows, qleaves, pool, scalars, capacity,
    row_sizes, row_examples, row_lengths,
):  # fmt: skip
    """Rebuild a fresh state: waiting examples in arrival order, then open rows in
    bucket-entry order (``row_sizes[r]`` placements each, packed from column 0)."""
    rrem, rnext, rstamp, qhead, qtail, qtree = rows[0], rows[1], rows[4], rows[5], rows[6], rows[7]
    window = len(buf[0])
    for j in range(len(examples)):
        buffer_insert(buf, lleaves, examples[j] % window, examples[j], lengths[j], fronts[j])
    k = 0
    for r in range(len(row_sizes)):
        row = row_open(rows, scalars)
        start = 0
        for _ in range(row_sizes[r]):
            row_append(rows, pool, scalars, row, row_examples[k], start)
            start += row_lengths[k]
            k += 1
        rrem[row] = capacity - start
        rstamp[row] = scalars[S_STAMP]
        scalars[S_STAMP] += 1
        bucket_push(qtree, qleaves, qhead, qtail, rnext, capacity - start, row)


# ------------------------------------------------------------ the packer


def _chain(start: Any, nxt: np.ndarray) -> list[int]:
    """The linked list from ``start`` through ``nxt`` (-1 ends it)."""
    out = []
    while start != -1:
        out.append(int(start))
        start = nxt[start]
    return out


class Placements(NamedTuple):
    """Example ``example[i]`` (global index) occupies row ``row[i]`` from column
    ``start[i]``; int64 [k], ordered by (row, start)."""

    example: np.ndarray
    row: np.ndarray
    start: np.ndarray


def bucket_sides(index: np.ndarray, seed: int) -> np.ndarray:
    """0/1 per example: the end of its length bucket it joins, one bit of
    splitmix64(seed, index) (stateless: a resumed packer chooses the same)."""
    z = np.uint64(seed % (1 << 64)) + (index.astype(np.uint64) + np.uint64(1)) * np.uint64(
        0x9E3779B97F4A7C15
    )
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return ((z ^ (z >> np.uint64(31))) >> np.uint64(63)).astype(np.int64)


class StreamPacker:
    """Streaming best fit, deterministic for ``(capacity, lookahead, max_open_rows,
    seed)`` (``kernels`` changes speed only); ``lookahead=1, max_open_rows=1`` is next-fit.
    Memory O(lookahead + max_open_rows * examples per row + capacity): the buffers
    (:func:`stream_bytes`) are checked against ``max_bytes`` (None: no limit) before any is
    allocated. Calls from several threads take turns (one lock per packer): the kernels
    release the GIL and share the packer's arrays. ``stream``: what the lengths come from
    (e.g. the input's split receipt), saved in the state, which only a packer of the same
    stream loads. Saved states keep the key ``window`` for ``lookahead``.
    """

    def __init__(
        self,
        capacity: int,
        *,
        lookahead: int = DEFAULT_LOOKAHEAD,
        max_open_rows: int = DEFAULT_MAX_OPEN_ROWS,
        seed: int = 0,
        kernels: str = "auto",
        max_bytes: int | None = DEFAULT_STATE_BYTES,
        stream: str | None = None,
    ) -> None:
        settings = self.check_settings(capacity, lookahead, max_open_rows, seed, kernels)
        self.capacity, self.lookahead, self.max_open_rows, self.seed, self.kernels = settings
        if stream is not None and (not isinstance(stream, str) or not stream):
            raise InvalidInput(
                f"stream must be a name (e.g. the input's split receipt), got {stream!r}"
            )
        self.stream = stream
        check_stream_bytes(self.capacity, self.lookahead, self.max_open_rows, max_bytes)
        self._lock = threading.Lock()
        self._reset()

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}  # a lock never pickles

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @staticmethod
    def check_settings(
        capacity: int,
        lookahead: int = DEFAULT_LOOKAHEAD,
        max_open_rows: int = DEFAULT_MAX_OPEN_ROWS,
        seed: int = 0,
        kernels: str = "auto",
    ) -> tuple[int, int, int, int, str]:
        """The settings as checked ints and the resolved kernels, allocating nothing."""
        cap = positive_int("capacity", capacity)
        check_max_length(cap, "stream-best-fit")
        lookahead = positive_int("lookahead", lookahead, INT32_MAX)
        max_open_rows = positive_int("max_open_rows", max_open_rows, INT32_MAX)
        if not is_int(seed):
            raise InvalidInput(f"seed must be an integer, got {seed!r}")
        return cap, lookahead, max_open_rows, int(seed), engine.resolve(kernels)

    def _reset(self) -> None:
        self.finished = False
        self._emitted = 0  # examples in rows already returned
        cap, window, k = self.capacity, self.lookahead, self.max_open_rows
        self._scalars = np.zeros(N_SCALARS, dtype=np.int64)
        self._lleaves, self._qleaves = engine.pow2_at_least(cap + 1), engine.pow2_at_least(cap)
        # bex blen bprev bnext | lhead ltail | ltree
        sizes = [window] * 4 + [cap + 1] * 2 + [2 * self._lleaves]
        fill = [-1, 0, -1, -1, -1, -1, 0]
        self._buf = tuple(np.full(n, v, np.int64) for n, v in zip(sizes, fill, strict=True))
        # rrem rnext rhead rtail rstamp | qhead qtail | qtree; rnext chains the free slots
        sizes = [k] * 5 + [cap] * 2 + [2 * self._qleaves]
        fill = [0, 0, -1, -1, 0, -1, -1, 0]
        rows = [np.full(n, v, np.int64) for n, v in zip(sizes, fill, strict=True)]
        rows[1] = np.append(np.arange(1, k, dtype=np.int64), -1)
        self._rows = tuple(rows)
        self._pool = tuple(np.zeros(0, dtype=np.int64) for _ in range(3))
        self._scalars[S_FREE_REC] = -1  # S_FREE_ROW: slot 0

    @property
    def examples_pushed(self) -> int:
        return int(self._scalars[S_PUSHED])

    @property
    def rows_emitted(self) -> int:
        return int(self._scalars[S_ROWS])

    @property
    def open_rows(self) -> int:
        return int(self._scalars[S_OPEN])

    @property
    def buffered(self) -> int:
        return int((self._buf[0] >= 0).sum())

    def push(self, lengths: Any) -> Placements:
        """Add examples (prediction lengths, 1-D ints); return the rows completed. An
        oversized one raises :class:`~exactpack.OversizedExample`, the packer unchanged."""
        with self._lock:
            self._require_open()
            first = self.examples_pushed
            arr = check_lengths(lengths, self.capacity, lambda i: f"example {first + i}")
            parts = [
                self._run(arr[lo : lo + CHUNK]) for lo in range(0, max(arr.shape[0], 1), CHUNK)
            ]
        if len(parts) == 1:
            return parts[0]
        return Placements(*map(np.concatenate, zip(*parts, strict=True)))

    def finish(self) -> Placements:
        """Place every waiting example and close every open row."""
        with self._lock:
            self._require_open()
            out = self._run(None)
            self.finished = True
        return out

    def _require_open(self) -> None:
        if self.finished:
            raise InvalidInput("this StreamPacker has finished; start a new one")

    def _run(self, lengths: np.ndarray | None) -> Placements:
        """One kernel call: push ``lengths``, or drain when None."""
        # at most every arriving and every waiting example is placed
        placed = self.lookahead + (0 if lengths is None else lengths.shape[0])
        self._reserve_records(placed)
        out = tuple(np.empty(int(self._scalars[S_LIVE]) + placed, dtype=np.int64) for _ in range(3))
        self._scalars[S_OUT] = 0
        state = (self._buf, self._lleaves, self._rows, self._qleaves, self._pool, out)
        tail = (self._scalars, self.capacity, self.max_open_rows)
        if lengths is None:
            engine.call(self.kernels, "stream_drain", *state, *tail)
        else:
            first = self.examples_pushed
            index = np.arange(first, first + lengths.shape[0], dtype=np.int64)
            sides = bucket_sides(index, self.seed)
            engine.call(self.kernels, "stream_push", lengths, sides, *state, *tail, inputs=2)
        k = int(self._scalars[S_OUT])
        self._emitted += k
        return Placements(*(column[:k].copy() for column in out))

    def _reserve_records(self, extra: int) -> None:
        """Grow the record pool so ``extra`` more placements fit."""
        pex, pstart, pnext = self._pool
        size = pex.shape[0]
        live = int(self._scalars[S_LIVE])
        if size - live >= extra:
            return
        grown = max(2 * size, live + extra, 1024)
        added = np.arange(size + 1, grown + 1, dtype=np.int64)
        added[-1] = self._scalars[S_FREE_REC]
        z = np.zeros(grown - size, dtype=np.int64)
        self._pool = tuple(np.concatenate(p) for p in ((pex, z), (pstart, z), (pnext, added)))
        self._scalars[S_FREE_REC] = size

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: config, counters, buffer, open rows (plain data)."""
        with self._lock:
            return self._state_dict()

    def _state_dict(self) -> dict[str, Any]:
        bex, blen = self._buf[0], self._buf[1]
        slots = np.flatnonzero(bex >= 0)
        slots = slots[np.argsort(bex[slots])]
        rrem, rnext, rhead, _, rstamp, qhead, _, _ = self._rows
        pex, pstart, pnext = self._pool
        open_slots = [s for r in np.flatnonzero(qhead >= 0) for s in _chain(qhead[r], rnext)]
        rows = []
        for slot in sorted(open_slots, key=lambda s: int(rstamp[s])):
            recs = _chain(rhead[slot], pnext)
            ends = np.append(pstart[recs], self.capacity - rrem[slot])
            rows.append({"example": pex[recs].tolist(), "length": np.diff(ends).tolist()})
        return {
            "format": STATE_FORMAT,
            "capacity": self.capacity,
            "window": self.lookahead,  # the 0.2 key, kept on disk
            "max_open_rows": self.max_open_rows,
            "seed": self.seed,
            "stream": self.stream,
            "finished": self.finished,
            "examples_pushed": self.examples_pushed,
            "examples_emitted": self._emitted,
            "rows_emitted": self.rows_emitted,
            "buffer": {"example": bex[slots].tolist(), "length": blen[slots].tolist()},
            "open_rows": rows,
        }

    @classmethod
    def from_state_dict(
        cls,
        state: dict[str, Any],
        kernels: str = "auto",
        max_bytes: int | None = DEFAULT_STATE_BYTES,
        stream: str | None = None,
    ) -> StreamPacker:
        """A packer configured and positioned as ``state`` says, checked whole and its
        buffers (:func:`stream_bytes`) within ``max_bytes`` (None: no limit) first; with
        ``stream``, a state saved from another stream is refused."""
        check_state(state)
        need = stream_bytes(state["capacity"], state["window"], state["max_open_rows"])
        enforce(need, max_bytes, "restoring the stream-best-fit state", "pass max_bytes=")
        settings = {k: state[k] for k in ("max_open_rows", "seed")}
        packer = cls(
            state["capacity"], lookahead=state["window"], **settings, kernels=kernels,
            max_bytes=max_bytes, stream=state["stream"] if stream is None else stream,
        )  # fmt: skip
        packer.load_state_dict(state)
        return packer

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` of a packer with the same configuration; a
        refused state (:func:`check_state`) leaves the packer as it was."""
        with self._lock:
            self._load_state_dict(state)

    def _load_state_dict(self, state: dict[str, Any]) -> None:
        check_state(state)
        for key in ("capacity", "window", "max_open_rows", "seed"):
            own = getattr(self, "lookahead" if key == "window" else key)
            if state[key] != own:
                raise InvalidInput(
                    f"state has {key}={state[key]!r} but this packer has {own!r}"
                    " — construct it with StreamPacker.from_state_dict(state)"
                )
        if state["stream"] != self.stream:
            raise BindingMismatch(
                f"the stream-best-fit state was saved from stream {state['stream']!r} but this"
                f" packer packs {self.stream!r} — resume it over the stream it was saved from,"
                " or start the stream again"
            )
        self._reset()
        self._scalars[S_PUSHED] = int(state["examples_pushed"])
        self._scalars[S_ROWS] = int(state["rows_emitted"])
        self._emitted = int(state["examples_emitted"])
        self.finished = bool(state["finished"])
        rows = state["open_rows"]
        self._reserve_records(sum(len(row["example"]) for row in rows))
        examples = np.asarray(state["buffer"]["example"], dtype=np.int64)
        lengths = np.asarray(state["buffer"]["length"], dtype=np.int64)
        sides = bucket_sides(examples, self.seed)
        engine.call(
            self.kernels, "stream_restore", examples, lengths, sides, self._buf, self._lleaves,
            self._rows, self._qleaves, self._pool, self._scalars, self.capacity,
            np.asarray([len(row["example"]) for row in rows], dtype=np.int64),
            np.asarray([e for row in rows for e in row["example"]], dtype=np.int64),
            np.asarray([n for row in rows for n in row["length"]], dtype=np.int64),
            inputs=3,
        )  # fmt: skip
