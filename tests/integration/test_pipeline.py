import json
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactpack import ExampleTable, OversizedExample, SequenceExample, plan_rows
from exactpack.core.examples import cut_long, long_ranges
from exactpack.core.policies import POLICIES
from exactpack.io.store import load_packed
from exactpack.pipeline.local import pack_path
from exactpack.pipeline.stats import stats_path

from support.packed_helpers import expected_flags, random_records, recovered_examples, write_jsonl
from support.strategies import BINDING


@given(st.lists(st.integers(1, 60), min_size=1, max_size=20), st.integers(1, 12))
def test_long_ranges_keep_every_pair_exactly_once(counts, capacity):
    source, starts, ends = long_ranges(np.array(counts), capacity)
    for doc, n in enumerate(counts):
        mine = source == doc
        s, e = starts[mine], ends[mine]
        pairs = [j for a, b in zip(s, e, strict=True) for j in range(a, b - 1)]
        assert sorted(pairs) == list(range(n - 1))  # pair j -> j+1 kept exactly once
        assert ((e - s) <= capacity + 1).all()
        assert (s[1:] == e[:-1] - 1).all()  # consecutive, one token of overlap
        assert s[0] == 0 and e[-1] == n
        if n - 1 <= capacity:
            assert mine.sum() == 1


@given(st.data())
def test_split_long_selects_interior_ranges_with_their_flags(data):
    capacity = data.draw(st.integers(1, 6))
    docs = data.draw(st.lists(st.integers(2, 20), min_size=1, max_size=6))
    examples = []
    for i, n in enumerate(docs):
        tokens = data.draw(st.lists(st.integers(0, 265), min_size=n, max_size=n))
        mask = data.draw(st.lists(st.booleans(), min_size=n - 1, max_size=n - 1))
        examples.append(
            SequenceExample.from_document(
                tokens, source_id=f"d{i}", partition="train", binding=BINDING, loss_mask=mask
            )
        )
    table = ExampleTable.from_examples(examples, "train", BINDING)
    split, count = cut_long(table, capacity)
    assert count == sum(n - 1 > capacity for n in docs)
    assert (split.lengths <= capacity).all()
    for i in range(len(split)):
        piece = split.example(i)
        whole = examples[[e.source_id for e in examples].index(piece.source_id)]
        s, e = piece.range
        assert piece.window.tolist() == whole.window[s:e].tolist()
        assert piece.loss_mask.tolist() == whole.loss_mask[s : e - 1].tolist()
        long = len(whole) > capacity
        assert piece.example_id == (f"{piece.source_id}[{s}:{e}]" if long else whole.example_id)
    plan_rows(split.lengths, capacity)  # no oversized example is left


def _check_round_trip(out, records):
    store = load_packed(out)
    got = recovered_examples(store)
    assert sorted(got) == list(range(len(records)))
    by_id = {r["id"]: r for r in records}
    for ex in got.values():
        record = by_id[ex["source_id"]]
        assert ex["tokens"] == record["input_ids"]
        assert ex["loss"] == expected_flags(record)
        assert ex["example_id"] == ex["source_id"]
        assert ex["range"] == (0, len(record["input_ids"]))
    return store


@pytest.mark.parametrize("policy", sorted(set(POLICIES) - {"padded"}))
def test_pack_path_round_trip_recovers_tokens_labels_and_provenance(tmp_path, rng, policy):
    records = random_records(rng, 120, vocab=500, max_len=40)
    path = write_jsonl(tmp_path / "d.jsonl", records)
    stats = pack_path(path, tmp_path / "out", max_length=48, policy=policy, vocab_size=500)
    plan = plan_rows([len(r["input_ids"]) - 1 for r in records], 48, policy)
    assert {k: stats[k] for k in plan.stats()} == plan.stats()
    assert stats["eligible_targets"] == sum(sum(expected_flags(r)) for r in records)
    store = _check_round_trip(tmp_path / "out", records)
    manifest = store.manifest
    assert manifest["statistics"]["rows"] == plan.num_rows == store.num_rows
    assert manifest["policy"]["name"] == policy
    assert manifest["binding"]["vocab_size"] == 500


