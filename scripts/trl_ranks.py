"""TRL's DPO, GRPO, RLOO and reward trainers with ``exactpack.trl.pack`` on 2 gloo ranks
against their own unpacked step on the same 2 ranks (float64; every gradient and every
parameter after the step). The suite runs the GRPO slice
(``tests/integration/test_trl_ranks.py``); this runs the whole matrix (about a minute)::

    PYTHONPATH=src .venv/bin/python scripts/trl_ranks.py [dpo grpo rloo reward]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "integration")]
from test_trl_ranks import TRAINERS, run_ranks  # noqa: E402


def main() -> None:
    names = sys.argv[1:] or list(TRAINERS)
    with tempfile.TemporaryDirectory() as out:
        worst = run_ranks(Path(out), names)
    print("| trainer (2 gloo ranks, float64) | worst gap / tolerance |")
    print("|---|---:|")
    for name, ratio in worst.items():
        print(f"| {name} | {ratio:.3g} {'PASS' if ratio <= 1 else 'FAIL'} |")
    sys.exit(0 if max(worst.values()) <= 1 else 1)


if __name__ == "__main__":
    main()
