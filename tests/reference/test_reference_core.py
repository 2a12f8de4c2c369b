"""Bindings and layout counts against plain references: hashlib, per-cell counts, messages.

Error messages are part of the contract ("what, which example, what to do"),
so the ones below are checked whole.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactpack import Binding, BindingMismatch, InvalidInput, PackConfig, Split, pack_examples
from exactpack.core.binding import INT32_MAX, data_digest
from exactpack.core.policies import (
    POLICIES,
    batch_counts,
    compare_layouts,
    layout_counts,
    plan_rows,
)

from support.reference import Layout, placed_from_records
from support.strategies import BINDING, example_lists

# ----------------------------------------------------------------- binding


@pytest.mark.parametrize("value", [1, 266, INT32_MAX, np.int64(7), np.int32(3)])
def test_vocabulary_sizes_in_range_are_kept_as_python_ints(value):
    b = Binding(value, "tok", "split")
    assert b.vocab_size == int(value) and type(b.vocab_size) is int
    assert b.to_dict() == {"vocab_size": int(value), "tokenizer_id": "tok", "split_id": "split"}
    assert Binding.from_dict(b.to_dict()) == b


@pytest.mark.parametrize("value", [0, -1, INT32_MAX + 1, True, False, 5.0, "266", None])
def test_vocabulary_sizes_outside_the_range_are_refused_with_the_fix(value):
    with pytest.raises(InvalidInput) as err:
        Binding(value, "tok", "split")
    assert str(err.value) == (
        f"vocab_size must be an integer in [1, {INT32_MAX}], got {value!r}"
        " — pass the tokenizer's vocabulary size"
    )


@pytest.mark.parametrize("field", ["tokenizer_id", "split_id"])
@pytest.mark.parametrize("value", ["", None, 3])
def test_identities_must_be_non_empty_strings(field, value):
    args = {"vocab_size": 10, "tokenizer_id": "tok", "split_id": "split", field: value}
    with pytest.raises(InvalidInput) as err:
        Binding(**args)
    assert str(err.value) == f"Binding.{field} must be a non-empty string"


def test_a_different_binding_names_every_difference_and_the_fix():
    want = Binding(266, "tok", "split-a")
    want.require(Binding(266, "tok", "split-a"), "example 3")  # equal: nothing raised
    with pytest.raises(BindingMismatch) as err:
        want.require(Binding(300, "tok", "split-b"), "example 3")
    assert str(err.value) == (
        "example 3 has a different binding (vocab_size 300 != expected 266;"
        " split_id 'split-b' != expected 'split-a')"
        " — re-encode it with the expected tokenizer and split, or pass its binding"
    )


@given(st.lists(st.one_of(st.text(max_size=6), st.binary(max_size=6)), max_size=5))
def test_split_digest_is_sha256_over_null_terminated_parts(parts):
    h = hashlib.sha256()
    for part in parts:
        h.update((part.encode("utf-8") if isinstance(part, str) else part) + b"\x00")
    assert data_digest(*parts) == "sha256:" + h.hexdigest()[:32]


def test_split_digest_separates_its_parts():
    assert data_digest("ab", "c") != data_digest("a", "bc")
    assert len(data_digest("x")) == len("sha256:") + 32


# ----------------------------------------------------------------- counts


@given(example_lists(max_capacity=10, max_examples=10), st.integers(1, 4))
def test_batch_counts_equal_the_per_cell_reference(case, rows):
    examples, capacity = case
    for batch in pack_examples(Split.TRAIN, examples, BINDING, PackConfig(capacity, rows)).batches:
        layout = Layout.build(placed_from_records(batch.occurrences, examples), *batch.shape)
        r, t = batch.shape
        valid = sum(p is not None for row in layout.owner for p in row)
        assert batch_counts(batch) == {
            "rows": r,
            "width": t,
            "cells": r * t,
            "valid_cells": valid,
            "dense_scores_per_head": r * t * t,
            "semantic_edges": len(layout.edges()),
            "valid_density": valid / (r * t),
        }


@given(st.lists(st.integers(1, 12), min_size=1, max_size=20), st.sampled_from(sorted(POLICIES)))
def test_compare_layouts_counts_both_layouts_with_the_policy_given(lengths, policy):
    capacity = max(lengths) + 3
    got = compare_layouts(lengths, capacity, policy)
    rows = plan_rows(lengths, capacity, policy).num_rows
    longest = max(lengths)
    edges = sum(n * (n + 1) // 2 for n in lengths)
    assert got["padded"]["rows"] == len(lengths) and got["padded"]["width"] == longest
    assert got["packed"]["rows"] == rows and got["packed"]["width"] == capacity
    assert got["padded"]["semantic_edges"] == got["packed"]["semantic_edges"] == edges
    assert got["packed"]["valid_density"] == sum(lengths) / (rows * capacity)


def test_compare_layouts_uses_the_policy_it_is_given():
    lengths = [4, 3, 3, 2]  # next-fit: 3 rows at capacity 6, best-fit-decreasing: 2
    assert compare_layouts(lengths, 6)["packed"]["rows"] == 3
    assert compare_layouts(lengths, 6, "best-fit-decreasing")["packed"]["rows"] == 2


def test_layout_counts_are_exact_integers_for_any_integer_dtype():
    # n(n+1)/2 in narrow integers or in floats would overflow or round.
    assert layout_counts(1, 255, np.array([255], dtype=np.uint8))["semantic_edges"] == 32640
    n = 2**27 + 1  # n(n+1)/2 > 2**53 and odd: a float division rounds it
    big = layout_counts(1, n, [n])
    assert big["semantic_edges"] == n * (n + 1) // 2 and type(big["semantic_edges"]) is int


def test_an_empty_layout_has_zero_density():
    assert layout_counts(0, 8, [])["valid_density"] == 0.0
    assert layout_counts(0, 8, [])["cells"] == 0


def test_partition_names_parse_in_any_case_and_unknown_ones_list_the_choices():
    assert Split.parse("VALIDATION") is Split.VALIDATION
    assert Split.parse(Split.TEST) is Split.TEST
    with pytest.raises(InvalidInput) as err:
        Split.parse("dev")
    assert str(err.value) == "unknown partition 'dev'; use one of train, validation, test"
