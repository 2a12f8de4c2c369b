"""exactpack.hf.adapter: the transformers keyword arguments, loss and Trainer collator."""

import itertools
import os
import warnings
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoConfig, AutoModelForCausalLM

from exactpack import InvalidInput, PackConfig, pack_examples
from exactpack.core.batch import IGNORE_INDEX
from exactpack.core.loss import token_weighted_loss
from exactpack.hf.adapter import cell_logits, hf_inputs, hf_loss
from exactpack.hf.collator import collator_for, hf_collator
from exactpack.hf.datasets_io import pack_dataset, to_batches
from exactpack.hf.masks import additive_mask, block_mask, bool_mask, hf_allowed
from exactpack.training.labels import model_labels, shift_labels
from exactpack.verify.fixture import fixture_batch, fixture_epoch, fixture_examples
from exactpack.verify.models import verification_examples
from exactpack.verify.tolerances import FLOAT32_TOLERANCE

from support.dtype_path import observed_tolerance, unlabelled
from support.mask_helpers import block_mask_cells
from support.reference import Layout, loss_sum, placed_from_records
from support.strategies import packed_epochs

os.environ["HF_HUB_OFFLINE"] = "1"
torch.set_num_threads(1)
CONFIG = Path(__file__).parents[1] / "data" / "tiny_llama.json"


def llama_config():
    return AutoConfig.from_pretrained(str(CONFIG), local_files_only=True)


#: The tiny Llama's config, one object (its capability is found once per object).
CFG = llama_config()


def tiny_llama(attn: str, dtype=torch.float64, seed: int = 0):
    torch.manual_seed(seed)
    config = AutoConfig.from_pretrained(str(CONFIG), local_files_only=True)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=dtype)
    return model.eval()


def predicate_or_pad_diagonal(batch, examples, window=None):
    """Reference: the permission of ``tests/support/reference.py`` (occurrence records, plain
    Python), plus each padding cell on itself, by a loop over cells."""
    layout = Layout.build(placed_from_records(batch.occurrences, examples), *batch.shape)
    rows, width = batch.shape
    out = np.zeros((rows, width, width), dtype=bool)
    for r, q, k in itertools.product(range(rows), range(width), range(width)):
        pad_self = q == k and layout.owner[r][q] is None
        out[r, q, k] = layout.allowed(r, q, k, window) or pad_self
    return out


WINDOWS = st.one_of(st.none(), st.integers(1, 14))


def close(a, b, atol=1e-10, rtol=1e-9):
    # dtype=float64 up front: a Python float through as_tensor would first round to float32.
    a, b = (torch.as_tensor(x, dtype=torch.float64) for x in (a, b))
    return bool(((a - b).abs() <= atol + rtol * torch.maximum(a.abs(), b.abs())).all())


def test_fixture_sdpa_kwargs():
    batch = fixture_batch()
    kw = hf_inputs(batch, "sdpa", config=CFG, dtype=torch.float64, pad_token_id=7)
    assert set(kw) == {
        "input_ids",
        "position_ids",
        "labels",
        "shift_labels",
        "attention_mask",
        "use_cache",
    }
    assert kw["use_cache"] is False
    assert kw["input_ids"].tolist() == np.where(batch.input_valid, batch.inputs, 7).tolist()
    assert kw["position_ids"].tolist() == batch.positions.tolist()
    want = np.where(batch.loss_mask, batch.targets, IGNORE_INDEX)
    assert kw["shift_labels"].tolist() == want.tolist()  # already shifted: used as they are
    # labels: transformers' unshifted meaning (-100 at each example's first cell, on padding)
    assert kw["labels"].tolist() == [
        [-100, 99, 100, -100, 101, -100],
        [-100, 102, 103, 104, -100, -100],
    ]
    mask = kw["attention_mask"]
    assert mask.dtype == torch.float64 and mask.shape == (2, 1, 6, 6)
    allowed = predicate_or_pad_diagonal(batch, fixture_examples())
    assert torch.equal(mask[:, 0] == 0, torch.as_tensor(allowed))
    assert bool((mask[:, 0][~torch.as_tensor(allowed)] == torch.finfo(torch.float64).min).all())
    # B's queries (row 0, columns 3-4) see keys [3, 4) and [3, 5) only.
    assert (mask[0, 0, 3] == 0).nonzero().flatten().tolist() == [3]
    assert (mask[0, 0, 4] == 0).nonzero().flatten().tolist() == [3, 4]


