"""Stream-best-fit and StreamDataset against a plain reference packer (``support/reference.py``).

The reference keeps waiting examples in a dict of Python lists and open rows
in a list, and follows the rules of ``core/stream_packer.py``'s docstring: the
example whose time is up (``window`` arrivals later) goes to the open row with
the fewest cells left that fit (equal rooms: the row that has had its room
longest), else a new row, closing the fullest open row first when
``max_open_rows`` are open; the row then takes the longest waiting example
that fits, ties in the seeded order; a full row closes; ``finish`` places the
rest longest first and closes the open rows fullest first.
"""

import itertools
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from exactpack import plan_rows
from exactpack.core import engine
from exactpack.core.stream_packer import StreamPacker, bucket_sides
from exactpack.training.stream import StreamDataset

from support.reference import (
    Layout,
    Placed,
    StreamReference,
    balanced_slots,
    seeded_side,
    split_ranges,
    stream_plan,
)
from support.strategies import BINDING, scaled

ENGINES = ["python", "native"] if engine.native_available() else ["python"]


@st.composite
def streams(draw, max_capacity=16, max_examples=80):
    capacity = draw(st.integers(1, max_capacity))
    lengths = draw(st.lists(st.integers(1, capacity), max_size=max_examples))
    window = draw(st.integers(1, 12))
    max_open = draw(st.integers(1, 6))
    seed = draw(st.one_of(st.integers(0, 5), st.integers(-(2**63), 2**64 - 1)))
    cuts = sorted(draw(st.lists(st.integers(0, len(lengths)), max_size=4)))
    return lengths, capacity, window, max_open, seed, cuts


def chunks(lengths, cuts):
    bounds = [0, *cuts, len(lengths)]
    return [lengths[a:b] for a, b in itertools.pairwise(bounds)]


def triples(placements):
    """``(example, row, start)`` per placement, as the reference lists them."""
    return list(zip(*(c.tolist() for c in placements), strict=True))


@settings(max_examples=scaled(150))
@given(streams(), st.sampled_from(ENGINES))
def test_every_push_returns_what_the_reference_closes(case, engine_name):
    lengths, capacity, window, max_open, seed, cuts = case
    packer = StreamPacker(
        capacity, lookahead=window, max_open_rows=max_open, seed=seed, kernels=engine_name
    )
    ref = StreamReference(capacity, window, max_open, seed)
    for part in chunks(lengths, cuts):
        got = packer.push(np.asarray(part, dtype=np.int64))
        want = ref.push(part)
        assert triples(got) == want
        assert packer.rows_emitted == ref.rows
        assert packer.open_rows == len(ref.open)
        assert packer.buffered == len(ref.length_of)
    got = packer.finish()
    assert triples(got) == ref.finish()
    assert packer.rows_emitted == ref.rows and packer.open_rows == packer.buffered == 0


@given(streams())
def test_a_restored_packer_continues_as_the_reference(case):
    lengths, capacity, window, max_open, seed, cuts = case
    cut = cuts[0] if cuts else len(lengths) // 2
    first = StreamPacker(capacity, lookahead=window, max_open_rows=max_open, seed=seed)
    first.push(np.asarray(lengths[:cut], dtype=np.int64))
    resumed = StreamPacker.from_state_dict(first.state_dict())
    ref = StreamReference(capacity, window, max_open, seed)
    ref.push(lengths[:cut])
    got = resumed.push(np.asarray(lengths[cut:], dtype=np.int64))
    assert triples(got) == ref.push(lengths[cut:])
    assert triples(resumed.finish()) == ref.finish()


@given(streams())
def test_the_in_memory_policy_is_the_reference_stream(case):
    lengths, capacity, window, max_open, seed, _ = case
    plan = plan_rows(
        lengths, capacity, "stream-best-fit", lookahead=window, max_open_rows=max_open, seed=seed
    )
    want = stream_plan(lengths, capacity, window, max_open, seed)
    assert sorted(want) == sorted(
        zip(range(len(lengths)), plan.row_of.tolist(), plan.start_of.tolist(), strict=True)
    )
    assert plan.num_rows == (max(r for _, r, _ in want) + 1 if want else 0)


@given(st.integers(-(2**63), 2**64 - 1), st.lists(st.integers(0, 2**40), max_size=20))
def test_the_seeded_tie_order_is_splitmix64(seed, index):
    sides = bucket_sides(np.asarray(index, dtype=np.int64), seed)
    assert sides.tolist() == [seeded_side(i, seed) for i in index]


