"""``seqpack verify`` without ``--hf-*``: the tiny decoder, separate vs padded vs packed.

The fixture and a few random layouts (:func:`tiny_layouts`) run through
:func:`seqpack.verify.layouts.three_way` in float64 with the seed's tolerance;
:func:`verify_tiny` merges them into the report the command prints.
``mode="naive"`` swaps in plain causal attention over storage columns, the
control that must fail.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from seqpack.core.errors import InvalidInput
from seqpack.core.examples import SequenceExample
from seqpack.verify.decoder import TinyDecoder
from seqpack.verify.fixture import FIXTURE_CAPACITY, fixture_binding, fixture_examples
from seqpack.verify.layouts import ATOL, RTOL, three_way
from seqpack.verify.probes import unguarded_causal_attention


def tiny_layouts(
    seed: int, count: int, max_len: int
) -> list[tuple[list[SequenceExample], int, int]]:
    """The fixture (capacity 6) and ``count`` random layouts: ``(examples, capacity, rows)``.

    Random layouts have 2-6 examples of 1..``max_len`` pairs, some with a
    loss mask, a capacity between the longest and twice ``max_len``, and
    1-3 rows per model call, drawn from ``default_rng(seed)``.
    """
    binding = fixture_binding()
    layouts = [(fixture_examples(binding), FIXTURE_CAPACITY, 2)]
    rng = np.random.default_rng(seed)
    for k in range(count):
        examples = []
        for i in range(int(rng.integers(2, 7))):
            length = int(rng.integers(1, max_len + 1))
            mask = rng.random(length) < 0.7 if rng.random() < 0.3 else None
            examples.append(
                SequenceExample.from_document(
                    rng.integers(0, binding.vocab_size, size=length + 1),
                    source_id=f"layout{k}-{i}",
                    partition="train",
                    binding=binding,
                    loss_mask=mask,
                )
            )
        longest = max(len(ex) for ex in examples)
        capacity = int(rng.integers(longest, 2 * max_len + 1))
        layouts.append((examples, capacity, int(rng.integers(1, 4))))
    return layouts


def verify_tiny(
    attention: str = "ranges", *, mode: str = "adapter", seed: int = 42, layouts: int = 4
) -> dict[str, Any]:
    """Separate vs padded vs packed on the tiny decoder (float64, the seed's tolerance).

    ``mode="naive"`` swaps in plain causal attention over storage columns,
    which must fail. Max abs diffs are the largest over every layout.
    """
    if mode not in ("adapter", "naive"):
        raise InvalidInput(
            f"--mode {mode!r} applies to transformers models only; the tiny decoder takes"
            " adapter or naive"
        )
    backend = unguarded_causal_attention if mode == "naive" else attention
    model = TinyDecoder("large", seed=seed, attention=backend)
    runs = [
        three_way(model, examples, capacity, max_rows_per_batch=rows)
        for examples, capacity, rows in tiny_layouts(seed, layouts, model.config.max_len)
    ]
    quantities = {"logits": "logits", "loss": "loss_sum", "gradients": "gradients"}
    report = {
        "target": "tiny-decoder",
        "model": {
            "profile": model.profile,
            "parameters": model.num_parameters,
            "dtype": "float64",
            "attention": attention,
            "seed": seed,
        },
        "mode": mode,
        "layouts": len(runs),
        "examples": sum(r["examples"] for r in runs),
        "targets": sum(r["targets"] for r in runs),
        "tolerance": {"abs": ATOL, "rel": RTOL, "why": "float64 throughout: the seed's tolerance"},
        "max_abs_diff": {
            name: max(r["max_abs_diff"][key] for r in runs) for name, key in quantities.items()
        },
        "comparisons": {
            name: sum(r["comparisons"][key] for r in runs) for name, key in quantities.items()
        },
        "failures": {
            name: sum(r["failures"][key] for r in runs) for name, key in quantities.items()
        },
        "pass": all(r["passed"] for r in runs),
    }
    if not report["pass"]:
        report["hint"] = (
            "plain causal attention over storage columns crosses examples (the control)"
            if mode == "naive"
            else f"backend {attention!r} does not honour the packed layout"
        )
    return report
