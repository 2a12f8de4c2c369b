"""exactpack.ray on a local 2-CPU Ray instance (started once for the module)."""

import hashlib
import itertools
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactpack import BudgetExceeded, InvalidInput, Split, SplitMismatch, data_digest
from exactpack.cli import main
from exactpack.core.config import PackConfig
from exactpack.io.readers import load_examples, read_documents
from exactpack.io.store import load_packed
from exactpack.pipeline.budget import check_budget
from exactpack.pipeline.local import pack_path
from exactpack.ray.shard_layout import RayTaskFailed, ShardCuts

from support.packed_helpers import expected_flags, random_records, recovered_examples
from support.ray_helpers import private_loopback_ray

CAPACITY = 128
VOCAB = 1000
SHARD_SIZES = (700, 1100, 900, 1450)
PINNED = "sha256:pinned-split"


@pytest.fixture(scope="module")
def ray_instance():
    ray = pytest.importorskip("ray")
    with private_loopback_ray() as session:
        try:
            ray.init(
                address="local",
                num_cpus=2,
                include_dashboard=False,
                _temp_dir=session,
                logging_level=logging.ERROR,
            )
            yield ray
        finally:
            ray.shutdown()


@pytest.fixture(scope="module")
def records():
    rows = random_records(np.random.default_rng(88), sum(SHARD_SIZES), vocab=VOCAB, max_len=100)
    return [r | {"labels": r.get("labels")} for r in rows]


def _write_shards(folder, records, with_ids=True):
    folder.mkdir(parents=True, exist_ok=True)
    bounds = np.cumsum((0, *SHARD_SIZES))
    for k, (a, b) in enumerate(itertools.pairwise(bounds)):
        rows = [r if with_ids else {"input_ids": r["input_ids"]} for r in records[a:b]]
        table = pa.Table.from_pylist(rows)
        if "input_ids" in table.column_names:
            ids = table.column("input_ids").cast(pa.list_(pa.int32()))
            table = table.set_column(table.schema.get_field_index("input_ids"), "input_ids", ids)
        pq.write_table(table, folder / f"part-{k:02d}.parquet", row_group_size=256)
    return folder


@pytest.fixture(scope="module")
def shards(tmp_path_factory, records):
    return _write_shards(tmp_path_factory.mktemp("in") / "shards", records)


@pytest.fixture(scope="module")
def packed_blocks(ray_instance, shards, tmp_path_factory):
    """Blocks of 1,000 examples across shard boundaries, best-fit-decreasing."""
    out = tmp_path_factory.mktemp("out") / "blocks"
    from exactpack.ray import pack

    stats = pack(
        shards,
        out,
        max_length=CAPACITY,
        vocab_size=VOCAB,
        block_examples=1000,
        split_id=PINNED,
        progress=False,
    )
    return out, stats


def _pack(*args, **kwargs):
    from exactpack.ray import pack

    return pack(*args, max_length=CAPACITY, vocab_size=VOCAB, progress=False, **kwargs)


def _all_rows(out):
    """Every packed row of ``out`` as flat arrays (tokens, flags, per-occurrence fields)."""
    store = load_packed(out)
    parts = [store.shard_rows(k) for k in range(len(store.shards))]
    cat = {
        name: np.concatenate([getattr(p, name) for p in parts])
        for name in (
            "tokens",
            "loss_mask",
            "lengths",
            "starts",
            "ordinals",
            "source_ids",
            "example_ids",
            "range_starts",
            "range_ends",
        )
    }
    cat["per_row"] = np.concatenate([np.diff(p.row_offsets) for p in parts])
    return cat


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _manifest(out):
    return json.loads((out / "manifest.json").read_text())


