"""Saved states are checked before they are trusted: plans, stream packers, samplers, streams.

Each invariant a loader relies on has a case that breaks it and must end in
one exactpack error (never a NumPy error, a wrong result or an allocation the
file merely claims).
"""

import io
import itertools
import json
import tracemalloc
import zipfile

import numpy as np
import pytest

from exactpack.core.errors import BudgetExceeded, InvalidInput
from exactpack.core.plan import Plan
from exactpack.core.policies import plan_rows
from exactpack.core.stream_packer import StreamPacker, stream_bytes
from exactpack.training.distributed import RowSampler

from support.integrity_cases import STATES, StateCase, run_state
from support.strategies import BINDING

# ---------------------------------------------------------------- plans


@pytest.fixture
def plan():
    return plan_rows(np.array([3, 2, 4, 1, 6]), 6, "best-fit-decreasing")


def _edited(plan, **changes):
    return {**plan.to_dict(), **changes}


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"lengths": [3, 0, 4, 1, 6]}, "lengths must lie in [1, capacity 6]"),
        ({"lengths": [3, -2, 4, 1, 6]}, "lengths must lie in [1, capacity 6]"),
        ({"lengths": [3.0, 2, 4, 1, 6]}, "lengths must hold integers, got float64"),
        ({"lengths": [3.7, 2, 4, 1, 6]}, "lengths must hold integers"),
        ({"lengths": [True, 2, 4, 1, 6]}, "lengths must hold integers"),
        ({"lengths": [2**70, 2, 4, 1, 6]}, "lengths must hold integers, got object"),
        ({"lengths": [[3], [2], [4], [1], [6]]}, "lengths must be 1-D"),
        ({"capacity": 0}, "capacity 0 lies outside [1, 2,147,483,647]"),
        ({"capacity": 2**62}, "capacity 4,611,686,018,427,387,904 lies outside"),
        ({"capacity": 6.0}, "capacity must be an integer, got 6.0"),
        ({"capacity": True}, "capacity must be an integer"),
        ({"num_rows": -1}, "num_rows -1 lies outside"),
        ({"num_rows": 99}, "99 rows for 5 examples"),
        ({"row_of": [0, 0, 0, 0, 0]}, "two examples on the same cells"),
        ({"start_of": [5, 0, 0, 0, 0]}, "outside its row"),
        ({"start_of": [-1, 0, 0, 0, 0]}, "outside its row"),
        ({"start_of": [2**62, 0, 0, 0, 0]}, "outside its row"),
        ({"row_of": [0, 1, 2, 3, 9]}, "row outside 0..num_rows-1"),
        ({"policy": 7}, "policy must be a name"),
        ({"lengths": [3, 2, 4, 1]}, "one entry per example"),
    ],
)
def test_a_plan_that_breaks_an_invariant_is_refused(plan, changes, needle):
    with pytest.raises(InvalidInput) as info:
        Plan.from_dict(_edited(plan, **changes))
    assert needle in str(info.value)


def test_an_overfull_row_is_refused(plan):
    # Two examples of 4 in one row of 6: starts 0 and 2 overlap, 0 and 4 overflow.
    for starts in ([0, 2], [0, 4]):
        data = {"policy": "x", "capacity": 6, "num_rows": 1, "lengths": [4, 4],
                "row_of": [0, 0], "start_of": starts}  # fmt: skip
        with pytest.raises(InvalidInput, match=r"same cells|outside its row"):
            Plan.from_dict(data)


def test_a_saved_plan_round_trips(plan, tmp_path):
    plan.save(tmp_path / "p.npz")
    got = Plan.load(tmp_path / "p.npz")
    assert got.to_dict() == plan.to_dict()


def _npz(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        for name, data in members.items():
            archive.writestr(f"{name}.npy", data)
    return buf.getvalue()


def _npy(array: np.ndarray, claim: tuple[int, ...] | None = None, dtype=None) -> bytes:
    """``.npy`` bytes of ``array``; ``claim`` replaces the shape its header declares."""
    buf = io.BytesIO()
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype or array.dtype)),
              "fortran_order": False, "shape": claim or array.shape}  # fmt: skip
    np.lib.format.write_array_header_1_0(buf, header)
    buf.write(array.tobytes())
    return buf.getvalue()