def test_the_seed_changes_tie_order_and_only_that():
    """Equal lengths leave in a seeded order: different seeds, same rows' lengths."""
    lengths = [2] * 12 + [3] * 6
    plans = {s: stream_plan(lengths, 7, 20, 3, s) for s in range(8)}
    assert len({tuple(p) for p in plans.values()}) > 1
    shapes = {
        tuple(sorted((r, lengths[e]) for e, r, _ in p)) for p in plans.values()
    }  # which lengths share rows
    assert len(shapes) == 1


# ----------------------------------------------------------------- StreamDataset


#: Supervision columns a mapping may carry together (labels and loss_mask exclude each other).
SUPERVISION_SETS = [
    ("labels",),
    ("completion_mask",),
    ("labels", "completion_mask"),
    ("completion_mask", "assistant_masks"),
    ("labels", "completion_mask", "assistant_masks"),
    ("loss_mask", "assistant_masks"),
]


def reference_flags(doc) -> list[bool]:
    """A target is supervised when every column present says so (the AND, written out).

    ``completion_mask`` is not among them: these rows have no ``prompt`` / ``completion``,
    and TRL 1.16's default ``completion_only_loss=None`` applies it only to such rows
    (``SFTTrainer.__init__``), so the whole sequence trains as far as it is concerned."""
    ids = doc["input_ids"]
    flags = [True] * (len(ids) - 1)
    for name in ("labels", "loss_mask", "assistant_masks"):
        if name in doc:
            per_token = [v != -100 if name == "labels" else bool(v) for v in doc[name]]
            flags = [f and p for f, p in zip(flags, per_token[1:], strict=True)]
    return flags


@st.composite
def stream_datasets(draw):
    capacity = draw(st.integers(2, 10))
    split = draw(st.booleans())
    longest = 3 * capacity if split else capacity + 1
    docs = []
    for i in range(draw(st.integers(1, 25))):
        n = draw(st.integers(2, longest))
        ids = draw(st.lists(st.integers(0, 265), min_size=n, max_size=n))
        if draw(st.booleans()):
            doc = {"id": f"d{i}", "input_ids": ids}
            for name in draw(st.sampled_from(SUPERVISION_SETS)):
                if name == "labels":
                    doc[name] = [t if draw(st.booleans()) else -100 for t in ids]
                else:  # one 0/1 per token (the first token's is no target's)
                    doc[name] = [int(draw(st.booleans())) for _ in ids]
            docs.append(doc)
        else:
            docs.append(ids)
    settings_ = {
        "max_length": capacity,
        "cut_long": split,
        "rows_per_micro_batch": draw(st.integers(1, 3)),
        "micro_batches": draw(st.integers(1, 2)),
        "world_size": draw(st.integers(1, 2)),
        "lookahead": draw(st.integers(1, 6)),
        "max_open_rows": draw(st.integers(1, 3)),
        "seed": draw(st.integers(0, 3)),
        "balance": draw(st.sampled_from(["tokens", "attention", "none"])),
        "read_chunk": draw(st.integers(1, 9)),
    }
    return docs, settings_


def reference_examples(docs, capacity):
    """``(source id, range start, window, flags)`` per example, in stream order."""
    out = []
    for i, doc in enumerate(docs):
        if isinstance(doc, dict):
            ids, sid, flags = doc["input_ids"], doc["id"], reference_flags(doc)
        else:
            ids, sid, flags = doc, str(i), [True] * (len(doc) - 1)
        for start, end in split_ranges(len(ids), capacity):
            out.append((sid, start, ids[start:end], flags[start : end - 1]))
    return out


def reference_slots(docs, s, rank):
    """Per scheduled call of ``rank``: (step, micro, global rows, step eligible, placements)."""
    examples = reference_examples(docs, s["max_length"])
    lengths = [len(w) - 1 for _, _, w, _ in examples]
    plan = stream_plan(lengths, s["max_length"], s["lookahead"], s["max_open_rows"], s["seed"])
    rows: dict[int, list[tuple[int, int]]] = {}
    for e, r, start in plan:
        rows.setdefault(r, []).append((e, start))
    per_step = s["world_size"] * s["micro_batches"] * s["rows_per_micro_batch"]
    out = []
    for step, first in enumerate(range(0, len(rows), per_step)):
        step_rows = list(range(first, min(first + per_step, len(rows))))

        def load(r):
            sizes = [lengths[e] for e, _ in rows[r]]
            if s["balance"] == "tokens":
                return float(sum(sizes))
            return float(sum(n * n for n in sizes)) if s["balance"] == "attention" else 0.0

        groups = balanced_slots(
            [load(r) for r in step_rows],
            s["world_size"] * s["micro_batches"],
            s["rows_per_micro_batch"],
        )
        eligible = sum(sum(examples[e][3]) for r in step_rows for e, _ in rows[r])
        for micro in range(s["micro_batches"]):
            members = [step_rows[i] for i in groups[rank * s["micro_batches"] + micro]]
            out.append((step, micro, members, eligible, {r: rows[r] for r in members}))
    return examples, lengths, out


