"""Per-sequence log-probabilities on flat and tree rows, from logits and from hidden
states through a chunked head: against a plain per-sequence computation in float64
(tolerance: the seed's, |a-b| <= 1e-10 + 1e-9*max(|a|,|b|): float64 sums of a few
dozen log-softmax terms, far inside it)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from exactpack.core.binding import Binding
from exactpack.core.errors import InvalidInput
from exactpack.core.tree import SequenceGroups, pack_tree
from exactpack.nn.logprobs import LMHead, sequence_cells, sequence_logprobs, token_logprobs
from exactpack.verify import fixture_batch

torch.set_num_threads(1)
BINDING = Binding(vocab_size=64, tokenizer_id="t", split_id="s")


def close(a, b):
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return bool(torch.all((a - b).abs() <= 1e-10 + 1e-9 * torch.maximum(a.abs(), b.abs())))


def _alone(logits, batch):
    """Each flat example's log-probs, one occurrence at a time, from its own columns."""
    log_p = torch.log_softmax(logits, dim=-1)
    occ, out, sums = batch.occurrences, [], []
    for row, start, end in zip(occ.row, occ.col_start, occ.col_end, strict=True):
        cols = range(int(start), int(end))
        per = torch.stack([log_p[row, c, int(batch.targets[row, c])] for c in cols])
        mask = torch.tensor([bool(batch.loss_mask[row, c]) for c in cols], dtype=per.dtype)
        out.append(per)
        sums.append((per * mask).sum())
    return out, torch.stack(sums)


def test_flat_rows_give_each_example_its_own_log_probs():
    batch = fixture_batch()  # rows [A A A B B .] and [C C C C . .]
    cells, bounds, supervised = sequence_cells(batch)
    assert cells.tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 9] and bounds.tolist() == [0, 3, 5, 9]
    assert supervised.all()
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(*batch.shape, 300, generator=g, dtype=torch.float64)
    want_tokens, want_sums = _alone(logits, batch)
    got = token_logprobs(logits, batch)
    assert len(got) == 3 and all(close(a, b) for a, b in zip(got, want_tokens, strict=True))
    assert close(sequence_logprobs(logits, batch), want_sums)
    means = torch.stack([t.mean() for t in want_tokens])  # every target supervised
    assert close(sequence_logprobs(logits, batch, mean=True), means)


def _groups():
    return SequenceGroups.from_prompt_completions(
        [[10, 11, 12, 13], [40, 41]],
        [[[20, 21, 22], [20, 23], [30, 31]], [[50, 51, 52], [53]]],
        BINDING,
    )


