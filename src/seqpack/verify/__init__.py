"""Proof tooling: packed rows compute what each example computes alone, or where not.

This package is what ``seqpack verify`` and ``seqpack demo`` run; the product
(``core`` .. ``hf``) never imports it.

=====================  =========================================================
module                 holds
=====================  =========================================================
``fixture``            the seed's A/B/C fixture (NumPy only)
``trace``              the JSON trace ``seqpack demo`` prints
``figure``             figures of a batch (matplotlib)
``decoder``            :class:`TinyDecoder`, the float64 reference model
``layouts``            separate vs padded vs packed; ``seqpack verify`` without ``--hf-*``
``probes``             the isolation and first-query probes
``models``             :func:`verify_hf`: a ``transformers`` model, packed == separate;
                       the model and the verification layout it runs on
``tolerance``          tolerances derived from the dtype path (float32 islands)
``diagnose``           the first divergent layer, and a hint
``tree_models``        :func:`verify_tree`: tree-packed rows on a real model
=====================  =========================================================

Names load on first use; ``import seqpack.verify`` imports nothing heavy.
"""

from __future__ import annotations

from seqpack._lazy import lazy_exports

_NAMES = {
    "FIXTURE_CAPACITY": "fixture",
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
    "tolerance": "tolerance",
    "verify_tree": "tree_models",
}
__all__ = sorted(_NAMES)

__getattr__, __dir__ = lazy_exports(__name__, _NAMES)
