"""Proof tooling: packed rows compute what each example computes alone, or where not.

What ``exactpack verify`` and ``exactpack demo`` run; the product (``core`` .. ``hf``) never
imports it. Names load on first use; ``import exactpack.verify`` imports nothing heavy.
"""

from __future__ import annotations

from exactpack._lazy import lazy_exports

_NAMES = {
    "FIXTURE_MAX_LENGTH": "fixture",
    "fixture_batch": "fixture",
    "fixture_binding": "fixture",
    "fixture_epoch": "fixture",
    "fixture_examples": "fixture",
    "demo_trace": "trace",
    "draw_batch": "figure",
    "draw_fixture": "figure",
    "draw_row": "figure",
    "PROFILES": "decoder",
    "DecoderConfig": "decoder",
    "TinyDecoder": "decoder",
    "three_way": "layouts",
    "verify_tiny": "layouts",
    "load_model": "models",
    "verify_hf": "models",
    "tolerance": "tolerances",
    "verify_tree": "tree_models",
}
__all__ = sorted(_NAMES)

__getattr__, __dir__ = lazy_exports(__name__, _NAMES)
