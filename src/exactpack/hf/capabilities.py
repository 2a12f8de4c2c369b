"""The capability check: what a model needs to be exact on packed rows, found before data moves.

:func:`capability` reads the config (:func:`exactpack.hf.architectures.describe`) and the
model's modules (the model given, else the config's model built on the ``meta`` device)
and returns an :class:`~exactpack.hf.architectures.Architecture`: exact, exact under stated
conditions, or refused with the reason. :func:`check_model`, :func:`check_vocabulary` and
:func:`check_runnable` are what ``pack_dataset(..., model=...)`` and the collators
(:func:`check_config`: :func:`exactpack.hf.hf_collator`, on flat or tree rows) run
first; ``Architecture.check_batch`` then
holds every batch, flat or tree, to the model's conditions.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import dataclasses
import importlib.util
import inspect
import logging
import sys
import textwrap
import warnings
import weakref
from functools import lru_cache
from typing import Any

from exactpack.core.binding import Binding
from exactpack.core.errors import InvalidInput
from exactpack.hf.architectures import FIX, MASKED_LAYERS, WHY_KIND, Architecture, describe

#: Class-name words of mixers (checked before a plain ``Conv1d`` inside them).
_LINEAR = ("Mamba", "GatedDeltaNet", "LinearAttention", "LightningAttention", "Rwkv", "xLSTM")
MIXER_CLASSES = {"ShortConv": "convolution"} | dict.fromkeys(
    (*_LINEAR, "mLSTM", "sLSTM"), "linear attention"
)
#: Source words of a forward that dispatches through transformers' attention interface.
INTERFACE_WORDS = ("ALL_ATTENTION_FUNCTIONS", "AttentionInterface")
#: Source words of a model that applies its config's sliding window.
WINDOW_WORDS = ("create_sliding_window_causal_mask", "sliding_window=", '"sliding_attention"')
#: Source words of a forward that builds its own mask from a 2-D padding mask (no block mask).
PADDING_MASK_WORDS = (
    "attention_mask.unsqueeze(1).unsqueeze(2)",  # openai-gpt
    "attention_mask[:, None, None, :]",
    "get_masks(",  # xlm
    "input_mask[None]",  # xlnet
)
#: Class-name words of modules that embed positions.
POSITION_WORDS = ("Positional", "PositionEmbedding", "Rotary", "Sinusoidal", "PositionalEmbedding")
#: Module-name words of towers that are not the packed text (a multimodal model's encoders).
TOWER_WORDS = ("vision", "image", "visual", "audio", "speech", "multi_modal")


@lru_cache(maxsize=512)
def _source(cls: type, attr: str = "forward") -> str:
    try:
        return textwrap.dedent(inspect.getsource(getattr(cls, attr)))
    except (OSError, TypeError, AttributeError):
        return ""


@lru_cache(maxsize=512)
def _nodes(cls: type) -> tuple[ast.AST, ...]:
    """Every node of ``cls.forward``'s syntax tree (none where its source is not Python)."""
    try:
        return tuple(ast.walk(ast.parse(_source(cls))))
    except SyntaxError:
        return ()


@lru_cache(maxsize=128)
def _module_source(module_name: str) -> str:
    module = sys.modules.get(module_name)
    try:
        return inspect.getsource(module) if module is not None else ""
    except (OSError, TypeError):
        return ""


def _params(fn: Any) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin or C function: no parameters to read
        return {}


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
    # a model, not a layer: modernbert-decoder's get_decoder() is its head's Linear
    return decoder if hasattr(decoder, "config") else model


_META: dict[tuple[str, str], Any] = {}  # meta-device models by config (JSON text), the last 16


def causal_lm(config: Any) -> Any:
    """The constructor of ``config``'s causal LM: its own class's (whose ``config_class`` it
    is: musicgen's decoder), else ``AutoModelForCausalLM.from_config``."""
    import transformers
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    family = str(getattr(config, "model_type", "")).split("_")[0]
    for model_type, name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items():
        if model_type.split("_")[0] == family:
            cls = getattr(transformers, name, None)
            if getattr(cls, "config_class", None) is type(config):
                return cls._from_config
    return AutoModelForCausalLM.from_config


def meta_model(config: Any) -> Any:
    """The model of ``config`` built on the ``meta`` device (no weights), or None if it fails."""
    import torch
    from transformers.utils import logging as hf_logging

    key = (type(config).__name__, config.to_json_string(use_diff=False))
    if key in _META:
        return _META[key]
    while len(_META) >= 16:
        _META.pop(next(iter(_META)))
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings(), torch.device("meta"):
            warnings.simplefilter("ignore")
            # eager: always there (the modules' code is what is read; flash may not build here)
            built = causal_lm(config)(copy.deepcopy(config), attn_implementation="eager")
    except Exception as err:  # an unbuildable config: judged from the config alone
        logging.getLogger(__name__).debug("meta build failed: %s", err)
        built = None
    finally:
        hf_logging.set_verbosity(verbosity)
    _META[key] = built
    return built


