from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactpack import InvalidInput
from exactpack.training.distributed import RowSampler, RowStats, schedule_rows
from exactpack.verify.fixture import fixture_batch


@given(
    n=st.integers(0, 60),
    world=st.integers(1, 4),
    micro=st.integers(1, 3),
    per=st.integers(1, 4),
    seed=st.integers(0, 5),
)
def test_every_row_once_and_every_rank_same_number_of_slots(n, world, micro, per, seed):
    loads = np.random.default_rng(seed).integers(1, 100, size=n).astype(float)
    s = schedule_rows(
        loads, world_size=world, micro_batches=micro, rows_per_micro_batch=per, seed=seed, epoch=1
    )
    got = np.sort(s.row_ids)
    assert np.array_equal(got, np.arange(n))  # none dropped, none duplicated
    assert s.steps == -(-n // (world * micro * per))
    for rank in range(world):
        slots = [s.slot(step, rank, m) for step in range(s.steps) for m in range(micro)]
        assert all(len(m) <= per for m in slots)
    # Only the last step may be short.
    for step in range(s.steps - 1):
        assert sum(len(s.slot(step, r, m)) for r in range(world) for m in range(micro)) == (
            world * micro * per
        )
    for step in range(s.steps):
        for r in range(world):
            for m in range(micro):
                assert s.loads[step, r, m] == loads[s.slot(step, r, m)].sum()


def test_deterministic_per_seed_and_epoch():
    loads = np.arange(40, dtype=float)
    a = schedule_rows(loads, world_size=2, micro_batches=2, rows_per_micro_batch=3, seed=7, epoch=0)
    b = schedule_rows(loads, world_size=2, micro_batches=2, rows_per_micro_batch=3, seed=7, epoch=0)
    c = schedule_rows(loads, world_size=2, micro_batches=2, rows_per_micro_batch=3, seed=7, epoch=1)
    assert np.array_equal(a.row_ids, b.row_ids) and np.array_equal(a.slot_offsets, b.slot_offsets)
    assert not np.array_equal(a.row_ids, c.row_ids)


def test_balancing_beats_round_robin_on_skewed_loads():
    rng = np.random.default_rng(0)
    loads = rng.lognormal(5, 1.5, size=64)
    s = schedule_rows(loads, world_size=4, micro_batches=1, rows_per_micro_batch=16, shuffle=False)
    balanced = s.loads[0, :, 0]
    naive = np.array([loads[r::4].sum() for r in range(4)])
    assert balanced.max() - balanced.min() < naive.max() - naive.min()


def test_short_final_step_is_explicitly_empty_not_dropped():
    s = schedule_rows(
        np.ones(5), world_size=2, micro_batches=1, rows_per_micro_batch=2, shuffle=False
    )
    assert s.steps == 2
    last = [len(s.slot(1, r, 0)) for r in range(2)]
    assert sorted(last) == [0, 1]


def test_attention_cost_balancing_uses_squared_lengths():
    # rows [4], [2, 2] and [1, 1, 1, 1]
    rows = RowStats.from_segments([4, 2, 2, 1, 1, 1, 1], [0, 1, 1, 2, 2, 2, 2], [4, 4, 4])
    assert rows.costs("tokens").tolist() == [4, 4, 4]
    assert rows.costs("attention").tolist() == [16, 8, 4]


def test_bad_arguments():
    with pytest.raises(InvalidInput, match="world_size must be an integer in"):
        schedule_rows(np.ones(3), world_size=0, micro_batches=1, rows_per_micro_batch=1)


def _reference_balance(rows, loads, slots, per_slot):
    """The plain algorithm: heaviest first, to the open slot with least load (lowest index)."""
    cap = min(per_slot, -(-len(rows) // slots)) if len(rows) else 0
    groups = [[] for _ in range(slots)]
    load = np.zeros(slots)
    for i in np.argsort(-loads, kind="stable"):
        open_slots = [s for s in range(slots) if len(groups[s]) < cap]
        target = min(open_slots, key=lambda s: (load[s], s))
        groups[target].append(int(rows[i]))
        load[target] += loads[i]
    return [sorted(g) for g in groups], load


@given(
    n=st.integers(0, 40),
    slots=st.integers(1, 6),
    per=st.integers(1, 8),
    ties=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_heap_balancing_equals_the_plain_greedy(n, slots, per, ties, seed):
    from exactpack.training.distributed import _balance_step

    rng = np.random.default_rng(seed)
    n = min(n, slots * per)
    loads = rng.integers(1, 4, size=n).astype(float) if ties else rng.lognormal(3, 1, size=n)
    rows = rng.permutation(100)[:n]
    got_groups, got_load = _balance_step(rows, loads, slots, per)
    want_groups, want_load = _reference_balance(rows, loads, slots, per)
    assert got_groups == want_groups
    assert np.array_equal(got_load, want_load)


def test_sampler_and_stats_reject_bad_settings():
    stats = RowStats.from_batches([fixture_batch()])
    with pytest.raises(InvalidInput, match="unknown balance"):
        RowSampler(stats, rows_per_micro_batch=1, balance="flops")
    with pytest.raises(InvalidInput, match="rank 2 outside"):
        RowSampler(stats, rows_per_micro_batch=1, world_size=2, rank=2)
    with pytest.raises(InvalidInput, match="micro_batches"):
        RowSampler(stats, rows_per_micro_batch=1, micro_batches=0)
    sampler = RowSampler(stats, rows_per_micro_batch=1)
    with pytest.raises(InvalidInput, match="position"):
        sampler.load_state_dict(sampler.state_dict() | {"position": 99})


#: Arguments of the training API that once allocated gigabytes or raised a traceback; each
#: must now be one ExactpackError before anything is allocated (run under a 3 GB cap).
def _bad_api_calls():
    import datasets

    import exactpack
    import exactpack.hf as H
    from exactpack.training import RowSampler, RowStats, StreamDataset

    b = exactpack.Binding(266, "t", "s")
    rs = RowStats.from_segments(np.full(5, 3), np.arange(5), np.full(5, 3))
    packed = H.pack_dataset(datasets.Dataset.from_dict({"input_ids": [[0, 1, 2]]}), 8,
                            vocab_size=266)  # fmt: skip
    docs = [[0, 1, 2]] * 10

    def stream(**kw):
        args = {"binding": b, "max_length": 8, "rows_per_micro_batch": 1} | kw
        return next(iter(StreamDataset(args.pop("documents", docs), **args)))

    return {
        "world_size 1e9": (
            lambda: RowSampler(rs, rows_per_micro_batch=1, world_size=10**9, rank=0),
            "over the",
        ),
        "micro_batches 1e9": (
            lambda: RowSampler(rs, rows_per_micro_batch=1, micro_batches=10**9),
            "over the",
        ),
        "rows_per_micro_batch 1e12": (
            lambda: RowSampler(rs, rows_per_micro_batch=10**12),
            "rows_per_micro_batch",
        ),
        "world_size '2'": (
            lambda: RowSampler(rs, rows_per_micro_batch=1, world_size="2"),
            "world_size",
        ),
        "rank 1.5": (
            lambda: RowSampler(rs, rows_per_micro_batch=1, world_size=2, rank=1.5),
            "rank",
        ),
        "stats list": (lambda: RowSampler([1, 2], rows_per_micro_batch=1), "RowStats"),
        "seed 'x'": (lambda: RowSampler(rs, rows_per_micro_batch=1, seed="x"), "seed"),
        "shuffle 'no'": (lambda: RowSampler(rs, rows_per_micro_batch=1, shuffle="no"), "shuffle"),
        "set_epoch 'x'": (lambda: RowSampler(rs, rows_per_micro_batch=1).set_epoch("x"), "epoch"),
        "stream world 1e9": (lambda: stream(world_size=10**9, rank=0), "over the"),
        "stream micro 1e9": (lambda: stream(micro_batches=10**9), "over the"),
        "stream window 1e9": (lambda: stream(lookahead=10**9), "over the"),
        "stream capacity 1e10": (lambda: stream(max_length=10**10), "capacity"),
        "stream read_chunk 1e12": (lambda: stream(read_chunk=10**12), "read_chunk"),
        "stream binding str": (lambda: stream(binding="x"), "binding"),
        "stream tokenizer str": (lambda: stream(tokenizer="bytes"), "tokenizer"),
        "stream documents int": (lambda: stream(documents=5), "documents"),
        "stream split_long 'yes'": (lambda: stream(cut_long="yes"), "cut_long"),
        "to_batches 1e12": (lambda: H.to_batches(packed, 10**12), "max_rows_per_batch"),
        "to_batches '8'": (lambda: H.to_batches(packed, "8"), "max_rows_per_batch"),
        "to_batches list": (lambda: H.to_batches([1, 2]), "pack_dataset"),
        "to_batches binding str": (lambda: H.to_batches(packed, 2, "b"), "expected_binding"),
        "schedule loads str": (
            lambda: schedule_rows("ab", world_size=1, micro_batches=1, rows_per_micro_batch=1),
            "loads",
        ),
    }


def test_api_arguments_are_refused_before_anything_is_allocated():
    """In a child process capped at 3 GB of address space (each case once asked for 7-74 GiB
    or raised AttributeError / ValueError): one ExactpackError naming the argument each."""
    import subprocess
    import sys

    code = (
        "import resource, sys; sys.path[:0] = ['tests', 'tests/integration'];"
        "resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30));"
        "import test_distributed as t, exactpack\n"
        "for name, (call, words) in t._bad_api_calls().items():\n"
        "    try:\n        call()\n    except exactpack.ExactpackError as e:\n"
        "        assert words in str(e) and '\\n' not in str(e), (name, str(e))\n"
        "        continue\n"
        "    except BaseException as e:\n        raise AssertionError((name, repr(e)))\n"
        "    raise AssertionError((name, 'accepted'))\n"
        "print('refused', len(t._bad_api_calls()))\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("refused")