@settings(max_examples=40)
@given(packed_epochs(), WINDOWS)
def test_masks_match_the_predicate_on_random_layouts(case, window):
    examples, _, epoch = case
    for batch in epoch.batches:
        allowed = predicate_or_pad_diagonal(batch, examples, window)
        assert np.array_equal(hf_allowed(batch, window), allowed)
        mask = additive_mask(batch, torch.float32, sliding_window=window)
        assert torch.equal(mask[:, 0] == 0, torch.as_tensor(allowed))
        assert torch.equal(bool_mask(batch, sliding_window=window)[:, 0], torch.as_tensor(allowed))
        kw = hf_inputs(batch, "flash_attention_2", config=CFG, labels=False)
        cu = batch.cu_seqlens()
        assert kw["cu_seq_lens_q"].tolist() == cu.cu_seqlens.tolist()
        assert kw["input_ids"].shape == (1, cu.valid_index.shape[0])


@settings(max_examples=40)
@given(packed_epochs(), WINDOWS)
def test_flex_block_mask_matches_the_predicate_on_random_layouts(case, window):
    """On valid cells the BlockMask is ``dense_mask()``; a padding cell reaches itself only."""
    _, _, epoch = case
    for batch in epoch.batches:
        cells = block_mask_cells(block_mask(batch, sliding_window=window))[:, 0].numpy()
        both = batch.input_valid[:, :, None] & batch.input_valid[:, None, :]
        assert np.array_equal(cells & both, batch.dense_mask(window))
        pad = ~batch.input_valid
        assert not (cells & pad[:, :, None] & ~pad[:, None, :]).any()  # pad query -> valid key
        assert not (cells & ~pad[:, :, None] & pad[:, None, :]).any()  # valid query -> pad key
        assert np.array_equal(cells, hf_allowed(batch, window))


@settings(max_examples=40)
@given(packed_epochs())
def test_flash_kwargs_spans_are_the_segments_on_random_layouts(case):
    """Each cu_seq_lens span of the flattened cells is one segment, positions 0..l-1."""
    _, _, epoch = case
    for batch in epoch.batches:
        kw = hf_inputs(batch, "flash_attention_2", config=CFG)
        cu = kw["cu_seq_lens_q"].tolist()
        assert kw["max_length_q"] == max(np.diff(cu), default=0)
        assert len(cu) - 1 == batch.occurrences.row.shape[0]  # one span per occurrence
        segments = batch.segments[batch.input_valid]
        for a, b in itertools.pairwise(cu):
            assert np.unique(segments[a:b]).size == 1
            assert kw["position_ids"][0, a:b].tolist() == list(range(b - a))
        assert kw["shift_labels"].tolist() == [shift_labels(batch)[batch.input_valid].tolist()]
        assert kw["labels"].tolist() == [model_labels(batch)[batch.input_valid].tolist()]
        lengths = np.diff(cu)
        assert kw["seq_idx"].dtype == torch.int32
        assert kw["seq_idx"].tolist() == [np.repeat(np.arange(lengths.size), lengths).tolist()]


def test_flash_kwargs_are_the_flattened_valid_cells():
    batch = fixture_batch()
    kw = hf_inputs(batch, "flash_attention_2", config=CFG, num_items_in_batch=20)
    cu = batch.cu_seqlens()
    assert "attention_mask" not in kw and kw["use_cache"] is False
    for name in ("cu_seq_lens_q", "cu_seq_lens_k"):
        assert kw[name].dtype == torch.int32 and kw[name].tolist() == cu.cu_seqlens.tolist()
    assert kw["max_length_q"] == kw["max_length_k"] == cu.max_seqlen
    valid = batch.input_valid
    assert kw["input_ids"].tolist() == [batch.inputs[valid].tolist()]
    assert kw["position_ids"].tolist() == [batch.positions[valid].tolist()]
    assert kw["shift_labels"].tolist() == [batch.targets[valid].tolist()]  # all eligible here
    assert kw["seq_idx"].tolist() == [[0, 0, 0, 1, 1, 2, 2, 2, 2]]  # A, B | C
    assert kw["num_items_in_batch"] == 20
    # Each segment restarts its positions at a cu_seqlens boundary.
    starts = np.flatnonzero(kw["position_ids"][0].numpy() == 0)
    assert starts.tolist() == cu.cu_seqlens[:-1].tolist()