def _attention_modules(decoder: Any) -> list[tuple[str, Any]]:
    """``(name, module)`` of the self-attention modules of ``decoder``."""
    found = []
    for name, module in text_modules(decoder):
        cls, lowered = type(module).__name__, name.lower()
        cross = "cross" in lowered or "encoder_attn" in lowered or "Cross" in cls
        if ("Attention" in cls or "Attn" in cls) and not (
            cross or getattr(module, "is_cross_attention", False)
        ):
            found.append((name, module))
    return found


def _drops_kwargs(parent: Any, attr: str) -> bool:
    """True when every call of ``self.<attr>(...)`` in ``parent.forward`` passes no ``**kwargs``."""
    calls = [
        node
        for node in _nodes(type(parent))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == attr
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "self"
    ]
    return bool(calls) and all(all(k.arg is not None for k in c.keywords) for c in calls)


def _own_mask(module: Any) -> str | None:
    """The name a module passes as ``attention_mask`` to attention when it is its own tensor."""
    for node in _nodes(type(module)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "attention_interface":
            given = node.args[4] if len(node.args) > 4 else None
            given = next((k.value for k in node.keywords if k.arg == "attention_mask"), given)
            if isinstance(given, ast.Name) and given.id != "attention_mask":
                return given.id
    return None


def _zero_pad(decoder: Any) -> int | None:
    """The embedding's zero ``padding_idx`` row when the decoder's forward takes the root of a
    mean (``mean(h ** 2) ** 0.5``, no epsilon: infinite slope at the zero row), else None."""
    padding_idx = getattr(decoder.get_input_embeddings(), "padding_idx", None)
    root = any(
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Pow)
        and getattr(node.right, "value", None) == 0.5
        and isinstance(node.left, ast.Call)
        and getattr(node.left.func, "attr", "") == "mean"
        for node in _nodes(type(decoder))
    )
    return padding_idx if isinstance(padding_idx, int) and root else None


def _positions(model: Any, decoder: Any) -> tuple[str, int, str | None]:
    """``(how, offset, refusal)``: how the model takes positions."""
    for module in decoder.modules():
        padding_idx = getattr(module, "padding_idx", None)
        if hasattr(module, "create_position_ids_from_input_ids") and isinstance(padding_idx, int):
            return "offset", padding_idx + 1, None
    outer = _params(type(model).forward)
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in outer.values())
    if "position_ids" in _params(type(decoder).forward) and ("position_ids" in outer or var_kw):
        return "position_ids", 0, None
    embeds = [
        type(m).__name__
        for n, m in text_modules(decoder)
        if any(w in type(m).__name__ for w in POSITION_WORDS)
        or n.rsplit(".", 1)[-1] in ("embed_positions", "wpe", "position_embeddings")
    ]
    source = " ".join(_module_source(type(m).__module__) for m in (model, decoder)).lower()
    if embeds and "rotary" in source:
        # rotary tables by column (roformer): scores see only q - k, the same in any column
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
            f"{model_type}'s attention ({sinks[0]}) has attention sinks, which exactpack_varlen"
            " (SDPA) cannot express — use eager"
        )
    users = [(n, m) for n, m in attention if any(w in _source(type(m)) for w in INTERFACE_WORDS)]
    if not users:
        names = sorted({type(m).__name__ for _, m in attention}) or ["its layers"]
        return (
            f"{model_type}'s attention ({names[0]}) never calls transformers' AttentionInterface,"
            " so attn_implementation='exactpack_varlen' would not run inside it — use sdpa or eager"
        )
    for _, module in users:
        own = _own_mask(module)
        if own is not None:
            return (
                f"{model_type}'s attention ({type(module).__name__}) passes its own bias {own!r}"
                " as the attention mask, which exactpack_varlen would drop — use sdpa or eager"
            )
    for name, module in users:
        parent_name, _, attr = name.rpartition(".")
        parent = decoder.get_submodule(parent_name) if parent_name else decoder
        if _drops_kwargs(parent, attr):
            return (
                f"{model_type}: {type(parent).__name__} calls {type(module).__name__} without"
                " its attention kwargs, so cu_seq_lens_q (the examples' boundaries) never reaches"
                " attention and exactpack_varlen would join the flattened examples"
                " — use sdpa or eager for this model"
            )
    return None


