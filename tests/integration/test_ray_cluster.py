"""Text -> packed on a real multi-node Ray cluster on this machine.

One cluster for the module (``ray.cluster_utils.Cluster``): a head node
with no CPUs (so no task runs beside the driver) and two worker nodes of one
CPU each, every raylet bound to 127.0.0.1, under a private temporary folder
(:func:`ray_helpers.private_loopback_ray`: no other Ray user on the machine
finds this cluster).
The texts are Python standard-library files; the tokenizer is a small
byte-level BPE trained on them here.
"""

import json
import logging
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from exactpack import InvalidInput
from exactpack.io.store import load_packed
from exactpack.io.tokenizers import load_tokenizer
from exactpack.pipeline.local import pack_path
from exactpack.ray import RayTaskFailed

from support.packed_helpers import recovered_examples
from support.ray_helpers import private_loopback_ray

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from workloads import stdlib_texts, train_bpe

#: Starting a multi-node cluster on a loaded machine takes most of a test's time.
pytestmark = pytest.mark.timeout(600)

CAPACITY = 256
PINNED = "sha256:pinned-split"
SHARDS = (50, 30, 40)
#: A lost node is declared dead after ~0.6 s instead of Ray's default ~30 s.
FAST_NODE_DEATH = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 200,
    "health_check_timeout_ms": 200,
    "health_check_failure_threshold": 3,
}
LOOPBACK = {"node_ip_address": "127.0.0.1", "include_dashboard": False}


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    with private_loopback_ray():
        nodes = None
        try:
            nodes = Cluster(
                initialize_head=True,
                head_node_args={"num_cpus": 0, "_system_config": FAST_NODE_DEATH} | LOOPBACK,
            )
            for _ in range(2):
                nodes.add_node(num_cpus=1, **LOOPBACK)
            nodes.wait_for_nodes()
            ray.init(address=nodes.address, logging_level=logging.ERROR)
            yield nodes
        finally:
            ray.shutdown()
            if nodes is not None:
                nodes.shutdown()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Standard-library files as JSON Lines shards (with blank lines) and Parquet text
    shards, and a BPE trained on them: (jsonl folder, parquet folder, tokenizer path)."""
    docs = stdlib_texts(200, 3000)[: sum(SHARDS)]
    root = tmp_path_factory.mktemp("corpus")
    tok = train_bpe([t for _, t in docs], 400, root / "bpe" / "tokenizer.json")
    (root / "jsonl").mkdir()
    (root / "parquet").mkdir()
    first = 0
    for k, n in enumerate(SHARDS):
        part = docs[first : first + n]
        first += n
        lines = [json.dumps({"id": name, "text": text}) for name, text in part]
        lines.insert(len(lines) // 2, "")
        (root / "jsonl" / f"part-{k:02d}.jsonl").write_text("\n".join(lines) + "\n")
        table = pa.table({"id": [d for d, _ in part], "text": [t for _, t in part]})
        pq.write_table(table, root / "parquet" / f"part-{k:02d}.parquet", row_group_size=16)
    return root / "jsonl", root / "parquet", tok


def _options(tok):
    return {"max_length": CAPACITY, "tokenizer": tok, "cut_long": True, "progress": False}


def _examples(out):
    """Every packed example of ``out`` keyed by (source id, range): tokens and loss flags."""
    got = recovered_examples(load_packed(out))
    return {(e["source_id"], e["range"]): (e["tokens"], e["loss"]) for e in got.values()}


def _manifest(out):
    return json.loads((out / "manifest.json").read_text())


@pytest.fixture(scope="module")
def local(corpus, tmp_path_factory):
    jsonl, _, tok = corpus
    out = tmp_path_factory.mktemp("local") / "out"
    pack_path(jsonl, out, **_options(str(tok)))
    return out


def test_cli_packs_text_on_two_nodes_like_the_local_engine(cluster, corpus, local, tmp_path):
    import ray

    jsonl, _, tok = corpus
    out = tmp_path / "out"
    argv = ["pack", str(jsonl), "--engine", "ray", "--ray-address", cluster.address]
    argv += ["--tokenizer", str(tok), "--cut-long", "--max-length", str(CAPACITY)]
    argv += ["--block-examples", "16", "--out", str(out), "--json"]
    proc = subprocess.run(
        [sys.executable, "-m", "exactpack", *argv], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout.splitlines()[-1])
    assert stats["blocks"] == -(-sum(SHARDS) // 16) and stats["nodes"] == 2
    assert _examples(out) == _examples(local)
    m, want = _manifest(out), _manifest(local)
    assert m["binding"]["tokenizer_id"] == want["binding"]["tokenizer_id"]
    assert m["binding"]["tokenizer_id"] == load_tokenizer(tok).identity
    assert m["statistics"]["tokens"] == want["statistics"]["tokens"]
    blocks = m["engine"]["per_block"]
    workers = {n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU")}
    assert {b["node"] for b in blocks} == workers  # both worker nodes planned blocks
    for b in blocks:
        assert b["node_ip"] == "127.0.0.1"
        times = ("read_seconds", "tokenize_seconds", "plan_seconds", "plan_cpu_seconds")
        assert min(b[k] for k in times) > 0
        assert b["write_seconds"] > 0 and b["write_cpu_seconds"] > 0
    nodes = m["engine"]["nodes"]
    assert sum(n["blocks"] for n in nodes) == len(blocks)
    assert sum(n["tokens"] for n in nodes) == m["statistics"]["tokens"]
    busy = [n["busy_seconds"] for n in nodes]
    assert busy == sorted(busy, reverse=True)


def _rows(out):
    store = load_packed(out)
    return [store.shard_rows(k) for k in range(len(store.shards))]


def test_one_block_per_shard_plans_each_shard_as_the_local_engine(cluster, corpus, tmp_path):
    jsonl, _, tok = corpus
    from exactpack.ray import pack

    pack(jsonl, tmp_path / "ray", **_options(str(tok)), split_id=PINNED)
    got, examples = _examples(tmp_path / "ray"), {}
    m = _manifest(tmp_path / "ray")
    for k, file in enumerate(sorted(jsonl.glob("*.jsonl"))):
        local = tmp_path / f"local-{k}"
        pack_path(file, local, **_options(str(tok)), split_id=PINNED)
        examples |= _examples(local)
        block = m["engine"]["per_block"][k]
        assert block["rows"] == load_packed(local).num_rows  # the same plan, block by block
    assert got == examples
    one = tmp_path / "one"
    pack(jsonl, one, **_options(str(tok)), split_id=PINNED, block_examples=10**6)
    whole = tmp_path / "whole"
    pack_path(jsonl, whole, **_options(str(tok)), split_id=PINNED)
    assert _manifest(one)["shards"] == _manifest(whole)["shards"]  # byte for byte (sha256)
    assert _manifest(one)["binding"] == _manifest(whole)["binding"]


def test_parquet_text_shards_and_a_text_dataset_give_the_same_examples(
    cluster, corpus, local, tmp_path
):
    import ray

    _, parquet, tok = corpus
    from exactpack.ray import pack

    stats = pack(parquet, tmp_path / "out", **_options(str(tok)), block_examples=25)
    assert stats["blocks"] == -(-sum(SHARDS) // 25)
    assert _examples(tmp_path / "out") == _examples(local)
    ds = ray.data.read_parquet(str(parquet))  # how object-storage input arrives
    pack(ds, tmp_path / "ds", **_options(str(tok)), block_examples=40)
    assert _examples(tmp_path / "ds") == _examples(local)


def test_workers_never_read_the_tokenizer_path(cluster, corpus, local, tmp_path):
    """The driver loads the tokenizer; the tasks get its content through the object store."""
    jsonl, _, tok = corpus
    from exactpack.ray import pack

    folder = tmp_path / "tok"
    shutil.copytree(tok.parent, folder)
    loaded = load_tokenizer(folder / "tokenizer.json")
    shutil.rmtree(folder)
    pack(jsonl, tmp_path / "out", **_options(loaded), block_examples=40)
    assert _examples(tmp_path / "out") == _examples(local)
    assert _manifest(tmp_path / "out")["binding"]["tokenizer_id"] == loaded.identity


def _no_output(parent):
    return [p.name for p in parent.iterdir() if p.name.startswith((".out", "out"))] == []


def test_a_bad_line_mid_file_is_named_and_nothing_is_written(cluster, corpus, tmp_path):
    jsonl, _, tok = corpus
    from exactpack.ray import pack

    folder = tmp_path / "in"
    shutil.copytree(jsonl, folder)
    path = folder / "part-01.jsonl"
    lines = path.read_text().splitlines()
    lines[20] = lines[20][:-2]  # line 21 (record 20: the block after 16 records) is torn
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InvalidInput, match=rf"^{path} line 21: not valid JSON"):
        pack(folder, tmp_path / "out", **_options(str(tok)), block_examples=8)
    assert _no_output(tmp_path)


def _wait_until_schedulable(ray, node_id, timeout=30.0):
    """Block until the scheduler counts ``node_id``'s CPU: a node registered in the GCS can
    still be missing from the resource view for a while on a loaded machine, and SPREAD
    would then place no block on it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}
        registered = node_id in alive and alive[node_id]["Resources"].get("CPU", 0) >= 1
        if registered and ray.available_resources().get("CPU", 0) >= 3:
            return
        time.sleep(0.1)
    raise AssertionError(f"node {node_id} never became schedulable")