def test_cell_logits_scatters_flattened_logits_back():
    batch = fixture_batch()
    n = int(batch.input_valid.sum())
    flat = torch.randn(1, n, 5, dtype=torch.float64)
    cells = cell_logits(flat, batch)
    assert cells.shape == (2, 6, 5)
    assert torch.equal(cells[torch.as_tensor(batch.input_valid)], flat[0])
    assert not cells[torch.as_tensor(~batch.input_valid)].any()
    assert cell_logits(cells, batch) is cells
    with pytest.raises(InvalidInput, match="fit neither"):
        cell_logits(torch.zeros(1, n + 1, 5), batch)


def test_flex_block_mask_attends_like_the_dense_predicate():
    from torch.nn.attention.flex_attention import flex_attention

    batch = fixture_epoch(3).batches[0]
    bm = hf_inputs(batch, "flex_attention", config=CFG)["attention_mask"]
    assert bm.shape == (2, 1, 6, 6)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 6, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    allowed = torch.as_tensor(hf_allowed(batch))[:, None]
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    with warnings.catch_warnings():  # the unfused path is deliberate here (warns once)
        warnings.simplefilter("ignore", UserWarning)
        got = flex_attention(q, k, v, block_mask=bm)
    assert close(got, want)
    assert block_mask(batch).shape == bm.shape


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_tiny_llama_packed_equals_separate_and_model_loss_is_token_weighted(attn):
    model = tiny_llama(attn)
    examples = verification_examples(266, seed=3)
    batch = pack_examples("train", examples, examples[0].binding, PackConfig(12, 6)).batches[0]
    kwargs = hf_inputs(batch, attn, config=model.config, dtype=torch.float64)
    logits_tol = observed_tolerance(model, unlabelled(kwargs))  # eager: float32 softmax
    assert (attn == "eager") == (logits_tol == FLOAT32_TOLERANCE)
    loss_tol = observed_tolerance(model, kwargs)  # ForCausalLMLoss upcasts logits to float32
    assert loss_tol == FLOAT32_TOLERANCE
    out = model(**kwargs)
    separate = [
        model(input_ids=torch.as_tensor(ex.inputs[None]).long()).logits[0] for ex in examples
    ]
    occ = batch.occurrences
    for i, sep in enumerate(separate):
        j = int(np.flatnonzero(occ.ordinal == i)[0])
        packed = out.logits[occ.row[j], occ.col_start[j] : occ.col_end[j]]
        assert close(packed, sep, *logits_tol)
    # The independent reference: every supervised target of every example, by its
    # occurrence's columns, -log softmax summed one cell at a time (tests/support/reference.py).
    cells = out.logits.detach().tolist()
    logits, targets, flags = [], [], []
    for j, i in enumerate(occ.ordinal.tolist()):
        r, a, b = int(occ.row[j]), int(occ.col_start[j]), int(occ.col_end[j])
        logits.append(cells[r][a:b])
        targets.append(examples[i].targets.tolist())
        flags.append(examples[i].loss_mask.tolist())
    total, count = loss_sum(logits, targets, flags)
    assert count == batch.eligible_count < int(batch.input_valid.sum())
    ref = token_weighted_loss(out.logits, batch)
    assert ref.count == count and close(ref.sum, total)
    assert close(hf_loss(out.logits, batch).mean, total / count)
    assert close(out.loss, total / count, *loss_tol)  # transformers' float32 loss
    # A global count divides the raw sum once (gradient accumulation / ranks).
    out = model(
        **hf_inputs(batch, attn, config=model.config, dtype=torch.float64, num_items_in_batch=100)
    )
    assert close(out.loss, total / 100, *loss_tol)
    assert close(hf_loss(out.logits, batch, count=100).mean, total / 100)


def test_the_mask_dtype_defaults_to_the_model_s():
    # float64 model, no dtype= given: the masks are built as with dtype=float64 (a float32
    # mask on a float64 sdpa call moved the logits by 0.12), from the model or its config.
    model = tiny_llama("sdpa")
    examples = verification_examples(266, seed=3)
    batch = pack_examples("train", examples, examples[0].binding, PackConfig(12, 6)).batches[0]
    want = model(**hf_inputs(batch, "sdpa", config=model, dtype=torch.float64)).logits
    for config in (model, model.config):
        kwargs = hf_inputs(batch, "sdpa", config=config, labels=False)
        assert kwargs["attention_mask"].dtype == torch.float64
        assert torch.equal(model(**kwargs).logits, want)


