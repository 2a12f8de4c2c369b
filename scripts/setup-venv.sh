#!/usr/bin/env bash
# Create .venv with the CPU build of torch 2.13.0 first, then exactpack with the
# given extras, so no dependency can pull a CUDA build of torch.
#
# Every package is constrained to the exact versions the test suite was run
# with (requirements/lock.txt), so a fresh clone reproduces that environment.
# EXACTPACK_UNLOCKED=1 instead upgrades everything to the newest versions
# pyproject.toml allows (torch stays 2.13.0): the way to test against them,
# e.g. `EXACTPACK_UNLOCKED=1 bash scripts/test.sh`, before refreshing the lock.
#
# A stamp inside .venv holds the sha256 of what was installed from (pyproject.toml,
# the lock, torch's constraint, the native kernels' source) and the extras: when it
# matches, nothing is installed again (scripts/test.sh runs in seconds, not minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-all}"
unlocked="${EXACTPACK_UNLOCKED:-0}"
stamp=.venv/exactpack-setup.sha256
note() { echo "setup-venv: $*" >&2; }
inputs=(pyproject.toml requirements/lock.txt requirements/torch.txt src/exactpack/core/native.c)
want="$(python3 -c '
import hashlib, sys
for path in sys.argv[2:]:
    with open(path, "rb") as f:
        print(hashlib.sha256(f.read()).hexdigest(), path)
print("extras", sys.argv[1])
' "${extras}" "${inputs[@]}")"
if [ "$unlocked" != 1 ] && [ -x .venv/bin/python ] && [ -f "$stamp" ] \
  && [ "$(cat "$stamp")" = "$want" ]; then
  note ".venv already has exactpack[${extras}] from this pyproject.toml and lock — nothing to install"
  exit 0
fi
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
if [ "$unlocked" = 1 ]; then
  pins=(-c requirements/torch.txt --upgrade --upgrade-strategy eager)
else
  pins=(-c requirements/lock.txt)
fi
if [ ! -x .venv/bin/python ]; then
  note "creating .venv (python3 -m venv)"
  python3 -m venv .venv
fi
rm -f "$stamp"  # an install that fails half-way leaves no stamp behind
note "installing torch 2.13.0, CPU build (a few minutes on a fresh .venv)"
"${pip[@]}" -c requirements/torch.txt "torch==2.13.0"
note "installing exactpack[${extras}] $([ "$unlocked" = 1 ] && echo "at the newest allowed versions" || echo "at the locked versions (requirements/lock.txt)")"
"${pip[@]}" "${pins[@]}" -e ".[${extras}]"
if [ "$unlocked" != 1 ]; then  # an unlocked install is never taken for the locked one
  printf '%s\n' "$want" >"$stamp"
fi
note "done: .venv has exactpack[${extras}]"
