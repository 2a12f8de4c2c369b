"""The peers' collator contracts, checked against exactpack's outputs (docs/testing.md lists them).

Learned from the peers' own test suites (never copied): transformers'
``DataCollatorWithFlattening`` tests and its padding-free modeling test,
TRL 1.16's padding-free ``DataCollatorForLanguageModeling`` tests, torchtune's
``PackedDataset`` tests and axolotl's multipack tests. Where a peer's
collator runs here (transformers, TRL), exactpack's output is compared with
the peer's own output on the same examples.
"""

import os
import pathlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from transformers import AutoConfig, AutoModelForCausalLM, DataCollatorWithFlattening
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

import exactpack.hf.attention_impl  # noqa: F401  (registers exactpack_varlen: tests may run alone)
from exactpack import InvalidInput, PackConfig, SequenceExample, pack_examples
from exactpack.hf.adapter import hf_inputs
from exactpack.hf.collator import hf_collator
from exactpack.training.packed_data import PackedCollator
from exactpack.verify.tolerances import FLOAT32_TOLERANCE

from support.dtype_path import observed_tolerance, unlabelled
from support.strategies import BINDING, packed_epochs

os.environ["HF_HUB_OFFLINE"] = "1"
torch.set_num_threads(1)
CONFIG = pathlib.Path(__file__).parents[1] / "data" / "tiny_llama.json"
#: The tiny Llama's config: what hf_inputs and hf_collator check the rows against.
CFG = AutoConfig.from_pretrained(str(CONFIG), local_files_only=True)
FLAT_KEYS = ("input_ids", "labels", "position_ids", "cu_seq_lens_q", "max_length_q", "seq_idx")


def occurrence_inputs(batch):
    """Each occurrence's input cells, in the flattened (row-major) order."""
    cu = batch.cu_seqlens()
    flat = batch.inputs[batch.input_valid]
    return [flat[a:b].tolist() for a, b in zip(cu.cu_seqlens[:-1], cu.cu_seqlens[1:], strict=True)]


def supervised(epoch):
    return all(bool(b.loss_mask[b.input_valid].all()) for b in epoch.batches)


def flat_outputs(batch):
    return [PackedCollator(flatten=True)(batch), hf_inputs(batch, "flash_attention_2", config=CFG)]


# -- transformers DataCollatorWithFlattening ------------------------------------------


@settings(max_examples=40)
@given(packed_epochs())
def test_flattened_outputs_equal_transformers_flattening_collator(case):
    """Same ids back to back, positions restarting, cu_seq_lens, max_length, seq_idx, labels."""
    _, _, epoch = case
    peer = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)
    for batch in epoch.batches:
        want = peer([{"input_ids": ids} for ids in occurrence_inputs(batch)])
        for got in flat_outputs(batch):
            assert "attention_mask" not in got
            for key in FLAT_KEYS:
                if key == "labels" and not supervised(epoch):
                    continue  # the peer supervises every pair; compared below with masks
                w, g = want[key], got[key]
                if isinstance(w, torch.Tensor):
                    assert g.dtype == w.dtype and torch.equal(g, w), key
                else:
                    assert g == w, key


@settings(max_examples=40)
@given(packed_epochs())
def test_labels_with_loss_masks_equal_the_peer_fed_the_same_labels(case):
    """The peer's ``labels`` given per-example labels (-100 where unsupervised) = exactpack's."""
    _, _, epoch = case
    peer = DataCollatorWithFlattening()
    for batch in epoch.batches:
        flat_targets = batch.targets[batch.input_valid]
        flat_mask = batch.loss_mask[batch.input_valid]
        cu = batch.cu_seqlens().cu_seqlens
        features = []
        for ids, a, b in zip(occurrence_inputs(batch), cu[:-1], cu[1:], strict=True):
            # label of cell c (unshifted) = target of cell c-1 where that target is supervised
            labels = [-100] + [
                int(t) if m else -100
                for t, m in zip(flat_targets[a : b - 1], flat_mask[a : b - 1], strict=True)
            ]
            features.append({"input_ids": ids, "labels": labels})
        want = peer(features)["labels"]
        for got in flat_outputs(batch):
            assert torch.equal(got["labels"], want)


def test_collating_leaves_its_inputs_unchanged():
    """transformers' immutability contract: a collator never edits the features it is given."""
    examples = [_example(i, n) for i, n in enumerate([3, 5, 2, 6])]
    batch = pack_examples("train", examples, BINDING, PackConfig(8, 4)).batches[0]
    before = {name: getattr(batch, name).copy() for name in ("inputs", "targets", "loss_mask")}
    for collate in (
        PackedCollator(),
        PackedCollator(flatten=True),
        hf_collator("exactpack_varlen", config=CFG),
    ):
        collate([batch])  # one collator: a list of one is that batch
    for name, value in before.items():
        assert np.array_equal(getattr(batch, name), value), name


