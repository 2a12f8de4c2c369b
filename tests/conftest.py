"""Replayable randomness, and a whole suite under CI.

- Hypothesis: under CI (``CI=true``, which ``.ci/run`` sets itself) examples are
  derandomized, so a run is reproducible and a landing never depends on luck;
  locally every run explores new examples and a failure prints the
  ``@reproduce_failure`` blob. ``HYPOTHESIS_PROFILE=mutation`` is the small
  derandomized profile ``scripts/mutation.sh`` uses.
- NumPy: random tests take the ``seed`` (or ``rng``) fixture. The seed is
  ``EXACTPACK_TEST_SEED`` when set, else a fixed default, and a failing test that
  used it reports ``EXACTPACK_TEST_SEED=<seed>`` so the run can be replayed.
- No silent absences: under ``CI=true`` every dependency of the ``dev`` extra in
  ``pyproject.toml`` must import at session start, or the run stops (exit 4) naming
  what is missing; a ``pytest.importorskip`` would otherwise drop its tests unseen.
  On a user's machine (``CI`` unset) optional dependencies still skip.
"""

import importlib.util
import os
import re
from pathlib import Path

import numpy as np
import pytest
import tomllib
from hypothesis import Phase, settings

CI = os.environ.get("CI") == "true"
settings.register_profile("ci", max_examples=200, deadline=None, derandomize=CI, print_blob=True)
settings.register_profile("dev", max_examples=60, deadline=None, print_blob=True)
# No shrinking under mutation runs: a kill needs one failing example, not the smallest.
settings.register_profile(
    "mutation",
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

ROOT = Path(__file__).resolve().parents[1]
#: Import name of a distribution where it differs; None: a tool, not imported by the tests
#: (ruff runs as a command) or a CUDA-only extra outside ``dev`` (flash-attn).
IMPORT_NAMES = {
    "import-linter": "importlinter",
    "ray": "ray.data",  # ray[data]: the tests use Ray Data
    "ruff": None,
    "flash-attn": None,
}


def dev_modules(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """Import names of everything the ``dev`` extra installs, its nested extras expanded."""
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    seen, todo, names = set(), ["dev"], []
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for req in extras[extra]:
            dist = re.match(r"[A-Za-z0-9_.-]+", req)[0]
            nested = re.fullmatch(r"exactpack\[(.*)\].*", req)
            if nested:
                todo += [e.strip() for e in nested[1].split(",")]
                continue
            name = IMPORT_NAMES.get(dist, dist.replace("-", "_"))
            if name and name not in names:
                names.append(name)
    return names


def missing_modules(names: list[str]) -> list[str]:
    """Each module that is not installed (found without importing it: cheap at start-up;
    one installed but broken fails its ``importorskip`` instead, see below)."""
    out = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError) as err:  # a parent package missing or broken
            found = False
            name = f"{name} ({err})"
        if not found:
            out.append(name)
    return out


def import_skip(report) -> str | None:
    """The reason of a skip made by ``pytest.importorskip`` (a module that did not import)."""
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2])
        if "could not import" in reason:
            return reason
    return None


def fail_import_skips(report) -> None:
    """Under CI an ``importorskip`` skip is a failure: the dev extra installs everything."""
    reason = import_skip(report) if CI else None
    if reason:
        report.outcome = "failed"
        report.longrepr = f"CI=true: {reason} — a dev dependency is missing or broken"


def pytest_sessionstart(session):
    if not CI:
        return
    missing = missing_modules(dev_modules())
    if missing:
        raise pytest.UsageError(
            "CI=true but dev dependencies are not installed, so their tests would be skipped"
            f" unseen: {', '.join(missing)} — install them (pip install -e '.[dev]') or"
            " unset CI to let optional tests skip"
        )


SEED_VARIABLE = "EXACTPACK_TEST_SEED"
DEFAULT_SEED = 1234


def suite_seed() -> int:
    """The seed of this run: ``EXACTPACK_TEST_SEED`` or :data:`DEFAULT_SEED`."""
    text = os.environ.get(SEED_VARIABLE, "").strip()
    return int(text) if text else DEFAULT_SEED


@pytest.fixture
def seed(request) -> int:
    value = suite_seed()
    request.node.user_properties.append(("seed", value))
    return value


@pytest.fixture
def rng(seed):
    return np.random.default_rng(seed)


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    fail_import_skips(report)  # a module-level importorskip
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    fail_import_skips(report)
    seeds = [v for k, v in item.user_properties if k == "seed"]
    if report.failed and seeds:
        report.sections.append(
            ("replay", f"rerun with {SEED_VARIABLE}={seeds[0]} to replay this test's randomness")
        )
    return report