def _plan_members(plan, **replace: bytes) -> dict[str, bytes]:
    header = json.dumps({"policy": plan.policy, "capacity": 6, "num_rows": plan.num_rows})
    members = {"header": _npy(np.frombuffer(header.encode(), dtype=np.uint8))}
    for name in ("lengths", "row_of", "start_of"):
        members[name] = _npy(getattr(plan, name))
    return members | replace


def test_a_header_that_claims_a_huge_array_allocates_nothing(plan, tmp_path):
    path = tmp_path / "p.npz"
    path.write_bytes(_npz(_plan_members(plan, lengths=_npy(plan.lengths, claim=(2**40,)))))
    tracemalloc.start()
    with pytest.raises(InvalidInput, match=r"lengths claims 8,796,093,022,208 bytes"):
        Plan.load(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20  # nothing near the claim was allocated


@pytest.mark.parametrize(
    ("members", "needle"),
    [
        ({"lengths": b"garbage"}, "not a exactpack plan"),
        ({"lengths": None}, "There is no item named 'lengths.npy'"),
        ({"lengths": "object"}, "not 1-D integers"),
        ({"lengths": "float"}, "not 1-D integers"),
        ({"lengths": "2-D"}, "not 1-D integers"),
        ({"lengths": "short"}, "cut short"),
        ({"header": "list"}, "the plan header is not a JSON object"),
        ({"header": "not-json"}, "not a exactpack plan"),
    ],
)
def test_a_damaged_plan_file_is_one_error(plan, tmp_path, members, needle):
    made = {
        "object": _npy(np.array([1, 2, 3, 4, 5], dtype=np.int64), dtype=object),
        "float": _npy(plan.lengths.astype(np.float64)),
        "2-D": _npy(plan.lengths.reshape(1, 5)),
        "short": _npy(plan.lengths)[:-8],
        "list": _npy(np.frombuffer(b"[1, 2]", dtype=np.uint8)),
        "not-json": _npy(np.frombuffer(b"{oops", dtype=np.uint8)),
    }
    replace = {k: made.get(v, v) if isinstance(v, str) else v for k, v in members.items()}
    built = _plan_members(plan, **{k: v for k, v in replace.items() if v is not None})
    for name in [k for k, v in replace.items() if v is None]:
        del built[name]
    (tmp_path / "p.npz").write_bytes(_npz(built))
    with pytest.raises(InvalidInput) as info:
        Plan.load(tmp_path / "p.npz")
    assert needle in str(info.value) and "p.npz" in str(info.value)


def test_not_a_zip_at_all(tmp_path):
    (tmp_path / "p.npz").write_bytes(b"\x80\x04pickle")
    with pytest.raises(InvalidInput, match=r"p\.npz: not a exactpack plan"):
        Plan.load(tmp_path / "p.npz")


def test_a_plan_budget_is_checked_before_reading(plan, tmp_path):
    plan.save(tmp_path / "p.npz")
    with pytest.raises(BudgetExceeded, match="need 120 bytes but max_bytes is 100"):
        Plan.load(tmp_path / "p.npz", max_bytes=100)
    assert Plan.load(tmp_path / "p.npz", max_bytes=120).num_rows == plan.num_rows


# ---------------------------------------------------------------- stream packer states


@pytest.fixture
def state():
    packer = StreamPacker(8, lookahead=4, max_open_rows=2, seed=3)
    packer.push([3, 5, 2, 7, 1, 4, 6, 2, 2])
    return json.loads(json.dumps(packer.state_dict()))


def _remove_an_example(state):
    state["buffer"]["example"].pop(0)
    state["buffer"]["length"].pop(0)


def _remove_from_a_row(state):
    row = next(r for r in state["open_rows"] if len(r["example"]) > 1)
    row["example"].pop()
    row["length"].pop()


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda s: s.update(rows_emitted=-1), "rows_emitted -1 lies outside"),
        (lambda s: s.update(examples_pushed=-3), "examples_pushed -3 lies outside"),
        (lambda s: s.update(window=2.0), "window must be an integer, got 2.0"),
        (lambda s: s.update(capacity=True), "capacity must be an integer"),
        (lambda s: s.update(capacity=0), "capacity 0 lies outside"),
        (lambda s: s.update(finished="no"), "finished must be true or false"),
        (lambda s: s.pop("buffer"), "has no 'buffer'"),
        (
            lambda s: s.update(format="exactpack.stream-best-fit/1"),
            "save it again with state_dict()",
        ),
        (_remove_an_example, "an example removed or added"),
        (_remove_from_a_row, "an example removed or added"),
        (lambda s: s["buffer"]["length"].__setitem__(0, 9), "buffer state's length holds a value"),
        (lambda s: s["buffer"]["length"].__setitem__(0, 1.5), "must be a list of integers"),
        (lambda s: s["buffer"]["example"].reverse(), "not in arrival order"),
        (lambda s: s["open_rows"][0]["length"].append(7), "empty, full"),
        (lambda s: s["open_rows"].__setitem__(-1, s["open_rows"][0]), "waiting and placed, or"),
        (lambda s: s.update(window=10**10), "window 10,000,000,000 lies outside"),
        (lambda s: s.update(examples_emitted=s["examples_emitted"] + 1), "removed or added"),
        (lambda s: s.update(rows_emitted=10**6), "rows_emitted 1,000,000 lies outside"),
    ],
)
def test_a_stream_state_that_breaks_an_invariant_is_refused(state, edit, needle):
    edit(state)
    with pytest.raises(InvalidInput) as info:
        StreamPacker.from_state_dict(state)
    assert needle in str(info.value)
    with pytest.raises(InvalidInput):
        StreamPacker(8, lookahead=4, max_open_rows=2, seed=3).load_state_dict(state)