def _example(i, pairs, mask=None, seed=0):
    rng = np.random.default_rng(seed + i)
    doc = rng.integers(3, 266, size=pairs + 1).tolist()
    return SequenceExample.from_document(
        doc, source_id=f"d{i}", partition="train", binding=BINDING, loss_mask=mask
    )


def _model(attn):
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(str(CONFIG), local_files_only=True)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.float64)
    return model.eval()


@pytest.mark.parametrize("attn", ["sdpa", "exactpack_varlen"])
def test_padding_free_loss_equals_the_padded_batch_loss(attn):
    """transformers' padding-free contract: the flattened call's loss is the padded batch's.

    The padded batch is what a user runs without packing: each whole document a
    row, right padding, a 2-D attention_mask and ``labels`` = the document
    with -100 on padding and on unsupervised targets; the model shifts them.
    """
    masks = [None, [True, False, True, True, False], None, [False, True, True]]
    examples = [_example(i, n, m) for i, (n, m) in enumerate(zip([4, 5, 2, 3], masks, strict=True))]
    batch = pack_examples("train", examples, BINDING, PackConfig(8, 4)).batches[0]
    model = _model(attn)
    width = max(len(ex.inputs) + 1 for ex in examples)
    ids = torch.full((len(examples), width), 2)
    labels = torch.full((len(examples), width), -100)
    attention = torch.zeros((len(examples), width), dtype=torch.long)
    for r, ex in enumerate(examples):
        doc = [*list(ex.inputs), int(ex.targets[-1])]
        ids[r, : len(doc)] = torch.tensor(doc)
        attention[r, : len(doc)] = 1
        keep = [False, *list(ex.loss_mask)]
        labels[r, : len(doc)] = torch.tensor(
            [t if k else -100 for t, k in zip(doc, keep, strict=True)]
        )
    padded_kwargs = {"input_ids": ids, "attention_mask": attention, "labels": labels}
    # Both losses go through ForCausalLMLoss, which upcasts the float64 logits with
    # logits.float(): a float32 island, so float32's tolerance, observed not assumed.
    atol, rtol = observed_tolerance(model, padded_kwargs)
    assert (atol, rtol) == FLOAT32_TOLERANCE
    with torch.no_grad():
        padded = model(**padded_kwargs).loss
        config = model.config
        for features in (
            hf_collator(attn, dtype=torch.float64, config=config)([batch]),
            PackedCollator(flatten=True)(batch) if attn == "exactpack_varlen" else None,
        ):
            if features is not None:
                got = model(**features).loss
                assert abs(float(got) - float(padded)) <= atol + rtol * abs(float(padded))
                # normalised by supervised targets: the padded labels' count
                assert int((features["shift_labels"] != -100).sum()) == int(
                    (labels[:, 1:] != -100).sum()
                )


# -- TRL 1.16 DataCollatorForLanguageModeling(padding_free=True) ----------------------


@settings(max_examples=40)
@given(packed_epochs())
def test_flattened_outputs_equal_trl_padding_free_collator(case):
    """TRL's padding-free keys (positions, -100 at each start, cu_seq_lens, seq_idx) are ours."""
    _, _, epoch = case
    if not supervised(epoch):
        return  # TRL supervises every pair of input_ids; masks are compared with transformers'
    peer = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    for batch in epoch.batches:
        want = peer([{"input_ids": ids} for ids in occurrence_inputs(batch)])
        for got in flat_outputs(batch):
            for key in (*FLAT_KEYS, "cu_seq_lens_k", "max_length_k"):
                w, g = want[key], got[key]
                assert (
                    (torch.equal(g, w) and g.dtype == w.dtype)
                    if isinstance(w, torch.Tensor)
                    else g == w
                ), key


def test_rows_mode_pads_with_the_pad_id_and_ignores_padding_labels():
    """TRL's different-pad-id contract: padding cells hold the pad id, their labels are -100."""
    examples = [_example(i, n) for i, n in enumerate([3, 6, 2])]
    batch = pack_examples("train", examples, BINDING, PackConfig(7, 3)).batches[0]
    pad = ~torch.as_tensor(batch.input_valid)
    config = AutoConfig.from_pretrained(str(CONFIG), local_files_only=True)
    for f in (
        PackedCollator(pad_id=7)(batch),
        hf_collator("sdpa", pad_token_id=7, config=config)([batch]),
    ):
        assert bool(pad.any()) and bool((f["input_ids"][pad] == 7).all())
        assert bool((f["labels"][pad] == -100).all()) and bool(
            (f["shift_labels"][pad] == -100).all()
        )