def from_modules(arch: Architecture, model: Any) -> Architecture:
    """``arch`` (from the config) corrected and completed by ``model``'s modules."""
    decoder = _text_part(model)
    how, offset, why = _positions(model, decoder)
    attention = _attention_modules(decoder)
    refusal, kind = arch.refusal, arch.kind
    restarted, foreign = mixers_of(decoder)
    if foreign:  # a mixer exactpack does not restart
        name, kind = foreign[0]
        cls = type(decoder.get_submodule(name)).__name__
        refusal = f"its {kind} layer {name} ({cls}): {WHY_KIND[kind]}; {FIX}"
    elif arch.kind in ("linear attention", "convolution") and refusal is not None:
        # layer-type words, but every such layer built restarts per example (or none was built)
        refusal, kind = None, (arch.kind if restarted else "attention")
    if refusal is None and not attention and not restarted:
        first = next(iter(decoder.children()), decoder)
        refusal, kind = (
            f"it has no attention layers: its positions mix through a recurrence"
            f" ({type(first).__name__}) that runs across the whole row",
            "linear attention",
        )
    if refusal is None and why is not None:
        refusal, kind = why, "positions"
    if how == "none" and not attention and restarted:
        how = "mixers"  # pure state-space models: nothing reads a position but the mixers
    padding = [
        (type(m).__name__, w)
        for m in (decoder, model)
        for w in PADDING_MASK_WORDS
        if w in _source(type(m))
    ]
    if refusal is None and padding:
        refusal = (
            f"its forward ({padding[0][0]}) builds its attention from a 2-D padding mask"
            f" ({padding[0][1]}...), so it cannot take the block mask that keeps packed"
            " examples apart; train it on unpacked rows"
        )
    bidirectional = [n for n, m in attention if getattr(m, "is_causal", True) is False]
    if refusal is None and bidirectional:
        refusal = (
            f"its self-attention ({bidirectional[0]}) is bidirectional (is_causal=False; for"
            " BERT-style models is_decoder=False), so no packed example would be causal"
            " — set is_decoder=True to train it as a causal LM"
        )
    layer_types = arch.layer_types
    if attention and layer_types and not set(layer_types) & set(MASKED_LAYERS):
        layer_types = None  # falcon_h1's "hybrid" layers: attention beside a mixer, one mask
    sources = {type(m).__module__ for m in decoder.modules()}
    applies = arch.window is None or any(
        w in _module_source(n) for n in sources for w in WINDOW_WORDS
    )
    return dataclasses.replace(
        arch,
        layer_types=layer_types,
        positions=how,
        position_offset=offset,
        refusal=refusal,
        kind=kind,
        varlen_refusal=arch.varlen_refusal or _varlen_refusal(arch.model_type, attention, decoder),
        window=arch.window if applies else None,  # moshi has the field and never applies it
        zero_pad=_zero_pad(decoder),
        mixers=restarted if refusal is None else (),
    )


def capability(config: Any) -> Architecture:
    """What a model needs to be exact on packed rows: ``config`` a model (its own modules
    read) or its config (the config's model built on the ``meta`` device; unbuildable: the
    config alone)."""
    model = config if hasattr(config, "config") else None
    config = getattr(config, "config", config)
    arch = describe(config)
    if model is None:
        model = meta_model(getattr(config, "get_text_config", lambda: config)())
        model = model if model is not None else meta_model(config)
    return arch if model is None else from_modules(arch, model)


#: Capabilities of the configs (or models) seen, by ``id`` (a weak reference tells a reused id).
_SEEN: dict[int, tuple[weakref.ref, Architecture]] = {}


def capability_once(config: Any) -> Architecture:
    """:func:`capability` of ``config`` (``model.config``, or the model itself), computed once
    per object: what every batch's inputs are checked against."""
    hit = _SEEN.get(id(config))
    if hit is not None and hit[0]() is config:
        return hit[1]
    arch = capability(config)
    with contextlib.suppress(TypeError):  # not weakly referenceable: not kept
        _SEEN[id(config)] = (weakref.ref(config), arch)
    return arch


