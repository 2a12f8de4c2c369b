"""Fast first calls (issue 23, item 7): C kernels that load wherever exactpack is
installed (no numba), no heavy import on the in-memory path, TRL's columns in one pass.

Speed itself is measured in ``benchmarks/bench_userpath.py`` (first call in a
fresh process beside warm medians), never in tests; these tests hold what
makes the first call fast.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
#: The C kernels are built (skipped on a user's machine without a compiler; never under CI).
NATIVE = pytest.mark.skipif(
    importlib.util.find_spec("exactpack.core.native") is None and os.environ.get("CI") != "true",
    reason="C kernels not built",
)

PLAN = """
import json, sys, numpy as np, exactpack
from exactpack.core import engine
from exactpack.core.policies import plan_rows
plan = plan_rows(np.array([3, 4, 5, 2]), 8, "best-fit-decreasing", kernels="native")
print(json.dumps({"rows": plan.num_rows, "kernels": engine.resolve("auto"),
                  "numba": "numba" in sys.modules, "file": exactpack.__file__}))
"""


@NATIVE
def test_the_c_kernels_load_from_a_read_only_install_without_a_home():
    """An installed package whose folder is read-only, run by a user without a writable home:
    the C kernels load and run there (nothing is compiled or cached at run time), and
    nothing imports numba."""
    root = Path(tempfile.mkdtemp(prefix="exactpack-ro-"))  # under /tmp: any user can reach it
    os.chmod(root, 0o755)
    site, tmp = root / "site", root / "tmp"
    shutil.copytree(SRC / "exactpack", site / "exactpack", ignore=shutil.ignore_patterns("*.c"))
    tmp.mkdir(mode=0o777)
    os.chmod(tmp, 0o777)
    for folder, _, files in os.walk(site):
        for name in files:
            os.chmod(os.path.join(folder, name), 0o444)
        os.chmod(folder, 0o555)
    env = {k: v for k, v in os.environ.items() if k != "EXACTPACK_KERNELS"}
    env |= {"PYTHONPATH": str(site), "HOME": str(root / "no-home"), "TMPDIR": str(tmp)}
    user = [] if os.getuid() else ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    argv = [*user, sys.executable, "-c", PLAN]
    try:
        run = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp, check=False)
        assert run.returncode == 0, run.stderr[-2000:]
        done = json.loads(run.stdout.splitlines()[-1])
        assert done["rows"] == 2
        assert done["file"].startswith(str(site))  # the read-only copy was the one imported
        assert done["kernels"] == "native" and not done["numba"]
        assert not list(tmp.iterdir())  # nothing cached
    finally:
        for folder, _, _ in os.walk(site):
            os.chmod(folder, 0o755)
        shutil.rmtree(root, ignore_errors=True)


FIRST = """
import sys, numpy as np, pyarrow as pa, datasets
datasets.disable_progress_bars()
tokens = [0, 99, 100, 1, 0, 101, 1, 0, 102, 103, 104, 1]
ids = pa.ListArray.from_arrays(pa.array([0, 4, 7, 12], pa.int32()), pa.array(tokens, pa.int32()))
ds = datasets.Dataset(datasets.table.InMemoryTable(pa.table({"input_ids": ids})), fingerprint="x")
before = set(sys.modules)
from exactpack.hf import pack_dataset
for fmt in ("exactpack", "trl"):
    pack_dataset(ds, 7, "bfd", vocab_size=266, format=fmt)
