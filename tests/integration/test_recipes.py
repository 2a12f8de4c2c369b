"""Every distributed recipe in docs/training.md, launched as documented under torchrun.

A recipe is the ``python`` blocks marked ``<!-- torchrun-recipe: NAME -->``, in
page order, run as one script by ``python -m torch.distributed.run
--nproc-per-node 2`` (gloo, 127.0.0.1) in a fresh folder. Each rank reports
its world size, its step losses and its final parameters; one process then
replays the same steps (both ranks' rows, the token-weighted mean of the
whole step) from the same initialisation, and every rank must equal it.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "training.md"
MARK = re.compile(
    r"<!--\s*torchrun-recipe:\s*(?P<name>[\w-]+)\s*-->\s*\n```python\n(?P<code>.*?)```", re.S
)
WORLD = 2

#: Appended to a recipe: what each rank reports (the names the recipe defines).
REPORT = """
import json as _json
_rank = dist.get_rank() if dist.is_initialized() else 0
with open(f"report.{_rank}.json", "w") as _f:
    _json.dump({"world": world, "rank": _rank, "losses": losses,
                "params": {n: p.detach().reshape(-1).tolist() for n, p in net.named_parameters()}},
               _f)
"""


def recipes() -> dict[str, str]:
    found: dict[str, list[str]] = {}
    for m in MARK.finditer(PAGE.read_text()):
        found.setdefault(m["name"], []).append(m["code"])
    return {name: "\n".join(blocks) for name, blocks in found.items()}


def test_the_page_marks_its_recipes():
    assert set(recipes()) == {"custom-loop"}
    assert "init_process_group" in recipes()["custom-loop"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _replay(folder: Path, epochs: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """One process, the custom loop's steps: both ranks' micro-batches of each step,
    each loss divided by the whole step's count (world_size=1), one SGD step."""
    from exactpack.training import (
        PackedBatches,
        PackedCollator,
        RowSampler,
        decoder_inputs,
        micro_batch_loss,
    )
    from exactpack.verify.decoder import DecoderConfig, TinyDecoder

    ds = PackedBatches(folder / "packed", expected_split="train")
    samplers = [
        RowSampler(ds.row_stats(), rows_per_micro_batch=4, micro_batches=2, seed=0,
                   balance="attention", world_size=WORLD, rank=r)
        for r in range(WORLD)
    ]  # fmt: skip
    torch.manual_seed(0)
    config = DecoderConfig(vocab_size=ds.binding.vocab_size, width=32, heads=2, ff=64,
                           layers=2, max_len=ds.capacity)  # fmt: skip
    net = TinyDecoder(config=config, attention="varlen", dtype=torch.float32)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    collate, losses = PackedCollator(), []
    for epoch in range(epochs):
        slots = []
        for s in samplers:
            s.set_epoch(epoch)
            slots.append(list(s))
        for step in range(len(slots[0]) // 2):
            total = 0.0
            for rank_slots in slots:
                for slot in rank_slots[2 * step : 2 * step + 2]:
                    f = collate(ds[slot])
                    loss = micro_batch_loss(net(*decoder_inputs(f)), f,
                                            parameters=net.parameters())  # fmt: skip
                    loss.backward()
                    total += loss.item()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(total)
    return losses, {n: p.detach().reshape(-1) for n, p in net.named_parameters()}


@pytest.mark.parametrize("name", sorted(recipes()))
def test_a_recipe_under_torchrun_is_distributed_and_equals_one_process(name, tmp_path):
    (tmp_path / "recipe.py").write_text(recipes()[name] + REPORT)
    env = os.environ | {
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",
        "EXACTPACK_KERNELS": "python",
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    launch = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={WORLD}"]
    launch += ["--master-addr=127.0.0.1", f"--master-port={_free_port()}", "recipe.py"]
    done = subprocess.run(
        launch, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"report.{r}.json").read_text()) for r in range(WORLD)]
    assert [r["world"] for r in ranks] == [WORLD] * WORLD
    want, params = _replay(tmp_path, epochs=2)
    # each rank trains its share: both ranks run the same steps, half an epoch's rows each
    assert len(ranks[0]["losses"]) == len(ranks[1]["losses"]) == len(want) >= 2
    for step, ref in enumerate(want):
        got = np.mean([r["losses"][step] for r in ranks])  # ranks' shares average to the mean
        assert abs(got - ref) <= 1e-5 * abs(ref), (step, got, ref)  # float32 sums, 1e-5
    for rank in ranks:
        for n, ref in params.items():
            gap = float(np.abs(np.array(rank["params"][n]) - ref.numpy()).max())
            assert gap <= 1e-5 * max(1.0, float(ref.abs().max())), (n, gap)