@pytest.mark.parametrize(("retries", "outcome"), [(None, "same output"), (0, "clean error")])
def test_a_worker_node_lost_mid_run_never_publishes_a_partial_output(
    cluster, corpus, local, tmp_path, retries, outcome
):
    """A third node joins; a block planned there stalls until the node is killed (its
    raylet, object store and workers). With Ray's retries the block runs again elsewhere
    and the node's lost objects are rebuilt: the output equals a clean run's. Without
    retries the run fails with RayTaskFailed and nothing is published. Never a partial
    output."""
    import ray

    from exactpack.ray import pack

    jsonl, _, tok = corpus
    clean = tmp_path / "clean"
    pack(jsonl, clean, **_options(str(tok)), block_examples=8, split_id=PINNED)
    doomed = cluster.add_node(num_cpus=1, **LOOPBACK)
    cluster.wait_for_nodes()
    _wait_until_schedulable(ray, doomed.node_id)
    marker = tmp_path / "stalled"

    def stall_on_the_doomed_node(stage, index, node=doomed.node_id, marker=str(marker)):
        if ray.get_runtime_context().get_node_id() == node:
            Path(marker).touch()
            time.sleep(60)  # killed with its node long before this ends
        elif stage == "plan":
            # SPREAD is best effort: under load it may keep every block off the new node.
            # Holding the two other CPUs until a block stalls there leaves the scheduler
            # only the doomed node for the next pending block (bounded, so a run that
            # never places one still ends and the assertion below names the cause).
            deadline = time.monotonic() + 15
            while not Path(marker).exists() and time.monotonic() < deadline:
                time.sleep(0.05)

    def remove_when_stalled():
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        cluster.remove_node(doomed, allow_graceful=False)

    killer = threading.Thread(target=remove_when_stalled)
    killer.start()
    out = tmp_path / "out"
    started = time.monotonic()
    remote_args = {} if retries is None else {"max_retries": retries}
    try:
        pack(
            jsonl,
            out,
            **_options(str(tok)),
            block_examples=8,
            split_id=PINNED,
            task_hook=stall_on_the_doomed_node,
            remote_args=remote_args,
        )
        got = "same output"
    except RayTaskFailed as err:
        assert "a Ray task failed" in str(err)
        got = "clean error"
    finally:
        killer.join()
    assert marker.exists(), "no block ran on the added node, so nothing was lost"
    assert got == outcome
    assert time.monotonic() - started < 50
    if got == "clean error":
        assert _no_output(tmp_path)
    else:
        assert _manifest(out)["shards"] == _manifest(clean)["shards"]
        assert _examples(out) == _examples(local)
        assert doomed.node_id not in {b["node"] for b in _manifest(out)["engine"]["per_block"]}