heavy = ("torch", "transformers", "tokenizers", "matplotlib", "tqdm", "ray", "numba")
print(sorted(m for m in set(sys.modules) - before if m.split(".")[0] in heavy))
"""


def test_the_first_pack_dataset_call_imports_nothing_heavy():
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    run = subprocess.run([sys.executable, "-c", FIRST], capture_output=True, text=True, env=env,
                         check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "[]"


@pytest.mark.parametrize("masked", [False, True])
def test_trl_columns_in_one_pass_equal_the_numpy_path(masked, monkeypatch):
    """TRL's rows from the C kernels' labels and from NumPy's are the same; positions (derived
    by TRL's collator from seq_lengths) restart at 0 per window, its first label -100."""
    pytest.importorskip("trl")
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from exactpack.core import engine
    from exactpack.core.binding import Binding, Split
    from exactpack.core.compact import CompactRows
    from exactpack.io.shards import token_offsets
    from exactpack.io.trl_schema import trl_table

    rng = np.random.default_rng(11)
    lengths = rng.integers(1, 40, size=300).astype(np.int64)
    total = int((lengths + 1).sum())
    cols = CompactRows(
        row_offsets=np.array([0, 120, 300]), tokens=rng.integers(0, 500, total,
        dtype=np.int32), lengths=lengths, starts=None, ordinals=None, capacity=64,
        partition=Split.TRAIN, binding=Binding(500, "t", "s"),
        loss_mask=rng.random(int(lengths.sum())) < 0.7 if masked else None,
    )  # fmt: skip
    tok, _ = token_offsets(cols)
    table = trl_table(cols)
    monkeypatch.setattr(engine, "compiled", lambda name: None)  # the NumPy path, no C kernels
    assert table.equals(trl_table(cols))
    assert table.schema.field("labels").type == pa.list_(pa.int64())  # labels always
    collate = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    batch = collate(table.to_pylist())
    labels, positions = (batch[c][0].numpy() for c in ("labels", "position_ids"))
    assert labels.dtype == np.int64
    starts = tok[:-1]
    assert (positions[starts] == 0).all() and (labels[starts] == -100).all()
    assert positions[starts[5] + 3] == 3


PACK = """
import json, sys
from exactpack.cli import main
with open("d.jsonl", "w") as f:
    for i in range(20):
        f.write(json.dumps({"id": f"doc-{i}", "text": "abc" * (i + 1)}) + "\\n")
for fmt in ("exactpack", "trl"):
    code = main(["pack", "d.jsonl", "--tokenizer", "bytes", "--max-length", "128", "--format", fmt,
                 "--out", "out-" + fmt])
    assert code == 0, code
heavy = ("pandas", "torch", "transformers", "tokenizers", "datasets", "matplotlib", "ray")
print(sorted(m for m in heavy if m in sys.modules))
"""


def test_exactpack_pack_imports_nothing_heavy(tmp_path):
    """`exactpack pack` with ids given (source ids gathered with Arrow's take): no pandas (it
    cost 0.65-1.5 s of a fresh process), nor anything else it does not need."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    run = subprocess.run([sys.executable, "-c", PACK], capture_output=True, text=True, env=env,
                         cwd=tmp_path, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "[]"


SMALL = """
import json, sys, numpy as np
from exactpack.core import engine
from exactpack.core.policies import plan_rows
used, call = set(), engine.call
engine.call = lambda kernels, *args, **kw: used.add(kernels) or call(kernels, *args, **kw)
lengths = np.random.default_rng(0).integers(1, 8, 20_000)
small = plan_rows(lengths[:1000], 8, "best-fit-decreasing")
big = plan_rows(lengths, 8, "stream-best-fit")
auto = sorted(used)
python = plan_rows(lengths[:1000], 8, "best-fit-decreasing", kernels="python")
same = bool((small.row_of == python.row_of).all() and (small.start_of == python.start_of).all())
print(json.dumps({"auto": auto, "numba": "numba" in sys.modules, "same": same}))
"""


@NATIVE
def test_every_call_plans_with_the_c_kernels_and_no_numba():
    """``"auto"`` runs the C kernels at any size (loading them costs no start-up), gives the
    Python kernels' plan, and nothing imports numba."""
    env = {k: v for k, v in os.environ.items() if k != "EXACTPACK_KERNELS"}
    env["PYTHONPATH"] = str(SRC)
    run = subprocess.run(
        [sys.executable, "-c", SMALL], capture_output=True, text=True, env=env, check=False
    )
    assert run.returncode == 0, run.stderr[-2000:]
    seen = json.loads(run.stdout.splitlines()[-1])
    assert seen == {"auto": ["native"], "numba": False, "same": True}


def test_the_user_path_benchmark_makes_its_scratch_folder_on_a_fresh_clone(tmp_path, monkeypatch):
    """A fresh clone has no ``.cache/bench``: the benchmark's first scratch folder makes it."""
    monkeypatch.syspath_prepend(str(SRC.parent / "benchmarks"))
    import bench_userpath

    missing = tmp_path / "clone" / ".cache" / "bench"
    monkeypatch.setattr(bench_userpath, "CACHE", missing)
    work = bench_userpath.scratch("userpath-")
    assert work.is_dir() and work.parent == missing