def test_a_huge_window_in_a_state_is_refused_before_allocating(state):
    state["window"] = 2**31 - 1
    tracemalloc.start()
    with pytest.raises(BudgetExceeded, match=r"restoring the stream-best-fit state needs"):
        StreamPacker.from_state_dict(state)
    assert tracemalloc.get_traced_memory()[1] < 1 << 20
    tracemalloc.stop()
    assert stream_bytes(8, 2**31 - 1, 2) > 10**11


def test_a_larger_window_restores_with_a_larger_budget(state):
    packer = StreamPacker(8, lookahead=100_000, max_open_rows=2, seed=3)
    packer.push([3, 5, 2])
    saved = packer.state_dict()
    need = stream_bytes(8, 100_000, 2)
    with pytest.raises(BudgetExceeded):
        StreamPacker.from_state_dict(saved, max_bytes=need - 1)
    assert StreamPacker.from_state_dict(saved, max_bytes=need).examples_pushed == 3


def test_a_refused_state_leaves_the_packer_as_it_was(state):
    packer = StreamPacker(8, lookahead=4, max_open_rows=2, seed=3)
    packer.push([1, 2])
    before = packer.state_dict()
    _remove_an_example(state)
    with pytest.raises(InvalidInput):
        packer.load_state_dict(state)
    assert packer.state_dict() == before


def test_every_example_still_comes_out_after_a_round_trip(state):
    packer = StreamPacker.from_state_dict(state)
    placed = packer.finish()
    held = set(state["buffer"]["example"]) | {e for r in state["open_rows"] for e in r["example"]}
    assert set(placed.example.tolist()) == held


# ---------------------------------------------------------------- samplers and streams


def _sampler():
    from exactpack.training.distributed import RowStats

    tokens = np.arange(1, 9, dtype=np.int64)
    stats = RowStats(tokens, tokens, (tokens**2).astype(np.float64))
    return RowSampler(stats, rows_per_micro_batch=2, world_size=1, rank=0)


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        ({"epoch": 1.5}, "epoch must be an integer, got 1.5"),
        ({"epoch": -1}, "epoch -1 lies outside"),
        ({"position": "2"}, "position must be an integer"),
        ({"position": 10**9}, "sampler position 1000000000 outside"),
    ],
)
def test_a_sampler_state_is_checked(edit, needle):
    sampler = _sampler()
    with pytest.raises(InvalidInput) as info:
        sampler.load_state_dict(sampler.state_dict() | edit)
    assert needle in str(info.value)
    state = sampler.state_dict()
    del state["epoch"]
    with pytest.raises(InvalidInput, match="has no 'epoch'"):
        sampler.load_state_dict(state)


