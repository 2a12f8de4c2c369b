"""Streaming best fit: complete rows per call, bounded look-ahead and open rows,
resume from a saved state with identical output."""

from __future__ import annotations

import itertools
import json
import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactpack import InvalidInput, OversizedExample, plan_rows
from exactpack.core import engine
from exactpack.core.plan import validate_plan
from exactpack.core.stream_packer import Placements, StreamPacker

ENGINES = ["python", "native"] if engine.native_available() else ["python"]


@st.composite
def streams(draw, max_capacity: int = 40, max_examples: int = 80):
    """(lengths, capacity, packer options, chunk cut points)."""
    capacity = draw(st.integers(1, max_capacity))
    lengths = np.asarray(
        draw(st.lists(st.integers(1, capacity), max_size=max_examples)), dtype=np.int64
    )
    options = {
        "lookahead": draw(st.integers(1, 16)),
        "max_open_rows": draw(st.integers(1, 6)),
        "seed": draw(st.integers(0, 2**70)),
    }
    cuts = sorted(draw(st.lists(st.integers(0, lengths.shape[0]), max_size=5)))
    return lengths, capacity, options, cuts


def chunks(lengths, cuts):
    bounds = [0, *cuts, lengths.shape[0]]
    return [lengths[a:b] for a, b in itertools.pairwise(bounds)]


def run(packer, pieces):
    return [packer.push(piece) for piece in pieces] + [packer.finish()]


def joined(parts):
    return [np.concatenate([getattr(p, f) for p in parts]) for f in Placements._fields]


@given(streams())
def test_each_call_returns_complete_rows_numbered_in_sequence(case):
    lengths, capacity, options, cuts = case
    packer = StreamPacker(capacity, **options)
    placed, next_row = set(), 0
    for part in run(packer, chunks(lengths, cuts)):
        order = np.lexsort((part.start, part.row))
        assert np.array_equal(order, np.arange(part.row.shape[0]))  # (row, start) order
        rows = np.unique(part.row)
        assert rows.tolist() == list(range(next_row, next_row + rows.shape[0]))
        next_row += rows.shape[0]
        placed.update(part.example.tolist())
    assert placed == set(range(lengths.shape[0]))
    assert packer.rows_emitted == next_row and packer.open_rows == 0 and packer.buffered == 0


@given(streams())
def test_the_stream_plan_is_valid_and_bounded(case):
    lengths, capacity, options, cuts = case
    packer = StreamPacker(capacity, **options)
    for piece in chunks(lengths, cuts):
        packer.push(piece)
        state = packer.state_dict()
        pushed = packer.examples_pushed
        # nobody waits longer than `window` arrivals; open rows stay within bounds
        assert all(pushed - options["lookahead"] <= e < pushed for e in state["buffer"]["example"])
        assert len(state["open_rows"]) <= options["max_open_rows"]
    packer.finish()
    plan = plan_rows(lengths, capacity, "stream-best-fit", **options)
    validate_plan(plan)


@given(streams(), st.sampled_from(["json", "pickle"]), st.sampled_from(ENGINES))
def test_a_resumed_stream_equals_the_uninterrupted_one(case, codec, engine):
    lengths, capacity, options, cuts = case
    whole = joined(run(StreamPacker(capacity, **options), [lengths]))
    parts, packer = [], StreamPacker(capacity, **options)
    for piece in chunks(lengths, cuts):
        parts.append(packer.push(piece))
        state = packer.state_dict()
        state = (
            json.loads(json.dumps(state)) if codec == "json" else pickle.loads(pickle.dumps(state))
        )
        packer = StreamPacker.from_state_dict(state, kernels=engine)
    parts.append(packer.finish())
    for a, b in zip(whole, joined(parts), strict=True):
        assert np.array_equal(a, b)


@given(st.lists(st.integers(1, 12), max_size=60), st.integers(12, 20), st.sampled_from(ENGINES))
def test_window_one_and_one_open_row_is_next_fit(lengths, capacity, engine):
    options = {"lookahead": 1, "max_open_rows": 1, "kernels": engine}
    stream = plan_rows(lengths, capacity, "stream-best-fit", **options)
    next_fit = plan_rows(lengths, capacity, "next-fit")
    assert np.array_equal(stream.row_of, next_fit.row_of)
    assert np.array_equal(stream.start_of, next_fit.start_of)


@pytest.mark.parametrize("window", [1, 3, 10])
def test_a_full_row_closes_as_soon_as_its_example_is_placed(window):
    packer = StreamPacker(8, lookahead=window, max_open_rows=4)
    out = packer.push(np.full(25, 8))
    # example i is placed when example i + window arrives, and its row is full
    assert out.example.tolist() == list(range(25 - window))
    rest = packer.finish()  # the last `window`, in the seeded order of equal lengths
    assert sorted(rest.example.tolist()) == list(range(25 - window, 25))


def test_the_seed_orders_equal_lengths():
    lengths = np.ones(64, dtype=np.int64)
    plans = {
        plan_rows(lengths, 4, "stream-best-fit", lookahead=16, seed=seed).row_of.tobytes()
        for seed in range(8)
    }
    assert len(plans) > 1
    again = plan_rows(lengths, 4, "stream-best-fit", lookahead=16, seed=3)
    assert again.row_of.tobytes() in plans


def test_a_bad_chunk_leaves_the_packer_unchanged():
    packer = StreamPacker(8, lookahead=4, max_open_rows=2)
    packer.push([3, 5, 2])
    before = packer.state_dict()
    with pytest.raises(OversizedExample, match="example 4 has 9 prediction pairs; capacity is 8"):
        packer.push([1, 9])
    assert packer.state_dict() == before
    with pytest.raises(InvalidInput, match="at least 1"):
        packer.push([0])
    assert packer.state_dict() == before


def test_misuse_is_reported():
    packer = StreamPacker(8, lookahead=4, max_open_rows=2, seed=1)
    packer.push([3, 5, 2, 7, 1])
    state = packer.state_dict()
    with pytest.raises(InvalidInput, match="state has seed=1 but this packer has 2"):
        StreamPacker(8, lookahead=4, max_open_rows=2, seed=2).load_state_dict(state)
    broken = json.loads(json.dumps(state))
    broken["buffer"]["example"][0] = 99
    with pytest.raises(InvalidInput, match="buffer state's example holds a value outside"):
        StreamPacker.from_state_dict(broken)
    with pytest.raises(InvalidInput, match="not a stream-best-fit state"):
        StreamPacker.from_state_dict({**state, "format": "other"})
    packer.finish()
    with pytest.raises(InvalidInput, match="has finished"):
        packer.push([1])
    with pytest.raises(InvalidInput, match="seed must be an integer"):
        StreamPacker(8, seed=1.5)


def test_long_streams_cross_internal_chunks():
    rng = np.random.default_rng(11)
    lengths = rng.integers(1, 300, 150_000)
    packer = StreamPacker(512, lookahead=1000, max_open_rows=8, seed=5)
    parts = run(packer, [lengths[:70_000], lengths[70_000:]])
    example, row, start = joined(parts)
    assert np.array_equal(np.sort(example), np.arange(lengths.shape[0]))
    whole = plan_rows(lengths, 512, "stream-best-fit", lookahead=1000, max_open_rows=8, seed=5)
    assert np.array_equal(whole.row_of[example], row)
    assert np.array_equal(whole.start_of[example], start)
