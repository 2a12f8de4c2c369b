"""Compute balancing: the cost model against a model's own modules, the pair counts
against the permission predicate counted by brute force, and the partition against
an exhaustive search on small instances."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from exactpack import InvalidInput
from exactpack.training.balance import CostModel, balanced_groups, causal_pairs, largest_share
from exactpack.training.distributed import RowSampler, RowStats, schedule_rows


def _brute_pairs(lengths, ancestors):
    """Count (q, k) with k an ancestor-or-self cell at or before q, cell by cell."""
    total = 0
    for n, d in zip(lengths, ancestors, strict=True):
        path = list(range(d + n))  # the node's path: d ancestor cells, then its own n
        for q in range(d, d + n):
            total += sum(1 for k in path if k <= q)
    return total


@given(st.lists(st.tuples(st.integers(1, 40), st.integers(0, 60)), min_size=1, max_size=8))
@example([(3, 0), (2, 0)])  # the fixture's two flat examples: 6 + 3 pairs
def test_causal_pairs_are_the_predicate_counted(units):
    lengths, ancestors = zip(*units, strict=True)
    got = causal_pairs(lengths, ancestors)
    assert got.sum() == _brute_pairs(lengths, ancestors)
    assert [int(x) for x in got] == [_brute_pairs([n], [d]) for n, d in units]


def test_the_linear_term_is_twice_the_matmul_weights_of_a_llama():
    """Forward FLOPs per token = 2 × the weights of every Linear a token passes through
    (norms and the embedding lookup are no matmul): counted from the model's modules."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=64, intermediate_size=176, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=300, head_dim=16,
    )  # fmt: skip
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    cost = CostModel.from_config(config)
    assert cost.linear == 2 * linear
    # QK^T and PV: 2 FLOPs per multiply-add, heads × head_dim each, on every layer
    assert cost.quadratic == 2 * 2 * 4 * 16 * 3


def test_moe_counts_the_routed_experts_and_only_attention_layers_score_pairs():
    config = {
        "hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 4, "vocab_size": 10, "num_experts": 8,
        "num_experts_per_tok": 2, "moe_intermediate_size": 24,
        "layer_types": ["linear_attention", "full_attention"] * 2,
    }  # fmt: skip
    cost = CostModel.from_config(config)
    attn = 2 * 32 * (2 * 32 + 2 * 32)
    experts = 6 * 32 * (2 * 24) + 2 * 32 * 8
    assert cost.linear == 4 * (attn + experts) + 2 * 32 * 10
    assert cost.quadratic == 4 * 32 * 2  # two attention layers of four
    with pytest.raises(InvalidInput, match="hidden_size and num_hidden_layers"):
        CostModel.from_config({"vocab_size": 10})
    with pytest.raises(InvalidInput, match="linear must be a number"):
        CostModel(linear=-1.0, quadratic=0.0)


def _optimum(costs, slots, cap):
    best = float("inf")
    for labels in itertools.product(range(slots), repeat=len(costs)):
        if max(labels.count(s) for s in range(slots)) <= cap:
            loads = [
                sum(c for c, lab in zip(costs, labels, strict=True) if lab == s)
                for s in range(slots)
            ]
            best = min(best, max(loads))
    return best


@given(
    st.lists(st.integers(0, 50), min_size=1, max_size=7),
    st.integers(1, 3),
    st.integers(1, 4),
)
@example([8, 7, 6, 5, 4], 2, 3)  # the docstring's: 15 + 15
def test_the_partition_is_whole_capped_and_never_worse_than_greedy(costs, slots, cap):
    if slots * cap < len(costs):
        with pytest.raises(InvalidInput, match="do not fit"):
            balanced_groups(costs, slots, cap)
        return
    groups = balanced_groups(costs, slots, cap)
    assert len(groups) == slots and sorted(i for g in groups for i in g) == list(range(len(costs)))
    assert all(len(g) <= cap for g in groups)
    largest = max(sum(costs[i] for i in g) for g in groups)
    greedy = schedule_rows(
        np.asarray(costs, float), world_size=slots, micro_batches=1, rows_per_micro_batch=cap,
        shuffle=False,
    )  # fmt: skip
    assert largest <= greedy.loads.max() + 1e-9
    optimum = _optimum(costs, slots, cap)
    assert optimum <= largest <= optimum * 4 / 3 + 1e-9  # LPT's bound; usually equal
    if (costs, slots, cap) == ([8, 7, 6, 5, 4], 2, 3):
        assert largest == optimum == 15


