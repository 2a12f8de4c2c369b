import numpy as np
import pytest

from exactpack import (
    Binding,
    BindingMismatch,
    ExampleTable,
    InvalidInput,
    SequenceExample,
    Split,
    SplitMismatch,
)

B = Binding(266, "bytes", "sha256:abc")


def make(tokens, **kw):
    kw.setdefault("source_id", "doc")
    kw.setdefault("partition", Split.TRAIN)
    kw.setdefault("binding", B)
    return SequenceExample.from_document(tokens, **kw)


def test_pairs_formed_inside_the_document():
    ex = make([0, 99, 100, 1])
    assert ex.inputs.tolist() == [0, 99, 100]
    assert ex.targets.tolist() == [99, 100, 1]
    assert len(ex) == 3
    assert ex.loss_mask.tolist() == [True] * 3
    assert ex.example_id == "doc[0:4]" and ex.range == (0, 4)
    assert ex.inputs.dtype == np.int32


def test_interior_range_keeps_its_own_neighbouring_pairs_and_adds_no_bos_eos():
    doc = [0, 10, 11, 12, 13, 14, 1]
    ex = make(doc, range=(2, 5))
    assert ex.inputs.tolist() == [11, 12]
    assert ex.targets.tolist() == [12, 13]
    assert 0 not in ex.inputs.tolist() and 1 not in ex.targets.tolist()


def test_loss_mask_is_carried_per_target():
    ex = make([0, 5, 6, 7, 1], loss_mask=[False, False, True, True])
    assert ex.loss_mask.tolist() == [False, False, True, True]
    ex01 = make([0, 5, 6, 7, 1], loss_mask=np.array([0, 0, 1, 1]))
    assert ex01.loss_mask.dtype == bool


@pytest.mark.parametrize(
    ("tokens", "kw", "needle"),
    [
        ([0, 266, 1], {}, "token id 266 at position 1 is outside [0, 266)"),
        ([0, -3, 1], {}, "token id -3 at position 1"),
        ([0.0, 1.5], {}, "token ids must be integers"),
        ([[0, 1]], {}, "1-D"),
        ([0, 1, 2], {"range": (1, 5)}, "lies outside the document of 3 tokens"),
        ([0, 1, 2], {"range": (2, 3)}, "has 1 token(s); an example needs at least 2"),
        ([0], {}, "has 1 token(s)"),
        ([0, 1, 2], {"loss_mask": [True]}, "loss_mask has shape (1,), expected (2,)"),
        ([0, 1, 2], {"loss_mask": [2, 0]}, "booleans"),
        ([0, 1, 2], {"partition": "dev"}, "unknown partition 'dev'"),
    ],
)
def test_bad_documents_are_refused_with_a_clear_message(tokens, kw, needle):
    with pytest.raises(InvalidInput) as err:
        make(tokens, **kw)
    assert needle in str(err.value)


def test_binding_validation():
    with pytest.raises(InvalidInput, match="vocab_size"):
        Binding(0, "t", "s")
    with pytest.raises(InvalidInput, match="tokenizer_id"):
        Binding(5, "", "s")
    assert Binding.from_dict(B.to_dict()) == B


def test_table_rejects_other_partition_and_binding():
    ok = make([0, 1, 2], source_id="a")
    val = make([0, 1, 2], source_id="v", partition="validation")
    with pytest.raises(
        SplitMismatch,
        match="example 1 \\('v\\[0:3\\]'\\[0:3\\]\\) belongs to partition 'validation'",
    ):
        ExampleTable.from_examples([ok, val], Split.TRAIN, B)
    other = make([0, 1, 2], binding=Binding(266, "other-tok", "sha256:abc"))
    with pytest.raises(BindingMismatch, match="tokenizer_id 'other-tok' != expected 'bytes'"):
        ExampleTable.from_examples([ok, other], Split.TRAIN, B)


def test_table_round_trips_examples_and_take_duplicates():
    exs = [make([0, 5, 6, 1], source_id="a", loss_mask=[1, 0, 1]), make([0, 7, 1], source_id="b")]
    table = ExampleTable.from_examples(exs, "train", B)
    assert table.lengths.tolist() == [3, 2]
    back = table.example(0)
    assert back.inputs.tolist() == [0, 5, 6] and back.loss_mask.tolist() == [True, False, True]
    dup = table.take(np.array([1, 0, 1]))
    assert dup.lengths.tolist() == [2, 3, 2]
    assert dup.example(2).targets.tolist() == [7, 1]
    assert dup.example(1).loss_mask.tolist() == [True, False, True]
    assert list(dup.source_ids) == ["b", "a", "b"]