@given(
    st.lists(st.integers(1, 30), min_size=1, max_size=8),
    st.integers(1, 8),
    st.data(),
)
def test_layout_cuts_every_row_once_on_model_call_boundaries(rows, step, data):
    layout = ShardCuts(len(rows), step)
    shards = []
    for n in rows:
        cuts = sorted(data.draw(st.sets(st.integers(1, n - 1), max_size=3))) if n > 1 else []
        shards += layout.add({"examples": n, "rows": n, "tokens": n, "cuts": cuts})
    assert [s.index for s in shards] == list(range(len(shards)))
    seen = [(j, r) for s in shards for j, a, b, _ in s.spans for r in range(a, b)]
    assert seen == [(j, r) for j, n in enumerate(rows) for r in range(n)]  # once, in order
    firsts = [s.first_row for s in shards]
    sizes = [sum(b - a for _, a, b, _ in s.spans) for s in shards]
    assert firsts == np.cumsum([0, *sizes[:-1]]).tolist() and min(sizes) > 0
    assert all(f % step == 0 for f in firsts)
    assert all(e == sum(rows[:j]) for s in shards for j, _, _, e in s.spans)
    assert layout.consumed == len(rows) and layout.rows == sum(rows)


@pytest.mark.parametrize(
    ("policy", "options"),
    [("next-fit", {}), ("best-fit-decreasing", {}), ("stream-best-fit", {"seed": 7})],
)
def test_one_block_per_shard_equals_the_local_pipeline_per_shard(
    ray_instance, shards, tmp_path, policy, options
):
    out = tmp_path / "ray"
    stats = _pack(shards, out, policy=policy, policy_options=options, split_id=PINNED)
    got = _all_rows(out)
    want, examples, rows = [], 0, 0
    for k, file in enumerate(sorted(shards.glob("*.parquet"))):
        local = tmp_path / f"local-{k}"
        s = pack_path(
            file,
            local,
            max_length=CAPACITY,
            vocab_size=VOCAB,
            policy=policy,
            policy_options=options,
            split_id=PINNED,
        )
        part = _all_rows(local)
        part["ordinals"] = part["ordinals"] + examples
        want.append(part)
        examples += s["examples"]
        rows += s["rows"]
    for name, value in got.items():
        assert np.array_equal(value, np.concatenate([w[name] for w in want])), name
    assert stats["blocks"] == len(SHARD_SIZES) and stats["rows"] == rows
    assert load_packed(out).binding.split_id == PINNED


@pytest.mark.parametrize("shard_tokens", [None, 50_000])
def test_one_block_is_byte_identical_to_the_local_pipeline(
    ray_instance, shards, tmp_path, shard_tokens
):
    sized = {} if shard_tokens is None else {"shard_tokens": shard_tokens}
    ray_stats = _pack(shards, tmp_path / "ray", block_examples=10**6, split_id=PINNED, **sized)
    local = pack_path(
        shards, tmp_path / "local", max_length=CAPACITY, vocab_size=VOCAB, split_id=PINNED,
        **sized,
    )  # fmt: skip
    a, b = _manifest(tmp_path / "ray"), _manifest(tmp_path / "local")
    assert a["shards"] == b["shards"] and a["binding"] == b["binding"]
    assert len(a["shards"]) > 1 if shard_tokens else len(a["shards"]) == 1  # one block, cut
    assert a["statistics"] == b["statistics"]
    assert {k: ray_stats[k] for k in a["statistics"]} == a["statistics"]
    assert ray_stats["rows"] == local["rows"]


def test_manifest_merges_the_blocks_statistics(packed_blocks, records):
    out, stats = packed_blocks
    m = _manifest(out)
    blocks, s = m["engine"]["per_block"], m["statistics"]
    assert [b["examples"] for b in blocks] == [1000] * 4 + [len(records) - 4000]
    assert [b["first_row"] for b in blocks] == np.cumsum(
        [0] + [b["rows"] for b in blocks[:-1]]
    ).tolist()
    tokens = sum(len(r["input_ids"]) - 1 for r in records)
    assert s["tokens"] == tokens == sum(b["tokens"] for b in blocks)
    assert s["rows"] == m["rows"] == sum(b["rows"] for b in blocks) == stats["rows"]
    assert s["examples"] == m["occurrences"] == len(records)
    assert s["lower_bound"] == -(-tokens // CAPACITY)  # the global bound, not the blocks'
    assert m["engine"]["block_lower_bound"] >= s["lower_bound"]
    assert s["efficiency"] == tokens / (s["rows"] * CAPACITY)
    assert m["engine"]["rows_over_lower_bound"] == s["rows"] / s["lower_bound"]
    assert s["eligible_targets"] == sum(sum(expected_flags(r)) for r in records)
    assert sum(x["rows"] for x in m["shards"]) == s["rows"]
    for shard in m["shards"]:
        assert shard["sha256"] == _sha(out / shard["file"])
        assert shard["first_row"] % m["config"]["max_rows_per_batch"] == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["manifest.json", *(x["file"] for x in m["shards"])]
    )


