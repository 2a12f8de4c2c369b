"""Proof tooling: packed rows compute what each example computes alone, or where not.

What ``exactpack verify`` and ``exactpack demo`` run; the product (``core`` .. ``hf``) never
imports it. Names load on first use; ``import exactpack.verify`` imports nothing heavy.
"""

from __future__ import annotations

from exactpack._lazy import lazy_exports

_NAMES = {
    "FIXTURE_MAX_LENGTH": "fixture",
    "fixture_batch": "fixture",
    "demo_trace": "trace",
    "draw_batch": "figure",
    "draw_fixture": "figure",
    "TinyDecoder": "decoder",
    "verify_tiny": "layouts",
    "load_model": "models",
    "verify_hf": "models",
}
__all__ = sorted(_NAMES)

__getattr__, __dir__ = lazy_exports(__name__, _NAMES)