def test_a_single_example_is_collated_unchanged():
    ex = _example(0, 5)
    batch = pack_examples("train", [ex], BINDING, PackConfig(5, 1)).batches[0]
    for f in flat_outputs(batch):
        assert f["input_ids"][0].tolist() == ex.inputs.tolist()
        assert f["position_ids"][0].tolist() == list(range(5))
        assert f["cu_seq_lens_q"].tolist() == [0, 5] and f["seq_idx"][0].tolist() == [0] * 5
        assert f["shift_labels"][0].tolist() == ex.targets.tolist()


# -- torchtune PackedDataset -------------------------------------------------------


@settings(max_examples=60)
@given(packed_epochs())
def test_every_cell_field_has_the_row_shape_and_no_label_crosses_a_boundary(case):
    """torchtune: tokens, labels, positions of one pack have one length; labels stay in-sample."""
    examples, capacity, epoch = case
    for batch in epoch.batches:
        f = PackedCollator()(batch)
        cells = ("input_ids", "labels", "shift_labels", "position_ids", "segment_ids")
        assert {tuple(f[k].shape) for k in cells} == {batch.shape}
        assert bool((f["position_ids"] >= 0).all()) and bool((f["position_ids"] < capacity).all())
        occ = batch.occurrences
        for row, end, ordinal in zip(occ.row, occ.col_end, occ.ordinal, strict=True):
            ex = examples[ordinal]  # the example's own last target, never the next one's token
            own = int(ex.targets[-1]) if ex.loss_mask[-1] else -100
            assert int(f["shift_labels"][row, end - 1]) == own
            if end < batch.shape[1]:
                assert (
                    int(f["labels"][row, end]) == -100
                )  # the next cell's label is not this example's


def test_an_example_longer_than_a_row_is_refused():
    """torchtune refuses a sample longer than max_seq_len (unless split); so does exactpack."""
    with pytest.raises(InvalidInput, match="capacity"):
        pack_examples("train", [_example(0, 9)], BINDING, PackConfig(8, 1))


# -- axolotl multipack -------------------------------------------------------------


@pytest.mark.parametrize("attn", ["sdpa", "eager", "exactpack_varlen"])
def test_a_packed_forward_equals_the_per_document_forward(attn):
    """axolotl: packing must not leak attention across documents (logits of each alone)."""
    examples = [_example(i, n, seed=7) for i, n in enumerate([5, 4, 2, 6, 3])]
    batch = pack_examples("train", examples, BINDING, PackConfig(9, 3)).batches[0]
    model = _model(attn)
    f = hf_collator(attn, dtype=torch.float64, config=model.config)([batch])
    # eager takes its softmax in float32 (an island): float32's tolerance; sdpa and
    # exactpack_varlen stay float64 and keep the seed's. Observed on the logits alone.
    atol, rtol = observed_tolerance(model, unlabelled(f))
    assert ((atol, rtol) == FLOAT32_TOLERANCE) == (attn == "eager")
    with torch.no_grad():
        logits = model(**f).logits
        occ = batch.occurrences
        if logits.shape[0] == 1 and batch.shape[0] > 1:  # flattened: scatter back to cells
            from exactpack.hf.adapter import cell_logits

            logits = cell_logits(logits, batch)
        for i, ex in enumerate(examples):
            j = int(np.flatnonzero(occ.ordinal == i)[0])
            alone = model(input_ids=torch.as_tensor(ex.inputs[None]).long()).logits[0]
            packed = logits[occ.row[j], occ.col_start[j] : occ.col_end[j]]
            bound = atol + rtol * torch.maximum(packed.abs(), alone.abs())
            assert bool(((packed - alone).abs() <= bound).all())


@settings(max_examples=60)
@given(packed_epochs())
def test_every_example_is_in_exactly_one_row_and_no_attention_mask_is_2d(case):
    """axolotl's sampler covers each index once; its 2-D mask of segment ids is never emitted."""
    examples, capacity, epoch = case
    seen = np.concatenate([b.occurrences.ordinal for b in epoch.batches])
    assert sorted(seen.tolist()) == list(range(len(examples)))
    for batch in epoch.batches:
        assert int(batch.input_valid.sum(axis=1).max()) <= capacity
        for f in (PackedCollator()(batch), PackedCollator(flatten=True)(batch)):
            assert "attention_mask" not in f
        mask = hf_inputs(batch, "sdpa", config=CFG)["attention_mask"]
        assert mask.ndim == 4 and mask.dtype.is_floating_point
