"""Tree packing in transformers: ``exactpack verify --tree-lengths``, the masks and the backend.

Models are the suite's tiny configs (2 layers, width 16): Llama (full
attention), Mistral (one window of 4), Qwen2 (full + sliding layers,
``layer_types``) and GPT-2 (LayerNorm in float64: no float32 cast at all,
so even its gradients meet the seed's tolerance).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from exactpack.cli import main
from exactpack.core.binding import Binding
from exactpack.core.errors import InvalidInput, NotAvailable
from exactpack.core.tree import SequenceGroups, pack_tree
from exactpack.hf.adapter import hf_inputs
from exactpack.hf.architectures import describe
from exactpack.hf.collator import hf_collator
from exactpack.hf.masks import hf_allowed, layer_masks
from exactpack.nn.flex import permission_mod
from exactpack.nn.tree_attention import tree_plan
from exactpack.verify.models import load_model, tree_groups, verify_hf

torch.set_num_threads(1)
LLAMA = Path(__file__).parents[1] / "data" / "tiny_llama.json"
SPEC = [(30, (5, 8, 12)), (10, (4, 4))]  # --tree-lengths "30:5,8,12;10:4,4"
SEED_TOL = (1e-10, 1e-9)


def config(tmp_path: Path, model_type: str, **extra) -> Path:
    base = json.loads(LLAMA.read_text())
    if model_type == "gpt2":
        base = {
            "vocab_size": 266,
            "n_embd": 16,
            "n_layer": 2,
            "n_head": 2,
            "n_positions": 64,
            "initializer_range": 0.2,
            "attn_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "resid_pdrop": 0.0,
            "bos_token_id": 0,
            "eos_token_id": 1,
        }
    base |= {"model_type": model_type, **extra}
    base.pop("architectures", None)
    path = tmp_path / f"{model_type}.json"
    path.write_text(json.dumps(base))
    return path


def verify(path: Path, attn: str, mode: str = "adapter") -> dict:
    model = load_model(config=path, attn_implementation="eager" if attn == "eager" else "sdpa")
    model.set_attn_implementation(attn)
    return verify_hf(model, tree_groups(SPEC, 266, seed=0), mode=mode)


@pytest.mark.parametrize(
    ("model_type", "extra", "attn"),
    [
        ("llama", {}, "sdpa"),
        ("llama", {}, "exactpack_tree"),
        ("llama", {}, "eager"),
        ("mistral", {"sliding_window": 4}, "exactpack_tree"),
        ("mistral", {"sliding_window": 4}, "sdpa"),
        ("mistral", {"sliding_window": 4}, "exactpack_tree_varlen"),  # the flash path on CPU
        (
            "qwen2",
            {"sliding_window": 4, "use_sliding_window": True, "max_window_layers": 1},
            "exactpack_tree",
        ),
        ("gpt2", {}, "exactpack_tree"),
    ],
)
def test_tree_rows_compute_what_each_sequence_computes_alone(tmp_path, model_type, extra, attn):
    report = verify(config(tmp_path, model_type, **extra), attn)
    assert report["pass"], report
    assert report["comparisons"]["logits"] == sum(report["lengths"]) * 266
    assert report["comparisons"]["sequence_logprobs"] == report["sequences"] == 5
    assert report["tokens_stored"] < report["tokens_flat"]
    # every quantity, gradients included, at the seed's tolerance: the float32 islands
    # (RMSNorm, eager's softmax) run in float64 for the check (Float64Islands)
    assert report["tolerance"]["abs"] == SEED_TOL[0]
    assert report["max_abs_diff"]["gradients"] < 1e-12
    assert bool(report["widened"]) == (model_type != "gpt2")  # GPT-2 casts nothing


#: The sweep's slice (scripts/sweep_tree.py, docs/tree.md): tiny configs of the types that
#: pack exactly flat, one case per feature: soft-capping and sinks (eager only), full +
#: sliding layers, RoBERTa's position offset, an indexer exact only for short sequences,
#: block-sparse attention run dense, a pad id whose embedding row is zero (gemma3n: NaN
#: gradients unless padding carries another id); refused up front with the reason the
#: tree adds.
SWEEP = [
    ("gemma2", "eager", None),
    ("gemma3n_text", "exactpack_tree", None),
    ("gpt_oss", "eager", None),
    ("cohere2", "exactpack_tree", None),
    ("roberta", "sdpa", None),
    ("axk2", "sdpa", None),
    ("big_bird", "eager", None),
    ("big_bird", "exactpack_tree", "never calls transformers. AttentionInterface"),
    ("mpt", "eager", "takes no position_ids"),
    ("roformer", "eager", "rotary tables are indexed by column"),
    ("gpt_neo", "eager", "band over the row.s columns"),
    ("gpt_oss", "exactpack_tree", "attention sinks"),
    ("llama4_text", "exactpack_tree", "chunked_attention"),
]


@pytest.mark.parametrize(("model_type", "attn", "refusal"), SWEEP)
def test_sweep_slice(model_type, attn, refusal):
    from exactpack.hf.architectures import UnsupportedArchitecture
    from exactpack.hf.capabilities import capability
    from exactpack.hf.kinds import tree_kind

    from support.architecture_tiny import tiny_config, tree_model

    config = tiny_config(model_type)
    if refusal is not None:
        with pytest.raises(UnsupportedArchitecture, match=refusal):
            capability(config).check(tree_kind(attn), tree=True)
        return
    model = tree_model(config, attn)
    arch = capability(config)
    short = [c.limit for c in arch.conditions if c.what == "example"]  # axk2: <= 8 pairs
    spec = [(4, (4, 3, 2)), (3, (2, 2))] if short else SPEC
    report = verify_hf(model, tree_groups(spec, config.get_text_config().vocab_size, 0))
    assert report["pass"], report
    assert report["tolerance"]["abs"] == SEED_TOL[0]


@pytest.mark.parametrize(
    ("model_type", "extra", "attn"),
    [
        ("llama", {}, "sdpa"),
        ("mistral", {"sliding_window": 4}, "exactpack_tree"),
        ("mistral", {"sliding_window": 4}, "exactpack_tree_varlen"),
    ],
)
def test_naive_layout_fails(tmp_path, model_type, extra, attn):
    report = verify(config(tmp_path, model_type, **extra), attn, mode="naive")
    assert not report["pass"]
    assert report["max_abs_diff"]["logits"] > 1e-3
    assert report["failures"]["sequence_logprobs"] > 0


def test_cli_exit_codes(capsys):
    args = ["verify", "--hf-config", str(LLAMA), "--tree-lengths", "6:3,3"]
    assert main([*args, "--attn", "exactpack_tree"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("PASS")
    assert main([*args, "--mode", "naive", "--json"]) == 1
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["pass"] is False and report["layout"] == "tree"
    assert main([*args, "--attn", "exactpack_varlen"]) == 2
    assert "cannot run tree-packed rows" in capsys.readouterr().err
    assert main(["verify", "--hf-config", str(LLAMA), "--tree-lengths", "6:"]) == 2
    assert main([*args, "--mode", "bool-mask"]) == 2


def tree_collator(max_length, vocab_size, attn="exactpack_tree", **fields):
    """The collator of tree records of ``max_length`` cells and ``vocab_size`` ids."""
    binding = Binding(vocab_size, "tree-records", "tree-records")
    return hf_collator(attn, max_length=max_length, binding=binding, tree=True, **fields)


def small_batch(window_groups=((6, (3, 3, 2)), (3, (2,)))):
    return pack_tree(tree_groups(list(window_groups), 266, seed=1), 40).batches[0]


@pytest.mark.parametrize("window", [None, 2])
def test_flex_mask_mod_is_the_predicate(window):
    from torch.nn.attention.flex_attention import create_mask

    batch = small_batch()
    t = torch.as_tensor
    mod = permission_mod(
        t(batch.input_valid), t(batch.segments), t(batch.positions), window, t(batch.node_ends)
    )
    rows, width = batch.shape
    dense = create_mask(mod, rows, 1, width, width, device="cpu")[:, 0].numpy()
    np.testing.assert_array_equal(dense, batch.dense_mask(window))


def test_layer_masks_per_layer_type_and_flattened_kinds_refused():
    from transformers import Qwen2Config

    cfg = Qwen2Config(
        num_hidden_layers=2,
        use_sliding_window=True,
        sliding_window=2,
        max_window_layers=1,
        vocab_size=266,
    )
    batch = small_batch()
    masks = layer_masks(batch, "sdpa", describe(cfg), dtype=torch.float64)
    assert set(masks) == {"full_attention", "sliding_attention"}
    for name, window in (("full_attention", None), ("sliding_attention", 2)):
        allowed = masks[name][:, 0] == 0
        np.testing.assert_array_equal(allowed.numpy(), hf_allowed(batch, window))
    for flattened in ("flash_attention_2", "exactpack_varlen"):  # one check refuses both
        with pytest.raises(NotAvailable, match=r"cu_seqlens.*ancestor"):
            hf_inputs(batch, flattened, config=cfg)


def test_tree_inputs_and_the_tree_collator_require_the_config():
    """Without the config a windowed model would get unwindowed masks, silently."""
    from transformers import Qwen2Config

    batch = small_batch()
    for attn in ("sdpa", "exactpack_tree"):
        with pytest.raises(InvalidInput, match=r"hf_inputs\(\.\.\., config=model\.config\)"):
            hf_inputs(batch, attn, config=None)
        with pytest.raises(InvalidInput, match=r"hf_collator\(\.\.\., config=model\.config\)"):
            tree_collator(batch.shape[1], batch.binding.vocab_size, attn)
    cfg = Qwen2Config(
        num_hidden_layers=2, use_sliding_window=True, sliding_window=2, max_window_layers=1,
        vocab_size=batch.binding.vocab_size, hidden_size=16, intermediate_size=32,
        num_attention_heads=2, num_key_value_heads=1,
    )  # fmt: skip
    masks = hf_inputs(batch, "sdpa", config=cfg)["attention_mask"]
    assert set(masks) == {"full_attention", "sliding_attention"}  # the window, from the config
    with pytest.raises(InvalidInput, match=r"config\.vocab_size is 3"):
        hf_inputs(batch, "sdpa", config=Qwen2Config(vocab_size=3, num_hidden_layers=1))


def test_backend_work_is_nodes_times_paths():
    batch = small_batch()
    plan = tree_plan(batch)
    keys, bounds = batch.node_paths()
    paths = np.diff(bounds)
    occ, width = batch.occurrences, batch.shape[1]
    assert plan.score_cells == int((occ.lengths * paths).sum())
    node_pos = batch.positions[occ.row, occ.col_start]
    assert paths.tolist() == (node_pos + occ.lengths).tolist()
    # each node's keys are exactly the cells the predicate permits its last query
    dense = batch.dense_mask().reshape(-1, width)
    for n in range(len(occ)):
        last = occ.row[n] * width + occ.col_end[n] - 1
        got = np.sort(keys[bounds[n] : bounds[n + 1]] % width)
        np.testing.assert_array_equal(got, np.flatnonzero(dense[last]))
    assert plan.score_cells < batch.shape[0] * width * width


def test_sequence_views_unpack_the_cells():
    from exactpack.nn.logprobs import sequence_logprobs, token_logprobs

    binding = Binding(7, "t", "s")
    groups = SequenceGroups.from_prompt_completions([[1, 2, 3]], [[[4, 5], [4, 6]]], binding)
    batch = pack_tree(groups, 8).batches[0]
    logits = torch.randn(*batch.shape, 7, dtype=torch.float64)
    logits[~torch.as_tensor(batch.input_valid)] = float("nan")  # padding is never read
    per_token = token_logprobs(logits, batch)
    sums = sequence_logprobs(logits, batch)
    logp = logits.log_softmax(-1)
    for i, s in enumerate(batch.seq_index):
        seq = groups.sequence(s)
        cells = batch.sequence_cells(i)
        expect = logp.reshape(-1, 7)[
            torch.as_tensor(cells), torch.as_tensor(seq[1:].astype(np.int64))
        ]
        torch.testing.assert_close(per_token[i], expect, rtol=0, atol=0)
        mask = torch.as_tensor(groups.pair_mask(np.array([s])))
        torch.testing.assert_close(sums[i], (expect * mask).sum(), rtol=0, atol=1e-15)


def test_rows_and_sub_tries_still_exact(tmp_path):
    """Capacity 45 splits the 30-token prompt's trie into sub-tries over 3 rows."""
    model = load_model(config=config(tmp_path, "mistral", sliding_window=4))
    model.set_attn_implementation("exactpack_tree")
    report = verify_hf(model, tree_groups(SPEC, 266, seed=0), max_length=45)
    assert report["pass"], report
    assert report["rows"] == 3 and report["tokens_stored"] > 67  # the prompt stored twice