def _check_exactly_once(out, records):
    got = recovered_examples(load_packed(out))
    assert sorted(got) == list(range(len(records)))  # every example once, none twice
    for ordinal, ex in got.items():
        record = records[ordinal]
        assert ex["source_id"] == record["id"] and ex["tokens"] == record["input_ids"]
        assert ex["loss"] == expected_flags(record)
        assert ex["range"] == (0, len(record["input_ids"]))


def test_workers_killed_mid_run_still_give_every_example_once(
    ray_instance, shards, packed_blocks, records, tmp_path
):
    markers = str(tmp_path / "markers")
    os.mkdir(markers)

    def die_once(stage, index):
        if (stage, index) in (("plan", 1), ("write", 2)):
            try:
                os.close(os.open(f"{markers}/{stage}-{index}", os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return
            os._exit(1)  # the worker process dies; Ray retries the task

    out = tmp_path / "out"
    _pack(shards, out, block_examples=1000, split_id=PINNED, task_hook=die_once)
    assert sorted(os.listdir(markers)) == ["plan-1", "write-2"]
    _check_exactly_once(out, records)
    assert _manifest(out)["shards"] == _manifest(packed_blocks[0])["shards"]


def _kill_plan_1(stop_file):
    """A task hook: block 1's plan worker is SIGKILLed (as Ray's memory monitor kills one)
    until ``stop_file`` exists."""

    def hook(stage, index):
        if (stage, index) == ("plan", 1) and not os.path.exists(stop_file):
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


def test_a_worker_killed_past_its_retries_is_one_line_naming_the_cause(
    ray_instance, shards, tmp_path
):
    stop = str(tmp_path / "stop")
    with pytest.raises(RayTaskFailed) as err:
        _pack(shards, tmp_path / "out", block_examples=1000, task_hook=_kill_plan_1(stop),
              remote_args={"max_retries": 0})  # fmt: skip
    message = str(err.value)
    assert "\n" not in message and message.startswith("a Ray task failed: its worker died")
    assert "WorkerCrashedError" in message and "raise max_retries" in message
    assert _no_output(tmp_path)


def test_a_worker_killed_on_every_retry_fails_at_the_task_timeout(ray_instance, shards, tmp_path):
    """Endless retries (the memory monitor's kills): the driver waited forever."""
    stop = tmp_path / "stop"
    started = time.monotonic()
    try:
        lost = r"no task finished in 3 s: a worker was lost or is stuck"
        with pytest.raises(RayTaskFailed, match=lost):
            _pack(shards, tmp_path / "out", block_examples=1000, task_timeout=3,
                  task_hook=_kill_plan_1(str(stop)), remote_args={"max_retries": -1})  # fmt: skip
    finally:
        stop.touch()  # the retried task may now finish: no loop left behind for later tests
    assert time.monotonic() - started < 60
    assert _no_output(tmp_path)


def test_every_lost_task_is_one_line_naming_its_cause():
    ray = pytest.importorskip("ray")
    from ray import exceptions as E

    from exactpack.ray.driver import lost_task

    cases = [
        (E.OutOfMemoryError("Task was killed due to the node running low on memory.\nMore"),
         "Ray's memory monitor killed its worker on every try (OutOfMemoryError)"),
        (E.WorkerCrashedError(), "its worker died on every try (WorkerCrashedError: The worker"),
        (E.NodeDiedError("node 7 died"), "its worker died on every try (NodeDiedError: node 7"),
        (E.GetTimeoutError("t"), "no task finished in 5 s: a worker was lost or is stuck"),
        (E.ObjectLostError("abc", "owner", "call"), "ObjectLostError: Failed to retrieve"),
    ]  # fmt: skip
    for err, needle in cases:
        mapped = lost_task(ray, err, 5)
        assert isinstance(mapped, RayTaskFailed) and "\n" not in str(mapped), str(mapped)
        assert str(mapped).startswith("a Ray task failed: ") and needle in str(mapped)
        assert "nothing was published" in str(mapped)
    own = InvalidInput("part-01.parquet row 7: bad token")
    assert lost_task(ray, E.RayTaskError("plan_block", "traceback", own), 5) is own
    interrupt = KeyboardInterrupt()
    assert lost_task(ray, interrupt, 5) is interrupt


def test_the_task_timeout_is_checked():
    from exactpack.ray import RayOptions

    for bad in (0, -1, 1.5, 10**9):
        with pytest.raises(InvalidInput, match="task_timeout must be an integer in"):
            RayOptions(task_timeout=bad)


def test_output_does_not_depend_on_the_number_of_parallel_tasks(
    ray_instance, shards, packed_blocks, tmp_path
):
    serial = tmp_path / "serial"
    _pack(
        shards, serial, block_examples=1000, split_id=PINNED, remote_args={"num_cpus": 2}
    )  # one task at a time on 2 CPUs
    assert _manifest(serial)["shards"] == _manifest(packed_blocks[0])["shards"]


def test_dataset_of_numpy_tensors_packs_like_its_parquet_shards(
    ray_instance, packed_blocks, records, tmp_path
):
    ray = ray_instance
    items = [
        {
            "id": r["id"],
            "input_ids": np.asarray(r["input_ids"], dtype=np.int32),
            "labels": np.asarray(r["labels"] or r["input_ids"], dtype=np.int32),
        }
        for r in records
    ]
    ds = (
        ray.data.from_items(items, override_num_blocks=7)
        .map_batches(lambda batch: batch, batch_format="numpy")
        .materialize()
    )
    assert "tensor" in str(ds.schema().types[1]).lower()  # Ray's extension type, not a list
    out = tmp_path / "out"
    stats = _pack(ds, out, block_examples=1000, split_id=PINNED)
    assert stats["blocks"] == 5
    assert _manifest(out)["shards"] == _manifest(packed_blocks[0])["shards"]
    first = json.loads((out / "manifest.json").read_text())["shards"][0]["file"]
    field = pq.read_schema(out / first).field("tokens")
    assert field.type == pa.list_(pa.int32()) and not field.metadata
    ds.write_parquet(str(tmp_path / "written"))  # tensor extension columns in the files
    assert "extension" in str(pq.read_schema(next((tmp_path / "written").iterdir())))
    _pack(tmp_path / "written", tmp_path / "from-files", block_examples=1000)
    by_id = {r["id"]: r for r in records}
    got = recovered_examples(load_packed(tmp_path / "from-files"))
    assert sorted(ex["source_id"] for ex in got.values()) == sorted(by_id)
    for ex in got.values():
        assert ex["tokens"] == by_id[ex["source_id"]]["input_ids"]
        assert ex["loss"] == expected_flags(by_id[ex["source_id"]])


def test_default_ids_and_split_receipt_follow_the_input(ray_instance, records, tmp_path):
    folder = _write_shards(tmp_path / "plain", records, with_ids=False)
    out = tmp_path / "out"
    _pack(folder, out)
    local = tmp_path / "local"
    pack_path(folder, local, max_length=CAPACITY, vocab_size=VOCAB)
    for rows in (_all_rows(out), _all_rows(local)):  # the id is the row number in the folder
        assert np.array_equal(rows["source_ids"], rows["ordinals"].astype(str).astype(object))
    digests = [read_documents(f).digest("train") for f in sorted(folder.glob("*.parquet"))]
    expected = data_digest("exactpack-split-blocks", "train", *digests)
    assert load_packed(out).binding.split_id == expected


def _corrupt(shards, tmp_path, name, data):
    folder = tmp_path / "bad"
    shutil.copytree(shards, folder)
    path = folder / name
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        pq.write_table(data, path)
    return folder


def _no_output(tmp_path):
    return [p.name for p in tmp_path.iterdir() if "out" in p.name] == []


def test_a_shard_that_is_not_parquet_is_named(ray_instance, shards, tmp_path):
    folder = _corrupt(shards, tmp_path, "part-01.parquet", b"not parquet at all")
    with pytest.raises(InvalidInput, match=r"part-01\.parquet: cannot read as Parquet"):
        _pack(folder, tmp_path / "out")
    assert _no_output(tmp_path)


def test_a_bad_token_in_a_shard_is_named_and_nothing_is_written(
    ray_instance, shards, records, tmp_path
):
    table = pq.read_table(shards / "part-02.parquet")
    ids = table.column("input_ids").to_pylist()
    ids[7][1] = VOCAB + 5
    bad = table.set_column(
        table.schema.get_field_index("input_ids"), "input_ids", pa.array(ids, pa.list_(pa.int32()))
    )
    folder = _corrupt(shards, tmp_path, "part-02.parquet", bad)
    row = records[SHARD_SIZES[0] + SHARD_SIZES[1] + 7]["id"]
    with pytest.raises(
        InvalidInput, match=rf"part-02\.parquet row 7 \(id '{row}'\): token id 1005"
    ):
        _pack(folder, tmp_path / "out", block_examples=1000)
    assert _no_output(tmp_path)


def test_validation_rows_never_enter_training_rows(ray_instance, records, tmp_path):
    folder = tmp_path / "mixed"
    folder.mkdir()
    split = ["validation" if i % 97 == 5 else "train" for i in range(len(records))]
    table = pa.Table.from_pylist(
        [r | {"partition": p} for r, p in zip(records, split, strict=True)]
    )
    pq.write_table(table, folder / "all.parquet")
    # Blocks run in parallel: the error names a validation row of whichever failing block
    # reports first (row 5 in block 0, or a later one), always the row and its own id.
    with pytest.raises(SplitMismatch) as err:
        _pack(folder, tmp_path / "out", block_examples=1000)
    named = re.search(r"all\.parquet row (\d+) \(id 'doc-(\d+)'\) belongs to", str(err.value))
    assert named and named[1] == named[2] and split[int(named[1])] == "validation", err.value
    assert _no_output(tmp_path)
    val = tmp_path / "val"
    val.mkdir()
    pq.write_table(table.filter(pa.array([p == "validation" for p in split])), val / "v.parquet")
    _pack(val, tmp_path / "val-out", split="validation")
    store = load_packed(tmp_path / "val-out")
    assert store.partition is Split.VALIDATION
    assert all(batch.partition is Split.VALIDATION for batch in store)
    assert store.manifest["statistics"]["examples"] == split.count("validation")


def test_cli_engine_ray(ray_instance, shards, tmp_path, capsys):
    argv = [
        "pack",
        str(shards),
        "--engine",
        "ray",
        "--max-length",
        str(CAPACITY),
        "--vocab-size",
        str(VOCAB),
        "--block-examples",
        "1000",
        "--out",
        str(tmp_path / "out"),
    ]
    assert main([*argv, "--json"]) == 0
    stats = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert stats["blocks"] == 5 and stats["rows"] == load_packed(tmp_path / "out").num_rows
    assert main([*argv[:-1], str(tmp_path / "again")]) == 0
    assert "rows / global lower bound" in capsys.readouterr().out
    bad = [*argv[:-2], "--out", str(tmp_path / "x"), "--vocab-size", "10"]
    assert main(bad) == 2
    err = capsys.readouterr().err
    assert err.startswith("exactpack pack: error: ") and "not below the vocabulary size 10" in err
    assert (
        main(["pack", str(shards), "--max-length", "8", "--out", "y", "--block-examples", "9"]) == 2
    )
    assert "need --engine ray" in capsys.readouterr().err


def test_without_ray_the_engine_says_how_to_install_it(tmp_path):
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "import exactpack.ray\n"
        "from exactpack import NotAvailable\n"
        "try:\n"
        f"    exactpack.ray.pack({str(tmp_path)!r}, {str(tmp_path / 'out')!r}, max_length=8,"
        " vocab_size=9)\n"
        "except NotAvailable as err:\n"
        "    print(err)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'exactpack[ray]'" in proc.stdout


def _small_shards(folder, records, sizes):
    """Shards ``part-KK.parquet`` of ``sizes`` consecutive records."""
    folder.mkdir(parents=True)
    bounds = np.cumsum((0, *sizes))
    for k, (a, b) in enumerate(itertools.pairwise(bounds)):
        table = pa.Table.from_pylist(records[a:b])
        pq.write_table(table, folder / f"part-{k:02d}.parquet", row_group_size=32)
    return folder


def test_duplicate_ids_are_counted_across_blocks_like_the_local_pipeline(
    ray_instance, packed_blocks, records, tmp_path, capsys
):
    rows = [dict(r) for r in records[:300]]
    rows[40]["id"] = rows[30]["id"]  # within a block
    rows[250]["id"] = rows[10]["id"]  # across blocks and shards
    rows[260]["id"] = rows[10]["id"]
    folder = _small_shards(tmp_path / "dup", rows, (100, 120, 80))
    seen, repeats = set(), 0
    for r in rows:
        repeats += r["id"] in seen
        seen.add(r["id"])
    stats = _pack(folder, tmp_path / "ray", block_examples=50, split_id=PINNED)
    local = pack_path(
        folder, tmp_path / "local", max_length=CAPACITY, vocab_size=VOCAB, split_id=PINNED
    )
    assert stats["duplicate_ids"] == local["duplicate_ids"] == repeats == 3
    assert stats["duplicate_first"] == local["duplicate_first"]
    assert stats["duplicate_first"]["at"].endswith("part-00.parquet row 40")
    assert stats["duplicate_first"]["first_seen"].endswith("part-00.parquet row 30")
    a, b = _manifest(tmp_path / "ray"), _manifest(tmp_path / "local")
    assert (
        "duplicate_ids" not in a["statistics"] and a["statistics"].keys() == b["statistics"].keys()
    )
    argv = ["pack", str(folder), "--engine", "ray", "--max-length", str(CAPACITY)]
    argv += ["--vocab-size", str(VOCAB), "--block-examples", "50", "--json"]
    assert main([*argv, "--out", str(tmp_path / "cli")]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out.splitlines()[-1])["duplicate_ids"] == repeats
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and f"{repeats} row(s) repeat an earlier id" in warnings[0]
    assert repr(rows[30]["id"]) in warnings[0]
    assert packed_blocks[1]["duplicate_ids"] == 0 and "duplicate_first" not in packed_blocks[1]


def _local_need(source, tmp_path):
    """The in-memory budget need of ``source`` packed at once (what each block checks; the
    local pipeline reads out of core, with a budget of its own), from its BudgetExceeded."""
    table = load_examples(source, vocab_size=VOCAB)
    with pytest.raises(BudgetExceeded) as err:
        check_budget(table, PackConfig(CAPACITY, 8), "best-fit-decreasing", 1)
    return int(re.search(r"needs ([\d,]+) bytes", str(err.value)).group(1).replace(",", ""))


def test_the_metadata_budget_applies_per_block(ray_instance, records, tmp_path, capsys):
    folder = _small_shards(tmp_path / "in", records[:400], (120, 200, 80))
    needs = [_local_need(f, tmp_path) for f in sorted(folder.glob("*.parquet"))]
    biggest = int(np.argmax(needs))
    limit = needs[biggest]  # enough for every block, far below the whole input's need
    assert limit < _local_need(folder, tmp_path)
    within = _pack(folder, tmp_path / "ok", max_metadata_bytes=limit, split_id=PINNED)
    free = _pack(folder, tmp_path / "free", split_id=PINNED)
    assert within["rows"] == free["rows"]
    assert _manifest(tmp_path / "ok")["shards"] == _manifest(tmp_path / "free")["shards"]
    with pytest.raises(BudgetExceeded) as err:
        _pack(folder, tmp_path / "out", max_metadata_bytes=limit - 1)
    msg = str(err.value)
    assert msg.startswith(f"block {biggest} (") and f"part-{biggest:02d}.parquet" in msg
    assert f"needs {limit:,} bytes but max_metadata_bytes is {limit - 1:,}" in msg
    assert _no_output(tmp_path)
    argv = ["pack", str(folder), "--engine", "ray", "--max-length", str(CAPACITY)]
    argv += ["--vocab-size", str(VOCAB), "--out", str(tmp_path / "out")]
    assert main([*argv, "--max-metadata-bytes", str(limit - 1)]) == 2
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert len(err_lines) == 1 and err_lines[0].startswith("exactpack pack: error: block ")
    assert f"max_metadata_bytes is {limit - 1:,}" in err_lines[0]
    assert _no_output(tmp_path)


def _trees(store):
    """Each sequence (by index) as its cells: token, target, position, weight and the set of
    sequences through the cell (its trie) — the same whatever row or block holds it."""
    out = {}
    for r in store.records():
        through = {}
        for s, cells in zip(r["sequence_index"], r["sequence_cells"], strict=True):
            for c in cells:
                through.setdefault(c, set()).add(s)
        for s, cells in zip(r["sequence_index"], r["sequence_cells"], strict=True):
            cols = ("input_ids", "target_ids", "position_ids", "weights")
            out[s] = [(*(r[k][c] for k in cols), frozenset(through[c])) for c in cells]
    return out


def test_tree_packing_on_ray_equals_the_local_engine(ray_instance, tmp_path, capsys):
    """--tree on Ray: blocks of whole groups (adjacent rows of one group), planned in tasks,
    written in shards that straddle blocks; the local engine's rows (carried ``id`` too) when
    the blocks are its blocks, its sequences and tries when they are not."""
    rng = np.random.default_rng(34)
    rows = []
    for g in range(40):
        prompt = rng.integers(0, VOCAB, rng.integers(1, 6)).tolist()
        for _ in range(rng.integers(1, 5)):
            ids = prompt + rng.integers(0, VOCAB, 4).tolist()
            rows.append({"input_ids": ids, "group": g, "id": f"r{len(rows)}"})  # id: carried
    source = tmp_path / "groups.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    from exactpack.ray import pack

    kw = {"max_length": 16, "vocab_size": VOCAB, "tree": "on", "chunk_bytes": 600}
    kw |= {"max_rows_per_batch": 2, "shard_tokens": 60, "progress": False}
    local = pack_path(source, tmp_path / "local", **kw)
    on_ray = pack(source, tmp_path / "ray", **kw)
    assert on_ray["blocks"] == local["blocks"] > 1 and on_ray["shards"] > 1
    want, got = load_packed(tmp_path / "local"), load_packed(tmp_path / "ray", integrity="full")
    assert got.layout == "tree" and got.manifest["engine"]["name"] == "ray"
    assert got.records() == want.records() and got.binding == want.binding
    for key in ("sequences", "groups", "tries", "nodes", "tokens_stored", "eligible_targets"):
        assert on_ray[key] == local[key], key
    argv = ["pack", str(source), "--tree", "--engine", "ray", "--max-length", "16"]
    argv += ["--vocab-size", str(VOCAB), "--chunk-bytes", "250", "--block-examples", "5"]
    assert main([*argv, "--no-progress", "--out", str(tmp_path / "cli")]) == 0
    assert "tree-packed" in capsys.readouterr().out
    cli = load_packed(tmp_path / "cli", integrity="full")
    assert cli.manifest["engine"]["blocks"] > local["blocks"]
    assert _trees(cli) == _trees(want) and len(_trees(want)) == len(rows)
    with pytest.raises(InvalidInput, match=r"not a ray\.data\.Dataset .* write it out"):
        pack(ray_instance.data.from_items(rows), tmp_path / "ds", **kw)
