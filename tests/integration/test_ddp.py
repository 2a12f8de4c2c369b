"""Two real ranks (torch.distributed, gloo, two processes on 127.0.0.1) vs one process.

Each rank runs DistributedDataParallel over its RowSampler slots with
gradient accumulation (``no_sync`` on all but the last micro-batch) and
``micro_batch_loss(world_size=2)``; DDP averages gradients over ranks. The
gradients of every optimizer step must equal, within the float64 tolerance,
those of the single-batch token-weighted mean computed here in one process
over the same rows, and the per-micro-batch-mean control must not. The same
processes then run tree rows (DPO-like groups, weights > 1 on shared prefixes)
through the same RowSampler, PackedCollator and micro_batch_loss, against
``token_weighted_loss`` (``Σ weight·nll / Σ weight``) over each step's rows in one process.

This file is also the worker: ``python tests/integration/test_ddp.py RANK WORLD PORT DATA OUT``.
"""

from __future__ import annotations

import sys
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch

WORLD = 2
MICRO = 2
ROWS_PER_MICRO = 2
SEED = 11
LR = 0.5
ATTENTION = "varlen"
TIMEOUT_S = 60


def _model():
    from exactpack.verify.decoder import TinyDecoder

    return TinyDecoder("large", seed=SEED, attention=ATTENTION)


