"""exactpack.hf.attention_impl: the exactpack_varlen attention function, against the predicate."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AttentionInterface, AutoConfig

from exactpack import InvalidInput, NotAvailable
from exactpack.hf.adapter import hf_inputs
from exactpack.hf.attention_impl import exactpack_attention, plan_of
from exactpack.hf.kinds import VARLEN
from exactpack.verify.fixture import fixture_batch

from support.reference import flat_spans, per_example_attention
from support.strategies import packed_epochs

torch.set_num_threads(1)
#: A small Llama config: what hf_inputs checks the rows against (vocabulary 266).
CFG = AutoConfig.for_model(
    "llama", vocab_size=266, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
    num_attention_heads=2, num_key_value_heads=1,
)  # fmt: skip


class Layer(torch.nn.Module):
    """What the function reads from a transformers attention module."""

    def __init__(self, config=None, layer_idx=0):
        super().__init__()
        self.config, self.layer_idx = config, layer_idx


def flattened(batch, heads=4, kv_heads=2, dim=8, seed=0):
    """q (1, H, N, D), k/v (1, Hkv, N, D) over the valid cells, and the kwargs."""
    gen = torch.Generator().manual_seed(seed)
    n = int(batch.input_valid.sum())
    q = torch.randn(1, heads, n, dim, generator=gen, dtype=torch.float64, requires_grad=True)
    k, v = (
        torch.randn(1, kv_heads, n, dim, generator=gen, dtype=torch.float64, requires_grad=True)
        for _ in range(2)
    )
    kwargs = hf_inputs(batch, VARLEN, config=CFG, labels=False)
    return q, k, v, {name: kwargs[name] for name in ("cu_seq_lens_q", "position_ids")}


def reference(q, k, v, batch, window):
    """Each example alone, plain causal softmax over its own flattened tokens (GQA: each kv
    head serves ``H // Hkv`` query heads), from ``tests/support/reference.py``: (N, H, D)."""
    spans = flat_spans(batch.occurrences)  # row-major valid cells, as cu_seq_lens orders them
    return per_example_attention(q, k, v, spans, 0.25, window)[0].transpose(0, 1)


def within(a, b):
    return bool(torch.all((a - b).abs() <= 1e-10 + 1e-9 * torch.maximum(a.abs(), b.abs())))


def test_registered_with_transformers():
    assert AttentionInterface._global_mapping[VARLEN] is exactpack_attention


@settings(max_examples=40)
@given(packed_epochs(), st.one_of(st.none(), st.integers(1, 6)))
def test_matches_the_predicate_with_gqa_and_windows(case, window):
    _, _, epoch = case
    batch = epoch.batches[0]
    q, k, v, kwargs = flattened(batch)
    config = AutoConfig.for_model("mistral", sliding_window=window, num_hidden_layers=1)
    out, weights = exactpack_attention(
        Layer(config), q, k, v, None, scaling=0.25, sliding_window=window, **kwargs
    )
    assert weights is None and out.shape == (1, q.shape[2], 4, 8)
    want = reference(q, k, v, batch, window)
    assert within(out[0], want)
    grads = torch.autograd.grad((out[0] * want.detach()).sum(), (q, k, v))
    wants = torch.autograd.grad((want * want.detach()).sum(), (q, k, v))
    assert all(within(g, w) for g, w in zip(grads, wants, strict=True))


def test_rows_without_cu_seqlens_are_one_example_each_and_packed_ones_are_refused():
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 5, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    out, _ = exactpack_attention(Layer(), q, k, v, None, scaling=0.5)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5)
    assert within(out, want.transpose(1, 2))
    packed = torch.tensor([[0, 1, 2, 0, 1], [0, 1, 2, 3, 4]])
    with pytest.raises(InvalidInput, match=r"packed position_ids .* would be joined"):
        exactpack_attention(Layer(), q, k, v, None, position_ids=packed)
    with pytest.raises(InvalidInput, match="batch of 1"):
        exactpack_attention(Layer(), q, k, v, None, cu_seq_lens_q=torch.tensor([0, 5]))


def test_softcapping_sinks_and_bad_cu_seqlens_are_refused():
    q, k, v, kwargs = flattened(fixture_batch())
    with pytest.raises(NotAvailable, match=r"soft-caps .*eager"):
        exactpack_attention(Layer(), q, k, v, None, softcap=50.0, **kwargs)
    with pytest.raises(NotAvailable, match="sinks"):
        exactpack_attention(Layer(), q, k, v, None, s_aux=torch.zeros(4), **kwargs)
    bad = kwargs | {"cu_seq_lens_q": torch.tensor([0, 3, 4], dtype=torch.int32)}
    with pytest.raises(InvalidInput, match="does not split the 9 flattened tokens"):
        exactpack_attention(Layer(), q, k, v, None, **bad)


