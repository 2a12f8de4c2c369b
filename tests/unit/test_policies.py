"""Packing policies: invariants, exact agreement with plain reference packers,
both kernel engines, and the fallback when the C kernels are missing."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactpack import InvalidInput, OversizedExample, plan_rows
from exactpack.core import engine
from exactpack.core.errors import MAX_TREE_CAPACITY, positive_int
from exactpack.core.plan import Plan, validate_plan
from exactpack.core.policies import POLICIES, decreasing_order

from support.reference import (
    decreasing,
    reference_best_fit_decreasing,
    reference_first_fit_decreasing,
    reference_next_fit,
)

PACKING = ["next-fit", "first-fit-decreasing", "best-fit-decreasing", "stream-best-fit"]
ENGINES = ["python", "native"] if engine.native_available() else ["python"]
needs_native = pytest.mark.skipif(not engine.native_available(), reason="C kernels not built")


@st.composite
def lengths_and_capacity(draw, max_capacity: int = 40, max_examples: int = 60):
    capacity = draw(st.integers(1, max_capacity))
    lengths = draw(st.lists(st.integers(1, capacity), max_size=max_examples))
    return np.asarray(lengths, dtype=np.int64), capacity


stream_options = st.fixed_dictionaries(
    {"lookahead": st.integers(1, 12), "max_open_rows": st.integers(1, 5), "seed": st.integers(0, 3)}
)


# ----------------------------------------------------------------- references


def optimal_rows(lengths, capacity):
    """Fewest rows, by exhaustive search (tiny inputs only)."""
    items = sorted(lengths.tolist(), reverse=True)
    lower = -(-sum(items) // capacity)
    best = len(items)

    def search(k, rooms):
        nonlocal best
        if len(rooms) >= best or best == lower:
            return
        if k == len(items):
            best = len(rooms)
            return
        tried = set()
        for b, room in enumerate(rooms):
            if room >= items[k] and room not in tried:
                tried.add(room)
                rooms[b] -= items[k]
                search(k + 1, rooms)
                rooms[b] += items[k]
        rooms.append(capacity - items[k])
        search(k + 1, rooms)
        rooms.pop()

    search(0, [])
    return best


def assert_same(plan, row_of, start_of):
    assert plan.row_of.tolist() == list(row_of)
    assert plan.start_of.tolist() == list(start_of)


def row_fill(plan):
    return np.bincount(plan.row_of, weights=plan.lengths, minlength=plan.num_rows)


# ----------------------------------------------------------------- invariants


@given(lengths_and_capacity(), stream_options, st.sampled_from(PACKING))
def test_every_policy_places_each_example_once_whole_and_inside_a_row(case, options, policy):
    lengths, capacity = case
    plan = plan_rows(lengths, capacity, policy, **(options if policy == "stream-best-fit" else {}))
    validate_plan(plan)  # one placement each, inside its row, no overlap, no empty row
    assert np.array_equal(plan.lengths, lengths)
    assert (row_fill(plan) <= capacity).all()
    assert plan.num_rows >= -(-int(lengths.sum()) // capacity)
    assert plan.stats()["rows"] == plan.num_rows


@given(lengths_and_capacity(), st.sampled_from(ENGINES))
def test_next_fit_keeps_the_supplied_order(case, engine):
    lengths, capacity = case
    plan = plan_rows(lengths, capacity, "next-fit", kernels=engine)
    assert_same(plan, *reference_next_fit(lengths, capacity))
    assert (np.diff(plan.row_of) >= 0).all()
    same_row = np.diff(plan.row_of) == 0
    assert (np.diff(plan.start_of)[same_row] > 0).all()


@given(lengths_and_capacity(), st.sampled_from(ENGINES))
def test_first_fit_decreasing_matches_the_plain_scan(case, engine):
    lengths, capacity = case
    plan = plan_rows(lengths, capacity, "first-fit-decreasing", kernels=engine)
    assert_same(plan, *reference_first_fit_decreasing(lengths, capacity))


@given(lengths_and_capacity(), st.sampled_from(ENGINES))
def test_best_fit_decreasing_matches_the_plain_scan(case, engine):
    lengths, capacity = case
    plan = plan_rows(lengths, capacity, "best-fit-decreasing", kernels=engine)
    assert_same(plan, *reference_best_fit_decreasing(lengths, capacity))


@given(lengths_and_capacity(max_capacity=20, max_examples=8))
def test_decreasing_policies_stay_within_their_worst_case_bounds(case):
    lengths, capacity = case
    opt = optimal_rows(lengths, capacity)
    ffd = plan_rows(lengths, capacity, "first-fit-decreasing").num_rows
    bfd = plan_rows(lengths, capacity, "best-fit-decreasing").num_rows
    assert opt <= ffd <= 11 / 9 * opt + 6 / 9  # Dósa's tight bound for FFD
    assert opt <= bfd <= 11 / 9 * opt + 1
    assert max(ffd, bfd) <= 1.5 * opt  # Simchi-Levi's absolute bound


@given(st.integers(1, 30), st.integers(0, 12), st.sampled_from(PACKING))
def test_full_rows_make_no_empty_row(capacity, n, policy):
    plan = plan_rows(np.full(n, capacity), capacity, policy)
    validate_plan(plan)
    assert plan.num_rows == n


@given(st.integers(2, 30), st.integers(0, 12), st.sampled_from(PACKING[:3]))
def test_exact_pairs_fill_rows_exactly(capacity, pairs, policy):
    split = capacity // 2
    lengths = np.asarray([split, capacity - split] * pairs + [capacity] * pairs)
    plan = plan_rows(lengths, capacity, policy)
    validate_plan(plan)
    assert plan.num_rows == 2 * pairs


@pytest.mark.parametrize("policy", [*PACKING, "padded"])
def test_no_examples_make_no_rows(policy):
    plan = plan_rows(np.zeros(0, dtype=np.int64), 8, policy)
    assert (plan.num_rows, plan.stats()["efficiency"]) == (0, 0.0)


def test_the_docstring_layouts():
    lengths = np.array([3, 2, 4])
    assert_same(plan_rows(lengths, 6), *reference_next_fit(lengths, 6))
    best = plan_rows(lengths, 6, "best-fit-decreasing")
    assert_same(best, *reference_best_fit_decreasing(lengths, 6))
    assert row_fill(best).tolist() == [6, 3]  # C and B share a row exactly


# ----------------------------------------------------------------- engines


@needs_native
@given(lengths_and_capacity(), stream_options, st.sampled_from(PACKING))
def test_native_and_python_kernels_give_identical_plans(case, options, policy):
    lengths, capacity = case
    opts = options if policy == "stream-best-fit" else {}
    fast = plan_rows(lengths, capacity, policy, kernels="native", **opts)
    slow = plan_rows(lengths, capacity, policy, kernels="python", **opts)
    assert np.array_equal(fast.row_of, slow.row_of)
    assert np.array_equal(fast.start_of, slow.start_of)


@needs_native
@given(lengths_and_capacity(max_examples=200))
def test_counting_sort_is_a_stable_descending_sort(case):
    lengths, capacity = case
    expected = np.argsort(-lengths, kind="stable")
    assert np.array_equal(decreasing_order(lengths, capacity, "native"), expected)
    assert np.array_equal(decreasing_order(lengths, capacity, "python"), expected)


@given(lengths_and_capacity(max_examples=200))
def test_the_counting_sort_kernel_run_as_plain_python(case):
    """The counting sort's Python source, run by the python engine (mutation runs use it)."""
    lengths, capacity = case
    order = np.empty(lengths.shape[0], dtype=np.int64)
    counts = np.zeros(capacity + 2, dtype=np.int64)
    engine.call("python", "counting_sort", lengths, capacity, counts, order, inputs=1)
    assert order.tolist() == decreasing(lengths)


