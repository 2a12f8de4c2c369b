#!/usr/bin/env bash
# The full test suite: set up .venv with the dev extras (the locked versions of
# requirements/lock.txt; EXACTPACK_UNLOCKED=1 for the newest) and run pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh dev  # installs only when pyproject.toml or the lock changed
export MPLCONFIGDIR="${MPLCONFIGDIR:-$PWD/.cache/matplotlib}"
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$PWD/.cache/inductor}"
exec .venv/bin/python -m pytest "$@"