def test_the_window_comes_from_the_config_and_must_agree_with_the_layer():
    q, k, v, kwargs = flattened(fixture_batch())
    config = AutoConfig.for_model(
        "qwen2", use_sliding_window=True, sliding_window=2, max_window_layers=1,
        num_hidden_layers=2,
    )  # fmt: skip
    full, _ = exactpack_attention(Layer(config, 0), q, k, v, None, scaling=0.25, **kwargs)
    slide, _ = exactpack_attention(Layer(config, 1), q, k, v, None, scaling=0.25, **kwargs)
    assert within(full[0], reference(q, k, v, fixture_batch(), None))
    assert within(slide[0], reference(q, k, v, fixture_batch(), 2))
    with pytest.raises(InvalidInput, match="passes sliding_window=3 but its config gives 2"):
        exactpack_attention(Layer(config, 1), q, k, v, None, sliding_window=3, **kwargs)


def test_one_plan_per_cu_seqlens_tensor():
    cu = torch.tensor([0, 3, 5, 9], dtype=torch.int32)
    plan = plan_of(cu, 9)
    assert plan_of(cu, 9) is plan  # every layer of one forward reuses it
    assert plan_of(cu.clone(), 9) is not plan
    assert plan.groups == ((1, 4, 4), (1, 3, 3), (1, 2, 2))  # each segment its own path
    assert np.array_equal(plan.scatter.numpy(), np.arange(1, 10)[[4, 5, 6, 7, 8, 0, 1, 2, 3]])


def test_the_trainer_collator_is_window_exact_on_exactpack_varlen():
    """exactpack_varlen reads each layer's window itself (the collator checks the config)."""
    from transformers import AutoModelForCausalLM

    from exactpack import PackConfig, pack_examples
    from exactpack.hf.collator import hf_collator
    from exactpack.verify.models import verification_examples, verification_layout

    config = AutoConfig.for_model(
        "qwen2", vocab_size=266, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, use_sliding_window=True, sliding_window=4,
        max_window_layers=1,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        config, attn_implementation=VARLEN, dtype=torch.float64
    ).eval()
    layout = verification_layout(4, 64)
    examples = verification_examples(266, 0, layout=layout)
    (batch,) = pack_examples(
        "train", examples, examples[0].binding, PackConfig(layout.capacity, 6)
    ).batches
    with torch.no_grad():
        packed = model(**hf_collator(VARLEN, config=config)([batch])).logits[
            0
        ]  # (N, V): the valid cells
        alone = torch.cat([model(input_ids=torch.as_tensor(ex.inputs[None]).long()).logits[0]
                           for ex in examples])  # fmt: skip
    order = np.argsort(np.repeat(batch.occurrences.ordinal, np.diff(batch.cu_seqlens().cu_seqlens)))
    assert within(packed[torch.as_tensor(order)], alone)


def test_a_mask_exactpack_varlen_would_drop_is_refused_an_all_ones_one_is_not():
    """doge passes its own 4-D bias; a caller's left padding is no better (never dropped);
    right padding hides no key from a real query under causal attention."""
    import pytest as _pytest

    from exactpack.core.errors import NotAvailable
    from exactpack.hf.attention_impl import exactpack_attention

    module = torch.nn.Module()
    q = torch.randn(1, 2, 5, 4, dtype=torch.float64)
    for mask in (torch.zeros(1, 2, 5, 5), torch.tensor([[0, 0, 1, 1, 1]])):
        with _pytest.raises(NotAvailable, match=r"hides keys.*set_attn_implementation"):
            exactpack_attention(module, q, q, q, mask)
    want = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    for mask in (torch.ones(1, 5, dtype=torch.long), torch.tensor([[1, 1, 1, 0, 0]])):
        out, _ = exactpack_attention(module, q, q, q, mask)
        assert torch.allclose(out, want.transpose(1, 2), atol=1e-12)


@pytest.mark.parametrize("impl", [VARLEN, "exactpack_tree", "exactpack_tree_varlen"])
def test_a_left_padded_batch_is_refused_not_ignored_by_exactpacks_kinds(impl):
    """A left-padded batch (generation, a padded eval) through a whole model: transformers
    drops the padding mask of a kind with no mask function, which gave logits off by ~0.07
    on the padded row with no error. No mask, an all-ones one or right padding (which no
    real query reaches) keep working, exactly as sdpa."""
    from transformers import AutoModelForCausalLM

    from exactpack.hf.attention_impl import register

    register()  # every exactpack kind, flat and tree
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CFG, attn_implementation="sdpa", dtype=torch.float64)
    ids = torch.tensor([[5, 6, 7, 8, 9], [2, 2, 3, 4, 5]])
    left = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    right = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    with torch.no_grad():
        want = model(input_ids=ids).logits
        want_right = model(input_ids=ids, attention_mask=right).logits
        model.set_attn_implementation(impl)
        with pytest.raises(NotAvailable, match=r"set_attn_implementation\('sdpa'\)"):
            model(input_ids=ids, attention_mask=left)
        for mask in (torch.ones_like(left), None):
            assert within(model(input_ids=ids, attention_mask=mask).logits, want)
        got = model(input_ids=ids, attention_mask=right).logits
        assert within(got[torch.as_tensor(right) == 1], want_right[torch.as_tensor(right) == 1])
        model.set_attn_implementation("sdpa")  # what the error says: padded batches on sdpa
        got = model(input_ids=ids, attention_mask=left).logits
        alone = model(input_ids=ids[1:, 2:]).logits
    assert within(got[1, 2:], alone[0])
