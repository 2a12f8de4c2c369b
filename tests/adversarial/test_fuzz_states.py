"""Fuzz saved states: a damaged plan or stream state is refused, or it is a valid one.

Three hypothesis targets, each starting from a real saved state and
damaging it:

- ``Plan.from_dict`` on a plan's dict with values replaced (numbers nudged or
  swapped for 0, -1, 2**62, floats, bools, text, null) and entries added or
  removed: an :class:`~exactpack.InvalidInput`, or a plan whose placements keep
  every invariant (checked here independently, cell by cell);
- ``Plan.load`` on a saved ``.npz`` with bytes flipped, cut or inserted:
  an :class:`~exactpack.InvalidInput`, or a valid plan;
- ``StreamPacker.from_state_dict`` on a state with the same kinds of damage:
  a :class:`~exactpack.ExactpackError`, or a packer that, finished, places
  exactly the examples the state holds, each once, in rows that fit.
"""

import copy

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exactpack import ExactpackError
from exactpack.core.plan import Plan
from exactpack.core.policies import plan_rows
from exactpack.core.stream_packer import StreamPacker

FUZZ = settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
ODD = [0, -1, 1, 2, 7, 2**31, 2**62, -(2**62), 1.5, 2.0, True, False, None, "3", [], [1]]

PLAN = plan_rows(np.array([3, 2, 4, 1, 6, 5, 2, 2]), 6, "best-fit-decreasing")


def _damage(draw, node):
    """Replace, nudge, add or remove one value anywhere in a nest of dicts and lists."""
    spots = []

    def walk(n):
        for key in list(n) if isinstance(n, dict) else range(len(n)):
            spots.append((n, key))
            if isinstance(n[key], (dict, list)):
                walk(n[key])

    walk(node)
    parent, key = draw(st.sampled_from(spots))
    how = draw(st.sampled_from(["odd", "nudge", "nudge", "remove", "grow"]))
    old = parent[key]
    if how == "remove":
        del parent[key]
    elif how == "grow" and isinstance(old, list):
        old.append(draw(st.sampled_from([*old[:1], 0, 1, 99])) if old else 1)
    elif how == "nudge" and isinstance(old, int) and not isinstance(old, bool):
        parent[key] = old + draw(st.sampled_from([-2, -1, 1, 2, 5]))
    else:
        parent[key] = copy.deepcopy(draw(st.sampled_from(ODD)))


def _check_plan(plan: Plan) -> None:
    """Placements keep the plan invariants, recomputed cell by cell."""
    cells = np.zeros((plan.num_rows, plan.capacity), dtype=np.int64)
    for length, row, start in zip(plan.lengths, plan.row_of, plan.start_of, strict=True):
        assert length >= 1 and start >= 0 and start + length <= plan.capacity
        assert 0 <= row < plan.num_rows
        cells[row, start : start + length] += 1
    assert cells.max(initial=0) <= 1  # no overlap
    assert plan.lengths.shape[0] == 0 or (cells.sum(axis=1) > 0).all()  # no empty row


@FUZZ
@given(st.data())
def test_a_damaged_plan_dict_is_refused_or_valid(data):
    state = PLAN.to_dict()
    for _ in range(data.draw(st.integers(1, 3))):
        _damage(data.draw, state)
    try:
        plan = Plan.from_dict(state)
    except ExactpackError:
        return
    _check_plan(plan)


@FUZZ
@given(st.data())
def test_a_damaged_plan_file_is_refused_or_valid(tmp_path_factory, data):
    path = _plan_file(tmp_path_factory)
    raw = bytearray(path.read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        how = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if how == "flip":
            raw[at] ^= 1 << data.draw(st.integers(0, 7))
        elif how == "cut":
            del raw[at : at + data.draw(st.integers(1, 64))]
        else:
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=8))
    damaged = path.with_name("damaged.npz")
    damaged.write_bytes(bytes(raw))
    try:
        plan = Plan.load(damaged)
    except ExactpackError:
        return
    _check_plan(plan)


_PLAN_FILE = []


def _plan_file(tmp_path_factory):
    if not _PLAN_FILE:
        path = tmp_path_factory.mktemp("plan") / "plan.npz"
        PLAN.save(path)
        _PLAN_FILE.append(path)
    return _PLAN_FILE[0]


def _stream_state():
    packer = StreamPacker(10, lookahead=5, max_open_rows=3, seed=4)
    packer.push(np.array([3, 7, 2, 9, 1, 4, 4, 6, 2, 5, 8, 1, 3]))
    return packer.state_dict()


STATE = _stream_state()


@FUZZ
@given(st.data())
def test_a_damaged_stream_state_is_refused_or_a_packer_that_places_what_it_holds(data):
    state = copy.deepcopy(STATE)
    for _ in range(data.draw(st.integers(1, 3))):
        _damage(data.draw, state)
    try:
        packer = StreamPacker.from_state_dict(state, kernels="python")
    except ExactpackError:
        return
    held = dict(zip(state["buffer"]["example"], state["buffer"]["length"], strict=True))
    for row in state["open_rows"]:
        held.update(zip(row["example"], row["length"], strict=True))
    placed = packer.finish()
    assert sorted(placed.example.tolist()) == sorted(held)  # each once, none lost or invented
    fill: dict[int, int] = {}
    for e, r, s in zip(*(p.tolist() for p in placed), strict=True):
        assert s >= 0 and s + held[e] <= state["capacity"]
        fill[r] = fill.get(r, 0) + held[e]
    assert all(total <= state["capacity"] for total in fill.values())
    assert packer.examples_pushed == state["examples_pushed"]