@settings(max_examples=scaled(60))
@given(stream_datasets())
def test_stream_dataset_yields_the_reference_schedule_and_cells(case):
    docs, s = case
    for rank in range(s["world_size"]):
        ds = StreamDataset(docs, binding=BINDING, rank=rank, **s)
        got = list(ds)
        examples, lengths, want = reference_slots(docs, s, rank)
        assert len(got) == len(want)
        for index, (item, (step, micro, members, eligible, rows)) in enumerate(
            zip(got, want, strict=True)
        ):
            slot = item.slot
            assert (slot.step, slot.rank, slot.micro, slot.index) == (step, rank, micro, index)
            assert list(slot.rows) == members and slot.step_eligible == eligible
            batch = item.batch
            assert batch.shape == (len(members), s["max_length"])
            placed = [
                Placed(e, local, start, start + lengths[e], examples[e][2], examples[e][3])
                for local, r in enumerate(members)
                for e, start in rows[r]
            ]
            layout = Layout.build(placed, len(members), s["max_length"])
            for name, cells in layout.cells().items():
                assert getattr(batch, name).tolist() == cells, name
            occ = batch.occurrences
            for o, sid, start in zip(occ.ordinal, occ.source_ids, occ.range_starts, strict=True):
                assert (str(sid), int(start)) == examples[int(o)][:2]
            if members:
                assert batch.first_row == members[0]


def _resumed_slots(docs, s, rank, cut):
    """The slots a dataset yields after a fresh one yielded ``cut`` and saved its state."""
    first = StreamDataset(docs, binding=BINDING, rank=rank, **s)
    items = iter(first)
    for _ in range(cut):
        next(items)
    resumed = StreamDataset(docs, binding=BINDING, rank=rank, **s)
    resumed.load_state_dict(first.state_dict())
    return [(i.slot.step, i.slot.micro, list(i.slot.rows), i.slot.index) for i in resumed]


def test_a_resumed_stream_continues_at_every_micro_batch_boundary_by_hand():
    """Six documents of 5 tokens fill a row of 4 pairs each and close in order; three
    micro-batches of one row a step: (step, micro, rows, index) written out."""
    docs = [[1 + d, 2, 3, 4, 5] for d in range(6)]
    s = {"max_length": 4, "rows_per_micro_batch": 1, "micro_batches": 3, "lookahead": 1}
    want = [(0, 0, [0], 0), (0, 1, [1], 1), (0, 2, [2], 2),
            (1, 0, [3], 3), (1, 1, [4], 4), (1, 2, [5], 5)]  # fmt: skip
    assert _resumed_slots(docs, s, 0, 0) == want
    for cut in range(len(want) + 1):  # after every micro-batch, the step's last included
        assert _resumed_slots(docs, s, 0, cut) == want[cut:], cut


@settings(max_examples=scaled(8), deadline=None)
@given(stream_datasets(), st.integers(2, 3))
@example(([[1, 2, 3, 4, 5]] * 7, {"max_length": 4, "rows_per_micro_batch": 1, "micro_batches": 3,
          "world_size": 1, "lookahead": 2, "max_open_rows": 1, "seed": 0, "balance": "tokens",
          "cut_long": False, "read_chunk": 2}), 3)  # fmt: skip
def test_a_resumed_stream_dataset_continues_as_the_reference_schedule(case, micro):
    """Saved after any number of calls (every micro-batch boundary of every step), a
    resumed dataset yields exactly the reference's remaining calls: none repeated."""
    docs, s = case
    s = {**s, "micro_batches": micro}
    for rank in range(s["world_size"]):
        _, _, want = reference_slots(docs, s, rank)
        listed = [(step, m, members, k) for k, (step, m, members, _, _) in enumerate(want)]
        for cut in range(len(listed) + 1):
            assert _resumed_slots(docs, s, rank, cut) == listed[cut:], (rank, cut)