def test_split_long_through_the_pipeline(tmp_path, rng):
    records = random_records(rng, 30, vocab=266, max_len=50)
    path = write_jsonl(tmp_path / "d.jsonl", records)
    with pytest.raises(OversizedExample, match=r"d\.jsonl line \d+: example \d+"):
        pack_path(path, tmp_path / "x", max_length=16, policy="next-fit", tokenizer="bytes")
    assert not (tmp_path / "x").exists()
    stats = pack_path(
        path, tmp_path / "out", max_length=16, policy="next-fit", tokenizer="bytes",
        cut_long=True,
    )  # fmt: skip
    long = [r for r in records if len(r["input_ids"]) - 1 > 16]
    assert stats["split_sources"] == len(long) > 0
    assert stats["tokens"] == sum(len(r["input_ids"]) - 1 for r in records)
    pieces: dict[str, dict[int, int]] = {}
    for ex in recovered_examples(load_packed(tmp_path / "out")).values():
        record = next(r for r in records if r["id"] == ex["source_id"])
        s, e = ex["range"]
        assert ex["tokens"] == record["input_ids"][s:e]
        assert ex["loss"] == expected_flags(record)[s : e - 1]
        seen = pieces.setdefault(ex["source_id"], {})
        for j in range(s, e - 1):
            seen[j] = seen.get(j, 0) + 1
    for r in records:
        assert pieces[r["id"]] == dict.fromkeys(range(len(r["input_ids"]) - 1), 1)


def test_stats_compares_every_policy_and_plots(tmp_path, rng):
    records = random_records(rng, 200, vocab=300, max_len=60)
    path = write_jsonl(tmp_path / "d.jsonl", records)
    lengths = np.array([len(r["input_ids"]) - 1 for r in records])
    started = time.perf_counter()
    report = stats_path(path, max_length=64, plot=tmp_path / "fig" / "stats.png")
    wall = time.perf_counter() - started
    assert report["tokens"] == lengths.sum() and report["examples"] == len(records)
    assert report["lower_bound"] == -(-lengths.sum() // 64)
    assert [p["policy"] for p in report["policies"]] == list(POLICIES)
    for entry in report["policies"]:
        plan = plan_rows(lengths, 64, entry["policy"])
        assert entry["rows"] == plan.num_rows
        assert entry["rows_over_lower_bound"] == plan.num_rows / report["lower_bound"]
    # Each policy's planning time is measured inside the call: together within its wall time.
    seconds = [entry["seconds"] for entry in report["policies"]]
    assert all(isinstance(t, float) and t > 0 for t in seconds) and sum(seconds) <= wall
    assert (tmp_path / "fig" / "stats.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    json.dumps(report)
    assert not list(tmp_path.glob("*.parquet"))


@pytest.mark.parametrize("fmt", ["exactpack", "trl"])
def test_the_plot_shows_the_too_long_examples_and_the_cut_line(tmp_path, monkeypatch, fmt):
    """What one needs to choose max_length: every example, the ones over it marked, in the
    format's unit (tokens for TRL's format, prediction pairs for ours)."""
    import matplotlib.figure

    records = [{"id": f"d{i}", "input_ids": list(range(1, n + 1))} for i, n in
               enumerate([5, 9, 12, 40, 41, 70, 8])]  # fmt: skip
    path = write_jsonl(tmp_path / "d.jsonl", records)
    figures = []
    monkeypatch.setattr(
        matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: figures.append(fig)
    )
    report = stats_path(path, max_length=30, format=fmt, vocab_size=100, plot=tmp_path / "s.png")
    assert report["oversized"]["examples"] == 3
    left = figures[0].axes[0]
    labels = [t.get_text() for t in left.get_legend().get_texts()]
    assert "over max_length: 3 (not packed)" in labels and "max_length 30" in labels
    unit = "tokens" if fmt == "trl" else "prediction pairs"
    assert left.get_xlabel() == f"{unit} per example"
    packed, over = left.containers  # stacked: the red bars sit on the blue ones
    assert sum(b.get_height() for b in over) == 3 and sum(b.get_height() for b in packed) == 4
    right_most = max(b.get_x() + b.get_width() for b in over)
    assert right_most >= (70 if fmt == "trl" else 69)


def test_progress_goes_to_stderr_when_asked(tmp_path, rng, capsys):
    path = write_jsonl(tmp_path / "d.jsonl", random_records(rng, 10, vocab=100, max_len=9))
    pack_path(
        path, tmp_path / "out", max_length=16, policy="next-fit", vocab_size=100, progress=True
    )
    err = capsys.readouterr().err
    assert "exactpack: reading" in err and "exactpack: writing" in err
    pack_path(path, tmp_path / "o2", max_length=16, policy="next-fit", vocab_size=100)
    assert capsys.readouterr().err == ""  # not a terminal: quiet
