"""GRPO / RLOO rows balanced across data-parallel ranks (``exactpack.trl._exchange``), on a
fake 2-rank gather (two threads): groups whole, as many rows per rank as each generated,
every column in step with its row and trimmed to the rank's widest, scalars as they were,
and the largest rank's compute the least any deal of whole groups reaches; on random
batches (``_rank_rows``) never heavier than the ranks' own split."""

from __future__ import annotations

import itertools
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from exactpack.training.balance import CostModel
from exactpack.trl import _exchange, _group_bounds, _group_loads, _rank_rows

COST = CostModel(linear=1.0, quadratic=1.0)


class FakeRanks:
    """``accelerator.gather`` / ``pad_across_processes`` between threads, one a rank."""

    def __init__(self, world: int):
        self.barrier, self.slots, self.world = threading.Barrier(world), [None] * world, world

    def accelerator(self, rank: int) -> SimpleNamespace:
        def gather(t):
            self.slots[rank] = t
            self.barrier.wait()
            out = torch.cat(self.slots)
            self.barrier.wait()
            return out

        def pad_across_processes(t, dim, pad_first):
            if t.ndim <= dim:
                return t
            more = int(gather(torch.tensor([t.shape[dim]])).max()) - t.shape[dim]
            return torch.nn.functional.pad(t, (more, 0) if pad_first else (0, more))

        return SimpleNamespace(
            gather=gather, pad_across_processes=pad_across_processes,
            num_processes=self.world, process_index=rank,
        )  # fmt: skip


def rank_rows(prompts, completions, first_row):
    """One rank's generation batch as TRL pads it: prompts left, completions right."""
    p, c = max(map(len, prompts)), max(map(len, completions))
    left = torch.tensor([[0] * (p - len(x)) + x for x in prompts])
    right = torch.tensor([x + [0] * (c - len(x)) for x in completions])
    return {
        "prompt_ids": left, "prompt_mask": (left > 0).long(),
        "completion_ids": right, "completion_mask": (right > 0).long(),
        "ref_per_token_logps": right * 0.5, "old_per_token_logps": None,
        "advantages": torch.arange(first_row, first_row + len(prompts), dtype=torch.float64),
        "num_items_in_batch": torch.tensor(99),
    }  # fmt: skip


def exchange(batches, generations=2):
    ranks, out = FakeRanks(len(batches)), [None] * len(batches)

    def run(r):
        trainer = SimpleNamespace(
            accelerator=ranks.accelerator(r), args=SimpleNamespace(), num_generations=generations
        )
        out[r] = _exchange(batches[r], trainer, COST)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(len(batches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return out


def largest(batches):
    """The largest rank's compute: the sum of its groups' tries."""
    return max(_group_loads(b, _group_bounds(b, 2), COST).sum() for b in batches)


@pytest.mark.timeout(20)
def test_groups_are_dealt_whole_and_the_largest_rank_is_the_least_any_deal_reaches():
    # rank 0 generated short completions, rank 1 long ones: 2 groups of 2 rows each
    short = rank_rows([[3, 4]] * 2 + [[5]] * 2, [[9, 2], [8, 2], [7, 2], [2]], 0)
    long_ = rank_rows([[6, 7, 8]] * 2 + [[5, 6]] * 2, [[9, 9, 9, 9, 2]] * 3 + [[8, 8, 8, 2]], 4)
    before = [short, long_]
    after = exchange(before)
    seen = torch.cat([b["advantages"] for b in after]).long()
    assert sorted(seen.tolist()) == list(range(8))  # every row once
    rows = {int(a): i for i, a in enumerate(torch.cat([b["advantages"] for b in before]))}
    for b, was in zip(after, before, strict=True):
        assert len(b["advantages"]) == 4 and b["old_per_token_logps"] is None
        assert b["num_items_in_batch"] is was["num_items_in_batch"]  # scalars stay
        assert torch.equal(b["advantages"].long().view(2, 2) % 2, torch.tensor([[0, 1]] * 2))
        # each row's real tokens and per-token values as it was generated, the padding trimmed
        assert b["prompt_mask"][:, 0].any() and b["completion_mask"][:, -1].any()
        assert torch.equal(b["ref_per_token_logps"], b["completion_ids"] * 0.5)
        for i, a in enumerate(b["advantages"].tolist()):
            src = before[rows[a] // 4]
            j = rows[a] % 4
            for key in ("prompt", "completion"):
                got = b[f"{key}_ids"][i][b[f"{key}_mask"][i].bool()]
                assert torch.equal(got, src[f"{key}_ids"][j][src[f"{key}_mask"][j].bool()])
    assert largest(after) < largest(before)
    loads = np.concatenate([_group_loads(b, np.arange(0, 5, 2), COST) for b in before])
    best = min(max(loads[list(s)].sum(), loads.sum() - loads[list(s)].sum())
               for s in itertools.combinations(range(4), 2))  # fmt: skip
    assert largest(after) == pytest.approx(best, rel=1e-12)


@pytest.mark.timeout(20)
def test_what_cannot_be_exchanged_safely_stays_on_its_rank_with_a_warning():
    # 3 groups of 4 rows on 2 ranks of 6 (TRL split the middle one): no deal of whole groups
    a = rank_rows([[3]] * 4 + [[4]] * 2, [[9, 2]] * 6, 0)
    b = rank_rows([[4]] * 2 + [[5]] * 4, [[9, 9, 9, 2]] * 6, 6)
    for batches, why in (
        ([a | {"image_sizes": list(range(6))}, b], "unknown layout: image_sizes"),
        ([a, b], "cannot fill the ranks evenly"),
    ):
        with pytest.warns(UserWarning, match=why):
            out = exchange(batches, generations=4)
        assert all(o is s for o, s in zip(out, batches, strict=True))


@pytest.mark.timeout(60)
@settings(max_examples=40)
@given(st.integers(2, 4), st.integers(1, 3), st.integers(1, 3), st.data())
def test_every_deal_keeps_groups_whole_and_never_makes_the_largest_rank_heavier(
    ranks, per_rank, size, data
):
    groups = ranks * per_rank
    p = np.repeat(data.draw(st.lists(st.integers(1, 6), min_size=groups, max_size=groups)), size)
    c = np.array(
        data.draw(st.lists(st.integers(0, 6), min_size=groups * size, max_size=groups * size))
    )
    cols = torch.arange(6)
    seqs = {
        "prompt_ids": torch.as_tensor(np.arange(groups * size) // size + 1)[:, None].expand(-1, 6),
        "prompt_mask": (cols >= 6 - torch.as_tensor(p)[:, None]).long(),
        "completion_mask": (cols < torch.as_tensor(c)[:, None]).long(),
    }
    rows = _rank_rows(seqs, ranks, size, COST)
    assert rows.shape == (ranks, per_rank * size)
    assert sorted(rows.ravel().tolist()) == list(range(groups * size))
    loads = _group_loads(seqs, np.arange(0, groups * size + 1, size), COST)
    for share in rows:  # whole groups: each group's rows together
        assert (np.bincount(share // size, minlength=groups) % size == 0).all()
    largest = max(loads[np.unique(share // size)].sum() for share in rows)
    assert largest <= loads.reshape(ranks, per_rank).sum(1).max()
