"""Streaming best-fit kernels (see :mod:`seqpack.core.stream_packer` for the rules).

State travels as tuples of int64 arrays, unpacked at the top of each kernel:

- ``buf`` = (bex, blen, bprev, bnext, lhead, ltail, ltree): the look-ahead
  ring (example ``i`` waits in slot ``i % window``; ``bex`` -1 when free),
  each waiting example linked into a bucket by length, and a tree whose leaf
  ``n`` holds ``n`` while some example of length ``n`` waits;
- ``rows`` = (rrem, rnext, rhead, rtail, rstamp, qhead, qtail, qtree): open
  row slots (cells left, placement list, bucket link, bucket entry stamp),
  FIFO buckets by cells left and their tree (as in best-fit-decreasing);
- ``pool`` = (pex, pstart, pnext): placements held by open rows (free list
  through ``pnext``);
- ``out`` = (oex, orow, ostart): placements of rows closed during a call.

``scalars`` holds the counters at the ``S_*`` indices.
"""

from __future__ import annotations

from seqpack.core.engine import kernel
from seqpack.core.plan_kernels import (
    bucket_pop,
    bucket_push,
    tree_first_at_least,
    tree_last_at_most,
    tree_set,
)

S_PUSHED, S_ROWS, S_OPEN, S_FREE_ROW, S_FREE_REC, S_LIVE, S_STAMP, S_OUT = range(8)
N_SCALARS = 8


@kernel
def buffer_insert(buf, lleaves, slot, ex, n, front):
    """Put example ``ex`` (length ``n``) into ring ``slot``; link it at the
    front or back of bucket ``n`` (a seeded choice: ties leave in a seeded order)."""
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
    """Place the example in ring ``slot`` and fill its row from the buffer.

    The example goes into the open row with the fewest cells left that fit
    (a new row when none fits; with ``max_open`` rows open the fullest is
    closed first). Then the row takes, while any fits, the longest waiting
    example that fits its cells left. An exactly full row closes.
    """
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
    """Admit ``lengths`` one by one; example ``i`` arriving forces out ``i - window``.

    ``fronts`` (0/1 per example) picks the bucket end each joins.
    """
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
    lhead = buf[4]
    ltree = buf[6]
    qhead, qtail, qtree = rows[5], rows[6], rows[7]
    rnext = rows[1]
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
    """Rebuild a fresh state from a saved one: waiting examples in arrival
    order (each to its ring slot and bucket end), then the open rows in
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
