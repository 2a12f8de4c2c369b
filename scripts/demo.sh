#!/usr/bin/env bash
# The main job: set up .venv and run `exactpack demo` on the built-in fixture.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh all >&2
exec .venv/bin/exactpack demo "$@"