@pytest.mark.parametrize("capacity", [1, 3, 7])
def test_split_ranges_keep_every_pair_once(capacity):
    for tokens in range(2, 30):
        ranges = split_ranges(tokens, capacity)
        pairs = [(a + j, a + j + 1) for a, b in ranges for j in range(b - a - 1)]
        assert pairs == [(t, t + 1) for t in range(tokens - 1)]
        assert all(b - a - 1 <= capacity for a, b in split_ranges(tokens, capacity))


@given(streams(), st.sampled_from(ENGINES))
def test_a_restored_state_saves_back_to_itself(case, engine_name):
    """Restoring rebuilds rooms, bucket order and stamps: saving again gives the same state,
    and both packers go on alike."""
    lengths, capacity, window, max_open, seed, cuts = case
    cut = cuts[-1] if cuts else len(lengths)
    first = StreamPacker(
        capacity, lookahead=window, max_open_rows=max_open, seed=seed, kernels=engine_name
    )
    first.push(np.asarray(lengths[:cut], dtype=np.int64))
    state = first.state_dict()
    again = StreamPacker.from_state_dict(state, kernels=engine_name)
    assert again.state_dict() == state
    more = np.asarray(lengths[: len(lengths) - cut], dtype=np.int64)
    assert triples(again.push(more)) == triples(first.push(more))
    assert again.state_dict() == first.state_dict()


@settings(max_examples=scaled(100))
@given(stream_datasets())
def test_mapping_flags_are_the_and_of_every_supervision_column(case):
    """The stream's per-document rule (``core.supervision.mapping_flags``) is the AND."""
    from exactpack.core.supervision import mapping_flags

    docs, _ = case
    for doc in docs:
        if not isinstance(doc, dict):
            continue
        tokens = np.asarray(doc["input_ids"], dtype=np.int32)
        flags = mapping_flags(doc, tokens, "doc")
        want = reference_flags(doc)
        assert (flags is None and all(want)) or flags.tolist() == want


@settings(max_examples=scaled(40), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stream_datasets())
def test_the_stream_and_the_file_pack_supervise_the_same_targets(tmp_path_factory, case):
    """The same mappings streamed and packed from a JSON Lines file: every example's loss
    flags are the reference AND on both routes (one reader each, one rule)."""
    from exactpack.io.store import load_packed
    from exactpack.pipeline.local import pack_path

    docs, s = case
    docs = [file_record(i, d) for i, d in enumerate(docs)]
    want = {}
    for sid, start, window, flags in reference_examples(docs, s["max_length"]):
        want[(sid, start)] = (window, flags)
    streamed = {}
    for rank in range(s["world_size"]):
        for item in StreamDataset(docs, binding=BINDING, rank=rank, **s):
            streamed.update(cells_by_example(item.batch))
    assert streamed == want
    path = tmp_path_factory.mktemp("stream-vs-file")
    (path / "d.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    pack_path(path / "d.jsonl", path / "out", max_length=s["max_length"],
              cut_long=s["cut_long"], vocab_size=BINDING.vocab_size)  # fmt: skip
    packed = {}
    for batch in load_packed(path / "out"):
        packed.update(cells_by_example(batch))
    assert packed == want


def file_record(i, doc):
    """``doc`` as a record one JSON Lines file can hold beside the others: an id, and a
    ``loss_mask`` (which a file may not mix with ``labels``) folded into
    ``assistant_masks`` (one 0/1 per token too, always ANDed alike)."""
    if not isinstance(doc, dict):
        return {"id": f"p{i}", "input_ids": doc}
    doc = dict(doc)
    if "loss_mask" in doc:
        mask = doc.pop("loss_mask")
        other = doc.get("assistant_masks", [1] * len(mask))
        doc["assistant_masks"] = [a & b for a, b in zip(mask, other, strict=True)]
    return doc


def cells_by_example(batch):
    """``{(source id, range start): (window, loss flags)}`` read out of a batch's cells."""
    out = {}
    occ = batch.occurrences
    for i in range(len(occ)):
        r, a, b = int(occ.row[i]), int(occ.col_start[i]), int(occ.col_end[i])
        window = [*batch.inputs[r, a:b].tolist(), int(batch.targets[r, b - 1])]
        key = (str(occ.source_ids[i]), int(occ.range_starts[i]))
        out[key] = (window, batch.loss_mask[r, a:b].tolist())
    return out
