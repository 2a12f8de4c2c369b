"""The capability check: what a model needs to be exact on packed rows, found before data moves.

:func:`capability` reads the config (:func:`seqpack.hf.architectures.describe`)
**and the model's modules** — the model itself when there is one, else the
same model built on the ``meta`` device from the config (no memory, no
weights) — and answers, for every attention implementation:

* **positions**: ``position_ids`` (local positions restart at 0), ``relative``
  (rotary tables indexed by column: scores see only ``q - k``), an
  **offset** (the RoBERTa family's embeddings number positions from
  ``padding_idx + 1``, so seqpack feeds ``position + padding_idx + 1``), or
  **columns** (a forward that takes no ``position_ids`` but embeds positions,
  e.g. the BART-family decoders: refused, a packed row cannot restart them);
* **causality**: self-attention modules with ``is_causal=False`` (a BERT with
  ``is_decoder=False``) are bidirectional and refused for causal packing;
* **the attention interface**: ``seqpack_varlen`` runs only inside modules
  that call ``transformers``' ``ALL_ATTENTION_FUNCTIONS`` and only when their
  decoder layer passes the attention kwargs on (``cu_seq_lens_q``); elsewhere
  it is refused with the model's name, never used as a silent fallback;
* **windows**: a config's ``sliding_window`` counts only where the model's
  code applies one (``moshi`` has the field and never uses it);
* **mixing layers**: short convolutions, recurrences (a decoder without any
  attention module, e.g. ``xlstm``), state-space and linear-attention
  mixers (:func:`mixing_modules`).

The result is an :class:`~seqpack.hf.architectures.Architecture`: exact
(with the inputs that make it exact), exact under stated conditions checked
on every batch (:class:`~seqpack.hf.architectures.Condition`), or refused
with the true reason.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import inspect
import logging
import textwrap
import warnings
from functools import lru_cache
from typing import Any

from seqpack.hf.architectures import FIX, WHY_KIND, Architecture, describe

#: Class-name words of mixers (checked before a plain ``Conv1d`` inside them).
MIXER_CLASSES = (
    ("ShortConv", "convolution"),
    ("Mamba", "linear attention"),
    ("GatedDeltaNet", "linear attention"),
    ("LinearAttention", "linear attention"),
    ("LightningAttention", "linear attention"),
    ("Rwkv", "linear attention"),
    ("xLSTM", "linear attention"),
    ("mLSTM", "linear attention"),
    ("sLSTM", "linear attention"),
)
#: Source words of a forward that dispatches through transformers' attention interface.
INTERFACE_WORDS = ("ALL_ATTENTION_FUNCTIONS", "AttentionInterface")
#: Source words of a model that applies its config's sliding window.
WINDOW_WORDS = ("create_sliding_window_causal_mask", "sliding_window=", '"sliding_attention"')
#: Class-name words of modules that embed positions.
POSITION_WORDS = ("Positional", "PositionEmbedding", "Rotary", "Sinusoidal", "PositionalEmbedding")


@lru_cache(maxsize=512)
def _source(cls: type, attr: str = "forward") -> str:
    try:
        return textwrap.dedent(inspect.getsource(getattr(cls, attr)))
    except (OSError, TypeError, AttributeError):
        return ""


@lru_cache(maxsize=128)
def _module_source(module_name: str) -> str:
    import sys

    module = sys.modules.get(module_name)
    try:
        return inspect.getsource(module) if module is not None else ""
    except (OSError, TypeError):
        return ""


def _params(fn: Any) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return {}


def _var_kw(fn: Any) -> bool:
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in _params(fn).values())


#: Module-name words of towers that are not the packed text (a multimodal model's encoders).
TOWER_WORDS = ("vision", "image", "visual", "audio", "speech", "multi_modal")


def text_modules(model: Any) -> list[tuple[str, Any]]:
    """``model.named_modules()`` without vision and audio towers."""
    return [
        (name, module)
        for name, module in model.named_modules()
        if not any(word in name.lower() for word in TOWER_WORDS)
    ]


def _text_part(model: Any) -> Any:
    """The decoder (language model) of ``model``: vision and audio towers are not packed."""
    try:
        decoder = model.get_decoder()
    except (AttributeError, NotImplementedError, ValueError, TypeError):
        decoder = None
    return decoder if decoder is not None else model


#: Meta-device models by config (JSON text), the last few.
_META: dict[tuple[str, str], Any] = {}


def meta_model(config: Any) -> Any:
    """The model of ``config`` built on the ``meta`` device (no weights), or None if it fails."""
    key = (type(config).__name__, config.to_json_string(use_diff=False))
    if key not in _META:
        while len(_META) >= 16:
            _META.pop(next(iter(_META)))
        _META[key] = _build_meta(copy.deepcopy(config))
    return _META[key]


def _build_meta(config: Any) -> Any:
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings(), torch.device("meta"):
            warnings.simplefilter("ignore")
            # eager: always there, whatever implementation the config asks for (the modules'
            # code is what is read; flash on a machine without it would fail to build)
            return AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    except Exception as err:  # an unbuildable config: judged from the config alone
        logging.getLogger(__name__).debug("meta build failed: %s", err)
        return None
    finally:
        hf_logging.set_verbosity(verbosity)


def _attention_modules(decoder: Any) -> list[tuple[str, Any]]:
    """``(name, module)`` of the self-attention modules of ``decoder``."""
    found = []
    for name, module in text_modules(decoder):
        cls = type(module).__name__
        lowered = name.lower()
        if not ("Attention" in cls or "Attn" in cls or "SelfAttention" in cls):
            continue
        if "Cross" in cls or "cross" in lowered or "encoder_attn" in lowered:
            continue
        if getattr(module, "is_cross_attention", False):
            continue
        found.append((name, module))
    return found


def _calls_interface(module: Any) -> bool:
    return any(word in _source(type(module)) for word in INTERFACE_WORDS)


def _drops_kwargs(parent: Any, attr: str) -> bool:
    """True when every call of ``self.<attr>(...)`` in ``parent.forward`` passes no ``**kwargs``."""
    text = _source(type(parent))
    if not text:
        return False
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return False
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == attr
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "self"
    ]
    return bool(calls) and all(all(k.arg is not None for k in c.keywords) for c in calls)


def _own_mask(module: Any) -> str | None:
    """The name a module passes as ``attention_mask`` to attention when it is its own tensor."""
    try:
        tree = ast.parse(_source(type(module)))
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call) and getattr(node.func, "id", "") == "attention_interface"
        ):
            continue
        given = node.args[4] if len(node.args) > 4 else None
        given = next((k.value for k in node.keywords if k.arg == "attention_mask"), given)
        if isinstance(given, ast.Name) and given.id != "attention_mask":
            return given.id
    return None


def _positions(model: Any, decoder: Any) -> tuple[str, int, str | None]:
    """``(how, offset, refusal)``: how the model takes positions."""
    for module in decoder.modules():
        padding_idx = getattr(module, "padding_idx", None)
        if hasattr(module, "create_position_ids_from_input_ids") and isinstance(padding_idx, int):
            return "offset", padding_idx + 1, None
    takes = "position_ids" in _params(type(decoder).forward) and (
        "position_ids" in _params(type(model).forward) or _var_kw(type(model).forward)
    )
    if takes:
        return "position_ids", 0, None
    embeds = [
        type(m).__name__
        for n, m in text_modules(decoder)
        if any(w in type(m).__name__ for w in POSITION_WORDS)
        or n.rsplit(".", 1)[-1] in ("embed_positions", "wpe", "position_embeddings")
    ]
    source = " ".join(_module_source(type(m).__module__) for m in (model, decoder)).lower()
    if embeds and "rotary" in source:
        # rotary tables indexed by column (roformer): scores see only q - k, which is the
        # same inside every example wherever it sits in the row
        return "relative", 0, None
    if embeds:
        return (
            "columns",
            0,
            f"it takes no position_ids: its positions ({embeds[0]}) count the row's columns,"
            " so a packed example would not restart at position 0; train it on unpacked rows",
        )
    return "none", 0, None


def _varlen_refusal(model_type: str, attention: list[tuple[str, Any]], decoder: Any) -> str | None:
    import torch

    sinks = [n for n, m in attention if isinstance(getattr(m, "sinks", None), torch.Tensor)]
    if sinks:
        return (
            f"{model_type}'s attention ({sinks[0]}) has attention sinks, which seqpack_varlen"
            " (SDPA) cannot express — use eager"
        )
    users = [(n, m) for n, m in attention if _calls_interface(m)]
    if not users:
        names = sorted({type(m).__name__ for _, m in attention}) or ["its layers"]
        return (
            f"{model_type}'s attention ({names[0]}) never calls transformers' AttentionInterface,"
            " so attn_implementation='seqpack_varlen' would not run inside it — use sdpa or eager"
        )
    for _, module in users:
        own = _own_mask(module)
        if own is not None:
            return (
                f"{model_type}'s attention ({type(module).__name__}) passes its own bias {own!r}"
                " as the attention mask, which seqpack_varlen would drop — use sdpa or eager"
            )
    for name, module in users:
        parent_name, _, attr = name.rpartition(".")
        parent = decoder.get_submodule(parent_name) if parent_name else decoder
        if _drops_kwargs(parent, attr):
            return (
                f"{model_type}: {type(parent).__name__} calls {type(module).__name__} without"
                " its attention kwargs, so cu_seq_lens_q (the examples' boundaries) never reaches"
                " attention and seqpack_varlen would join the flattened examples"
                " — use sdpa or eager for this model"
            )
    return None


def _applies_window(decoder: Any) -> bool:
    names = {type(m).__module__ for m in decoder.modules()}
    return any(word in _module_source(n) for n in names for word in WINDOW_WORDS)


def from_modules(arch: Architecture, model: Any) -> Architecture:
    """``arch`` (from the config) corrected and completed by ``model``'s modules."""
    decoder = _text_part(model)
    changes: dict[str, Any] = {}
    how, offset, why = _positions(model, decoder)
    changes |= {"positions": how, "position_offset": offset}
    attention = _attention_modules(decoder)
    refusal, kind = arch.refusal, arch.kind
    mixers = mixing_modules(decoder)
    if mixers:
        refusal, kind = mixing_reason(decoder, mixers[0])
    elif arch.kind in ("linear attention", "convolution") and refusal is not None:
        refusal, kind = None, "attention"  # layer-type words, but no such layer was built
    if refusal is None and not attention:
        first = next(iter(decoder.children()), decoder)
        refusal, kind = (
            f"it has no attention layers: its positions mix through a recurrence"
            f" ({type(first).__name__}) that runs across the whole row",
            "linear attention",
        )
    if refusal is None and why is not None:
        refusal, kind = why, "positions"
    bidirectional = [n for n, m in attention if getattr(m, "is_causal", True) is False]
    if refusal is None and bidirectional:
        refusal = (
            f"its self-attention ({bidirectional[0]}) is bidirectional (is_causal=False; for"
            " BERT-style models is_decoder=False), so no packed example would be causal"
            " — set is_decoder=True to train it as a causal LM"
        )
    changes |= {"refusal": refusal, "kind": kind}
    changes["varlen_refusal"] = arch.varlen_refusal or _varlen_refusal(
        arch.model_type, attention, decoder
    )
    if arch.window is not None and not _applies_window(decoder):
        changes["window"] = None
    return dataclasses.replace(arch, **changes)