def _w1_like_stats(rng, rows=256, capacity=4096):
    """Rows of a W1-like mix (lognormal lengths, median ~210, clipped to the row)."""
    lengths, row_of, row, room = [], [], 0, capacity
    while row < rows:
        n = int(np.clip(np.rint(rng.lognormal(np.log(350) - 0.5, 1.0)), 8, capacity))
        if n > room:
            row, room = row + 1, capacity
            if row == rows:
                break
        lengths.append(n)
        row_of.append(row)
        room -= n
    lengths, row_of = np.array(lengths), np.array(row_of)
    eligible = np.bincount(row_of, weights=lengths, minlength=rows).astype(np.int64)
    return RowStats.from_segments(lengths, row_of, eligible)


#: Llama-3-8B's shape: at 4096 tokens the quadratic term is ~7% of a full row's FLOPs.
LLAMA_8B = {
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
}  # fmt: skip


def test_a_compute_balanced_sampler_schedules_every_row_once_and_balances_flops(rng):
    stats = _w1_like_stats(rng, rows=1024)
    cost = CostModel.from_config(LLAMA_8B)
    flops = cost.row_costs(stats)
    pairs = (stats.attention + stats.tokens) / 2
    assert np.allclose(flops, cost.linear * stats.tokens + cost.quadratic * pairs)
    spreads = {}
    for balance in ("tokens", cost):
        sampler = RowSampler(
            stats, rows_per_micro_batch=4, micro_batches=4, world_size=8, rank=0, seed=3,
            balance=balance,
        )  # fmt: skip
        schedule = sampler.schedule
        assert sorted(schedule.row_ids.tolist()) == list(range(len(stats)))
        per_step = 8 * 4
        slots = [schedule.row_ids[schedule.slot_offsets[i] : schedule.slot_offsets[i + 1]]
                 for i in range(schedule.steps * per_step)]  # fmt: skip
        loads = np.array([flops[s].sum() for s in slots]).reshape(schedule.steps, per_step)
        spreads[sampler.balance] = loads.max(axis=1).sum() / loads.mean(axis=1).sum()
    assert spreads["compute"] <= spreads["tokens"]
    assert spreads["compute"] < 1.05


def test_a_compute_sampler_state_names_its_cost_model(rng):
    stats = _w1_like_stats(rng, rows=40)
    kwargs = {"rows_per_micro_batch": 2, "micro_batches": 2, "world_size": 2, "rank": 1}
    sampler = RowSampler(stats, balance=CostModel(2.0, 1.0), **kwargs)
    first = [s.rows for s in itertools.islice(iter(sampler), 3)]
    state = sampler.state_dict()
    assert state["balance"] == "compute" and state["cost"] == [2.0, 1.0]
    again = RowSampler(stats, balance=CostModel(2.0, 1.0), **kwargs)
    again.load_state_dict(state)
    assert [s.rows for s in again][:1] == [sampler.slot(3).rows] and first
    other = RowSampler(stats, balance=CostModel(2.0, 5.0), **kwargs)
    with pytest.raises(InvalidInput, match=r"cost=\[2.0, 1.0\]"):
        other.load_state_dict(state)
    with pytest.raises(InvalidInput, match="or a CostModel"):
        RowSampler(stats, balance="compute", **kwargs)


def test_largest_share_is_largest_over_mean():
    assert largest_share([4, 2, 2], [[0], [1, 2]]) == 1.0
    assert largest_share([6, 1, 1], [[0], [1, 2]]) == pytest.approx(6 / 4)
