"""Hybrid models packed exactly: mixers that carry state along the row restart per example.

Tiny float64 models (width 16, 2 layers): LFM2's short convolutions, Mamba's selective
scan, Bamba's Mamba-2 scan and Qwen3-Next's gated delta rule. The matrix
(``tests/support/architecture_cases.py``) proves each exact on its implementations; here:
the restart is what makes them exact (the control without it fails), the inputs carry
``seq_idx``, a model whose mixers were not restarted is refused its inputs, and mixers
exactpack does not know keep a refusal naming them. On tree rows each node starts from its
parent's final state: a slice of the families (LFM2's vectorised convolution, Qwen3-Next's
forked gated delta rule, Jamba's replayed Mamba scan) is exact, and the controls (a
sibling's state, or zero at every node) fail; ``scripts/sweep_tree.py`` runs every type.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from exactpack import InvalidInput, PackConfig, pack_examples
from exactpack.hf.adapter import hf_inputs
from exactpack.hf.capabilities import capability
from exactpack.hf.collator import hf_collator
from exactpack.hf.kinds import tree_kind
from exactpack.hf.mixers import (
    RESTARTABLE,
    cell_parents,
    cell_seq_idx,
    chunk_gated_delta_rule,
    path_conv1d,
    restart_mixers,
    runs,
    selective_scan,
    seq_idx_parents,
)
from exactpack.verify.fixture import fixture_batch

from support.architecture_cases import CASES, build, verify_default
from support.architecture_tiny import tiny_config

torch.set_num_threads(1)


def _sweep_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[2] / "scripts" / "sweep_architectures.py"
    spec = importlib.util.spec_from_file_location("sweep_architectures", path)
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    return sweep


#: scripts/sweep_architectures.py: every hybrid type exactpack restarts (tiny configs mix one
#: mixer layer with one attention layer where the type has attention).
HYBRIDS = _sweep_script().HYBRIDS
CASE = {c.model_type: c for c in CASES if "restarted" in c.name}


@pytest.mark.parametrize("model_type", sorted(HYBRIDS))
def test_every_hybrid_type_is_exact_with_its_mixers_named(model_type):
    arch = capability(tiny_config(model_type))
    assert arch.refusal is None and arch.mixers, arch
    assert set(arch.mixers) <= set(RESTARTABLE) and "restarts its" in arch.verdict
    arch.check(tree_kind("eager"), tree=True)  # tree rows too: each node forks its parent's


def test_seq_idx_marks_each_example_and_the_padding():
    batch = fixture_batch()  # row 0: A = columns 0-2, B = 3-4, padding at 5
    config = tiny_config("lfm2")
    model = restart_mixers(build(CASE["lfm2"], "sdpa"))
    kwargs = hf_inputs(batch, "sdpa", config=model.config)
    ids = kwargs["seq_idx"].numpy()
    assert ids[0].tolist() == [0, 0, 0, 1, 1, -1]
    assert runs(seq_idx_parents(kwargs["seq_idx"]))[0] == [(0, 3, -1), (3, 5, -1), (5, 6, -1)]
    cu = batch.cu_seqlens()
    want = cell_seq_idx(np.diff(cu.cu_seqlens), cu.valid_index, batch.shape)
    assert (ids == want).all()
    flat = hf_inputs(batch, "exactpack_varlen", config=model.config)["seq_idx"]
    assert flat.shape == (1, int(batch.input_valid.sum()))
    # a config whose model's mixers were never restarted: refused, not fed seq_idx to ignore
    with pytest.raises(InvalidInput, match=r"restart_mixers\(model\)"):
        hf_inputs(batch, "sdpa", config=config)
    with pytest.raises(InvalidInput, match=r"restart_mixers\(model\)"):
        hf_collator("sdpa", config=config)
    collated = hf_collator("sdpa", config=model.config)(batch)
    assert torch.equal(collated["seq_idx"], kwargs["seq_idx"])


@pytest.mark.parametrize("model_type", ["lfm2", "mamba", "bamba", "qwen3_next"])
def test_the_restart_is_what_makes_them_exact(model_type, monkeypatch):
    """Control: the same inputs with seq_idx 0 on every cell (one example a row: the state
    carried across examples) fail, first at a mixer; the naive call (no seq_idx) fails too."""
    case = CASE[model_type]
    attn = case.attns[0]
    assert verify_default(build(case, attn))["pass"]
    monkeypatch.setattr(
        "exactpack.hf.adapter.cell_seq_idx", lambda lengths, index, shape: np.zeros(shape, "i4")
    )
    carried = verify_default(build(case, attn))
    assert not carried["pass"] and carried["mixed"]
    assert carried["max_abs_diff"]["logits"] > 1e-6  # a real leak, not rounding
    assert carried["first_divergence"]["kind"] in ("convolution", "linear attention")
    assert "restart_mixers(model)" in carried["hint"]
    monkeypatch.undo()
    naive = verify_default(build(case, attn), mode="naive")
    assert not naive["pass"] and naive["first_divergence"]["class"] in RESTARTABLE


def test_the_vectorised_short_conv_is_the_convolution_of_each_path_alone():
    """Flat rows (from seq_idx) and a tree row: each column's window is its own path's."""
    torch.manual_seed(0)
    x, weight, bias = torch.randn(2, 5, 9, dtype=torch.float64), torch.randn(5, 3), torch.randn(5)
    seq_idx = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 2], [3, 3, 3, 3, 3, 3, -1, -1, -1]])
    # row 2: a trie, prompt 0-2, branch 3-4 then its child 5, branch 6-7 from column 2
    tree = torch.tensor([[-1, 0, 1, 2, 3, 4, 2, 6, -1]])
    got = path_conv1d(x, weight.double(), bias.double(), seq_idx_parents(seq_idx))
    got_tree = path_conv1d(x[:1], weight.double(), bias.double(), tree)

    def alone(cols, row=0):
        part, w = x[row : row + 1, :, cols], weight.double()[:, None]
        return F.conv1d(part, w, bias.double(), padding=2, groups=5)[0, :, : len(cols)]

    for row, spans in enumerate(runs(seq_idx_parents(seq_idx))):
        for s, e, parent in spans:
            assert parent == -1
            cols = list(range(s, e))
            assert torch.allclose(got[row, :, s:e], alone(cols, row), 0, 1e-15)
    for path in ([0, 1, 2, 3, 4, 5], [0, 1, 2, 6, 7]):
        assert torch.allclose(got_tree[0, :, path], alone(path), 0, 1e-15)
    joined = alone(
        list(range(9))
    )  # no restart: column 3 reads columns 1 and 2 of the example before
    assert not torch.allclose(got[0, :, 3], joined[:, 3])
    assert not torch.allclose(got_tree[0, :, 6], joined[:, 6])  # 6 reads 2 and 1, not 5 and 4


def test_the_scan_stand_ins_restart_each_example_and_fork_each_branch():
    """The gated delta rule over whole rows (examples crossing its 64-cell chunks) equals
    transformers' own run of each example alone (float32 inside, as there); the Mamba scan
    on a trie equals transformers' scan of each path alone (float64, to the last bits)."""
    from transformers.models.mamba.modeling_mamba import mamba_selective_scan
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

    torch.manual_seed(0)
    seq_idx = torch.tensor([[0] * 70 + [1] * 3 + [2] * 64 + [-1] * 13, [3] * 150])
    q, k = (torch.randn(2, 150, 2, 8, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, 150, 4, 8, dtype=torch.float64)
    g, beta = -3 * torch.rand(2, 150, 4, dtype=torch.float64), torch.rand(2, 150, 4)
    got, _ = chunk_gated_delta_rule(q, k, v, g, beta, 64, True, parents=seq_idx_parents(seq_idx))
    joined, _ = chunk_gated_delta_rule(
        q, k, v, g, beta, 64, True, parents=seq_idx_parents(0 * seq_idx)
    )
    for row, spans in enumerate(runs(seq_idx_parents(seq_idx))):
        for s, e, _ in spans:
            part = [x[row : row + 1, s:e] for x in (q, k, v, g, beta)]
            want, _ = torch_chunk_gated_delta_rule(*part, use_qk_l2norm_in_kernel=True)
            assert torch.allclose(got[row : row + 1, s:e], want, 1e-4, 1e-5)
    assert not torch.allclose(joined[0, 70:], got[0, 70:], 1e-2, 1e-2)  # no restart: a leak

    tree = torch.tensor([[-1, 0, 1, 2, 3, 4, 2, 6, -1]])  # prompt 0-2, branches 3-5 and 6-7
    x, dt, z = (torch.randn(1, 5, 9, dtype=torch.float64) for _ in range(3))
    A, B, C = -torch.rand(5, 3), *(torch.randn(1, 3, 9, dtype=torch.float64) for _ in range(2))
    D, bias = torch.randn(5), torch.randn(5)
    scan = selective_scan(x, dt, A, B, C, D, z, bias, True, parents=tree)
    for path in ([0, 1, 2, 3, 4, 5], [0, 1, 2, 6, 7], [8]):
        part = [t[..., path] for t in (x, dt)] + [A] + [t[..., path] for t in (B, C)]
        alone = mamba_selective_scan(*part, D, z[..., path], bias, delta_softplus=True)
        assert torch.allclose(scan[..., path], alone, 0, 1e-14)


def test_cell_parents_cut_runs_at_every_branch_point():
    """A child laid right after its parent continues it in one run, but the run ends at the
    parent's last cell when a later sibling starts from there too (that state is forked)."""
    nodes = np.array([[0, 0, 1, 1, 2, 3, -1, -1]])  # 1 and 3 are children of 0, 2 of 1
    parents = cell_parents(
        nodes, np.array([-1, 0, 1, 0]), np.array([0, 2, 4, 5]), np.array([2, 2, 1, 1])
    )
    assert parents.tolist() == [[-1, 0, 1, 2, 3, 1, -1, 6]]
    assert runs(torch.as_tensor(parents))[0] == [(0, 2, -1), (2, 5, 0), (5, 6, 0), (6, 8, -1)]
    flat = seq_idx_parents(torch.tensor([[0, 0, 0, 1, 1, -1]]))
    assert flat.tolist() == [[-1, 0, 1, -1, 3, -1]]


#: The tree slice: a vectorised conv, a forked gated delta rule, a replayed Mamba-1 scan.
TREE_SLICE = ["lfm2", "qwen3_next", "jamba"]


@pytest.mark.parametrize("model_type", TREE_SLICE)
def test_tree_rows_fork_each_node_from_its_parent_and_the_controls_fail(model_type, monkeypatch):
    """Each sequence of a trie, run alone, equals its tree-packed cells (float64, the seed's
    tolerance); a node that starts from its sibling's state (the naive rows) or from zero
    (every node a new path) fails."""
    from exactpack.verify.models import tree_groups, verify_hf

    case = CASE[model_type]
    groups = tree_groups([(5, (3, 2, 1)), (3, (4,))], tiny_config(model_type).vocab_size, 0)
    report = verify_hf(build(case, case.attns[0]), groups)
    assert report["pass"] and report["max_abs_diff"]["gradients"] < 1e-12, report
    sibling = verify_hf(build(case, case.attns[0]), groups, mode="naive")
    assert not sibling["pass"] and sibling["max_abs_diff"]["logits"] > 1e-6

    def zero_at_nodes(nodes, node_parent, node_col, node_len):
        roots = np.full_like(node_parent, -1)  # each node restarts: the parent's state lost
        return cell_parents(nodes, roots, node_col, node_len)

    monkeypatch.setattr("exactpack.hf.adapter.cell_parents", zero_at_nodes)
    zero = verify_hf(build(case, case.attns[0]), groups)
    assert not zero["pass"] and zero["max_abs_diff"]["logits"] > 1e-6


def test_tree_rows_refuse_gradient_checkpointing_up_front():
    """The fork lives only inside the call: a recompute after it could not start a node
    from its parent, so the call says so."""
    from exactpack.core.tree import pack_tree
    from exactpack.hf.adapter import hf_inputs
    from exactpack.verify.models import tree_groups

    model = restart_mixers(build(CASE["lfm2"], "sdpa"))
    model.activation_checkpointing_enable()
    model.train()
    (batch,) = pack_tree(tree_groups([(4, (2, 2))], model.config.vocab_size, 0), 12).batches
    with pytest.raises(InvalidInput, match="turn checkpointing off for tree rows"):
        model(**hf_inputs(batch, "sdpa", config=model.config))


def test_a_restarted_mixer_runs_as_before_outside_packed_calls():
    model = build(CASE["mamba"], "eager")
    ids = torch.arange(3, 11)[None]
    with torch.no_grad():
        before = model(input_ids=ids).logits
        after = restart_mixers(restart_mixers(model))(input_ids=ids).logits  # idempotent
    assert torch.equal(before, after)


def test_gradient_checkpointing_is_refused_where_a_mixer_gets_no_seq_idx():
    """Mamba's blocks call the mixer without the call's kwargs: a recompute in backward
    could not restart it, so the packed call says so instead of training on leaked state."""
    model = restart_mixers(build(CASE["mamba"], "eager"))
    model.activation_checkpointing_enable()
    model.train()
    examples_batch = _batch(model, [5, 4], 12)
    kwargs = hf_inputs(examples_batch, "eager", config=model.config)
    with pytest.raises(InvalidInput, match="checkpointing would recompute"):
        model(**kwargs)


def test_checkpointed_layers_that_get_seq_idx_restart_in_their_recompute_too():
    """LFM2's decoder layers hand the call's kwargs (seq_idx) to the conv, so the backward's
    recompute restarts it as the forward did: the same gradients as without checkpointing."""

    def grads(checkpointing):
        model = restart_mixers(build(CASE["lfm2"], "sdpa"))
        if checkpointing:
            model.activation_checkpointing_enable()
        model.train()
        batch = _batch(model, [5, 4, 2], 12)
        out = model(**hf_inputs(batch, "sdpa", config=model.config, dtype=torch.float64))
        return torch.autograd.grad(out.loss, [p for p in model.parameters() if p.requires_grad])

    for a, b in zip(grads(False), grads(True), strict=True):
        assert torch.equal(a, b)


def _batch(model, lengths, capacity):
    from exactpack.verify.models import VerifyCase, verification_examples

    layout = VerifyCase(tuple(lengths), capacity)
    examples = verification_examples(model.config.vocab_size, 0, layout=layout)
    config = PackConfig(capacity, len(examples))
    return pack_examples("train", examples, examples[0].binding, config).batches[0]


@pytest.mark.parametrize(
    ("model_type", "words"),
    [
        ("recurrent_gemma", "conv_1d (Conv1d)"),
        ("zamba2", "Zamba2MambaDecoderLayer"),
        ("minimax", "MiniMaxLightningAttention"),
    ],
)
def test_mixers_exactpack_does_not_restart_keep_a_refusal_naming_them(model_type, words):
    arch = capability(tiny_config(model_type))
    assert arch.refusal and words in arch.refusal and not arch.mixers
    assert "exactpack restarts only the mixers it knows" in arch.refusal
