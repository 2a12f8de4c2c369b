import numpy as np
import pytest
import torch

from exactpack import InvalidInput, PackConfig, SequenceExample, Split, pack_examples
from exactpack.core.loss import masked_nll_sum
from exactpack.nn import BACKENDS, AttentionLayout
from exactpack.nn.attention import ranges_attention
from exactpack.verify.decoder import DecoderConfig, TinyDecoder
from exactpack.verify.fixture import fixture_batch, fixture_binding, fixture_examples

torch.set_num_threads(1)


def within(a, b):
    return (a - b).abs() <= 1e-10 + 1e-9 * torch.maximum(a.abs(), b.abs())


# The seed's acceptance values (shared/DESIGN.md); every other count in the suite is
# derived from ``num_parameters`` and the layout.
@pytest.mark.parametrize(("profile", "expected"), [("large", 3448), ("small", 1188)])
def test_profiles_have_the_seed_parameter_counts(profile, expected):
    model = TinyDecoder(profile)
    counted = sum(p.numel() for p in model.parameters())
    assert model.num_parameters == counted == expected == model.config.parameter_count()
    # Llama-style: no biases, RMSNorm weights only, one embedding shared with the output.
    names = [n for n, _ in model.named_parameters()]
    assert not any(n.endswith("bias") for n in names)
    assert sum(n.startswith("embed") for n in names) == 1


def test_initialisation_is_seeded_and_device_independent():
    a, b, c = TinyDecoder(seed=7), TinyDecoder(seed=7), TinyDecoder(seed=8)
    f32 = TinyDecoder(seed=7, dtype=torch.float32)
    for (name, pa), pb, pc, pf in zip(
        a.named_parameters(), b.parameters(), c.parameters(), f32.parameters(), strict=True
    ):
        assert torch.equal(pa, pb), name
        assert torch.equal(pa.float(), pf), name
        if not name.endswith("norm.weight"):
            assert not torch.equal(pa, pc), name


def test_output_projection_is_tied_to_the_embedding():
    model = TinyDecoder()
    batch = fixture_batch()
    before = model.forward_packed(batch).detach()
    with torch.no_grad():
        model.embed.weight[200] += 1.0  # token 200 never occurs in the fixture's inputs
    after = model.forward_packed(batch).detach()
    changed = (after != before).any(dim=(0, 1))
    assert changed[200] and not changed[:200].any() and not changed[201:].any()


def test_rotary_angles_come_from_local_positions():
    model = TinyDecoder()
    layout = AttentionLayout.from_batch(fixture_batch())
    cos, sin = model.rotary(layout)  # (R, 1, T, D/2)
    # B starts at storage column 3 with local position 0: no rotation there.
    assert torch.all(cos[0, 0, 3] == 1) and torch.all(sin[0, 0, 3] == 0)
    assert torch.equal(cos[0, 0, 4], cos[0, 0, 1])  # B's second cell = A's second cell
    assert not torch.equal(cos[0, 0, 4], cos[0, 0, 2])


def test_positions_beyond_max_len_are_a_clear_error():
    model = TinyDecoder("small")  # max_len 4
    ex = SequenceExample.from_document(
        [0, 5, 6, 7, 8, 1], source_id="long", partition="train", binding=fixture_binding()
    )
    with pytest.raises(InvalidInput, match="local position 4 reaches the decoder's max_len 4"):
        model.forward_separate(ex)


def test_padding_ids_are_never_gathered_and_padding_stays_zero():
    model = TinyDecoder()
    batch = fixture_batch()
    ids, layout = model.inputs_of(batch)
    assert int(ids.min()) == -1  # PAD_CELL reaches the model and is skipped
    logits = model(ids, layout)
    other = ids.clone()
    other[~layout.valid] = 7  # any id in padding cells: nothing changes
    assert torch.equal(model(other, layout), logits)
    pad = torch.as_tensor(~batch.input_valid)
    assert torch.all(logits[pad] == 0)
    assert torch.all(model.embed_tokens(ids, layout)[pad] == 0)


