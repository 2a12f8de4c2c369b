"""Plans, policy options and the numeric checks against plain references and whole messages.

A plan's statistics and storage order are recomputed with Python loops; a
plan that breaks a rule (overlap, outside a row, empty row, missing
placement) is refused with the rule named; the command-line number parsers
are held against a plain reading of the same grammar.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactpack import InvalidInput, OversizedExample, plan_rows
from exactpack.cli.flags import parse_byte_size, parse_count, parse_option
from exactpack.core.binding import INT32_MAX
from exactpack.core.errors import (
    MAX_OPTION_VALUE,
    MAX_TREE_CAPACITY,
    check_lengths,
    check_max_length,
    positive_int,
)
from exactpack.core.plan import Plan, validate_plan
from exactpack.core.policies import POLICIES, check_policy_options, decreasing_order
from exactpack.core.stream_packer import DEFAULT_LOOKAHEAD, DEFAULT_MAX_OPEN_ROWS

from support.reference import decreasing, stream_plan

lengths_and_capacity = st.integers(1, 30).flatmap(
    lambda c: st.tuples(st.lists(st.integers(1, c), max_size=40), st.just(c))
)


@given(lengths_and_capacity, st.sampled_from(sorted(POLICIES)))
def test_plan_statistics_and_storage_order_by_hand(case, policy):
    lengths, capacity = case
    plan = plan_rows(lengths, capacity, policy)
    tokens = sum(lengths)
    rows = len({int(r) for r in plan.row_of})
    assert plan.num_rows == rows and plan.policy == policy and plan.capacity == capacity
    assert plan.stats() == {
        "policy": policy,
        "capacity": capacity,
        "examples": len(lengths),
        "tokens": tokens,
        "rows": rows,
        "lower_bound": math.ceil(tokens / capacity),
        "efficiency": tokens / (rows * capacity) if rows else 0.0,
    }
    keys = sorted(range(len(lengths)), key=lambda i: (plan.row_of[i], plan.start_of[i]))
    assert plan.row_order().tolist() == keys and plan.row_order().dtype == np.int64
    data = plan.to_dict()
    assert data == {
        "policy": policy,
        "capacity": capacity,
        "num_rows": rows,
        "lengths": list(lengths),
        "row_of": plan.row_of.tolist(),
        "start_of": plan.start_of.tolist(),
    }
    back = Plan.from_dict(json.loads(json.dumps(data)))
    assert back.to_dict() == data and back.lengths.dtype == back.row_of.dtype == np.int64


def test_a_plan_file_round_trips_and_keeps_int64(tmp_path):
    plan = plan_rows([3, 2, 4], 6, "best-fit-decreasing")
    plan.save(tmp_path / "p.npz")
    back = Plan.load(tmp_path / "p.npz")
    assert back.to_dict() == plan.to_dict()
    assert back.start_of.dtype == np.int64 and back.policy == "best-fit-decreasing"
    # The largest capacity a plan may have, exactly.
    huge = plan_rows([INT32_MAX, 3, INT32_MAX - 3], INT32_MAX, "first-fit-decreasing")
    huge.save(tmp_path / "huge.npz")
    assert Plan.load(tmp_path / "huge.npz").to_dict() == huge.to_dict()
    empty = Plan.from_dict(plan_rows([], 4).to_dict())
    assert empty.num_rows == 0
    assert empty.lengths.dtype == empty.row_of.dtype == empty.start_of.dtype == np.int64


def test_a_plan_file_with_pickled_objects_is_refused(tmp_path):
    """Loading never unpickles: a crafted .npz with object arrays is an error, not code."""

    path = tmp_path / "evil.npz"
    header = np.frombuffer(
        json.dumps({"policy": "x", "capacity": 4, "num_rows": 1}).encode(), np.uint8
    )
    objects = np.array([1, 2], dtype=object)
    np.savez(path, header=header, lengths=objects, row_of=objects, start_of=objects)
    with pytest.raises((ValueError, InvalidInput)) as err:  # NumPy's refusal, or exactpack's check
        Plan.load(path)
    assert "allow_pickle" in str(err.value) or "object array" in str(err.value)


def placements(row_of, start_of, lengths=(3, 2, 4), num_rows=2, capacity=6):
    return Plan(
        np.array(lengths, dtype=np.int64),
        np.array(row_of, dtype=np.int64),
        np.array(start_of, dtype=np.int64),
        num_rows,
        capacity,
        "next-fit",
    )


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        (placements([0, 0, 1], [0, 3, 0]), None),
        (placements([0, 0, 1], [0, 3, 3]), "plan places an example outside its row"),
        (placements([0, 0, 1], [-1, 3, 0]), "plan places an example outside its row"),
        (placements([0, 0, 1], [0, 2, 0]), "plan places two examples on the same cells"),
        (placements([0, 0, 2], [0, 3, 0]), "plan refers to a row outside 0..num_rows-1"),
        (placements([0, -1, 1], [0, 3, 0]), "plan refers to a row outside 0..num_rows-1"),
        (placements([0, 0, 0], [0, 3, 5], (3, 2, 1)), "plan has an empty row"),
        (placements([0, 0], [0, 3]), "plan arrays must have one entry per example"),
        (placements([0, 0, 1], [0, 3]), "plan arrays must have one entry per example"),
        (placements([0, 1, 1], [0, 0, 1], (3, 2, 2)), "plan places two examples on the same cells"),
        (placements([], [], (), 1), "an empty plan has no rows"),
        (placements([], [], (), 0), None),
        (placements([0, 1, 1], [0, 0, 2], (3, 2, 4)), None),  # end exactly at capacity
    ],
)
def test_validate_plan_names_the_broken_rule(plan, message):
    if message is None:
        validate_plan(plan)
        return
    with pytest.raises(InvalidInput) as err:
        validate_plan(plan)
    assert str(err.value) == message


@given(st.lists(st.integers(1, 50), max_size=60), st.integers(50, 200))
def test_decreasing_order_is_the_stable_longest_first_sort(lengths, capacity):
    arr = np.array(lengths, dtype=np.int64)
    want = decreasing(arr)
    for engine in ("python", "auto"):
        got = decreasing_order(arr, capacity, engine)
        assert got.tolist() == want and got.dtype == np.int64


@given(lengths_and_capacity, st.integers(0, 4))
def test_stream_best_fit_defaults_are_the_packers(case, seed):
    lengths, capacity = case
    plan = plan_rows(lengths, capacity, "stream-best-fit", seed=seed)
    want = stream_plan(lengths, capacity, DEFAULT_LOOKAHEAD, DEFAULT_MAX_OPEN_ROWS, seed)
    got = zip(range(len(lengths)), plan.row_of.tolist(), plan.start_of.tolist(), strict=True)
    assert sorted(got) == sorted(want)


def test_padded_is_one_example_per_row():
    plan = plan_rows([3, 1, 2], 4, "padded")
    assert plan.row_of.tolist() == [0, 1, 2] and plan.start_of.tolist() == [0, 0, 0]
    assert plan.row_of.dtype == plan.start_of.dtype == np.int64 and plan.num_rows == 3


def test_policy_options_are_checked_by_name_with_the_known_ones_listed():
    check_policy_options("stream-best-fit", {"lookahead": 3, "seed": 1})
    with pytest.raises(InvalidInput) as err:
        check_policy_options("worst-fit", {})
    assert str(err.value) == f"unknown policy 'worst-fit'; choose one of {', '.join(POLICIES)}"
    with pytest.raises(InvalidInput) as err:
        check_policy_options("best-fit-decreasing", {"window": 4, "alpha": 1})
    assert str(err.value) == (
        "policy 'best-fit-decreasing' takes no option alpha, window; its options: kernels"
    )
    with pytest.raises(InvalidInput) as err:
        check_policy_options("stream-best-fit", {"windows": 8})
    assert str(err.value) == (
        "policy 'stream-best-fit' takes no option windows;"
        " its options: kernels, lookahead, max_open_rows, seed"
    )
    with pytest.raises(InvalidInput) as err:
        check_policy_options("padded", {"engine": "python"})
    assert str(err.value) == "policy 'padded' takes no option engine; its options: none"


def test_labels_name_the_oversized_example():
    with pytest.raises(OversizedExample) as err:
        plan_rows([2, 9], 8, labels=lambda i: f"example {i} ('doc-{i}')")
    assert str(err.value) == (
        "example 1 ('doc-1') has 9 prediction pairs; capacity is 8"
        " — raise --max-length or cut it with --cut-long"
    )


@pytest.mark.parametrize(
    ("lengths", "message"),
    [
        ([[1, 2]], "lengths must be a 1-D integer array of prediction pairs per example"),
        ([1.5], "lengths must be a 1-D integer array of prediction pairs per example"),
        ([3, 0, 2], "example 1 has 0 prediction pairs; each needs at least 1"),
        ([3, -4, 0], "example 1 has -4 prediction pairs; each needs at least 1"),
        ([5, 6, 7], "example 1 has 6 prediction pairs; capacity is 5"),
    ],
)
def test_check_lengths_names_the_example(lengths, message):
    with pytest.raises(InvalidInput) as err:
        check_lengths(lengths, 5)
    assert str(err.value).startswith(message)


def test_check_lengths_keeps_valid_lengths_as_int64():
    out = check_lengths(np.array([1, 5], dtype=np.int16), 5)
    assert out.dtype == np.int64 and out.tolist() == [1, 5]
    assert check_lengths([], 5).shape == (0,)


def test_tree_capacity_is_bounded_with_the_alternative_named():
    check_max_length(MAX_TREE_CAPACITY, "best-fit-decreasing")
    with pytest.raises(InvalidInput) as err:
        check_max_length(MAX_TREE_CAPACITY + 1, "stream-best-fit")
    assert str(err.value) == (
        f"capacity {MAX_TREE_CAPACITY + 1:,} exceeds {MAX_TREE_CAPACITY:,}, the largest"
        " stream-best-fit indexes; use first-fit-decreasing or next-fit"
    )


def test_positive_int_messages_with_and_without_a_maximum():
    with pytest.raises(InvalidInput) as err:
        positive_int("rows", 0)
    assert str(err.value) == "rows must be a positive integer, got 0"
    with pytest.raises(InvalidInput) as err:
        positive_int("rows", 11, 10)
    assert str(err.value) == (
        "rows must be an integer in [1, 10], got 11 — pass a positive integer within that range"
    )
    assert positive_int("rows", 10, 10) == 10 and positive_int("rows", 1) == 1


# ----------------------------------------------------------------- command-line numbers


def plain_count(text: str) -> int | None:
    body = text.strip().replace("_", "")
    if not body or any(c not in "0123456789" for c in body):
        return None
    value = int(body)
    return value if 1 <= value <= MAX_OPTION_VALUE else None


UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "p": 2**50}


def plain_byte_size(text: str) -> int | None:
    body = text.strip().lower()
    for suffix in ("ib", "b"):
        if body.endswith(suffix) and body[: -len(suffix)][-1:] in "kmgtp0123456789 ":
            body = body[: -len(suffix)].rstrip()
            break
    unit = body[-1:] if body[-1:] in "kmgtp" else ""
    number = body[: len(body) - len(unit)].strip()
    parts = number.split(".")
    if not number or len(parts) > 2 or not all(p.isdigit() and p.isascii() for p in parts):
        return None
    value = float(number) * UNITS[unit]
    if value >= MAX_OPTION_VALUE or int(value) < 1:
        return None
    return int(value)


@pytest.mark.parametrize(
    "text",
    [
        "4096",
        "10_000",
        " 7 ",
        "0",
        "-3",
        "1.5",
        "inf",
        "nan",
        "",
        "1e3",
        str(2**62),
        str(2**62 + 1),
    ],
)
def test_parse_count_is_the_plain_reading(text):
    want = plain_count(text)
    if want is None:
        with pytest.raises(InvalidInput) as err:
            parse_count(text, "--capacity")
        assert str(err.value).startswith("--capacity ")
    else:
        assert parse_count(text, "--capacity") == want


@pytest.mark.parametrize(
    "text",
    ["123", "512K", "512k", "1.5G", "2GiB", "2 GB", "3MB", "1P", "0", "0.4", "7X", "G", "1.2.3",
     "inf", "nan", "8192P", "-1K", " 64 m "],
)  # fmt: skip
def test_parse_byte_size_is_the_plain_reading(text):
    want = plain_byte_size(text)
    if want is None:
        with pytest.raises(InvalidInput) as err:
            parse_byte_size(text, "--max-metadata-bytes")
        assert str(err.value).startswith("--max-metadata-bytes ")
    else:
        assert parse_byte_size(text, "--max-metadata-bytes") == want


def test_byte_size_messages():
    with pytest.raises(InvalidInput) as err:
        parse_byte_size("lots", "--budget")
    assert str(err.value) == "--budget 'lots' is not a byte size like 512M or 2G"
    with pytest.raises(InvalidInput) as err:
        parse_byte_size("8192P", "--budget")
    assert str(err.value) == "--budget '8192P' is beyond any machine's memory — write e.g. 2G"
    with pytest.raises(InvalidInput) as err:
        parse_count("x", "--rows")
    assert str(err.value) == "--rows 'x' is not a whole number — write e.g. 4096"


@pytest.mark.parametrize(
    ("item", "want"),
    [
        ("window=4096", ("window", 4096)),
        ("max-open-rows=8", ("max_open_rows", 8)),
        (" seed = 3", ("seed", 3)),
        ("name=abc", ("name", "abc")),
        ("flag=true", ("flag", True)),
        ("sizes=[1, 2]", ("sizes", [1, 2])),
        ("text==x", ("text", "=x")),
    ],
)
def test_policy_options_parse_as_json_or_text(item, want):
    assert parse_option(item) == want


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("window", "--option 'window' is not KEY=VALUE — write e.g. lookahead=4096"),
        ("=3", "--option '=3' is not KEY=VALUE — write e.g. lookahead=4096"),
        ("x=NaN", "--option 'x=NaN': NaN is not a usable value — write a finite number"),
        (
            "x=Infinity",
            "--option 'x=Infinity': Infinity is not a usable value — write a finite number",
        ),
    ],
)
def test_bad_policy_options_are_named(item, message):
    with pytest.raises(InvalidInput) as err:
        parse_option(item)
    assert str(err.value) == message


def test_zero_sizes_and_the_limit_itself_are_refused_with_the_range():
    limit = f"[1, {MAX_OPTION_VALUE:,}]"
    for text in ("0", "0.4"):
        with pytest.raises(InvalidInput) as err:
            parse_byte_size(text, "--b")
        assert str(err.value) == (
            f"--b must be an integer in {limit}, got 0 — pass a positive integer within that range"
        )
    with pytest.raises(InvalidInput) as err:
        parse_byte_size("4096P", "--b")  # exactly 2**62: past the last usable value
    assert str(err.value) == "--b '4096P' is beyond any machine's memory — write e.g. 2G"
    assert parse_byte_size("4095P", "--b") == 4095 * 2**50


def test_check_lengths_names_the_capacity_and_labels_every_refusal():
    with pytest.raises(InvalidInput) as err:
        check_lengths([1], 0)
    assert str(err.value) == "capacity must be a positive integer, got 0"
    with pytest.raises(InvalidInput) as err:
        check_lengths([3, 0], 5, labels=lambda i: f"example {i} ('doc-{i}')")
    assert str(err.value) == "example 1 ('doc-1') has 0 prediction pairs; each needs at least 1"


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_plans_are_int64_and_read_only_lengths_are_only_read(policy):
    lengths = np.array([3, 5, 2, 4, 4, 1], dtype=np.int64)
    lengths.setflags(write=False)  # the planner must never write into its input
    plan = plan_rows(lengths, 6, policy)
    assert plan.lengths.dtype == plan.row_of.dtype == plan.start_of.dtype == np.int64
    assert lengths.tolist() == [3, 5, 2, 4, 4, 1]
    validate_plan(plan)


def test_decreasing_order_takes_the_default_engine():
    arr = np.array([2, 5, 5, 1], dtype=np.int64)
    assert decreasing_order(arr, 8).tolist() == [1, 2, 0, 3]
