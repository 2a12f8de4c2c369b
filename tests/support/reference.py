"""Independent references for the contracts in ``shared/DESIGN.md``.

Everything here is written from the rules in the docs, in plain Python
(lists, loops, one cell or one example at a time), and calls no exactpack
function: the tests hold the library's vectorised views, packers and loss
against these. A reference that shared code with what it checks would pass
with it when both are wrong.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

PAD = -1
IGNORE = -100


# ----------------------------------------------------------------- layout from occurrences


@dataclass
class Placed:
    """One occurrence as the records say: row, columns ``[start, end)``, its example."""

    ordinal: int
    row: int
    start: int
    end: int
    window: list[int]  # len + 1 tokens of the example's selected range
    flags: list[bool]  # len loss flags


def placed_from_records(occurrences, examples: Sequence) -> list[Placed]:
    """Occurrence records (row, col_start, col_end, ordinal) joined with the examples supplied.

    ``examples[ordinal]`` is anything with ``window`` and ``loss_mask`` (a SequenceExample).
    """
    out = []
    for i in range(len(occurrences.ordinal)):
        ordinal = int(occurrences.ordinal[i])
        ex = examples[ordinal]
        out.append(
            Placed(
                ordinal,
                int(occurrences.row[i]),
                int(occurrences.col_start[i]),
                int(occurrences.col_end[i]),
                [int(t) for t in ex.window],
                [bool(f) for f in ex.loss_mask],
            )
        )
    return out


@dataclass
class Layout:
    """Cell tables rebuilt one cell at a time from the placements (lists of lists)."""

    rows: int
    width: int
    owner: list[list[Placed | None]] = field(default_factory=list)

    @classmethod
    def build(cls, placed: list[Placed], rows: int, width: int) -> Layout:
        owner: list[list[Placed | None]] = [[None] * width for _ in range(rows)]
        for p in placed:
            assert 0 <= p.row < rows and 0 <= p.start < p.end <= width, "outside the batch"
            assert p.end - p.start == len(p.window) - 1, "columns and window disagree"
            for c in range(p.start, p.end):
                assert owner[p.row][c] is None, "two occurrences on one cell"
                owner[p.row][c] = p
        return cls(rows, width, owner)

    def local(self, r: int, c: int) -> int:
        p = self.owner[r][c]
        return 0 if p is None else c - p.start

    # The cells.
    def cells(self) -> dict[str, list[list]]:
        out: dict[str, list[list]] = {
            k: []
            for k in (
                "inputs",
                "targets",
                "segments",
                "positions",
                "input_valid",
                "target_valid",
                "loss_mask",
            )
        }
        for r in range(self.rows):
            rows = {k: [] for k in out}
            for c in range(self.width):
                p = self.owner[r][c]
                if p is None:
                    vals = (PAD, PAD, -1, 0, False, False, False)
                else:
                    t = c - p.start
                    vals = (p.window[t], p.window[t + 1], p.ordinal, t, True, True, p.flags[t])
                for k, v in zip(out, vals, strict=True):
                    rows[k].append(v)
            for k in out:
                out[k].append(rows[k])
        return out

    # The permission and its views.
    def allowed(self, r: int, q: int, k: int, window: int | None = None) -> bool:
        """``k`` is a cell of the same occurrence as ``q`` at or before it (and, with a
        sliding ``window``, fewer than ``window`` cells back)."""
        pq, pk = self.owner[r][q], self.owner[r][k]
        near = window is None or q - k < window
        return pq is not None and pk is pq and pk.start <= k <= q and near

    def dense(self, window: int | None = None) -> list[list[list[bool]]]:
        w = self.width
        return [
            [[self.allowed(r, q, k, window) for k in range(w)] for q in range(w)]
            for r in range(self.rows)
        ]

    def edges(self, window: int | None = None) -> list[tuple[int, int, int]]:
        out = []
        for r in range(self.rows):
            for q in range(self.width):
                for k in range(self.width):
                    if self.allowed(r, q, k, window):
                        out.append((r, q, k))
        return out

    def key_ranges(
        self, window: int | None = None
    ) -> tuple[list[list[int]], list[list[int]], list[int]]:
        """Per query ``[start, end)`` of permitted keys (``[q, q)`` when none); valid per row."""
        starts, ends, lengths = [], [], []
        for r in range(self.rows):
            srow, erow = [], []
            for q in range(self.width):
                keys = [k for k in range(self.width) if self.allowed(r, q, k, window)]
                if keys:
                    assert keys == list(range(keys[0], keys[-1] + 1)), "keys not contiguous"
                    srow.append(keys[0])
                    erow.append(keys[-1] + 1)
                else:
                    srow.append(q)
                    erow.append(q)
            starts.append(srow)
            ends.append(erow)
            lengths.append(sum(p is not None for p in self.owner[r]))
        return starts, ends, lengths

    def runs(self) -> list[tuple[int, int, int]]:
        """Segments in row-major storage order: ``(row, first column, length)``."""
        out = []
        for r in range(self.rows):
            c = 0
            while c < self.width:
                p = self.owner[r][c]
                if p is None:
                    c += 1
                    continue
                out.append((r, c, p.end - c))
                c = p.end
        return out

    def cu_seqlens(self) -> tuple[list[int], int, list[int], list[int]]:
        """``(cu_seqlens, max_seqlen, valid_index, segment_rows)`` by walking the rows."""
        cu, total, longest, valid, seg_rows = [0], 0, 0, [], []
        for r, c, n in self.runs():
            total += n
            cu.append(total)
            longest = max(longest, n)
            valid.extend(r * self.width + c + j for j in range(n))
            seg_rows.append(r)
        return cu, longest, valid, seg_rows

    def position_ids(self) -> list[list[int]]:
        return [[self.local(r, c) for c in range(self.width)] for r in range(self.rows)]

    def collated(self, pad_id: int, ignore_index: int = IGNORE) -> dict[str, list[list[int]]]:
        """What a collator must hand a model, rows mode: ids, labels, positions, segments.

        ``shift_labels[c]``: cell ``c``'s own target; ``labels[c]``
        (transformers' unshifted form): the target of cell ``c-1`` when both
        cells hold the same example, else ``ignore_index``.
        """
        cells = self.cells()
        out = {k: [] for k in ("input_ids", "labels", "shift_labels", "position_ids")}
        out["segment_ids"] = []
        for r in range(self.rows):
            ids, shifted, unshifted = [], [], []
            seg = cells["segments"][r]
            for c in range(self.width):
                ids.append(cells["inputs"][r][c] if cells["input_valid"][r][c] else pad_id)
                shifted.append(cells["targets"][r][c] if cells["loss_mask"][r][c] else ignore_index)
                same = c > 0 and cells["input_valid"][r][c] and seg[c] == seg[c - 1]
                kept = same and cells["loss_mask"][r][c - 1]
                unshifted.append(cells["targets"][r][c - 1] if kept else ignore_index)
            out["input_ids"].append(ids)
            out["labels"].append(unshifted)
            out["shift_labels"].append(shifted)
            out["position_ids"].append(self.position_ids()[r])
            out["segment_ids"].append(cells["segments"][r])
        return out

    def flattened(self, pad_id: int, ignore_index: int = IGNORE) -> dict[str, list[int]]:
        """The same, padding dropped, valid cells in row-major order."""
        rows = self.collated(pad_id, ignore_index)
        out = {k: [] for k in rows}
        for r, c, n in self.runs():
            for k in rows:
                out[k].extend(rows[k][r][c : c + n])
        return out


# ----------------------------------------------------------------- in-memory policies


def decreasing(lengths):
    """Indices longest first, ties in supplied order."""
    return sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))


def reference_next_fit(lengths, capacity):
    row_of, start_of, row, used = [], [], 0, 0
    for n in lengths.tolist():
        if n > capacity - used:
            row, used = row + 1, 0
        row_of.append(row)
        start_of.append(used)
        used += n
    return row_of, start_of


def reference_first_fit_decreasing(lengths, capacity):
    left, row_of, start_of = [], [0] * len(lengths), [0] * len(lengths)
    for i in decreasing(lengths):
        n = int(lengths[i])
        row = next((r for r, room in enumerate(left) if room >= n), len(left))
        if row == len(left):
            left.append(capacity)
        row_of[i], start_of[i] = row, capacity - left[row]
        left[row] -= n
    return row_of, start_of


def reference_best_fit_decreasing(lengths, capacity):
    """Tightest row; among equally tight rows the one that got its room first."""
    rows, row_of, start_of = [], [0] * len(lengths), [0] * len(lengths)  # [room, since]
    for clock, i in enumerate(decreasing(lengths)):
        n = int(lengths[i])
        fits = [r for r, (room, _) in enumerate(rows) if room >= n]
        if fits:
            row = min(fits, key=lambda r: rows[r])
        else:
            row = len(rows)
            rows.append([capacity, clock])
        row_of[i], start_of[i] = row, capacity - rows[row][0]
        rows[row] = [rows[row][0] - n, clock]
    return row_of, start_of


# ----------------------------------------------------------------- stream-best-fit

MASK64 = (1 << 64) - 1


def seeded_side(index: int, seed: int) -> int:
    """The top bit of splitmix64 of ``seed + (index + 1) * golden``: 1 joins the front."""
    z = (seed + (index + 1) * 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return (z ^ (z >> 31)) >> 63


class StreamReference:
    """Streaming best fit from the rules in ``core/stream_packer.py``'s docstring.

    Examples wait in arrival order (a list); for ties in length each joins the
    front or back of its length's queue by :func:`seeded_side`. Open rows are
    ``[cells left, since, placements]`` where ``since`` counts when the row got
    its current room (equal rooms: the oldest is chosen first).
    """

    def __init__(self, capacity: int, window: int, max_open_rows: int, seed: int) -> None:
        self.capacity, self.window, self.max_open, self.seed = capacity, window, max_open_rows, seed
        self.waiting: dict[int, list[int]] = {}  # length -> example indices, queue order
        self.length_of: dict[int, int] = {}
        self.open: list[list] = []
        self.clock = 0
        self.pushed = 0
        self.rows = 0

    def _join(self, ex: int, n: int) -> None:
        queue = self.waiting.setdefault(n, [])
        self.length_of[ex] = n
        if queue and seeded_side(ex, self.seed):
            queue.insert(0, ex)
        else:
            queue.append(ex)

    def _leave(self, ex: int) -> int:
        n = self.length_of.pop(ex)
        self.waiting[n].remove(ex)
        if not self.waiting[n]:
            del self.waiting[n]
        return n

    def _close(self, row: list, out: list) -> None:
        self.open.remove(row)
        for ex, start in row[2]:
            out.append((ex, self.rows, start))
        self.rows += 1

    def _tick(self) -> int:
        self.clock += 1
        return self.clock

    def _place(self, ex: int, out: list) -> None:
        n = self._leave(ex)
        fits = [row for row in self.open if row[0] >= n]
        if fits:
            row = min(fits, key=lambda r: (r[0], r[1]))
        else:
            if len(self.open) == self.max_open:
                self._close(min(self.open, key=lambda r: (r[0], r[1])), out)
            row = [self.capacity, 0, []]
            self.open.append(row)
        row[2].append((ex, self.capacity - row[0]))
        row[0] -= n
        while row[0] > 0:
            lengths = [m for m in self.waiting if m <= row[0]]
            if not lengths:
                break
            filler = self.waiting[max(lengths)][0]
            row[2].append((filler, self.capacity - row[0]))
            row[0] -= self._leave(filler)
        if row[0] == 0:
            self._close(row, out)
        else:
            row[1] = self._tick()

    def push(self, lengths: Sequence[int]) -> list[tuple[int, int, int]]:
        """Placements ``(example, row, start)`` of the rows closed meanwhile, in closing order."""
        out: list[tuple[int, int, int]] = []
        for n in lengths:
            due = self.pushed - self.window
            if due >= 0 and due in self.length_of:
                self._place(due, out)
            self._join(self.pushed, int(n))
            self.pushed += 1
        return out

    def finish(self) -> list[tuple[int, int, int]]:
        out: list[tuple[int, int, int]] = []
        while self.waiting:
            self._place(self.waiting[max(self.waiting)][0], out)
        while self.open:
            self._close(min(self.open, key=lambda r: (r[0], r[1])), out)
        return out


def stream_plan(
    lengths: Sequence[int], capacity: int, window: int, max_open_rows: int, seed: int
) -> list[tuple[int, int, int]]:
    ref = StreamReference(capacity, window, max_open_rows, seed)
    return ref.push(lengths) + ref.finish()


def split_ranges(tokens: int, capacity: int) -> list[tuple[int, int]]:
    """``--cut-long``: every pair of a source once, pieces of at most ``capacity`` pairs."""
    if tokens - 1 <= capacity:
        return [(0, tokens)]
    out, start = [], 0
    while start < tokens - 1:
        end = min(start + capacity + 1, tokens)
        out.append((start, end))
        start = end - 1
    return out


def balanced_slots(loads: Sequence[float], slots: int, per_slot: int) -> list[list[int]]:
    """Heaviest first (stable) into the least-loaded slot with room (ties: lowest index);
    a short step caps every slot at ``ceil(rows / slots)``. Members sorted."""
    cap = min(per_slot, -(-len(loads) // slots))
    groups: list[list[int]] = [[] for _ in range(slots)]
    load = [0.0] * slots
    for i in sorted(range(len(loads)), key=lambda i: -loads[i]):
        target = min((s for s in range(slots) if len(groups[s]) < cap), key=lambda s: (load[s], s))
        groups[target].append(i)
        load[target] += loads[i]
    return [sorted(g) for g in groups]


# ----------------------------------------------------------------- loss


def log_softmax_nll(logits_row: Sequence[float], gold: int) -> float:
    """``-log softmax(z)[gold]`` in float64 with an exact-sum log-sum-exp."""
    top = max(logits_row)
    return top + math.log(math.fsum(math.exp(z - top) for z in logits_row)) - logits_row[gold]


def softmax(logits_row: Sequence[float]) -> list[float]:
    top = max(logits_row)
    e = [math.exp(z - top) for z in logits_row]
    s = math.fsum(e)
    return [x / s for x in e]


def close(a: float, b: float) -> bool:
    """The suite's float64 agreement: ``|a-b| <= 1e-10 + 1e-9 * max(|a|, |b|)``."""
    return abs(a - b) <= 1e-10 + 1e-9 * max(abs(a), abs(b))


# ----------------------------------------------------------------- cells of a store


def placed_from_plan(
    examples: Sequence, row_of: Sequence[int], start_of: Sequence[int], first: int, rows: int
) -> list[Placed]:
    """The occurrences of rows ``[first, first + rows)``, written from the examples and the
    plan's placements alone (example ``i`` at ``row_of[i]``, columns from ``start_of[i]``)."""
    out = []
    for i, ex in enumerate(examples):
        row = int(row_of[i])
        if first <= row < first + rows:
            window = [int(t) for t in ex.window]
            flags = [bool(f) for f in ex.loss_mask]
            start = int(start_of[i])
            out.append(Placed(i, row - first, start, start + len(flags), window, flags))
    return out


def reference_calls(
    examples: Sequence, row_of: Sequence[int], start_of: Sequence[int], per: int, width: int
) -> list[tuple[Layout, list[Placed]]]:
    """Every model call of ``per`` rows (the last one shorter): its layout and occurrences
    in storage order (row, then column)."""
    total = max(int(r) for r in row_of) + 1 if len(row_of) else 0
    out = []
    for first in range(0, total, per):
        rows = min(per, total - first)
        placed = placed_from_plan(examples, row_of, start_of, first, rows)
        placed.sort(key=lambda p: (p.row, p.start))
        out.append((Layout.build(placed, rows, width), placed))
    return out


def split_examples(examples: Sequence, capacity: int) -> list[SimpleExample]:
    """``--cut-long`` written out: each example's pieces (``split_ranges``), in order."""
    out = []
    for ex in examples:
        window = [int(t) for t in ex.window]
        flags = [bool(f) for f in ex.loss_mask]
        for a, b in split_ranges(len(window), capacity):
            out.append(SimpleExample(window[a:b], flags[a : b - 1]))
    return out


@dataclass
class SimpleExample:
    """An example as plain lists: ``window`` (len + 1 tokens) and ``loss_mask`` (len flags)."""

    window: list[int]
    loss_mask: list[bool]


# ----------------------------------------------------------------- attention


def spans_of(occurrences) -> list[tuple[int, int, int]]:
    """``(row, first column, end column)`` per occurrence, from its records alone."""
    return [
        (int(r), int(a), int(b))
        for r, a, b in zip(occurrences.row, occurrences.col_start, occurrences.col_end, strict=True)
    ]


def flat_spans(occurrences) -> list[tuple[int, int, int]]:
    """The same occurrences with padding dropped, one row of valid cells in row-major order
    (transformers' flattened layout): ``(0, start, end)`` each."""
    out, at = [], 0
    for _, a, b in sorted(spans_of(occurrences)):
        out.append((0, at, at + b - a))
        at += b - a
    return out


def per_example_attention(q, k, v, spans, scale: float, window: int | None = None):
    """Each example run alone: plain causal softmax attention over its own cells.

    ``q``, ``k``, ``v`` torch (R, H, T, D) (``k``/``v`` may have fewer heads: each
    serves ``H // Hkv`` query heads); ``spans`` ``(row, start, end)`` per example.
    Query ``i`` of an example sees its keys ``j <= i`` (and ``i - j < window``);
    cells of no example get zeros. Differentiable (torch autograd), no exactpack code.
    """
    import torch

    heads = q.shape[1]
    k = k.repeat_interleave(heads // k.shape[1], dim=1)
    v = v.repeat_interleave(heads // v.shape[1], dim=1)
    out = torch.zeros_like(q)
    for row, start, end in spans:
        n = end - start
        near = [[j <= i and (window is None or i - j < window) for j in range(n)] for i in range(n)]
        qe, ke, ve = (x[row, :, start:end] for x in (q, k, v))  # (H, n, D)
        scores = (qe @ ke.transpose(-1, -2)) * scale  # (H, n, n)
        scores = scores.masked_fill(~torch.tensor(near), float("-inf"))
        out[row, :, start:end] = torch.softmax(scores, dim=-1) @ ve
    return out


# ----------------------------------------------------------------- loss of a call


def loss_sum(logits, targets, supervised) -> tuple[float, int]:
    """``(Σ -log softmax(logits[c])[targets[c]], N)`` over supervised cells, one at a time.

    ``logits`` nested lists (..., V); ``targets`` / ``supervised`` nested lists of the
    same leading shape. A plain ``math.fsum`` of per-cell log-softmax losses."""
    terms = []

    def walk(z, t, s):
        if isinstance(s, bool):
            if s:
                terms.append(log_softmax_nll(z, t))
            return
        for zz, tt, ss in zip(z, t, s, strict=True):
            walk(zz, tt, ss)

    walk(logits, targets, supervised)
    return math.fsum(terms), len(terms)