def test_refused_architectures_stay_refused(tmp_path, capsys):
    path = tmp_path / "bloom.json"
    path.write_text(
        json.dumps(
            {"model_type": "bloom", "vocab_size": 266, "hidden_size": 16, "n_layer": 2, "n_head": 2}
        )
    )
    assert main(["verify", "--hf-config", str(path), "--tree-lengths", "6:2,2"]) == 2
    assert "cannot be packed exactly" in capsys.readouterr().err


@pytest.mark.parametrize("window", [None, 2])
def test_flex_block_mask_forward_matches_the_tree_backend(window):
    """FlexAttention (forward only on CPU) under block_mask == path_attention, float32."""
    import warnings

    from torch.nn.attention.flex_attention import flex_attention

    from exactpack.hf.masks import block_mask
    from exactpack.nn.varlen import path_attention

    batch = small_batch()
    rows, width = batch.shape
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(rows, 2, width, 8, generator=gen) for _ in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the unfused path's "use torch.compile" warning
        flex = flex_attention(q, k, v, block_mask=block_mask(batch, "cpu", window), scale=0.25)

    def tokens(x):
        return x.transpose(1, 2).reshape(rows * width, 2, 8)

    ours = path_attention(tokens(q), tokens(k), tokens(v), tree_plan(batch), 0.25, window)
    ours = ours.view(rows, width, 2, 8).transpose(1, 2)
    real = torch.as_tensor(batch.input_valid)[:, None, :, None]
    # float32 softmax on two kernels: float32's tolerance
    torch.testing.assert_close(flex * real, ours * real, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("window", "merge"), [(None, False), (2, False), (3, False), (None, True)])