def _sampler(stats, world_size=None, rank=None):
    from exactpack.training import RowSampler

    return RowSampler(
        stats,
        rows_per_micro_batch=ROWS_PER_MICRO,
        micro_batches=MICRO,
        world_size=world_size,
        rank=rank,
        seed=SEED,
        balance="attention",
    )


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def worker(rank: int, world: int, port: int, data: str, out: str) -> None:
    """One rank: the naive control on step 0, then the epoch with correct normalisation."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    from exactpack.training import PackedBatches, PackedCollator, decoder_inputs, micro_batch_loss
    from exactpack.training.global_loss import labels_nll_sum

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=TIMEOUT_S // 2),
    )
    ds = PackedBatches(data)
    sampler = _sampler(ds.row_stats())  # world size and rank from torch.distributed
    loader = DataLoader(ds, sampler=sampler, batch_size=None, collate_fn=PackedCollator())
    model = DistributedDataParallel(_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    features = list(loader)
    # Control: each micro-batch's own mean, averaged over micro-batches (and, by DDP, ranks).
    for f in features[:MICRO]:
        sync = nullcontext() if f["slot"].last_micro else model.no_sync()
        with sync:
            total = labels_nll_sum(model(*decoder_inputs(f)), f["shift_labels"])
            zero = sum(p.sum() for p in model.parameters()) * 0.0
            loss = total.sum / max(total.count, 1) / MICRO + zero
            loss.backward()
    naive = _grads(model.module)
    optimizer.zero_grad(set_to_none=True)
    steps, logged = [], []
    running = torch.zeros((), dtype=torch.float64)
    for f in features:
        sync = nullcontext() if f["slot"].last_micro else model.no_sync()
        with sync:
            logits = model(*decoder_inputs(f))
            loss = micro_batch_loss(logits, f, world_size=world, parameters=model.parameters())
            loss.backward()
        running += loss.detach()
        if f["slot"].last_micro:
            steps.append(_grads(model.module))
            dist.all_reduce(running)  # Σ over ranks of Σ micro losses = R * step mean
            logged.append(float(running) / world)
            running.zero_()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    tree = _tree_epoch(world)
    torch.save(
        {"steps": steps, "naive": naive, "logged": logged, "slots": len(features), "tree": tree},
        Path(out) / f"rank{rank}.pt",
    )
    dist.destroy_process_group()


# ---------------------------------------------------------------- tree rows


class TreeModel(torch.nn.Module):
    """Embedding, one tree-attention layer (``tree_plan`` of the collated rows), a head;
    float64: the smallest model whose logits depend on every ancestor's cells."""

    def __init__(self, vocab: int = 266, width: int = 8, heads: int = 2) -> None:
        super().__init__()
        torch.manual_seed(SEED)
        self.heads = heads
        self.embed = torch.nn.Embedding(vocab, width, dtype=torch.float64)
        self.qkv = torch.nn.Linear(width, 3 * width, dtype=torch.float64)
        self.head = torch.nn.Linear(width, vocab, dtype=torch.float64)

    def forward(self, features) -> torch.Tensor:
        from exactpack.nn.varlen import path_attention

        x = self.embed(features["input_ids"])  # (R, T, C)
        rows, width, c = x.shape
        q, k, v = self.qkv(x).reshape(rows * width, 3, self.heads, c // self.heads).unbind(1)
        mixed = path_attention(q, k, v, features["tree_plan"], (c // self.heads) ** -0.5)
        return self.head(x + mixed.reshape(rows, width, c))  # (R, T, V)


def _tree_rows():
    """Tree records of groups (a shared prefix, two or three continuations, every target
    supervised: the prefix's weights count its sequences), 16 cells a row."""
    from exactpack.core.tree import SequenceGroups, pack_tree
    from exactpack.io.shards import row_records

    from support.strategies import BINDING

    rng = np.random.default_rng(SEED)
    prompts = [rng.integers(0, 266, int(rng.integers(1, 6))) for _ in range(26)]
    groups = [
        [np.r_[p, rng.integers(0, 266, int(rng.integers(1, 5)))] for _ in range(rng.integers(2, 4))]
        for p in prompts
    ]
    groups = SequenceGroups.from_lists(groups, BINDING)
    (batch,) = pack_tree(groups, 16, policy="best-fit-decreasing").batches
    assert int(batch.weights.max()) > 1  # a shared prefix supervised by several sequences
    return row_records(batch)


def _tree_batch(records, rows):
    from exactpack.io.store import tree_batch_from_rows

    return tree_batch_from_rows([records[r] for r in rows], 16, 266)


def _tree_sampler(records, world_size, rank):
    from exactpack.training.distributed import RowStats

    stats = RowStats.from_batches([_tree_batch(records, range(len(records)))])
    return _sampler(stats, world_size, rank)


def _tree_epoch(world: int) -> list[dict[str, torch.Tensor]]:
    """This rank's tree epoch under DDP: the gradients of each step."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from exactpack.training import PackedCollator, ScheduledBatch, micro_batch_loss

    records = _tree_rows()
    sampler = _tree_sampler(records, world, dist.get_rank())
    collate = PackedCollator()
    model = DistributedDataParallel(TreeModel())
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    steps = []
    for slot in sampler:
        f = collate(ScheduledBatch(_tree_batch(records, slot.rows), slot))
        with nullcontext() if slot.last_micro else model.no_sync():
            loss = micro_batch_loss(model(f), f, world_size=world, parameters=model.parameters())
            loss.backward()
        if slot.last_micro:
            steps.append(_grads(model.module))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return steps


def _tree_reference():
    """One process: per step, the gradient of token_weighted_loss over all the step's rows."""
    from exactpack.core.loss import token_weighted_loss
    from exactpack.training import PackedCollator

    records = _tree_rows()
    schedule = _tree_sampler(records, WORLD, 0).schedule
    model = TreeModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    grads = []
    for step in range(schedule.steps):
        slots = [schedule.slot(step, r, m) for r in range(WORLD) for m in range(MICRO)]
        batch = _tree_batch(records, np.sort(np.concatenate(slots)))
        token_weighted_loss(model(PackedCollator()(batch)), batch).mean.backward()
        grads.append(_grads(model))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return grads


# ---------------------------------------------------------------- the test


def _write_data(path: Path) -> None:
    from exactpack import ExampleTable, SequenceExample, plan_rows
    from exactpack.core.compact import compact_rows
    from exactpack.io.store import write_packed

    from support.strategies import BINDING

    rng = np.random.default_rng(SEED)
    examples = []
    for i in range(33):
        length = int(rng.integers(1, 17))
        examples.append(
            SequenceExample.from_document(
                rng.integers(0, 266, size=length + 1),
                source_id=f"d{i}",
                partition="train",
                binding=BINDING,
                loss_mask=rng.random(length) < 0.75,
            )
        )
    table = ExampleTable.from_examples(examples, "train", BINDING)
    plan = plan_rows(table.lengths, 16, "best-fit-decreasing")
    write_packed(compact_rows(table, plan), path, max_rows_per_batch=4)


def _reference(data: Path):
    """One process: per step, the gradient of the mean over all the step's rows; SGD between."""
    from exactpack.core.loss import token_weighted_loss
    from exactpack.training import PackedBatches

    ds = PackedBatches(data)
    stats = ds.row_stats()
    schedules = [_sampler(stats, WORLD, r) for r in range(WORLD)]
    schedule = schedules[0].schedule
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    grads, means, empty = [], [], 0
    for step in range(schedule.steps):
        slots = [schedule.slot(step, r, m) for r in range(WORLD) for m in range(MICRO)]
        empty += sum(s.size == 0 for s in slots)
        batch = ds.rows(np.sort(np.concatenate(slots)))
        loss = token_weighted_loss(model.forward_packed(batch), batch).mean
        loss.backward()
        grads.append(_grads(model))
        means.append(float(loss.detach()))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return grads, means, empty, schedule.steps


def test_two_gloo_ranks_match_one_process(tmp_path):
    from exactpack.verify.tolerances import within_tolerance

    torch.set_num_threads(1)
    data = tmp_path / "packed"
    _write_data(data)
    from support.ranks import free_port, start_ranks, wait_ranks

    port = free_port()
    argvs = [
        [__file__, str(r), str(WORLD), str(port), str(data), str(tmp_path)] for r in range(WORLD)
    ]
    procs = start_ranks(argvs)
    want, means, empty, steps = _reference(data)
    want_tree = _tree_reference()
    wait_ranks(procs, TIMEOUT_S)
    assert steps >= 2 and empty >= 1  # a short last step with an explicitly empty slot
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    assert ranks[0]["slots"] == ranks[1]["slots"] == steps * MICRO
    for rank in ranks:
        assert len(rank["steps"]) == steps
        for got, ref in zip(rank["steps"], want, strict=True):
            for name, g in ref.items():
                ok = within_tolerance(got[name], g)
                assert bool(ok.all()), (name, float((got[name] - g).abs().max()))
        for logged, mean in zip(rank["logged"], means, strict=True):
            assert abs(logged - mean) <= 1e-10 + 1e-9 * abs(mean)
    naive = ranks[0]["naive"]
    assert any(not bool(within_tolerance(naive[n], want[0][n]).all()) for n in want[0])
    assert len(want_tree) >= 2
    for rank in ranks:  # tree rows: the same sampler, collator and loss
        assert len(rank["tree"]) == len(want_tree)
        for got, ref in zip(rank["tree"], want_tree, strict=True):
            for name, g in ref.items():
                ok = within_tolerance(got[name], g)
                assert bool(ok.all()), ("tree", name, float((got[name] - g).abs().max()))


if __name__ == "__main__":
    rank_, world_, port_, data_, out_ = sys.argv[1:6]
    worker(int(rank_), int(world_), int(port_), data_, out_)