def capability(config: Any, model: Any = None) -> Architecture:
    """What ``config``'s model (``model`` itself when given) needs to be exact on packed rows.

    Without ``model`` the modules come from the config's model built on the
    ``meta`` device; a config ``transformers`` cannot build is judged from
    the config alone.
    """
    if model is not None and config is None:
        config = model.config
    arch = describe(config)
    if model is None:
        model = meta_model(getattr(config, "get_text_config", lambda: config)())
        if model is None:
            model = meta_model(config)
    return arch if model is None else from_modules(arch, model)


def mixing_modules(model: Any) -> list[tuple[str, str]]:
    """``(module name, kind)`` of every layer of ``model`` that mixes positions besides attention.

    A second net under :func:`describe`: depthwise ``Conv1d`` layers with a
    kernel wider than one column (``transformers``' ``Conv1D`` in GPT-2 is a
    linear layer, not a convolution) and modules whose class names a
    state-space or linear-attention mixer.
    """
    import torch

    found = []
    for name, module in text_modules(model):
        if not name:  # the model itself (``MambaModel``) is no layer
            continue
        cls = type(module).__name__
        kind = next((k for word, k in MIXER_CLASSES if word in cls), None)
        if kind is None and isinstance(module, torch.nn.Conv1d) and module.kernel_size[0] > 1:
            kind = "convolution"
        if kind is not None:
            found.append((name, kind))
    return found


def mixing_reason(model: Any, mixer: tuple[str, str]) -> tuple[str, str]:
    """``(why, kind)`` of the refusal for one ``(module name, kind)`` of :func:`mixing_modules`."""
    name, kind = mixer
    cls = type(model.get_submodule(name)).__name__
    return f"its {kind} layer {name} ({cls}): {WHY_KIND[kind]}; {FIX}", kind


def architecture_of(model: Any) -> Architecture:
    """The capability of ``model`` from its config and its modules."""
    return capability(model.config, model)


__all__ = [
    "architecture_of",
    "capability",
    "from_modules",
    "meta_model",
    "mixing_modules",
    "mixing_reason",
]