def check_config(
    config: Any,
    kind: str | None,
    caller: str,
    binding: Binding | None,
    pad_token_id: int,
    *,
    tree: bool = False,
) -> Architecture:
    """What :func:`exactpack.hf.hf_inputs` and :func:`exactpack.hf.hf_collator` check first:
    the capability of ``config`` (``model.config``, or the model) for ``kind`` (``tree``: on
    tree rows), the vocabulary and pad id, a hybrid's mixers restarted. No config is refused:
    without it a model's sliding windows and refusals are unknown and its inputs could be
    silently wrong. The architecture then checks every batch (``check_batch``)."""
    if config is None:
        raise InvalidInput(
            f"{caller} needs the model's config to know its sliding windows and refusals"
            f" — pass {caller}(..., config=model.config)"
        )
    arch = capability_once(config).check(kind, tree=tree)
    model_config = getattr(config, "config", config)
    check_vocabulary(model_config, binding, pad_token_id)
    check_restarts(arch, model_config)  # hybrids: restart_mixers(model) first
    return arch


def mixers_of(model: Any) -> tuple[tuple[str, ...], list[tuple[str, str]]]:
    """``(restarted classes, the rest)``: the classes of every
    :data:`~exactpack.hf.mixers.RESTARTABLE` mixer of ``model``'s text part, and
    ``(module name, kind)`` of every other layer that mixes positions besides attention (a
    ``Conv1d`` wider than one column, or a class named as a mixer) unless it is inside a
    restartable mixer (its conv), around one (its block) or a normalization named after its
    family (position-wise)."""
    import torch

    from exactpack.hf.mixers import RESTARTABLE

    ours = [n for n, m in text_modules(model) if type(m).__name__ in RESTARTABLE]
    rest = []
    for name, module in text_modules(model):
        cls = type(module).__name__
        kind = next((k for word, k in MIXER_CLASSES.items() if word in cls), None)
        if kind is None and isinstance(module, torch.nn.Conv1d) and module.kernel_size[0] > 1:
            kind = "convolution"
        covered = any(name.startswith(o + ".") or o.startswith(name + ".") for o in ours)
        # the model itself (``MambaModel``) is no layer
        if kind and name and name not in ours and not covered and "Norm" not in cls:
            rest.append((name, kind))
    classes = tuple(dict.fromkeys(type(model.get_submodule(n)).__name__ for n in ours))
    return classes, rest


def check_runnable(attn_implementation: str) -> None:
    """Refuse a flash implementation that cannot run on this machine (no CUDA or no flash-attn)."""
    if attn_implementation not in ("flash_attention_2", "flash_attention_3"):
        return
    import torch

    package = "flash_attn" if attn_implementation == "flash_attention_2" else "flash_attn_interface"
    cuda, found = torch.cuda.is_available(), importlib.util.find_spec(package) is not None
    if not (cuda and found):
        missing = " and ".join(
            w for w, ok in (("a CUDA device", cuda), (f"the {package} package", found)) if not ok
        )
        raise InvalidInput(
            f"attn_implementation={attn_implementation!r} cannot run here: {missing} missing"
            " — use 'sdpa' (or 'exactpack_varlen') on this machine"
        )


def check_vocabulary(config: Any, binding: Binding | None, pad_token_id: int) -> None:
    """Refuse a packing whose vocabulary (or pad id) the model's embedding cannot index."""
    vocab = getattr(getattr(config, "get_text_config", lambda: config)(), "vocab_size", None)
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


def check_restarts(arch: Architecture, config: Any) -> None:
    """Refuse the inputs of a model whose mixers (``arch.mixers``) do not restart yet: fed
    ``seq_idx``, its mixers would still run across the row."""
    from exactpack.hf.mixers import restarts

    if arch.mixers and not restarts(config):
        raise InvalidInput(
            f"{arch.model_type}'s {', '.join(arch.mixers)} carry state along the row: call"
            " exactpack.hf.restart_mixers(model) once before feeding it packed rows, and pass"
            " config=model.config (that model's own config)"
        )


def check_model(
    model: Any,
    binding: Binding | None,
    pad_token_id: int | None,
    longest: int,
    capacity: int,
    *,
    tree: bool = False,
) -> Architecture:
    """``pack_dataset(..., model=model)``'s check (a model or a config): refused for its
    implementation, beyond its conditions (``longest`` pairs, rows of ``capacity``), or when
    its embedding cannot index the vocabulary or pad id. ``tree``: for tree rows
    (``longest``: the longest sequence; ``Architecture.check(kind, tree=True)``)."""
    from exactpack.hf.kinds import TREE_NAMES, derived_kind, tree_kind

    config = getattr(model, "config", model)
    arch = capability(model)
    attn = getattr(config, "_attn_implementation", None)
    kind = derived_kind(attn) if isinstance(attn, str) else None
    if tree and (kind is not None or attn in TREE_NAMES):
        kind = tree_kind(attn)
    arch.check(kind, tree=tree)
    arch.check_batch(longest, capacity)
    check_vocabulary(config, binding, 0 if pad_token_id is None else pad_token_id)
    return arch
