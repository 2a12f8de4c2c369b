"""The packing budget, small scale: checked before allocating, and an upper bound of the truth.

``benchmarks/stress.py`` runs the same checks on 10 million examples and
100 million tokens; here random tables of a few thousand examples show that
:func:`seqpack.pipeline.packing_bytes` bounds what :func:`pack_table`
allocates (tracemalloc sees NumPy's allocations) for every policy, and that a
budget one byte short raises :class:`~seqpack.BudgetExceeded` having
allocated nothing.
"""

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqpack import Binding, BudgetExceeded, ExampleTable
from seqpack.core.policies import POLICIES
from seqpack.pipeline.budget import packing_bytes
from seqpack.pipeline.local import pack_table

#: Allocations below this are Python bookkeeping, not packing arrays.
NOTHING = 64 << 10


def random_table(rng, n, max_len, masked):
    lengths = rng.integers(1, max_len + 1, size=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths + 1, out=offsets[1:])
    pairs = int(lengths.sum())
    ids = np.array([f"s{i}" for i in range(n)], dtype=object)
    return ExampleTable(
        windows=rng.integers(0, 1000, size=int(offsets[-1]), dtype=np.int32),
        offsets=offsets,
        loss_mask=rng.random(pairs) < 0.8 if masked else np.ones(pairs, dtype=bool),
        source_ids=ids,
        example_ids=ids,
        range_starts=np.zeros(n, dtype=np.int64),
        range_ends=lengths + 1,
        partition="train",
        binding=Binding(1000, "t", "s"),
    )


def traced_peak(fn):
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from([1, 2, 7, 300, 2500, 6000]),
    st.sampled_from([1, 3, 40, 300]),
    st.booleans(),
    st.sampled_from(sorted(POLICIES)),
)
def test_the_estimate_bounds_what_packing_allocates(seed, n, max_len, masked, policy):
    rng = np.random.default_rng(seed)
    table = random_table(rng, n, max_len, masked)
    capacity = int(rng.integers(max_len, 4 * max_len + 1))
    pack_table(table, capacity, policy)  # kernels loaded before measuring
    need = packing_bytes(table, capacity, policy)
    assert traced_peak(lambda: pack_table(table, capacity, policy)) <= need
    assert traced_peak(lambda: pack_table(table, capacity, policy, max_metadata_bytes=need)) <= need


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_budget_one_byte_short_refuses_before_allocating(rng, policy):
    table = random_table(rng, 20_000, 200, masked=True)
    need = packing_bytes(table, 256, policy)
    assert need > 20_000 * 32  # the plan and rows are in it

    def refused():
        with pytest.raises(BudgetExceeded, match=f"needs {need:,} bytes but max_metadata_bytes"):
            pack_table(table, 256, policy, max_metadata_bytes=need - 1)

    assert traced_peak(refused) < NOTHING


def test_gathering_policies_count_one_copy_of_the_tokens(rng):
    table = random_table(rng, 1000, 50, masked=True)
    keep = packing_bytes(table, 64, "next-fit")
    gather = packing_bytes(table, 64, "first-fit-decreasing")
    extra = table.windows.nbytes + table.loss_mask.nbytes
    assert gather - keep == extra + 1000 * (128 - 64) + 64 * 16
