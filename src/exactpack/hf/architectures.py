"""Which ``transformers`` architectures exactpack can pack exactly, with which masks, or why not.

From the config: ``sliding_window`` (unless ``use_sliding_window`` is False) bounds every
``"sliding_attention"`` layer; a config with ``layer_types`` takes one mask per layer type,
one without one mask. Layers that mix positions other than through the mask are an
:class:`UnsupportedArchitecture` naming why (``exactpack verify``: exit 2). The fixture
under a window of 2 (A = columns 0-2 of row 0)::

    full_attention     A's last query sees columns 0, 1, 2
    sliding_attention  A's last query sees columns 1, 2
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exactpack.core.errors import NotAvailable
from exactpack.core.permission import check_sliding_window

#: Layer types whose positions mix only through the attention mask, and their window source.
ATTENTION_LAYERS = ("full_attention", "sliding_attention")
#: Layer type of attention within chunks of ``attention_chunk_size`` positions (Llama 4).
CHUNKED = "chunked_attention"
#: Layer type of DeepSeek-V3.2-style attention over the keys a top-k indexer selects.
INDEXED = "indexed_attention"
#: Layer types exactpack builds a mask for.
MASKED_LAYERS = (*ATTENTION_LAYERS, CHUNKED, INDEXED)
#: Layer types that mix no positions at all (position-wise blocks of hybrid patterns).
POSITIONWISE_LAYERS = ("mlp", "moe")
#: Layer-type words and the kind of position mixing they stand for.
LAYER_KINDS = (
    ("conv", "convolution"),
    *((w, "linear attention") for w in ("linear", "mamba", "hybrid", "recurrent")),
    ("chunk", "chunked attention"),
)
_SCAN = "its state-space scan carries state across the whole row"
#: model_type -> (kind, why): architectures whose config does not show the hazard in layer_types.
REFUSED_TYPES: dict[str, tuple[str, str]] = {
    "bloom": (
        "attention",
        "its ALiBi bias is built from a 2-D padding mask and it takes no position_ids,"
        " so a packed row can neither restart positions per example nor take a block mask",
    ),
    "blt": (
        "embedding",
        "its byte n-gram hash embeddings (byte_group_hash_function) hash each byte with the"
        " bytes before it in the row, and its entropy patcher groups the row's columns into"
        " patches, so a packed example's first bytes would read the example before it;"
        " train it on unpacked rows",
    ),
    "rwkv": ("linear attention", "its recurrent time-mixing carries state across the whole row"),
    **dict.fromkeys(("mamba", "mamba2", "falcon_mamba"), ("linear attention", _SCAN)),
}
WHY_KIND = {
    "convolution": "short convolutions mix neighbouring columns of the row",
    "linear attention": "linear-attention / state-space layers carry state across the row",
    "chunked attention": "chunked attention groups absolute columns, not each example's positions",
}
FIX = (
    "exactpack restarts only the mixers it knows per example (exactpack.hf.mixers.RESTARTABLE:"
    " LFM2 short convolutions, Mamba and Mamba-2 scans, gated delta rules), not this one;"
    " train it on unpacked (padded) rows"
)
#: The same, judged from a config whose model could not be built to see its mixers.
CONFIG_FIX = (
    "exactpack restarts a mixer per example only once it has seen the model's mixer class"
    " (exactpack.hf.mixers.RESTARTABLE), and this config's model could not be built to look;"
    " train it on unpacked (padded) rows"
)


#: ``Architecture.positions`` that count the row's columns (tree rows refuse them).
COLUMN_POSITIONS = {
    "relative": "its rotary tables are indexed by column",
    "none": "it takes no position_ids, so any position it uses (mpt's ALiBi) is the column",
}
#: Models that apply their sliding window themselves, as a band over the row's columns.
COLUMN_WINDOWS = {"gpt_neo": "its local layers apply window_size as a band over the row's columns"}


class UnsupportedArchitecture(NotAvailable):
    """exactpack cannot make this architecture compute exactly what separate examples compute."""


@dataclass(frozen=True)
class Condition:
    """Exact only while every ``example`` (prediction pairs) or ``row`` (columns) is at most
    ``limit`` long; ``why``: the computation that breaks beyond."""

    what: str
    limit: int
    why: str

    def text(self) -> str:
        """``every example <= 8 pairs (why)`` or ``rows <= 256 columns (why)``."""
        if self.what == "example":
            return f"every example <= {self.limit} pairs ({self.why})"
        return f"rows <= {self.limit} columns ({self.why})"


@dataclass(frozen=True)
class Architecture:
    """What one model config means for packed rows.

    ``layer_types``: one per decoder layer for a mask per layer type, else None.
    ``window``: ``sliding_window`` where applied. ``refusal`` (None: exact) and ``kind``, the
    layer kind that would mix examples. ``positions``: ``position_ids``, ``offset`` (by
    ``position_offset``), ``relative``, ``columns``, ``none`` or ``mixers`` (no attention:
    only the restarted mixers mix positions). ``varlen_refusal``: why
    ``exactpack_varlen`` cannot run it. ``chunk``: ``attention_chunk_size``.
    ``mask_from_positions``: feed no 4-D mask (falcon's ALiBi). ``zero_pad``: an id padding
    cells must not carry (gemma3n: NaN gradients). ``mixers``: the classes of the layers that
    carry state along the row, restarted at every example (:mod:`exactpack.hf.mixers`).
    """

    model_type: str
    layer_types: tuple[str, ...] | None
    window: int | None
    refusal: str | None = None
    kind: str = "attention"
    positions: str = "position_ids"
    position_offset: int = 0
    varlen_refusal: str | None = None
    conditions: tuple[Condition, ...] = ()
    chunk: int | None = None
    mask_from_positions: bool = False
    zero_pad: int | None = None
    mixers: tuple[str, ...] = ()

    def padding_id(self, pad_token_id: int, vocab: int) -> int:
        """The id padding cells carry: ``pad_token_id``, or the next id where that one is
        :attr:`zero_pad` (padding is never seen by a real query, so any id will do)."""
        pad = int(pad_token_id)
        return (pad + 1) % vocab if pad == self.zero_pad else pad

    @property
    def mask_types(self) -> tuple[str, ...]:
        """The distinct mask keys the model reads, in first-use order (``()``: one mask)."""
        return tuple(dict.fromkeys(self.layer_types)) if self.layer_types else ()

    @property
    def verdict(self) -> str:
        """``exact``, ``exact if ...`` (its conditions) or ``refused: why``."""
        if self.refusal is not None:
            return f"refused: {self.refusal}"
        restarts = f" (restarts its {', '.join(self.mixers)} per example)" if self.mixers else ""
        if self.conditions:
            return "exact if " + "; ".join(c.text() for c in self.conditions) + restarts
        return "exact" + restarts

    def layer_sliding_window(self, layer_idx: int | None) -> int | None:
        """The window of decoder layer ``layer_idx`` (one-mask models: the model's window)."""
        if self.layer_types is None or layer_idx is None:
            return self.window
        return self.window if self.layer_types[layer_idx] == "sliding_attention" else None

    @property
    def windows(self) -> dict[str, int | None]:
        """Mask key -> window, with ``""`` for the single mask of a one-mask model."""
        if not self.layer_types:
            return {"": self.window}
        return {t: self.window if t == "sliding_attention" else None for t in self.mask_types}

    @property
    def tree_refusal(self) -> str | None:
        """Why tree rows cannot be exact though flat rows are: the model reads positions from
        the row's columns, where a branch does not continue its parent's positions."""
        why = COLUMN_WINDOWS.get(self.model_type)
        if self.positions in COLUMN_POSITIONS:
            why = COLUMN_POSITIONS[self.positions]
        elif self.mask_from_positions:
            why = "its ALiBi bias is built from the row's columns"
        return why

    def check(self, kind: str | None = None, *, tree: bool = False) -> Architecture:
        """Raise :class:`UnsupportedArchitecture` (which model, why) unless exact for
        ``kind``, the implementation's (:mod:`exactpack.hf.kinds`); with ``tree``, on
        tree-packed rows too (:attr:`tree_refusal`), where ``exactpack_tree`` and
        ``exactpack_tree_varlen`` are of kind ``exactpack_varlen`` (the tree plan rides the
        same attention kwargs)."""
        if self.refusal is not None:
            raise UnsupportedArchitecture(
                f"{self.model_type} cannot be packed exactly: {self.refusal}"
            )
        if kind == "exactpack_varlen" and self.varlen_refusal is not None:
            name = "exactpack_tree' or 'exactpack_tree_varlen" if tree else "exactpack_varlen"
            raise UnsupportedArchitecture(
                f"{self.model_type} cannot run attn_implementation='{name}':"
                f" {self.varlen_refusal.removeprefix(self.model_type + ': ')}"
            )
        if tree and self.tree_refusal is not None:
            raise UnsupportedArchitecture(
                f"{self.model_type} cannot run tree-packed rows: {self.tree_refusal}, and a"
                " branch's columns do not continue its parent's positions"
            )
        return self

    def check_batch(self, longest_example: int, width: int) -> None:
        """Raise :class:`UnsupportedArchitecture` when a batch breaks one of the conditions.

        ``longest_example``: the batch's largest position + 1 in pairs (a flat example's
        length; on tree rows the longest sequence, its path's depth); ``width``: the
        columns one model call's row holds."""
        for cond in self.conditions:
            example = cond.what == "example"
            got = longest_example if example else width
            if got > cond.limit:
                raise UnsupportedArchitecture(
                    f"{self.model_type} is exact only while {cond.text()}; this batch has"
                    f" {'an example' if example else 'rows'} of {got}"
                    f" {'pairs' if example else 'columns'} — lower max_length= to {cond.limit}"
                    f"{' or pre-split the longer examples' if example else ''}"
                )


def _refusal(config: Any, model_type: str, layer_types: list[str] | None) -> tuple[str, str] | None:
    """``(kind, why)`` when the config's model cannot be made exact, else ``None``."""
    if model_type in REFUSED_TYPES:
        kind, why = REFUSED_TYPES[model_type]
        return kind, (f"{why}; {CONFIG_FIX}" if kind in WHY_KIND else why)
    if getattr(config, "position_embedding_type", "") == "alibi":
        return (
            "attention",
            "its ALiBi bias is built from column positions (in bfloat16, build_alibi_tensor),"
            " which a packed row cannot restart per example; use the rotary variant (alibi=False)",
        )
    shared = getattr(config, "num_kv_shared_layers", None)
    if isinstance(shared, int) and shared > 0 and shared == config.num_hidden_layers:
        return (
            "attention",
            "every layer reads another model's keys and values (num_kv_shared_layers ="
            " num_hidden_layers: a speculative-decoding assistant runs on its target model's"
            " states, not on tokens alone), so there are no examples of its own to pack",
        )
    if (
        getattr(config, "use_bidirectional_attention", None) not in (None, False, "vision")
        or not getattr(config, "is_causal", True)
        or getattr(config, "causal", True) is False  # xlm
        or getattr(config, "attn_type", None) == "bi"  # xlnet
    ):
        return ("attention", "its attention is bidirectional, so no example is causal")
    if set(getattr(config, "attn_layers", None) or ()) & {"lsh", "local"}:  # reformer
        return (
            "attention",
            "its LSH attention sorts the row's keys into hash buckets across the whole row and"
            " its local attention attends within chunks of the row's columns, so neither keeps"
            " packed examples apart; train it on unpacked rows",
        )
    for layer_type in dict.fromkeys(layer_types or ()):
        if layer_type in ATTENTION_LAYERS or layer_type in POSITIONWISE_LAYERS:
            continue
        if layer_type == CHUNKED and _chunk(config) is not None:
            continue  # chunks of each example's own positions: a mask exactpack builds
        if layer_type == INDEXED and isinstance(getattr(config, "index_topk", None), int):
            continue  # the full block mask; exact while examples <= index_topk (a condition)
        kind = next((k for word, k in LAYER_KINDS if word in layer_type), None)
        if kind is None:
            return ("attention", f"its layer type {layer_type!r} is not one exactpack knows")
        return (kind, f"its {layer_type!r} layers: {WHY_KIND[kind]}; {CONFIG_FIX}")
    return None


def describe(config: Any) -> Architecture:
    """The :class:`Architecture` of a ``transformers`` config (a ``PretrainedConfig``).

    >>> from transformers import Qwen2Config
    >>> arch = describe(Qwen2Config(num_hidden_layers=2, use_sliding_window=True,
    ...                             sliding_window=4, max_window_layers=1))
    >>> arch.layer_types, arch.windows
    (('full_attention', 'sliding_attention'), {'full_attention': None, 'sliding_attention': 4})
    """
    config = getattr(config, "get_text_config", lambda: config)()
    model_type = str(getattr(config, "model_type", type(config).__name__))
    raw_types = getattr(config, "layer_types", None)
    layer_types = [str(t) for t in raw_types] if isinstance(raw_types, (list, tuple)) else None
    window = getattr(config, "sliding_window", None)
    if window is not None and not getattr(config, "use_sliding_window", True):
        window = None
    kind, why = _refusal(config, model_type, layer_types) or ("attention", None)
    chunk = _chunk(config) if layer_types and CHUNKED in layer_types else None
    return Architecture(
        model_type=model_type,
        layer_types=tuple(layer_types) if layer_types else None,
        window=check_sliding_window(window),
        refusal=why,
        kind=kind,
        conditions=conditions(config, model_type),
        chunk=chunk,
        mask_from_positions=model_type == "falcon" and bool(getattr(config, "alibi", False)),
        varlen_refusal=_varlen_refusal(
            chunk, layer_types, getattr(config, "attn_logit_softcapping", None)
        ),
    )


def _varlen_refusal(
    chunk: int | None, layer_types: list[str] | None, softcap: Any = None
) -> str | None:
    if softcap is not None:
        return (
            f"it soft-caps its attention logits (attn_logit_softcapping={softcap}), which"
            " exactpack_varlen (SDPA) cannot express — use eager (or attn_logit_softcapping=None)"
        )
    if chunk is not None:
        return (
            f"its {CHUNKED!r} layers attend within chunks of {chunk} positions, which"
            " exactpack_varlen does not apply — use sdpa or eager (exactpack builds chunked masks)"
        )
    if layer_types and INDEXED in layer_types:
        return (
            f"its {INDEXED!r} layers pick keys with an indexer that reads the attention mask,"
            " which exactpack_varlen does not give it — use sdpa or eager"
        )
    return None


def _chunk(config: Any) -> int | None:
    chunk = getattr(config, "attention_chunk_size", None)
    return int(chunk) if isinstance(chunk, int) and chunk > 0 else None


def _rope(config: Any) -> list[dict]:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if not isinstance(params, dict):
        return []
    nested = [v for v in params.values() if isinstance(v, dict)]
    return nested or [params]


def conditions(config: Any, model_type: str) -> tuple[Condition, ...]:
    """The stated conditions under which the config's model is exact on packed rows:
    LongRoPE / dynamic RoPE (examples within the original context), Llama 4's NoPE
    temperature (rows below ``floor_scale``), top-k indexers (examples <= ``index_topk``),
    falcon's bfloat16 ALiBi (rows <= 256)."""
    out = []
    for rope in _rope(config):
        limit = (
            rope.get("original_max_position_embeddings")
            or getattr(config, "original_max_position_embeddings", None)
            or getattr(config, "max_position_embeddings", None)
        )
        if rope.get("rope_type", rope.get("type")) in ("longrope", "dynamic") and isinstance(
            limit, int
        ):
            why = f"{rope.get('rope_type')} RoPE picks its frequencies from the batch's largest"
            out.append(Condition("example", limit, why + " position"))
            break
    floor = getattr(config, "floor_scale", None)
    nope = 0 in (getattr(config, "no_rope_layers", None) or ())
    if getattr(config, "attn_temperature_tuning", False) and isinstance(floor, int) and nope:
        why = "its NoPE layers' attention temperature grows with the columns from floor_scale"
        out.append(Condition("row", floor - 1, why))
    topk = getattr(config, "index_topk", None)
    if isinstance(topk, int) and topk > 0:
        out.append(Condition("example", topk, "its indexer keeps only the index_topk highest keys"))
    if model_type == "falcon" and getattr(config, "alibi", False):
        out.append(
            Condition("row", 256, "its ALiBi bias is built in bfloat16, exact for 256 columns")
        )
    return tuple(out)
