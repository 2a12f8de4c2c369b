"""Position ids handed to a model whose embedding counts from ``padding_idx + 1``.

RoBERTa-family models (``create_position_ids_from_input_ids``) read position ``p`` of a
token as row ``p + padding_idx + 1`` of their table, so packed inputs must add that
offset to every restarting position (the padding cells get the offset itself). Expected
values are written out by hand for the seed fixture (flat, next-fit at 6) and the tree
docstring's drawn layout; no model is run (the configs' models are built on ``meta``).
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from transformers import LlamaConfig, RobertaConfig

from exactpack.core.binding import Binding
from exactpack.core.tree import SequenceGroups, pack_tree
from exactpack.hf.adapter import hf_inputs
from exactpack.hf.collator import hf_collator
from exactpack.io.shards import row_records
from exactpack.verify.fixture import fixture_batch

#: The fixture's positions: rows A+B and C, padding 0 (verify/fixture.py's drawing).
FLAT = [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 0]]
#: The drawn tree (core/tree.py): depths along the path, then three padding cells.
TREE = [[0, 1, 2, 3, 4, 5, 4, 3, 4, 0, 0, 0]]
#: (pad_token_id, what RoBERTa's positions add): padding_idx + 1.
OFFSETS = [(1, 2), (0, 1), (7, 8)]


def roberta(pad: int) -> RobertaConfig:
    return RobertaConfig(vocab_size=266, hidden_size=8, num_hidden_layers=1,
                         num_attention_heads=1, intermediate_size=8, pad_token_id=pad,
                         max_position_embeddings=40, is_decoder=True)  # fmt: skip


def drawn_tree():
    a, b, c, d, e, f = 20, 21, 22, 23, 30, 31
    groups = SequenceGroups.from_prompt_completions(
        [[10, 11, 12, 13]], [[[a, b, c], [a, d], [e, f]]], Binding(266, "t", "sha256:t")
    )
    return pack_tree(groups, 12).batches[0]


def test_roberta_flat_positions_by_hand():
    config = roberta(1)
    for attn in ("sdpa", "eager"):
        got = hf_inputs(fixture_batch(), attn, config=config)["position_ids"].tolist()
        assert got == [[2, 3, 4, 2, 3, 2], [2, 3, 4, 5, 2, 2]], attn
    flat = hf_inputs(fixture_batch(), "exactpack_varlen", config=config)["position_ids"]
    assert flat.tolist() == [[2, 3, 4, 2, 3, 2, 3, 4, 5]]  # the valid cells, one row


def test_roberta_tree_positions_by_hand():
    config = roberta(1)
    for attn in ("sdpa", "eager"):
        got = hf_inputs(drawn_tree(), attn, config=config)["position_ids"].tolist()
        assert got == [[2, 3, 4, 5, 6, 7, 6, 5, 6, 2, 2, 2]], attn


def test_the_tree_collator_passes_the_offset_on():
    records = row_records(drawn_tree())
    collate = hf_collator("sdpa", max_length=12, binding=Binding(266, "t", "sha256:t"),
                         tree=True, config=roberta(1))  # fmt: skip
    got = collate(records)["position_ids"].tolist()
    assert got == [[2, 3, 4, 5, 6, 7, 6, 5, 6, 2, 2, 2]]


@pytest.mark.parametrize(("pad", "offset"), OFFSETS)
def test_the_offset_is_padding_idx_plus_one(pad, offset):
    config = roberta(pad)
    flat = hf_inputs(fixture_batch(), "sdpa", config=config)["position_ids"].tolist()
    tree = hf_inputs(drawn_tree(), "sdpa", config=config)["position_ids"].tolist()
    assert flat == [[p + offset for p in row] for row in FLAT]
    assert tree == [[p + offset for p in row] for row in TREE]


def test_a_model_without_the_offset_gets_the_plain_positions():
    config = LlamaConfig(vocab_size=266, hidden_size=8, num_hidden_layers=1,
                         num_attention_heads=1, intermediate_size=8, pad_token_id=1)  # fmt: skip
    assert hf_inputs(fixture_batch(), "sdpa", config=config)["position_ids"].tolist() == FLAT
    assert hf_inputs(drawn_tree(), "sdpa", config=config)["position_ids"].tolist() == TREE