def test_backends_are_resolved_by_name_at_forward_time(monkeypatch):
    model = TinyDecoder(attention="late")
    batch = fixture_batch()
    with pytest.raises(InvalidInput, match="unknown attention backend 'late'"):
        model.forward_packed(batch)
    monkeypatch.setitem(BACKENDS, "late", ranges_attention)
    late = model.forward_packed(batch)
    dense = model(*model.inputs_of(batch), attention="dense")
    assert torch.all(within(late, TinyDecoder().forward_packed(batch)))
    assert torch.all(within(late, dense))


def test_custom_config_and_float32():
    config = DecoderConfig(vocab_size=300, width=16, heads=2, ff=24, layers=3, max_len=32)
    model = TinyDecoder(config=config, dtype=torch.float32, seed=1)
    assert model.profile == "custom" and model.num_parameters == config.parameter_count()
    batch = fixture_batch()
    logits = model.forward_packed(batch)
    assert logits.shape == (2, 6, 300) and logits.dtype == torch.float32
    b = model.forward_separate(fixture_examples()[1])
    assert torch.allclose(logits[0, 3:5], b, atol=1e-5)
    with pytest.raises(InvalidInput, match="even width"):
        DecoderConfig(width=6, heads=2)
    with pytest.raises(InvalidInput, match="unknown decoder profile 'huge'"):
        TinyDecoder("huge")


def test_forward_padded_rejects_packed_rows():
    with pytest.raises(InvalidInput, match=r'row 0 holds 2 examples.*policy="padded"'):
        TinyDecoder().forward_padded(fixture_batch())


def test_fixture_separate_padded_packed_agree_on_every_logit_loss_and_gradient():
    """The seed's comparison, written out: per layout (padded, packed) one logit comparison
    per target and vocabulary id and one gradient comparison per parameter."""
    model = TinyDecoder("large", seed=42)
    examples = fixture_examples()
    binding = fixture_binding()
    params = dict(model.named_parameters())

    def grads(loss):
        return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(params.values()))])

    separate = [model.forward_separate(ex) for ex in examples]  # [(L, V)]
    sep_loss = sum(
        masked_nll_sum(z, ex.targets, ex.loss_mask).sum
        for z, ex in zip(separate, examples, strict=True)
    )
    layouts = {}
    for name, policy, width in (("padded", "padded", 4), ("packed", "next-fit", 6)):
        [batch] = pack_examples(
            Split.TRAIN, examples, binding, PackConfig(width, 3), policy=policy
        ).batches
        forward = model.forward_padded if name == "padded" else model.forward_packed
        logits = forward(batch)
        loss = model.loss_packed(batch)
        assert loss.count == 9
        layouts[name] = (batch, logits, loss.sum)
    assert layouts["padded"][0].shape == (3, 4) and layouts["packed"][0].shape == (2, 6)

    reference = grads(sep_loss)
    counts = {"logits": 0, "loss": 0, "gradients": 0}
    for batch, logits, loss_sum in layouts.values():
        occ = batch.occurrences
        for i, ex in enumerate(examples):
            r, c0, c1 = occ.row[i], occ.col_start[i], occ.col_end[i]
            ok = within(logits[r, c0:c1], separate[i])
            assert ok.all() and ok.shape == (len(ex), 266)
            counts["logits"] += ok.numel()
        assert within(loss_sum, sep_loss)
        counts["loss"] += 1
        ok = within(grads(loss_sum), reference)
        assert ok.all()
        counts["gradients"] += ok.numel()
    targets = sum(len(ex) for ex in examples)
    assert targets == int(fixture_batch().target_valid.sum())
    want = {
        "logits": 2 * targets * binding.vocab_size,
        "loss": 2,
        "gradients": 2 * model.num_parameters,
    }
    assert counts == want
    assert reference.abs().max() > 0 and np.isfinite(sep_loss.item())