def test_bad_arguments_are_refused():
    batch = fixture_batch()
    with pytest.raises(InvalidInput, match=r"'flash_attention_9' is of no kind.*flash_attention_2"):
        hf_inputs(batch, "flash_attention_9", config=CFG)
    with pytest.raises(InvalidInput, match="pad_token_id"):
        hf_inputs(batch, "sdpa", config=CFG, pad_token_id=266)
    with pytest.raises(InvalidInput, match="floating"):
        additive_mask(batch, torch.int64)
    with pytest.raises(InvalidInput, match="paged cache"):
        hf_collator("paged|sdpa", config=CFG)


@pytest.mark.parametrize("attn", ["sdpa", "eager", "flex_attention", "exactpack_varlen"])
def test_every_entry_point_that_builds_inputs_requires_the_config(attn):
    """Without the config a windowed model would get unwindowed masks, silently."""
    batch = fixture_batch()
    with pytest.raises(InvalidInput, match=r"hf_inputs\(\.\.\., config=model\.config\)"):
        hf_inputs(batch, attn, config=None)
    with pytest.raises(TypeError, match="config"):
        hf_inputs(batch, attn)  # a required keyword
    with pytest.raises(InvalidInput, match=r"hf_collator\(\.\.\., config=model\.config\)"):
        hf_collator(attn)
    # The model itself does as well as its config; a vocabulary it cannot index is refused.
    model = tiny_llama("sdpa")
    assert hf_inputs(batch, attn, config=model)["input_ids"].shape[0] >= 1
    small = config_of("llama", vocab_size=100)
    with pytest.raises(InvalidInput, match=r"config\.vocab_size is 100"):
        hf_inputs(batch, attn, config=small)