@pytest.mark.parametrize("kind", ["flat", "tree"])
def test_hidden_states_through_the_chunked_head_equal_the_logits(kind):
    batch = fixture_batch() if kind == "flat" else pack_tree(_groups(), 16).batches[0]
    vocab = batch.binding.vocab_size + 7
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(*batch.shape, 8, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(vocab, 8, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(vocab, generator=g, dtype=torch.float64)
    head = LMHead(weight, bias, scale=0.5, softcap=3.0, chunk=2)
    logits = head.logits(hidden)
    want = sequence_logprobs(logits, batch)
    grads_want = torch.autograd.grad(want.sum(), (hidden, weight))
    got = sequence_logprobs(hidden, batch, head)
    grads_got = torch.autograd.grad(got.sum(), (hidden, weight))
    assert close(got, want)
    assert all(close(a, b) for a, b in zip(grads_got, grads_want, strict=True))
    per_token = token_logprobs(hidden, batch, head)
    assert [len(t) for t in per_token] == np.diff(sequence_cells(batch)[1]).tolist()


def test_the_chunked_head_keeps_no_cells_by_vocabulary_tensor_for_the_backward():
    batch = fixture_batch()
    vocab = 1000
    hidden = torch.randn(*batch.shape, 4, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(vocab, 4, dtype=torch.float64, requires_grad=True)
    saved: list[tuple[int, ...]] = []

    def keep(t):
        saved.append(tuple(t.shape))
        return t

    head = LMHead(weight, chunk=2)
    for chunked in (True, False):  # the plain logits path is the control: it keeps (R*T, V)
        saved.clear()
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            out = sequence_logprobs(
                *((hidden, batch, head) if chunked else (head.logits(hidden), batch))
            )
        out.sum().backward()
        big = [s for s in saved if len(s) >= 2 and s[-1] == vocab]
        assert (big == []) is chunked, saved  # chunked: only inputs kept, logits recomputed
    assert hidden.grad is not None and weight.grad is not None


def test_the_head_of_a_transformers_model_gives_the_models_logits():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, vocab_size=300, tie_word_embeddings=False,
    )  # fmt: skip
    model = LlamaForCausalLM(config).double()
    batch = fixture_batch()
    ids = torch.as_tensor(np.where(batch.inputs < 0, 0, batch.inputs), dtype=torch.long)
    out = model(input_ids=ids, output_hidden_states=True)
    want = sequence_logprobs(out.logits, batch)
    got = sequence_logprobs(out.hidden_states[-1], batch, LMHead.of(model, chunk=3))
    assert close(got, want)


@pytest.mark.parametrize("paired", [True, False])
def test_sums_and_means_on_tree_rows_equal_each_sequence_computed_alone(paired):
    """SimPO / ORPO (mean over supervised targets) and DPO / KTO (sums; KTO's unpaired rows
    are groups of one) against each sequence run alone through a "model" whose logits at
    a token depend on its token and depth only — what the tree's cells hold."""
    groups = _groups() if paired else SequenceGroups.from_prompt_completions(
        [[10, 11, 12], [10, 11], [40]], [[[20, 21]], [[22, 23, 24]], [[50]]], BINDING
    )  # fmt: skip
    batch = pack_tree(groups, 8).batches[0]
    g = torch.Generator().manual_seed(2)
    embed = torch.randn(64, 64, generator=g, dtype=torch.float64)
    depth = torch.randn(16, 64, generator=g, dtype=torch.float64)
    inputs = torch.as_tensor(np.maximum(batch.inputs, 0), dtype=torch.long)
    logits = embed[inputs] + depth[torch.as_tensor(batch.positions, dtype=torch.long)]
    sums, means = [], []
    for i in batch.seq_index:  # layout order -> the input's sequence
        seq = torch.as_tensor(groups.sequence(int(i)), dtype=torch.long)
        a, b = groups.offsets[i] - i, groups.offsets[i + 1] - i - 1  # its targets' mask
        mask = torch.as_tensor(groups.loss_mask[a:b])
        alone = embed[seq[:-1]] + depth[: seq.shape[0] - 1]
        per = torch.log_softmax(alone, -1).gather(1, seq[1:, None])[:, 0][mask]
        sums.append(per.sum())
        means.append(per.mean())
    assert close(sequence_logprobs(logits, batch), torch.stack(sums))
    assert close(sequence_logprobs(logits, batch, mean=True), torch.stack(means))


def test_bad_arguments_are_refused():
    batch = fixture_batch()
    with pytest.raises(InvalidInput, match="must be a PackedBatch"):
        sequence_cells("rows")
    with pytest.raises(InvalidInput, match="hidden states have shape"):
        sequence_logprobs(torch.zeros(2, 5, 4), batch, LMHead(torch.zeros(300, 4)))
    with pytest.raises(InvalidInput, match="outside the vocabulary"):
        sequence_logprobs(torch.zeros(*batch.shape, 4), batch, LMHead(torch.zeros(50, 4)))
    with pytest.raises(InvalidInput, match="chunk"):
        LMHead(torch.zeros(3, 4), chunk=0)
    unsupervised = dataclasses.replace(batch, loss_mask=np.zeros_like(batch.loss_mask))
    with pytest.raises(InvalidInput, match="sequence 0 of the batch has no supervised target"):
        sequence_logprobs(torch.zeros(*batch.shape, 300), unsupervised, mean=True)