def test_flash_path_is_the_tree_backend(window, merge):
    """The varlen path (flash_attn_varlen_func's signature; on CPU its plain-torch
    reference) == path_attention, outputs and gradients, float64, GQA (4 heads, 2 kv)."""
    from exactpack.nn.flash import varlen_reference
    from exactpack.nn.tree_attention import tree_flash_attention
    from exactpack.nn.varlen import path_attention

    batch = small_batch()
    n = batch.shape[0] * batch.shape[1]
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(n, 4, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    k, v = (
        torch.randn(n, 2, 8, generator=gen, dtype=torch.float64, requires_grad=True)
        for _ in range(2)
    )
    ours = tree_flash_attention(q, k, v, tree_plan(batch), 0.3, window, merge=merge)
    want = path_attention(q, k, v, tree_plan(batch), 0.3, window)
    torch.testing.assert_close(ours, want, rtol=0, atol=1e-14)
    seed = torch.randn(want.shape, generator=gen, dtype=torch.float64)
    for a, b in zip(
        torch.autograd.grad((ours * seed).sum(), (q, k, v)),
        torch.autograd.grad((want * seed).sum(), (q, k, v)),
        strict=True,
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-13)
    if merge:  # flash-attn's backward drops the log-sum-exp's gradient: refused with grads
        with pytest.raises(NotAvailable, match="log-sum-exp"):
            tree_flash_attention(
                q, k, v, tree_plan(batch), 0.3, merge=True, varlen=lambda *a, **kw: None
            )
        with torch.no_grad():
            forward = tree_flash_attention(
                q, k, v, tree_plan(batch), 0.3, merge=True, varlen=varlen_reference
            )
        torch.testing.assert_close(forward, want.detach(), rtol=0, atol=1e-14)


# One capability check, one per-batch check: tree rows take flat packing's, never a copy.


def tree_and_flat(spec, capacity, vocab=266):
    """The same random sequences (``spec``: prompt : completion lengths) tree-packed and
    flat-packed, one model call each."""
    from exactpack.core.compact import pack_examples
    from exactpack.core.config import PackConfig
    from exactpack.core.examples import SequenceExample

    groups = tree_groups(spec, vocab, seed=0)
    tree = pack_tree(groups, capacity).batches[0]
    examples = [
        SequenceExample.from_document(
            groups.sequence(i), source_id=str(i), partition="train", binding=groups.binding
        )
        for i in range(len(groups))
    ]
    flat = pack_examples("train", examples, groups.binding, PackConfig(capacity, 64)).batches[0]
    return tree, flat


#: (model type, config extra, tree attention, flat attention, the refusal both make): one per
#: kind of model-level refusal the flat path makes, from the config or the model's modules.
REFUSALS = [
    ("bloom", {}, "eager", "eager", "ALiBi"),  # a refused type (config)
    ("bert", {"is_decoder": False}, "sdpa", "sdpa", "bidirectional"),  # modules: is_causal
    ("openai-gpt", {}, "eager", "eager", "2-D padding mask"),  # its forward builds its mask
    ("bart", {}, "sdpa", "sdpa", "takes no position_ids"),  # positions from the columns
    ("recurrent_gemma", {}, "sdpa", "sdpa", "convolution layer"),  # a mixer (modules)
    # where exactpack_varlen is refused, so are the tree implementations (same kwargs)
    ("gpt_oss", {}, "exactpack_tree", "exactpack_varlen", "attention sinks"),
    ("nemotron", {}, "exactpack_tree", "exactpack_varlen", "without its attention kwargs"),
    ("doge", {}, "exactpack_tree_varlen", "exactpack_varlen", "its own bias"),
    ("big_bird", {}, "exactpack_tree", "exactpack_varlen", "never calls transformers"),
    ("gemma2", {}, "exactpack_tree", "exactpack_varlen", "soft-caps"),
    ("llama4_text", {}, "exactpack_tree", "exactpack_varlen", "chunked_attention"),
    ("axk2", {}, "exactpack_tree", "exactpack_varlen", "indexer"),
]


@pytest.mark.parametrize(("model_type", "extra", "tree_attn", "flat_attn", "why"), REFUSALS)
def test_tree_inputs_refuse_what_flat_inputs_refuse(model_type, extra, tree_attn, flat_attn, why):
    """``hf_inputs(..., config=)`` and ``hf_collator(tree=True)`` run the flat path's capability
    check (the config and the model's modules), not a config-only copy."""
    from exactpack.hf.architectures import UnsupportedArchitecture

    from support.architecture_tiny import tiny_config

    cfg = tiny_config(model_type, **extra)
    tree, flat = tree_and_flat([(4, (3, 2))], 16)
    with pytest.raises(UnsupportedArchitecture, match=why):
        hf_inputs(flat, flat_attn, config=cfg)
    with pytest.raises(UnsupportedArchitecture, match=why):
        hf_inputs(tree, tree_attn, config=cfg)
    with pytest.raises(UnsupportedArchitecture, match=why):
        tree_collator(16, 266, tree_attn, config=cfg)


@pytest.mark.parametrize(
    ("model_type", "extra", "why"),
    [
        ("roformer", {}, "rotary tables are indexed by column"),  # found in its modules
        ("mpt", {}, "takes no position_ids"),  # found in its modules
        ("gpt_neo", {}, "band over the row.s columns"),
        ("falcon", {"alibi": True}, "ALiBi bias is built from the row.s columns"),
    ],
)
def test_tree_refusals_of_column_positions_from_the_config(model_type, extra, why):
    """Exact flat, refused as trees: found through ``config=`` alone (the model's modules
    are read from the config's model on the meta device, as the flat check reads them)."""
    from exactpack.hf.architectures import UnsupportedArchitecture

    from support.architecture_tiny import tiny_config

    cfg = tiny_config(model_type, **extra)
    tree, flat = tree_and_flat([(4, (3, 2))], 16)
    hf_inputs(flat, "eager", config=cfg)  # flat: exact
    with pytest.raises(UnsupportedArchitecture, match="cannot run tree-packed rows: .*" + why):
        hf_inputs(tree, "eager", config=cfg)


@pytest.mark.parametrize("attn", ["sdpa", "exactpack_tree"])
def test_roberta_position_offset_on_tree_inputs_is_exact(attn):
    """RoBERTa numbers positions from ``padding_idx + 1``: only its modules say so. The
    documented ``hf_inputs(batch, attn, config=model.config)`` (and ``hf_collator(tree=True)``)
    feed the offset, so every sequence's logits equal its run alone; the depths without
    the offset (what a config-only check fed) are far off."""
    from exactpack.io.shards import row_records

    from support.architecture_tiny import tiny_config, tree_model

    model = tree_model(tiny_config("roberta"), attn)
    groups = tree_groups([(6, (4, 3, 3))], 266, seed=2)
    assert not (groups.tokens == model.config.pad_token_id).any()  # alone: numbered from 2
    batch = pack_tree(groups, 24).batches[0]
    kwargs = hf_inputs(batch, attn, config=model.config, dtype=torch.float64)
    assert int(kwargs["position_ids"][0, 0]) == model.config.pad_token_id + 1
    collated = tree_collator(24, 266, attn, config=model.config, dtype=torch.float64)(
        row_records(batch)
    )
    torch.testing.assert_close(collated["position_ids"], kwargs["position_ids"])

    def cells(kw):
        with torch.no_grad():
            out = model(**kw).logits
        return out.reshape(-1, out.shape[-1])

    packed = cells(kwargs)
    wrong = cells(kwargs | {"position_ids": torch.as_tensor(batch.position_ids())})
    for i, s in enumerate(batch.seq_index):
        seq = torch.as_tensor(groups.sequence(s)[:-1].astype(np.int64))[None]
        with torch.no_grad():
            alone = model(input_ids=seq, use_cache=False).logits[0]
        got = packed[torch.as_tensor(batch.sequence_cells(i))]
        torch.testing.assert_close(got, alone, rtol=1e-9, atol=1e-10)
        assert float((wrong[torch.as_tensor(batch.sequence_cells(i))] - alone).abs().max()) > 1e-3


#: (model type, config extra, tree spec, capacity) beyond one stated condition, and the
#: largest tree within it: the condition reads the tree's depth (or its row's columns).
CONDITIONS = [
    (  # dynamic RoPE: examples <= 16 pairs; depth 6 + 12 - 1 = 17 though no node is > 11
        "llama",
        {
            "rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4},
            "max_position_embeddings": 16,
        },
        [(6, (12, 4))],
        40,
        [(6, (11, 4))],
        "every example <= 16 pairs",
    ),
    (  # LongRoPE: the same from original_max_position_embeddings
        "phi3",
        {
            "rope_parameters": {
                "rope_type": "longrope",
                "short_factor": [1.0] * 4,
                "long_factor": [2.0] * 4,
                "original_max_position_embeddings": 16,
                "rope_theta": 1e4,
            },
            "original_max_position_embeddings": 16,
            "max_position_embeddings": 64,
        },
        [(10, (8, 2))],
        40,
        [(10, (7, 2))],
        "every example <= 16 pairs",
    ),
    (  # an indexer keeping index_topk = 8 keys: a path of 9 pairs is beyond
        "axk2",
        {},
        [(5, (5, 1))],
        24,
        [(5, (4, 1))],
        "every example <= 8 pairs",
    ),
    (  # Llama 4's NoPE temperature: rows <= floor_scale - 1 = 7 columns
        "llama4_text",
        {"attn_temperature_tuning": True, "floor_scale": 8, "no_rope_layers": [0, 1]},
        [(3, (2, 2))],
        8,
        [(3, (2, 2))],
        "rows <= 7 columns",
    ),
]


@pytest.mark.parametrize(("model_type", "extra", "beyond", "capacity", "within", "why"), CONDITIONS)
def test_tree_batches_are_held_to_the_flat_conditions(
    model_type, extra, beyond, capacity, within, why
):
    from exactpack.hf.architectures import UnsupportedArchitecture
    from exactpack.hf.capabilities import capability
    from exactpack.io.shards import row_records

    from support.architecture_tiny import tiny_config

    cfg = tiny_config(model_type, **extra)
    assert capability(cfg).conditions  # the model states the condition
    tree, flat = tree_and_flat(beyond, capacity)
    with pytest.raises(UnsupportedArchitecture, match=why):
        hf_inputs(flat, "sdpa", config=cfg)  # the same sequences, flat: refused alike
    with pytest.raises(UnsupportedArchitecture, match=why):
        hf_inputs(tree, "sdpa", config=cfg)
    collator = tree_collator(capacity, 266, "sdpa", config=cfg)
    with pytest.raises(UnsupportedArchitecture, match=why):
        collator(row_records(tree))
    if model_type == "llama4_text":  # a row condition: the same tree in 7 columns passes
        capacity = 7
    ok, _ = tree_and_flat(within, capacity)
    assert max(np.diff(ok.sequences()[1])) == ok.longest
    hf_inputs(ok, "sdpa", config=cfg)
    collator = tree_collator(capacity, 266, "sdpa", config=cfg)
    collator(row_records(ok))


def test_tree_attention_is_registered_on_import():
    """``import exactpack.hf`` registers the tree implementations as it registers
    ``exactpack_varlen``: a model is built on them with no helper called."""
    import subprocess
    import sys

    code = (
        "import exactpack.hf, json\n"
        "from transformers import AutoConfig, AutoModelForCausalLM\n"
        f"cfg = AutoConfig.from_pretrained({str(LLAMA)!r})\n"
        "for name in ('exactpack_varlen', 'exactpack_tree', 'exactpack_tree_varlen'):\n"
        "    m = AutoModelForCausalLM.from_config(cfg, attn_implementation=name)\n"
        "    assert m.config._attn_implementation == name\n"
        "print('ok')\n"
    )
    src = str(Path(__file__).parents[2] / "src")
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "PYTHONPATH": src, "HF_HUB_OFFLINE": "1"},
        check=False,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_tree_collator_checks_what_hf_collator_checks():
    """hf_collator on tree rows runs its flat up-front check (check_config): the mask kinds need
    the config, the vocabulary must fit the model's, and padding avoids a zero pad row
    (gemma3n, known from its modules only)."""
    from exactpack.core.errors import InvalidInput
    from exactpack.hf.capabilities import capability

    from support.architecture_tiny import tiny_config

    with pytest.raises(
        InvalidInput,
        match=r"hf_collator needs the model's config .* pass hf_collator\(..., config=",
    ):
        tree_collator(16, 266, "sdpa")
    llama = tiny_config("llama")
    with pytest.raises(InvalidInput, match=r"config\.vocab_size is 266"):
        tree_collator(16, 300, "exactpack_tree", config=llama)
    gemma = tiny_config("gemma3n_text")
    zero = capability(gemma).zero_pad
    assert zero is not None  # from its modules, not its config
    batch = small_batch()
    assert (~batch.input_valid).any()
    ids = hf_inputs(batch, "sdpa", config=gemma, pad_token_id=zero)["input_ids"]
    assert not bool((ids[torch.as_tensor(~batch.input_valid)] == zero).any())
