"""Sweep every causal-LM model type of the installed transformers through ``verify``.

Usage::

    PYTHONPATH=src nice .venv/bin/python scripts/sweep_architectures.py \
        [--out .cache/sweep.json] [--types llama,moshi,...|hybrids] [--no-docs]

For each type of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``: a tiny random config
(``tests/support/architecture_tiny.py``: width 16, 2 layers, window 4 where the model
has one, smaller than the longest example), its capability
(:func:`exactpack.hf.capabilities.capability`: exact / exact if ... / refused and
why), and ``verify_hf`` in float64 on each of eager, sdpa and
``exactpack_varlen``, the separate runs on the model's own sdpa/eager. Each
cell is ``PASS`` (packed == separate), ``FAIL`` (mixed examples), ``refused``
(up front, with the reason), ``n/a`` (transformers has no such
implementation for the type) or ``crash``. Writes the JSON result and, unless
``--no-docs``, the sweep table of ``docs/transformers.md``. ``--types hybrids``
sweeps :data:`HYBRIDS`, the hybrid types whose mixers exactpack restarts per
example (:mod:`exactpack.hf.mixers`; their tiny configs mix one mixer layer with
one attention layer where the type has attention).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
ATTNS = ("eager", "sdpa", "exactpack_varlen")
DOCS = ROOT / "docs" / "transformers.md"
BEGIN, END = "<!-- sweep:begin -->", "<!-- sweep:end -->"
#: Hybrid types whose mixers restart per example: short convolutions (LFM2), Mamba and
#: Mamba-2 selective scans, gated delta rules (each PASS in float64, the rest refused).
HYBRIDS = (
    "lfm2",
    "lfm2_moe",
    "mamba",
    "falcon_mamba",
    "jamba",
    "mamba2",
    "bamba",
    "nemotron_h",
    "falcon_h1",
    "granitemoehybrid",
    "qwen3_next",
    "qwen3_5",
    "qwen3_5_moe",
    "olmo_hybrid",
)


def _line(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())[:160]}"


def _build(config, attn: str, dtype):
    import torch

    from exactpack.hf.capabilities import causal_lm

    torch.manual_seed(0)
    return causal_lm(config)(
        config, attn_implementation=attn, dtype=dtype, experts_implementation="eager"
    ).eval()


def _runs_alone(model) -> str | None:
    """None, or why the model's own forward of one short example fails (no exactpack inputs)."""
    import torch

    try:
        with torch.no_grad():
            model(input_ids=torch.arange(3, 9)[None], use_cache=False)
    except Exception as err:
        return _line(err)
    return None


def run_one(model_type: str, attn: str, config) -> dict:
    """One cell: ``{"status", "detail", ...}`` for ``model_type`` on ``attn``."""
    import torch

    from exactpack.hf.architectures import UnsupportedArchitecture
    from exactpack.hf.capabilities import capability
    from exactpack.hf.kinds import attention_kind

    from support.architecture_cases import verify_default

    try:  # what load_model does: the config's capability first, before any weights
        capability(config).check(attention_kind(attn))
    except UnsupportedArchitecture as err:
        return {"status": "refused", "detail": str(err)}
    try:
        model = _build(config, attn, torch.float64)
    except Exception as err:  # transformers has no such implementation for this type
        return {"status": "n/a", "detail": _line(err)}
    cell = {"dtype": "float64"}
    why = _runs_alone(model)
    if why is not None and _runs_alone(float32 := _build(config, attn, torch.float32)) is None:
        # the model's own float64 forward fails (xglm: finfo(float64).min into float32)
        model, cell = float32, {"dtype": "float32", "float64": why}
    try:
        capability(model).check(attention_kind(attn))
        report = verify_default(model)
    except UnsupportedArchitecture as err:
        return {"status": "refused", "detail": str(err)}
    except Exception as err:
        return {"status": "crash", "detail": _line(err)}
    diff = report["max_abs_diff"]
    return cell | {
        "status": "PASS" if report["pass"] else ("FAIL" if report["mixed"] else "own loss"),
        "logits": diff["logits"],
        "gradients": diff.get("gradients"),
        "reference": report["reference"],
        "tolerance": report["tolerance"]["why"],
        "detail": report.get("hint", ""),
        "window_exercised": report["architecture"]["window_exercised"],
    }


class TimedOut(BaseException):
    """A type that took longer than its budget (reported, not waited for)."""


def _alarm(signum: int, frame: object) -> None:
    raise TimedOut("took longer than the sweep's per-type budget")


