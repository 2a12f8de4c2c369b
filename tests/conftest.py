"""Replayable randomness for the whole suite.

- Hypothesis: under CI (``CI=true``, which ``.ci/run`` sets itself) examples are
  derandomized, so a run is reproducible and a landing never depends on luck;
  locally every run explores new examples and a failure prints the
  ``@reproduce_failure`` blob. ``HYPOTHESIS_PROFILE=mutation`` is the small
  derandomized profile ``scripts/mutation.sh`` uses.
- NumPy: random tests take the ``seed`` (or ``rng``) fixture. The seed is
  ``SEQPACK_TEST_SEED`` when set, else a fixed default, and a failing test that
  used it reports ``SEQPACK_TEST_SEED=<seed>`` so the run can be replayed.
"""

import os

import numpy as np
import pytest
from hypothesis import settings

CI = os.environ.get("CI") == "true"
settings.register_profile("ci", max_examples=200, deadline=None, derandomize=CI, print_blob=True)
settings.register_profile("dev", max_examples=60, deadline=None, print_blob=True)
settings.register_profile(
    "mutation", max_examples=25, deadline=None, derandomize=True, database=None
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

SEED_VARIABLE = "SEQPACK_TEST_SEED"
DEFAULT_SEED = 1234


def suite_seed() -> int:
    """The seed of this run: ``SEQPACK_TEST_SEED`` or :data:`DEFAULT_SEED`."""
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
def pytest_runtest_makereport(item, call):
    report = yield
    seeds = [v for k, v in item.user_properties if k == "seed"]
    if report.failed and seeds:
        report.sections.append(
            ("replay", f"rerun with {SEED_VARIABLE}={seeds[0]} to replay this test's randomness")
        )
    return report