def _stream(docs, **kw):
    from exactpack.training.stream import StreamDataset

    kw = {"binding": BINDING} | kw
    return StreamDataset(docs, max_length=8, rows_per_micro_batch=1, world_size=1, rank=0,
                         lookahead=4, **kw)  # fmt: skip


def _stream_state():
    docs = [[0, 5, 6, 1], [0, 7, 1], [0, 8, 9, 10, 1]] * 3
    ds = _stream(docs)
    it = iter(ds)
    next(it)
    return docs, ds.state_dict()


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda s: s["packer"].update(window=10**10), "window 10,000,000,000 lies outside"),
        (lambda s: s["packer"].update(window=5), "state has window=5 but this packer has 4"),
        (lambda s: s["packer"].update(rows_emitted=-1), "rows_emitted -1 lies outside"),
        (lambda s: s["closed"]["row"].append(0), "closed lists differ in length"),
        (lambda s: s.update(step=0.5), "step must be an integer"),
        (lambda s: s.update(first_doc=10**9), "docs_read"),
        (lambda s: s.pop("closed"), "has no 'closed'"),
        (lambda s: s.pop("pending_digest"), "has no 'pending_digest'"),
    ],
)
def test_a_stream_dataset_state_is_checked(edit, needle):
    docs, state = _stream_state()
    edit(state)
    ds = _stream(docs)
    ds.load_state_dict(state)
    with pytest.raises(InvalidInput) as info:
        next(iter(ds))
    assert needle in str(info.value)


def test_a_stream_packer_state_names_its_stream():
    from exactpack import BindingMismatch

    packer = StreamPacker(8, lookahead=4, stream="sha256:a")
    packer.push([3, 5, 2, 7])
    state = packer.state_dict()
    assert state["stream"] == "sha256:a"
    resumed = StreamPacker.from_state_dict(state)  # the state's own stream
    assert resumed.finish().example.tolist() == packer.finish().example.tolist()
    with pytest.raises(BindingMismatch, match="saved from stream 'sha256:a' but this packer"):
        StreamPacker(8, lookahead=4).load_state_dict(state)
    with pytest.raises(InvalidInput, match="state's stream must be a name or null, got 5"):
        StreamPacker.from_state_dict(state | {"stream": 5})
    with pytest.raises(InvalidInput, match="stream must be a name"):
        StreamPacker(8, stream="")


def test_a_stream_dataset_state_names_its_stream():
    from exactpack import Binding, BindingMismatch

    docs, state = _stream_state()
    assert state["binding"] == BINDING.to_dict()
    other = Binding(BINDING.vocab_size, "another-tokenizer", BINDING.split_id)
    with pytest.raises(
        BindingMismatch, match=f"tokenizer_id {BINDING.tokenizer_id!r} != 'another-tokenizer'"
    ):
        _stream(docs, binding=other).load_state_dict(state)
    for damaged in ([1], {"vocab_size": 1}):
        with pytest.raises(InvalidInput, match="state's binding must hold vocab_size"):
            _stream(docs).load_state_dict(state | {"binding": damaged})


@pytest.mark.timeout(30)  # both were read document by document, for ever or to the end
def test_a_resume_never_reads_past_what_the_state_pushed():
    docs, state = _stream_state()
    for edit, needle in (
        ({"docs_read": 10**15}, "docs_read 1,000,000,000,000,000 lies outside"),
        ({"docs_read": 10**15, "first_doc": 10**15}, "docs_read"),
    ):
        ds = _stream(lambda: itertools.cycle(docs))  # endless
        ds.load_state_dict(state | edit)
        with pytest.raises(InvalidInput, match=needle):
            next(iter(ds))
    ds = _stream(docs[:1])  # a sized source shorter than what the state read
    ds.load_state_dict(state)
    with pytest.raises(InvalidInput, match=r"has read \d+ documents but the source holds 1 —"):
        next(iter(ds))


# ---------------------------------------------------------------- the catalogue's cases


@pytest.mark.parametrize("case", STATES, ids=lambda c: c.name)
def test_every_catalogued_state_damage_is_refused(case: StateCase, tmp_path):
    error, message = run_state(case, tmp_path)
    assert error is case.error, message
    for needle in case.needles:
        assert needle in message, (needle, message)
