import os

import numpy as np
import pytest
from hypothesis import settings

# Under CI (CI=true) the examples are derandomized so a run is reproducible and a
# landing never depends on luck; locally every run explores new examples.
settings.register_profile(
    "ci", max_examples=200, deadline=None, derandomize=os.environ.get("CI") == "true"
)
settings.register_profile("dev", max_examples=60, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