def test_a_windowed_model_is_exact_only_through_its_config():
    """Qwen2 with a window of 2: the inputs hf_inputs builds from its config give each
    example's logits alone; the unwindowed masks it would have built without are off."""
    torch.manual_seed(0)
    qwen = config_of(
        "qwen2", use_sliding_window=True, sliding_window=2, max_window_layers=0,
        num_key_value_heads=1, intermediate_size=32,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(qwen, attn_implementation="sdpa", dtype=torch.float64)
    model = model.eval()
    examples = verification_examples(266, seed=3)
    batch = pack_examples("train", examples, examples[0].binding, PackConfig(12, 6)).batches[0]
    out = model(**hf_inputs(batch, "sdpa", config=model.config, dtype=torch.float64)).logits
    occ = batch.occurrences
    for j, i in enumerate(occ.ordinal.tolist()):
        alone = model(input_ids=torch.as_tensor(examples[i].inputs[None]).long()).logits[0]
        packed = out[occ.row[j], occ.col_start[j] : occ.col_end[j]]
        assert close(packed, alone)
    unwindowed = hf_inputs(batch, "sdpa", config=CFG, dtype=torch.float64)  # llama: no window
    wrong = model(**unwindowed).logits
    assert not close(
        wrong[torch.as_tensor(batch.input_valid)], out[torch.as_tensor(batch.input_valid)]
    )


def _packed_dataset():
    rng = np.random.default_rng(5)
    pairs = [6, 3, 8, 4, 5, 2, 7, 1]  # capacity 12 next-fit: rows of 9, 12, 7 and 8 targets
    docs = [rng.integers(0, 266, size=n + 1).tolist() for n in pairs]
    ds = datasets.Dataset.from_dict({"input_ids": docs})
    return pack_dataset(ds, 12, "next-fit", vocab_size=266, max_rows_per_batch=4)


def test_collator_on_dataset_rows_and_on_batches():
    packed = _packed_dataset()
    (whole,) = to_batches(packed)
    collate = collator_for(packed, "sdpa", dtype=torch.float64, config=llama_config())
    got = collate([packed[2], packed[0]])  # Trainer's sampler reorders rows
    want = hf_inputs(whole, "sdpa", config=CFG, dtype=torch.float64)
    assert got.keys() == want.keys()
    for name in ("input_ids", "position_ids", "labels", "shift_labels", "attention_mask"):
        assert torch.equal(got[name], want[name][[2, 0]])
    assert collate.batch_of([packed[2], packed[0]]).eligible_count == 7 + 9
    halves = list(to_batches(packed, 2))
    assert torch.equal(collate(halves)["attention_mask"], want["attention_mask"])
    with pytest.raises(InvalidInput, match="remove_unused_columns=False"):
        collate([{"input_ids": packed[0]["tokens"]}])
    with pytest.raises(InvalidInput, match="collator_for"):
        hf_collator("sdpa", config=llama_config())([packed[0]])
    with pytest.raises(InvalidInput, match="width"):
        collate([fixture_batch(), halves[0]])


def test_trainer_step_is_the_token_weighted_gradient_of_the_whole_step(tmp_path):
    """Trainer, 2 micro-batches of 2 rows, SGD: the update is lr * grad of sum / N_step."""
    from transformers import Trainer, TrainingArguments

    packed = _packed_dataset()
    (whole,) = to_batches(packed)
    assert whole.loss_mask.sum(axis=1).tolist() == [9, 12, 7, 8]
    model = tiny_llama("sdpa")
    params = list(model.parameters())

    def grad_of(batch):
        logits = model(**hf_inputs(batch, "sdpa", config=model.config, dtype=torch.float64)).logits
        grads = torch.autograd.grad(hf_loss(logits, batch).mean, params)
        return torch.cat([g.reshape(-1) for g in grads])

    def rows(pair):
        return collate.batch_of([packed[i] for i in pair])

    collate = collator_for(packed, "sdpa", dtype=torch.float64, config=model.config)
    want = grad_of(whole)
    # Control: the mean of per-micro-batch means differs for every split into pairs.
    for a, b in (((0, 1), (2, 3)), ((0, 2), (1, 3)), ((0, 3), (1, 2))):
        naive = 0.5 * (grad_of(rows(a)) + grad_of(rows(b)))
        assert not close(naive, want, 1e-7, 1e-4)

    before = torch.cat([p.detach().reshape(-1).clone() for p in params])
    lr = 0.5
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        max_steps=1,
        learning_rate=lr,
        optim="sgd",
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=0.0,
        remove_unused_columns=False,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    Trainer(model=model, args=args, train_dataset=packed, data_collator=collate).train()
    got = (before - torch.cat([p.detach().reshape(-1) for p in params])) / lr
    assert close(got, want, 1e-7, 1e-4)  # transformers' loss runs in float32


def config_of(model_type, **options):
    base = {"vocab_size": 266, "num_hidden_layers": 2, "hidden_size": 16, "num_attention_heads": 2}
    return AutoConfig.for_model(model_type, **(base | options))


def test_masks_follow_the_model_config_one_per_layer_type():
    batch = fixture_epoch(3).batches[0]
    qwen = config_of("qwen2", use_sliding_window=True, sliding_window=2, max_window_layers=1)
    masks = hf_inputs(batch, "sdpa", config=qwen, dtype=torch.float64)["attention_mask"]
    assert set(masks) == {"full_attention", "sliding_attention"}
    assert torch.equal(masks["full_attention"], additive_mask(batch, torch.float64))
    assert torch.equal(
        masks["sliding_attention"], additive_mask(batch, torch.float64, sliding_window=2)
    )
    # One-mask models: windowed when the config says so, plain otherwise.
    mistral = hf_inputs(batch, "sdpa", config=config_of("mistral", sliding_window=2))
    assert torch.equal(
        mistral["attention_mask"], additive_mask(batch, torch.float32, sliding_window=2)
    )
    llama = hf_inputs(batch, "sdpa", config=config_of("llama"))
    assert torch.equal(llama["attention_mask"], additive_mask(batch, torch.float32))
    # A window no shorter than the row is no window: one shared tensor, not a copy.
    wide = config_of("gemma2", sliding_window=6)
    masks = hf_inputs(batch, "eager", config=wide)["attention_mask"]
    assert masks["sliding_attention"] is masks["full_attention"]
    flex = hf_inputs(batch, "flex_attention", config=qwen)["attention_mask"]
    cells = block_mask_cells(flex["sliding_attention"])[:, 0].numpy()
    assert np.array_equal(cells, hf_allowed(batch, 2))
    # Flattened implementations take the window from the layer: no mask at all.
    for attn in ("flash_attention_2", "exactpack_varlen"):
        assert "attention_mask" not in hf_inputs(batch, attn, config=qwen)


def test_bool_masks_are_for_sdpa_only():
    batch = fixture_batch()
    kw = hf_inputs(batch, "sdpa", config=CFG, mask="bool")
    assert kw["attention_mask"].dtype == torch.bool
    assert torch.equal(kw["attention_mask"][:, 0], torch.as_tensor(hf_allowed(batch)))
    with pytest.raises(InvalidInput, match="as numbers"):
        hf_inputs(batch, "eager", config=CFG, mask="bool")
    with pytest.raises(InvalidInput, match="one of float, bool"):
        hf_inputs(batch, "sdpa", config=CFG, mask="half")


@pytest.mark.parametrize(
    ("model_type", "options", "words"),
    [
        ("bloom", {}, "ALiBi"),
        ("rwkv", {}, "RwkvBlock"),
        ("gemma3_text", {"use_bidirectional_attention": True}, "bidirectional"),
    ],
)
def test_architectures_that_cannot_be_exact_are_refused(model_type, options, words):
    from exactpack.hf.architectures import UnsupportedArchitecture

    config = config_of(model_type, **options)
    with pytest.raises(UnsupportedArchitecture, match=f"^{model_type} cannot be packed exactly"):
        hf_inputs(fixture_batch(), "sdpa", config=config)
    with pytest.raises(UnsupportedArchitecture, match=words):
        hf_inputs(fixture_batch(), "sdpa", config=config)


def test_a_collator_with_a_config_checks_the_vocabulary_and_pad_id_before_step_one():
    """Issue 23 item 5: 1,024 packed ids vs a 400-id model is one line, not an IndexError."""
    docs = [list(range(n, n + 6)) for n in (10, 500, 1000)]
    packed = pack_dataset(datasets.Dataset.from_dict({"input_ids": docs}), 12, vocab_size=1024)
    small = config_of("llama", vocab_size=400)
    with pytest.raises(InvalidInput, match=r"1,024 ids but the model's config.vocab_size is 400"):
        collator_for(packed, "sdpa", config=small)
    with pytest.raises(InvalidInput, match=r"pad_token_id 400 .*config.vocab_size 400") as err:
        hf_collator("sdpa", config=small, pad_token_id=400)
    assert "\n" not in str(err.value)
    collator_for(packed, "sdpa", config=config_of("llama", vocab_size=1024))


def test_an_implementation_that_cannot_run_here_is_refused_at_construction(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(InvalidInput, match=r"flash_attention_2.*cannot run here: a CUDA device"):
        hf_collator("flash_attention_2", config=llama_config())


def test_importing_exactpack_hf_registers_exactpack_varlen_in_a_fresh_process():
    import subprocess
    import sys

    script = (
        "import sys, exactpack.hf\n"
        "assert 'transformers' not in sys.modules  # still light\n"
        "from transformers import AttentionInterface, LlamaConfig, AutoModelForCausalLM\n"
        "assert 'exactpack_varlen' in AttentionInterface._global_mapping\n"
        "cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=16,"
        " num_hidden_layers=1, num_attention_heads=2)\n"
        "m = AutoModelForCausalLM.from_config(cfg, attn_implementation='exactpack_varlen')\n"
        "from transformers.trainer import DEFAULT_CALLBACKS  # the first-batch check too\n"
        "assert [c.__name__ for c in DEFAULT_CALLBACKS][-1] == 'CheckBatches'\n"
        "print(m.config._attn_implementation)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-1500:]
    assert done.stdout.strip().splitlines()[-1] == "exactpack_varlen"


def test_pack_dataset_with_a_model_checks_its_capability_before_any_row():
    docs = [list(range(n, n + 12)) for n in (10, 30, 50)]
    ds = datasets.Dataset.from_dict({"input_ids": docs})
    packed = pack_dataset(ds, 24, vocab_size=266, model=llama_config())
    assert len(packed) == 2
    with pytest.raises(InvalidInput, match=r"config\.vocab_size is 40"):
        pack_dataset(ds, 24, vocab_size=266, model=config_of("llama", vocab_size=40))
    bidirectional = config_of("bert", is_decoder=False, intermediate_size=32)
    from exactpack.hf.architectures import UnsupportedArchitecture

    with pytest.raises(UnsupportedArchitecture, match="bidirectional"):
        pack_dataset(ds, 24, vocab_size=266, model=bidirectional)
    topk = config_of("deepseek_v32", index_topk=8, num_key_value_heads=2)
    with pytest.raises(UnsupportedArchitecture, match="every example <= 8 pairs"):
        pack_dataset(ds, 24, vocab_size=266, model=topk)
