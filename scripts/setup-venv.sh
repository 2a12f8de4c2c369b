#!/usr/bin/env bash
# Create .venv with the CPU build of torch 2.13.0 first, then seqpack with the
# given extras, so no dependency can pull a CUDA build of torch.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-all}"
python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[${extras}]"