def sweep_type(model_type: str, budget: int = 180) -> dict:
    """The capability and the three cells of one model type, within ``budget`` seconds."""
    import signal

    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(budget)
    try:
        return _sweep_type(model_type)
    except TimedOut as err:
        return {"verdict": f"timed out: {err}", "cells": {}}
    finally:
        signal.alarm(0)


def _sweep_type(model_type: str) -> dict:
    from exactpack.hf.capabilities import capability

    from support.architecture_tiny import tiny_config

    try:
        config = tiny_config(model_type)
        verdict = capability(config).verdict
    except Exception as err:
        return {"verdict": f"no tiny config: {_line(err)}", "cells": {}}
    return {
        "verdict": verdict,
        "cells": {attn: run_one(model_type, attn, config) for attn in ATTNS},
    }


def cell_text(cell: dict) -> str:
    status = cell.get("status", "—")
    if status in ("PASS", "FAIL", "own loss"):
        dtype = " (float32)" if cell.get("dtype") == "float32" else ""
        return f"{status} {cell['logits']:.0e}{dtype}"
    return status


def table(results: dict) -> str:
    head = "| model type | capability | eager | sdpa | exactpack_varlen |\n|---|---|---|---|---|\n"
    rows = []
    for model_type, r in results.items():
        cells = [cell_text(r["cells"].get(a, {})) for a in ATTNS]
        verdict = r["verdict"].replace("|", "/")
        refused = {
            c.get("detail", "").split(": ", 1)[-1]
            for c in r["cells"].values()
            if c.get("status") == "refused" and not r["verdict"].startswith("refused")
        }
        if refused:
            verdict += "; " + "; ".join(sorted(refused)).replace("|", "/")
        if r["cells"] and all(c["status"] == "n/a" for c in r["cells"].values()):
            verdict += f"; not built here: {r['cells']['eager']['detail'][:90]}".replace("|", "/")
        rows.append(f"| `{model_type}` | {verdict} | {' | '.join(cells)} |")
    return head + "\n".join(rows) + "\n"


def counts(results: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in results.values():
        for cell in r["cells"].values():
            out[cell["status"]] = out.get(cell["status"], 0) + 1
        if not r["cells"]:
            key = r["verdict"].split(":")[0]
            out[key] = out.get(key, 0) + 1
    return out


def write_docs(results: dict) -> None:
    import torch
    import transformers

    total = counts(results)
    stamp = (
        f"*Generated by `scripts/sweep_architectures.py`: {len(results)} causal-LM types of"
        f" transformers {transformers.__version__}, torch {torch.__version__}, float64 on CPU;"
        f" cells: {', '.join(f'{k} {v}' for k, v in sorted(total.items()))}.*\n\n"
    )
    text = DOCS.read_text()
    block = f"{BEGIN}\n{stamp}{table(results)}{END}"
    if BEGIN in text:
        pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
        text = pattern.sub(lambda _: block, text)
    else:
        text += f"\n## Every causal-LM type (the sweep)\n\n{block}\n"
    DOCS.write_text(text)


def sweep_args(description: str, out: str, types_help: str) -> argparse.Namespace:
    """The sweeps' command line; then transformers and logging quieted, one torch thread."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", default=out)
    parser.add_argument("--types", help=types_help)
    parser.add_argument("--no-docs", action="store_true")
    parser.add_argument("--merge", action="store_true", help="update --out's earlier results")
    args = parser.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    warnings.filterwarnings("ignore")
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    return args


def run_sweep(args: argparse.Namespace, every: list[str], sweep, counts, write_docs) -> None:
    """``sweep(type)`` for ``--types`` (default ``every``), the JSON saved after each type;
    ``--merge`` re-runs some types inside an earlier result; the docs once all are in."""
    types = args.types.split(",") if args.types else every
    if types == ["hybrids"]:
        types = list(HYBRIDS)
    out = Path(args.out)
    results = json.loads(out.read_text()) if args.merge and out.exists() else {}
    for model_type in types:
        started = time.perf_counter()
        results[model_type] = sweep(model_type)
        cells = {a: c["status"] for a, c in results[model_type]["cells"].items()}
        print(f"{model_type}: {cells} {time.perf_counter() - started:.1f}s", file=sys.stderr)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1))
    print(json.dumps(counts(results)))
    if not args.no_docs and set(every) <= set(results):
        write_docs({t: results[t] for t in every})


def main() -> None:
    args = sweep_args(
        __doc__.splitlines()[0], str(ROOT / ".cache" / "sweep.json"),
        "comma-separated model types, or hybrids (default: all)",
    )  # fmt: skip
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    import exactpack.hf.attention_impl  # noqa: F401  (registers exactpack_varlen)

    run_sweep(args, list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES), sweep_type, counts, write_docs)


if __name__ == "__main__":
    main()
