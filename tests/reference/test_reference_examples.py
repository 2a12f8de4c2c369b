"""Examples and example tables against plain references: slicing by hand, whole messages.

Pairs form inside the selected range only: inputs ``doc[a:b-1]``, targets
``doc[a+1:b]``; a table is the examples' windows back to back; ``--cut-long``
keeps every pair of a source exactly once. Error messages are checked whole
(what, which example, what to do).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactpack import Binding, ExampleTable, InvalidInput, SequenceExample, Split
from exactpack.core.examples import as_token_array, concat_ranges, cut_long, long_ranges

from support.reference import split_ranges
from support.strategies import BINDING, example_lists


def test_token_arrays_are_int32_and_shared_when_already_int32():
    ids = np.array([0, 5, 265], dtype=np.int32)
    out = as_token_array(ids, 266, "doc")
    assert out.dtype == np.int32 and np.shares_memory(out, ids)
    wide = as_token_array(np.array([0, 5], dtype=np.int64), 266, "doc")
    assert wide.dtype == np.int32 and wide.tolist() == [0, 5]
    assert as_token_array([], 266, "doc").dtype == np.int32


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        (
            [0.5, 1.0],
            "doc: token ids must be integers, got dtype float64"
            " — encode text with a tokenizer first and pass integer ids",
        ),
        (
            [0, 300, 5],
            "doc: token id 300 at position 1 is outside [0, 266)"
            " — check the tokenizer or raise the vocabulary size",
        ),
        (
            [4, -2],
            "doc: token id -2 at position 1 is outside [0, 266)"
            " — check the tokenizer or raise the vocabulary size",
        ),
        ([[0, 1]], "doc: tokens must be a 1-D sequence of ids, got shape (1, 2)"),
    ],
)
def test_bad_token_arrays_are_named_with_the_fix(tokens, message):
    with pytest.raises(InvalidInput) as err:
        as_token_array(tokens, 266, "doc")
    assert str(err.value) == message


@given(
    st.lists(st.integers(0, 265), min_size=2, max_size=20),
    st.data(),
)
def test_an_example_is_its_range_sliced_by_hand(doc, data):
    a = data.draw(st.integers(0, len(doc) - 2))
    b = data.draw(st.integers(a + 2, len(doc)))
    mask = data.draw(
        st.one_of(st.none(), st.lists(st.booleans(), min_size=b - a - 1, max_size=b - a - 1))
    )
    ex = SequenceExample.from_document(
        doc, source_id="s", partition="validation", binding=BINDING, range=(a, b), loss_mask=mask
    )
    assert ex.inputs.tolist() == doc[a : b - 1] and ex.targets.tolist() == doc[a + 1 : b]
    assert ex.window.tolist() == doc[a:b] and len(ex) == b - a - 1
    assert ex.loss_mask.dtype == np.bool_
    assert ex.loss_mask.tolist() == ([True] * (b - a - 1) if mask is None else mask)
    assert ex.example_id == f"s[{a}:{b}]" and ex.source_id == "s" and ex.range == (a, b)
    assert ex.partition.value == "validation" and ex.binding == BINDING


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"range": (2, 9)},
            "source 'd' range [2, 9) lies outside the document of 4 tokens"
            " — choose 0 <= start < end <= 4",
        ),
        (
            {"range": (1, 2)},
            "source 'd' range [1, 2) has 1 token(s); an example needs at least 2"
            " to form one input/target pair — drop it or widen the range",
        ),
        (
            {"loss_mask": [True]},
            "source 'd' range [0, 4): loss_mask has shape (1,), expected (3,)"
            " — one flag per target (end - start - 1)",
        ),
        (
            {"loss_mask": [0, 2, 1]},
            "source 'd' range [0, 4): loss_mask must hold booleans (or 0/1)",
        ),
        (
            {"range": (2, 2)},
            "source 'd' range [2, 2) has 0 token(s); an example needs at least 2",
        ),
        ({"binding": "not a binding"}, "source 'd': binding must be a exactpack.Binding"),
        ({"tokens": [0, 999]}, "source 'd': token id 999 at position 1 is outside [0, 266)"),
    ],
)
def test_bad_examples_are_named_with_the_fix(kwargs, message):
    args = {"tokens": [0, 1, 2, 3], "source_id": "d", "partition": "train", "binding": BINDING}
    args |= kwargs
    tokens = args.pop("tokens")
    with pytest.raises(InvalidInput) as err:
        SequenceExample.from_document(tokens, **args)
    assert str(err.value).startswith(message)


def test_integer_masks_become_booleans():
    ex = SequenceExample.from_document(
        [0, 1, 2], source_id="d", partition="train", binding=BINDING, loss_mask=[1, 0]
    )
    assert ex.loss_mask.dtype == np.bool_ and ex.loss_mask.tolist() == [True, False]


@given(example_lists(max_capacity=8, max_examples=8))
def test_a_table_is_the_windows_back_to_back_and_gives_each_example_back(case):
    examples, _ = case
    table = ExampleTable.from_examples(examples, "train", BINDING)
    assert table.windows.dtype == np.int32 and table.offsets.dtype == np.int64
    assert table.windows.tolist() == [t for ex in examples for t in ex.window.tolist()]
    assert table.loss_mask.dtype == np.bool_
    assert table.loss_mask.tolist() == [f for ex in examples for f in ex.loss_mask.tolist()]
    assert table.lengths.tolist() == [len(ex) for ex in examples]
    assert table.source_ids.dtype == object and table.example_ids.dtype == object
    assert table.range_starts.dtype == table.range_ends.dtype == np.int64
    for i, ex in enumerate(examples):
        back = table.example(i)
        assert back.window.tolist() == ex.window.tolist()
        assert back.inputs.tolist() == ex.inputs.tolist()
        assert back.targets.tolist() == ex.targets.tolist()
        assert back.loss_mask.tolist() == ex.loss_mask.tolist()
        assert (back.source_id, back.example_id, back.range) == (
            ex.source_id,
            ex.example_id,
            ex.range,
        )
        assert type(back.source_id) is str and type(back.example_id) is str
        assert back.partition is ex.partition and back.binding == ex.binding
        assert table.label(i) == f"example {i} ({ex.example_id!r}[{ex.range[0]}:{ex.range[1]}])"
    order = np.arange(len(examples))[::-1].copy()
    taken = table.take(np.concatenate([order, order[:1]]).astype(np.int32))
    picked = [examples[i] for i in [*order.tolist(), int(order[0])]]
    assert taken.windows.tolist() == [t for ex in picked for t in ex.window.tolist()]
    assert taken.loss_mask.tolist() == [f for ex in picked for f in ex.loss_mask.tolist()]
    assert taken.source_ids.tolist() == [ex.source_id for ex in picked]


def test_an_empty_table_has_typed_empty_arrays():
    table = ExampleTable.from_examples([], "train", BINDING)
    assert len(table) == 0 and table.windows.shape == (0,) and table.windows.dtype == np.int32
    assert table.loss_mask.shape == (0,) and table.loss_mask.dtype == np.bool_
    assert table.offsets.tolist() == [0]


def test_a_non_example_is_named():
    with pytest.raises(InvalidInput) as err:
        ExampleTable.from_examples([[0, 1, 2]], "train", BINDING)
    assert str(err.value) == "example 0 is a list, not a SequenceExample"


@given(st.lists(st.integers(2, 40), max_size=12), st.integers(1, 9))
def test_long_ranges_are_the_plain_split(counts, capacity):
    source, starts, ends = long_ranges(np.array(counts, dtype=np.int32), capacity)
    want = [(s, a, b) for s, n in enumerate(counts) for a, b in split_ranges(n, capacity)]
    assert list(zip(source.tolist(), starts.tolist(), ends.tolist(), strict=True)) == want
    assert source.dtype == starts.dtype == ends.dtype == np.int64


@given(example_lists(max_capacity=12, max_examples=8), st.integers(1, 6))
def test_split_long_keeps_every_pair_and_flag_once(case, capacity):
    examples, _ = case
    table = ExampleTable.from_examples(examples, "train", BINDING)
    split, count = cut_long(table, capacity)
    assert count == sum(len(ex) > capacity for ex in examples)
    if count == 0:
        assert split is table
    pieces = iter(range(len(split)))
    for ex in examples:
        a0 = ex.range[0]
        for a, b in split_ranges(len(ex) + 1, capacity):
            i = next(pieces)
            piece = split.example(i)
            assert piece.window.tolist() == ex.window.tolist()[a:b]
            assert piece.loss_mask.tolist() == ex.loss_mask.tolist()[a : b - 1]
            assert piece.source_id == ex.source_id and piece.range == (a0 + a, a0 + b)
            whole = len(ex) <= capacity
            assert piece.example_id == (
                ex.example_id if whole else f"{ex.source_id}[{a0 + a}:{a0 + b}]"
            )
    assert next(pieces, None) is None


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 5)), max_size=8))
def test_concat_ranges_is_the_plain_concatenation(pairs):
    starts = np.array([s for s, _ in pairs], dtype=np.int64)
    lengths = np.array([n for _, n in pairs], dtype=np.int64)
    out = concat_ranges(starts, lengths)
    assert out.dtype == np.int64
    assert out.tolist() == [s + j for s, n in pairs for j in range(n)]


def test_table_checks_name_the_example_and_the_fix():
    ok = {
        "windows": np.array([0, 1, 2], dtype=np.int32),
        "offsets": np.array([0, 3], dtype=np.int64),
        "loss_mask": np.ones(2, dtype=bool),
        "source_ids": np.array(["a"], dtype=object),
        "example_ids": np.array(["a"], dtype=object),
        "range_starts": np.zeros(1, dtype=np.int64),
        "range_ends": np.array([3], dtype=np.int64),
        "partition": "train",
        "binding": Binding(3, "t", "s"),
    }
    table = ExampleTable(**ok)
    assert table.partition is Split.TRAIN  # a name becomes the Split
    cases = [
        (
            {"binding": None},
            "ExampleTable.binding must be a exactpack.Binding — build one with"
            " Binding(vocab_size, tokenizer_id, split_id)",
        ),
        (
            {"windows": [0, 1, 2]},
            "ExampleTable.windows must be a 1-D integer NumPy array, got list — encode text with"
            " a tokenizer; build tables with ExampleTable.from_examples or"
            " exactpack.io.load_examples",
        ),
        (
            {"loss_mask": np.ones(2)},
            "ExampleTable.loss_mask must be a 1-D bool NumPy array, got float64 — encode text"
            " with a tokenizer; build tables with ExampleTable.from_examples or"
            " exactpack.io.load_examples",
        ),
        (
            {"offsets": np.array([1, 3])},
            "ExampleTable offsets must start at 0 and end at len(windows)",
        ),
        (
            {"offsets": np.array([0, 2])},
            "ExampleTable offsets must start at 0 and end at len(windows)",
        ),
        (
            {"loss_mask": np.ones(3, dtype=bool)},
            "ExampleTable loss_mask must hold one flag per target",
        ),
        (
            {"source_ids": np.array([], dtype=object)},
            "ExampleTable.source_ids must have one entry per example",
        ),
        (
            {"range_ends": np.array([3, 4])},
            "ExampleTable.range_ends must have one entry per example",
        ),
        (
            {"windows": np.array([0, 1, 5], dtype=np.int32)},
            "example 0 ('a'[0:3]): token id 5 is outside [0, 3)"
            " — check the tokenizer or raise the vocabulary size",
        ),
        (
            {
                "windows": np.array([0, 1, 2, 1], dtype=np.int32),
                "offsets": np.array([0, 3, 4]),
                "source_ids": np.array(["a", "b"], dtype=object),
                "example_ids": np.array(["a", "b"], dtype=object),
                "range_starts": np.zeros(2, dtype=np.int64),
                "range_ends": np.array([3, 1]),
            },
            "example 1 ('b'[0:1]) has fewer than 2 tokens; drop it or widen its range",
        ),
    ]
    for change, message in cases:
        with pytest.raises(InvalidInput) as err:
            ExampleTable(**(ok | change))
        assert str(err.value).startswith(message), (change, str(err.value))
        if "NumPy array" in message or "exactpack.Binding" in message:
            assert str(err.value) == message


@pytest.mark.parametrize(
    ("windows", "message"),
    [
        ([0, 1, 2, 1, 9, 2], "example 1 ('b'[0:3]): token id 9 is outside [0, 3)"),
        ([0, 1, 2, 7, 1, 2], "example 1 ('b'[0:3]): token id 7 is outside [0, 3)"),  # first token
        ([0, -4, 2, 1, 2, 2], "example 0 ('a'[0:3]): token id -4 is outside [0, 3)"),
        ([0, 1, 2, 1, -1, 9], "example 1 ('b'[0:3]): token id -1 is outside [0, 3)"),  # low first
    ],
)
def test_a_table_names_the_example_holding_a_bad_token(windows, message):
    with pytest.raises(InvalidInput) as err:
        ExampleTable(
            windows=np.array(windows, dtype=np.int32),
            offsets=np.array([0, 3, 6], dtype=np.int64),
            loss_mask=np.ones(4, dtype=bool),
            source_ids=np.array(["a", "b"], dtype=object),
            example_ids=np.array(["a", "b"], dtype=object),
            range_starts=np.zeros(2, dtype=np.int64),
            range_ends=np.array([3, 3], dtype=np.int64),
            partition="train",
            binding=Binding(3, "t", "s"),
        )
    assert str(err.value) == message + " — check the tokenizer or raise the vocabulary size"