def test_the_core_plans_without_the_c_kernels():
    code = f"""
import json, sys
sys.modules["exactpack.core.native"] = None  # as if not built
import numpy as np
from exactpack import NotAvailable, plan_rows
from exactpack.core import engine
assert not engine.native_available()
assert "numba" not in sys.modules
lengths = np.random.default_rng(7).integers(1, 100, 500)
out = {{p: plan_rows(lengths, 128, p).to_dict() for p in {PACKING!r}}}
try:
    plan_rows(lengths, 128, kernels="native")
except NotAvailable as err:
    out["error"] = str(err)
print(json.dumps(out))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert "C kernels are not built" in out.pop("error")
    lengths = np.random.default_rng(7).integers(1, 100, 500)
    for policy, data in out.items():
        here = plan_rows(lengths, 128, policy)  # the C kernels in this process when built
        assert data == here.to_dict(), policy


# ----------------------------------------------------------------- workloads


def w1_lengths():
    """W1 of benchmarks/workloads.py: 200,000 lognormal SFT lengths, capacity 4096."""
    rng = np.random.default_rng(20240601)
    lengths = np.rint(rng.lognormal(math.log(350) - 0.5, 1.0, 200_000))
    return np.clip(lengths, 8, 4096).astype(np.int64)


@needs_native
@pytest.mark.parametrize(
    ("lengths", "capacity"),
    [
        pytest.param(w1_lengths(), 4096, id="W1"),
        pytest.param(
            np.random.default_rng(20240602).integers(16, 513, size=1_000_000), 2048, id="W2"
        ),
    ],
)
@pytest.mark.parametrize("policy", ["first-fit-decreasing", "best-fit-decreasing"])
def test_decreasing_fits_leave_less_room_than_the_last_opener(lengths, capacity, policy):
    """Provable on any input: when the item that opened the last row arrived, no row had
    room for it, and rooms only shrink, so every other row ends with less room than it.
    (How close the row counts come to the lower bound is benchmarks/bench_policies.py's.)
    """
    plan = plan_rows(lengths, capacity, policy)
    used = np.bincount(plan.row_of, weights=plan.lengths, minlength=plan.num_rows)
    last = plan.num_rows - 1  # rows are numbered in the order they open
    opener = int(plan.lengths[(plan.row_of == last) & (plan.start_of == 0)][0])
    room = capacity - used
    assert (room[:last] < opener).all()
    assert plan.num_rows >= plan.stats()["lower_bound"]


# ----------------------------------------------------------------- plans and errors


@given(lengths_and_capacity(), st.sampled_from(PACKING))
def test_plans_round_trip_through_dict_and_npz(tmp_path_factory, case, policy):
    lengths, capacity = case
    plan = plan_rows(lengths, capacity, policy)
    path = tmp_path_factory.mktemp("plan") / "plan.npz"
    plan.save(path)
    for back in (Plan.from_dict(json.loads(json.dumps(plan.to_dict()))), Plan.load(path)):
        assert back.to_dict() == plan.to_dict()
        assert back.stats() == plan.stats()


def test_stats_are_computed_from_the_plan():
    lengths = np.array([5, 7, 3, 8, 2])
    stats = plan_rows(lengths, 10, "best-fit-decreasing").stats()
    tokens = int(lengths.sum())
    assert stats["examples"] == 5 and stats["tokens"] == tokens
    assert stats["lower_bound"] == -(-tokens // 10)
    assert stats["efficiency"] == tokens / (stats["rows"] * 10)


def test_a_tampered_plan_is_rejected(tmp_path):
    plan = plan_rows([3, 2, 4], 6, "best-fit-decreasing")
    data = plan.to_dict()
    data["start_of"][1] = 1  # B overlaps C
    with pytest.raises(InvalidInput, match="same cells"):
        Plan.from_dict(data)


@pytest.mark.parametrize("policy", PACKING)
def test_an_oversized_example_is_named(policy):
    with pytest.raises(OversizedExample, match=r"example 2 has 9 prediction pairs; capacity is 8"):
        plan_rows([3, 8, 9, 1], 8, policy)


def test_bad_policy_engine_and_options_are_reported():
    with pytest.raises(InvalidInput, match="unknown policy"):
        plan_rows([1], 4, "worst-fit")
    with pytest.raises(InvalidInput, match="unknown engine"):
        plan_rows([1], 4, "next-fit", kernels="gpu")
    with pytest.raises(InvalidInput, match="takes no option lookahead"):
        plan_rows([1], 4, "best-fit-decreasing", lookahead=4)
    with pytest.raises(InvalidInput, match=r"lookahead must be an integer in \[1, "):
        plan_rows([1], 4, "stream-best-fit", lookahead=0)
    with pytest.raises(InvalidInput, match="largest best-fit-decreasing indexes"):
        plan_rows([1], MAX_TREE_CAPACITY + 1, "best-fit-decreasing")


def test_every_registered_policy_is_planned_and_valid():
    """Each policy places every example once, whole, in a row of its own cells (checked
    cell by cell here, not only by ``validate_plan``), numbers rows without a gap and
    never beats the lower bound."""
    lengths = np.random.default_rng(3).integers(1, 33, 300)
    bound = -(-int(lengths.sum()) // 32)
    for policy in POLICIES:
        plan = plan_rows(lengths, 32, policy)
        validate_plan(plan)  # raises on a bad plan; the checks below say what "valid" means
        assert plan.policy == policy and plan.capacity == 32
        assert plan.lengths.tolist() == lengths.tolist()  # none split, dropped or resized
        owner = {}
        for i, (row, start, n) in enumerate(zip(plan.row_of.tolist(), plan.start_of.tolist(),
                                                 plan.lengths.tolist(), strict=True)):  # fmt: skip
            assert start >= 0 and start + n <= 32, (policy, i)
            for c in range(start, start + n):
                assert (row, c) not in owner, (policy, i, owner.get((row, c)))
                owner[(row, c)] = i
        assert sorted({r for r, _ in owner}) == list(range(plan.num_rows)), policy
        assert len(owner) == int(lengths.sum())
        assert bound <= plan.num_rows <= len(lengths), policy


@given(st.lists(st.integers(1, 2**40), max_size=30))
def test_first_fit_decreasing_takes_any_capacity(values):
    capacity = 2**40
    lengths = np.asarray(values, dtype=np.int64)
    plan = plan_rows(lengths, capacity, "first-fit-decreasing")
    assert_same(plan, *reference_first_fit_decreasing(lengths, capacity))


@pytest.mark.parametrize("value", [0, -3, True, 2.0, "4", None])
def test_positive_int_rejects_non_positive_and_non_integers(value):
    with pytest.raises(InvalidInput, match=f"size must be a positive integer, got {value!r}"):
        positive_int("size", value)


def test_positive_int_bounds_and_converts():
    assert positive_int("size", np.int16(7)) == 7 and type(positive_int("size", np.int16(7))) is int
    assert positive_int("size", 9, maximum=9) == 9
    with pytest.raises(InvalidInput, match=r"size must be an integer in \[1, 1,000\], got 1001"):
        positive_int("size", 1001, maximum=1000)
