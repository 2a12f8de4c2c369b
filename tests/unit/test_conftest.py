"""tests/conftest.py under CI: a missing dev dependency stops the run, it does not skip."""

import os
import subprocess
import sys
from pathlib import Path

from conftest import dev_modules

TESTS = Path(__file__).resolve().parents[1]

#: A pytest plugin that makes ``trl`` unimportable, as if it were not installed.
HIDE_TRL = "import sys\nsys.modules['trl'] = None  # import trl -> ImportError\n"
NEEDS_TRL = (
    "import pytest\n"
    "def test_uses_trl():\n"
    "    trl = pytest.importorskip('trl')\n"
    "    assert trl.__name__ == 'trl'\n"
)


#: A test file whose module-level importorskip names a module no extra installs.
NEEDS_OTHER = "import pytest\npytest.importorskip('exactpack_no_such_module')\n"


def run_without_trl(tmp_path, ci, test="test_needs_trl.py"):
    (tmp_path / "hide_trl.py").write_text(HIDE_TRL)
    (tmp_path / "test_needs_trl.py").write_text(NEEDS_TRL)
    (tmp_path / "test_needs_other.py").write_text(NEEDS_OTHER)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    args_hide = ["-p", "hide_trl"] if test == "test_needs_trl.py" else []
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(TESTS), env.get("PYTHONPATH", "")])
    if ci:
        env["CI"] = "true"
    args = [*args_hide, "-p", "conftest", "-q", "-p", "no:cacheprovider"]
    return subprocess.run(
        [sys.executable, "-m", "pytest", *args, str(tmp_path / test)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_the_dev_extra_is_read_whole():
    names = dev_modules()
    # nested extras expanded (all -> hf, plot, cli; ray) and import names mapped
    for name in ("trl", "ray.data", "datasets", "transformers", "hypothesis"):
        assert name in names
    assert "numba" not in names  # the kernels are exactpack's own C (exactpack.core.engine)
    for name in ("matplotlib", "tqdm", "accelerate", "pyarrow", "torch", "importlinter"):
        assert name in names
    assert "ruff" not in names and "flash_attn" not in names


def test_ci_fails_loudly_when_trl_is_missing_and_users_skip(tmp_path):
    ci = run_without_trl(tmp_path, ci=True)
    out = ci.stdout + ci.stderr
    assert ci.returncode == 4, out  # pytest.UsageError: the run never starts
    assert "CI=true but dev dependencies are not installed" in out, out
    assert "skipped unseen: trl —" in out, out
    assert "1 passed" not in out and "1 skipped" not in out  # no test ran
    user = run_without_trl(tmp_path, ci=False)
    assert user.returncode == 0, user.stdout + user.stderr
    assert "1 skipped" in user.stdout, user.stdout


def test_under_ci_an_importorskip_fails_instead_of_skipping(tmp_path):
    ci = run_without_trl(tmp_path, ci=True, test="test_needs_other.py")
    assert ci.returncode == 2, ci.stdout + ci.stderr  # a collection error: nothing runs
    assert "CI=true: Skipped: could not import 'exactpack_no_such_module'" in ci.stdout, ci.stdout
    user = run_without_trl(tmp_path, ci=False, test="test_needs_other.py")
    assert "1 skipped" in user.stdout, user.stdout
