"""Streams into pack_dataset and out to Trainer: IterableDataset in, IterableDataset of packed
rows out (stream best fit), resumable, padded for torchrun; hf_collator over StreamDataset
items; and a 2-process torchrun Trainer run where every example is trained on exactly once
per epoch and the parameters equal one process's."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch

import exactpack
import exactpack.hf as H
from exactpack import ByteTokenizer, ExactpackError
from exactpack.training import StreamDataset

PACKER = {"lookahead": 8, "max_open_rows": 4, "seed": 3}
ROOT = Path(__file__).resolve().parents[2]


def rows(n=60, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i, k in enumerate(rng.integers(2, 12, size=n)):
        ids = rng.integers(0, 266, size=int(k)).tolist()
        labels = [-100 if j == 1 and i % 3 == 0 else t for j, t in enumerate(ids)]
        out.append({"id": f"d{i}", "input_ids": ids, "labels": labels})
    return out


def stream_of(docs):
    return datasets.IterableDataset.from_generator(lambda: iter(docs))


@pytest.mark.parametrize("fmt", ["exactpack", "trl"])
def test_a_stream_packs_as_stream_best_fit_packs_it_in_memory(fmt):
    docs = rows()
    packed = H.pack_dataset(stream_of(docs), 12, vocab_size=266, format=fmt, **PACKER)
    assert isinstance(packed, datasets.IterableDataset) and packed.n_shards == 1
    memory = H.pack_dataset(
        datasets.Dataset.from_list(docs), 12, "stream-best-fit", vocab_size=266, format=fmt,
        **PACKER,
    )  # fmt: skip
    got, want = list(packed), list(memory)
    assert 1 < len(got) < len(docs)
    keys = ["input_ids", "labels", "seq_lengths"] if fmt == "trl" else ["tokens", "ordinals"]
    for key in keys:
        assert [r[key] for r in got] == [r[key] for r in want], key
    if fmt == "exactpack":
        a, b = list(H.to_batches(packed, 4)), list(H.to_batches(memory, 4))
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert (x.inputs == y.inputs).all() and (x.loss_mask == y.loss_mask).all()
    assert list(packed) == got  # a second pass (epoch) packs the same rows


def test_text_rows_generators_and_functions():
    texts = [{"id": f"t{i}", "text": "packed " * (i % 5 + 1)} for i in range(30)]
    packed = H.pack_dataset(lambda: iter(texts), 64, tokenizer="bytes")
    got = H.unpack_dataset(datasets.Dataset.from_list(list(packed), info=packed.info))
    tok = ByteTokenizer()
    assert got["id"] == [t["id"] for t in texts]
    assert got["input_ids"] == [tok.encode(t["text"]).tolist() for t in texts]
    once = H.pack_dataset((r for r in rows()), 12, vocab_size=266)
    assert len(list(once)) > 1
    with pytest.raises(ExactpackError, match="already read once"):
        list(once)


def test_stream_failures_are_one_exactpack_error():
    docs = rows()
    with pytest.raises(ExactpackError, match="pass vocab_size="):
        H.pack_dataset(stream_of(docs), 12)
    with pytest.raises(ExactpackError, match="lower lookahead"):  # 56 GB of buffers: refused first
        H.pack_dataset(stream_of(docs), 12, vocab_size=266, lookahead=10**9)
    with pytest.raises(ExactpackError, match="policy 'stream-best-fit'"):
        H.pack_dataset(stream_of(docs), 12, "first-fit-decreasing", vocab_size=266)
    from exactpack.pipeline import pack_path

    with pytest.raises(ExactpackError, match=r"exactpack\.hf\.pack_dataset"):
        pack_path(stream_of(docs), "out", max_length=12, vocab_size=266)
    cases = [
        ([[1, 2, 3]], "not a mapping"),
        ([{"input_ids": [1, 2]}, {"input_ids": "x"}], "cannot read their columns"),
        ([{"input_ids": list(range(40))}], "cut_long=True"),
        ([{"input_ids": [1, 300]}], "300"),
        ([{"text": "abc"}], "tokenizer"),
    ]
    for bad, words in cases:
        with pytest.raises(ExactpackError, match=words):
            list(H.pack_dataset(bad, 12, vocab_size=266))


def test_a_stream_resumes_from_its_state_dict():
    packed = H.pack_dataset(stream_of(rows()), 12, vocab_size=266, **PACKER)
    everything = list(packed)
    it = iter(packed)
    first = [next(it) for _ in range(5)]
    state = packed.state_dict()
    again = H.pack_dataset(stream_of(rows()), 12, vocab_size=266, **PACKER)
    again.load_state_dict(state)
    assert first + list(again) == everything


@pytest.mark.parametrize("fmt", ["exactpack", "trl"])
def test_under_torchrun_the_end_is_padded_with_rows_that_train_nothing(fmt, monkeypatch):
    import exactpack.hf.datasets_io as streaming

    docs = rows(37)
    alone = list(H.pack_dataset(docs, 12, vocab_size=266, format=fmt, max_rows_per_batch=3))
    monkeypatch.setattr(streaming, "stream_world", lambda: 2)
    ranked = list(H.pack_dataset(docs, 12, vocab_size=266, format=fmt, max_rows_per_batch=3))
    assert len(alone) % 6 and len(ranked) % 6 == 0 and len(alone) < len(ranked) < len(alone) + 6
    assert ranked[: len(alone)] == alone
    if fmt == "exactpack":  # split by node (a loop without accelerate): equal shares, all rows
        from datasets.distributed import split_dataset_by_node

        packed = H.pack_dataset(docs, 12, vocab_size=266, max_rows_per_batch=3)
        shares = [list(split_dataset_by_node(packed, rank=r, world_size=2)) for r in range(2)]
        assert len(shares[0]) == len(shares[1])
        assert sorted(x["row"] for share in shares for x in share) == [x["row"] for x in ranked]
    for row in ranked[len(alone) :]:
        if fmt == "trl":
            assert set(row["labels"]) == {-100}
        else:
            assert row["pair_counts"] == [] and row["tokens"] == []
    if fmt == "exactpack":  # empty rows collate to padding only: no target, no key, no query
        packed = H.pack_dataset(docs, 12, vocab_size=266, max_rows_per_batch=3)
        collate = H.collator_for(packed, "sdpa", config=_llama().config)
        out = collate(ranked[-2:])
        assert (out["labels"] == -100).all() and (out["shift_labels"] == -100).all()


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=266, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
        attn_implementation="sdpa",
    )  # fmt: skip
    return LlamaForCausalLM(config)


def test_hf_collator_takes_stream_dataset_items_and_text_mappings():
    binding = exactpack.Binding(vocab_size=266, tokenizer_id="exactpack/bytes-266", split_id="demo")
    texts = [{"id": f"t{i}", "text": "stream " * (i % 4 + 1)} for i in range(20)]
    stream = StreamDataset(
        texts, binding=binding, max_length=32, rows_per_micro_batch=2, tokenizer=ByteTokenizer()
    )
    items = list(stream)
    assert {s for item in items for s in item.batch.occurrences.source_ids} == {
        t["id"] for t in texts
    }
    model = _llama()
    collate = H.hf_collator("sdpa", config=model.config)
    out = collate(items[:2])
    assert out["input_ids"].shape == (4, 32) and out["use_cache"] is False
    model.config.use_cache = False  # as Trainer sets it: then every value is a row tensor
    out = collate(items[:2])
    assert all(isinstance(v, torch.Tensor) and v.shape[0] == 4 for v in out.values())
    ranked = StreamDataset(
        texts, binding=binding, max_length=32, rows_per_micro_batch=2, tokenizer=ByteTokenizer(),
        world_size=2, rank=0,
    )  # fmt: skip
    with pytest.raises(ExactpackError, match="world_size=1, rank=0"):
        collate([next(iter(ranked))])  # accelerate would shard it again: half lost
    with pytest.raises(ExactpackError, match="text_field"):
        list(StreamDataset([{"body": "x"}], binding=binding, max_length=8, rows_per_micro_batch=1))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(nproc: int, tmp: Path, batch: int) -> list[dict]:
    record = tmp / f"world{nproc}"
    env = os.environ | {
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",
        "EXACTPACK_KERNELS": "python",
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    script = [str(ROOT / "examples" / "trainer_stream.py"), "--out", str(tmp / f"o{nproc}")]
    script += ["--record", str(record), "--batch", str(batch)]
    launch = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    launch += ["--master-addr=127.0.0.1", f"--master-port={_free_port()}"]
    done = subprocess.run(launch + script, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads(Path(f"{record}.{r}.json").read_text()) for r in range(nproc)]


def test_torchrun_trainer_trains_every_streamed_example_once_per_epoch(tmp_path):
    """Two gloo ranks, accelerate's defaults (dispatch_batches), 2 rows per rank and step,
    2 epochs, vs one process with 4 rows per step: the same steps, every example once per
    epoch across the ranks, and the same parameters (float32: 1e-6 absolute)."""
    sys.path.insert(0, str(ROOT / "examples"))
    from trainer_stream import EXAMPLES, main

    two = _launch(2, tmp_path, batch=2)
    record = tmp_path / "one"  # one process: here, 4 rows per step
    main(["--out", str(tmp_path / "o1"), "--record", str(record), "--batch", "4"])
    one = json.loads(Path(f"{record}.0.json").read_text())
    assert [r["world"] for r in two] == [2, 2] and one["world"] == 1
    per_epoch = -(-one["rows"] // 4)
    assert one["steps"] == two[0]["steps"] == two[1]["steps"] == 2 * per_epoch
    assert two[0]["rows"] % 4 == 0 and one["rows"] <= two[0]["rows"] < one["rows"] + 4
    for run in (two, [one]):
        for epoch in range(2):
            seen = [
                e
                for rank in run
                for call in rank["calls"]
                if call["step"] // per_epoch == epoch
                for e in call["examples"]
            ]
            assert sorted(seen) == list(range(EXAMPLES)), (len(run), epoch)
    for rank in two:
        for name, values in one["params"].items():
            assert np.abs(np.array(rank["params"][name]) - values).max() < 1e-6, name


def test_trainer_resumes_a_stream_from_its_checkpoint_exactly(tmp_path):
    """Trainer saves at step 5 of 12 and a fresh Trainer resumes from that checkpoint: it
    trains the remaining calls on the same rows (the stream is packed again and the rows
    trained on are skipped) and ends at the same parameters as the uninterrupted run."""
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    sys.path.insert(0, str(ROOT / "examples"))
    from trainer_stream import CAPACITY, ROWS, corpus

    def run(resume=None):
        args = TrainingArguments(
            output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=12,
            learning_rate=0.1, optim="sgd", lr_scheduler_type="constant",
            remove_unused_columns=False, report_to=[], use_cpu=True, save_strategy="steps",
            save_steps=5, logging_strategy="no", disable_tqdm=True,
        )  # fmt: skip
        packed = H.pack_dataset(corpus, CAPACITY, vocab_size=266, max_rows_per_batch=ROWS)
        torch.manual_seed(0)
        config = LlamaConfig(
            vocab_size=266, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=CAPACITY,
            attn_implementation="sdpa",
        )  # fmt: skip
        model = LlamaForCausalLM(config)
        calls = []

        class Recording(Trainer):
            def compute_loss(self, model, inputs, *rest, **kw):
                calls.append(inputs["input_ids"].tolist())
                return super().compute_loss(model, inputs, *rest, **kw)

        collate = H.collator_for(packed, "sdpa", config=model.config)
        trainer = Recording(model=model, args=args, train_dataset=packed, data_collator=collate)
        trainer.train(resume_from_checkpoint=resume)
        return calls, torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    calls, params = run()
    resumed, again = run(str(tmp_path / "checkpoint-5"))
    assert len(calls) == 12 and resumed == calls[5:]
    assert torch.equal(params, again)
