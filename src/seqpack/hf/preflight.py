"""Checks before data moves: the model's vocabulary and pad id, an implementation that can run.

:func:`check_model` is what ``pack_dataset(..., model=...)`` runs;
:class:`seqpack.hf.HFCollator` runs :func:`check_runnable` and
:func:`check_vocabulary` at construction.
"""

from __future__ import annotations

from typing import Any

import torch

from seqpack.core.binding import Binding
from seqpack.core.errors import InvalidInput
from seqpack.hf.architectures import Architecture
from seqpack.hf.capability import capability


def check_runnable(attn_implementation: str, kind: str | None) -> None:
    """Refuse a flash implementation that cannot run on this machine (no CUDA or no flash-attn)."""
    if attn_implementation not in ("flash_attention_2", "flash_attention_3"):
        return
    import importlib.util

    package = "flash_attn" if attn_implementation == "flash_attention_2" else "flash_attn_interface"
    cuda = torch.cuda.is_available()
    found = importlib.util.find_spec(package) is not None
    if not (cuda and found):
        missing = " and ".join(
            w for w, ok in (("a CUDA device", cuda), (f"the {package} package", found)) if not ok
        )
        raise InvalidInput(
            f"attn_implementation={attn_implementation!r} cannot run here: {missing} missing"
            " — use 'sdpa' (or 'seqpack_varlen') on this machine"
        )


def check_vocabulary(config: Any, binding: Binding | None, pad_token_id: int) -> None:
    """Refuse a packing whose vocabulary (or pad id) the model's embedding cannot index."""
    text = getattr(config, "get_text_config", lambda: config)()
    vocab = getattr(text, "vocab_size", None)
    if not isinstance(vocab, int):
        return
    if binding is not None and binding.vocab_size > vocab:
        raise InvalidInput(
            f"the packed rows' vocabulary has {binding.vocab_size:,} ids but the model's"
            f" config.vocab_size is {vocab:,}: ids >= {vocab:,} would index past its embedding"
            " — pack with the model's tokenizer (or resize the model's token embeddings)"
        )
    if not 0 <= int(pad_token_id) < vocab:
        raise InvalidInput(
            f"pad_token_id {pad_token_id} is not an id of the model's vocabulary"
            f" (config.vocab_size {vocab:,}) — pass pad_token_id=tokenizer.pad_token_id (any"
            " real id: padding cells are never seen by real queries)"
        )


def check_model(
    model: Any, binding: Binding | None, pad_token_id: int | None, longest: int, capacity: int
) -> Architecture:
    """The checks ``pack_dataset(..., model=model)`` makes before it writes a row.

    ``model``: a ``transformers`` model (its modules are inspected) or a config.
    Refuses what its capability refuses (:func:`seqpack.hf.capability.capability`,
    for the attention implementation it was loaded with), rows or examples beyond
    its stated conditions (``longest`` pairs, rows of ``capacity``), and a
    vocabulary or pad id its embedding cannot index.
    """
    from seqpack.hf.kinds import derived_kind

    config = getattr(model, "config", model)
    arch = capability(config, model if hasattr(model, "config") else None)
    attn = getattr(config, "_attn_implementation", None)
    arch.check(derived_kind(attn) if isinstance(attn, str) else None)
    arch.check_batch(longest, capacity)
    check_vocabulary(config, binding, 0 if pad_token_id is None else pad_token_id)
    return arch


__all__ = ["check_model", "check_runnable", "check_vocabulary"]
