#!/usr/bin/env bash
# Create .venv with the CPU build of torch 2.13.0 first, then exactpack with the
# given extras, so no dependency can pull a CUDA build of torch.
#
# Every package is constrained to the exact versions the test suite was run
# with (requirements/lock.txt), so a fresh clone reproduces that environment.
# EXACTPACK_UNLOCKED=1 instead upgrades everything to the newest versions
# pyproject.toml allows (torch stays 2.13.0): the way to test against them,
# e.g. `EXACTPACK_UNLOCKED=1 bash scripts/test.sh`, before refreshing the lock.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-all}"
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
if [ "${EXACTPACK_UNLOCKED:-0}" = 1 ]; then
  pins=(-c requirements/torch.txt --upgrade --upgrade-strategy eager)
else
  pins=(-c requirements/lock.txt)
fi
python3 -m venv .venv
"${pip[@]}" -c requirements/torch.txt "torch==2.13.0"
"${pip[@]}" "${pins[@]}" -e ".[${extras}]"
