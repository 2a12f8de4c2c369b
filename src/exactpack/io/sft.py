"""SFT text rows tokenized as TRL 1.16's ``SFTTrainer`` does: prompt-completion and chats.

Rows without ``input_ids`` may hold, instead of ``text``: ``prompt`` / ``completion``
strings or lists of ``{role, content}`` messages, or ``messages`` (ShareGPT's
``conversations`` with ``from`` / ``value``). What is trained follows TRL's
``assistant_only_loss`` and ``completion_only_loss``
(:class:`~exactpack.core.supervision.Objective`), as the table in docs/datasets.md says;
a row left with nothing to train is refused naming it. Chats render through the
tokenizer's own ``apply_chat_template`` inside :func:`exactpack.io.templates.bounded`,
with each row's ``tools`` and ``chat_template_kwargs`` (template variables only).

:func:`encode_sft` returns tokens ``int32 [Σn]``, offsets ``int64 [k+1]`` and one
supervision flag per token ``bool [Σn]``: for the prompt ``"2+2="`` and
completion ``"4"`` with the byte tokenizer, ``[BOS 2 + 2 = 4 EOS]`` is flagged
``[0 0 0 0 0 1 1]``, so the targets ``=->4`` and ``4->EOS`` are trained.
"""

from __future__ import annotations

import itertools
import json
import re
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from exactpack.core.errors import InvalidInput, foreign
from exactpack.core.examples import offsets_of
from exactpack.core.supervision import NOT_CONVERSATIONAL, Objective
from exactpack.io.cells import column, first
from exactpack.io.documents import Origin
from exactpack.io.tokenizers import ByteTokenizer, HFTokenizer, Tokenizer

__all__ = ["SFT_COLUMNS", "TEMPLATE_COLUMNS", "encode_sft", "sft_columns"]

#: Columns a row's text SFT data is read from (with the optional :data:`TEMPLATE_COLUMNS`).
SFT_COLUMNS = ("prompt", "completion", "messages", "conversations")
#: Per-row extras the chat template receives, as in TRL.
TEMPLATE_COLUMNS = ("tools", "chat_template_kwargs")
#: Conversations rendered per ``apply_chat_template`` call.
CHAT_BATCH = 256
_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")
#: Settings a ``chat_template_kwargs`` key may not name (they change the tokens or clash).
SETTINGS = frozenset(
    ("conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
     "continue_final_message", "tokenize", "sanitize_control_tokens", "padding", "truncation",
     "max_length", "tokenizer_kwargs", "add_special_tokens", "stride", "pad_to_multiple_of",
     "padding_side", "is_split_into_words", "text", "text_target", "verbose")
)  # fmt: skip

#: A template error's words (the row and the error's own come with them).
REFUSED = "the chat template refuses this conversation"

Encoded = tuple[list[np.ndarray], list[np.ndarray]]


def sft_columns(names: Sequence[str]) -> tuple[str, ...] | None:
    """The text SFT columns to read (prompt-completion first, as TRL), or None."""
    if "prompt" in names or "completion" in names:
        return ("prompt", "completion")
    return next(((n,) for n in ("messages", "conversations") if n in names), None)


def encode_sft(
    table: pa.Table,
    origin: Origin,
    tokenizer: Tokenizer | None,
    names: tuple[str, ...],
    objective: Objective | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tokens int32 [Σn], offsets int64 [k+1] and per-token supervision bool [Σn] of the
    rows, trained as ``objective`` (default TRL's) says."""
    objective = objective or Objective()
    where = origin.parts[0][0]
    if tokenizer is None:
        raise InvalidInput(
            f"{where}: rows hold {' / '.join(names)} but no tokenizer was given — pass"
            " --tokenizer with a local tokenizer folder"
        )
    if names != ("prompt", "completion"):
        ids, masks = _chat_rows(table, origin, tokenizer, objective, names[0])
    elif missing := [n for n in names if n not in table.column_names]:
        raise InvalidInput(
            f"{where}: rows hold {' '.join(n for n in names if n not in missing)} without"
            f" {missing[0]} — prompt-completion rows need both (a prompt alone has nothing"
            " to train on)"
        )
    elif _is_chat(table, "prompt") or _is_chat(table, "completion"):
        ids, masks = _chat_rows(table, origin, tokenizer, objective, None)
    elif objective.assistant_only_loss:
        raise InvalidInput(f"{where}: {NOT_CONVERSATIONAL}")
    else:
        ids, masks = _text_prompt_completion(table, origin, tokenizer, objective)
    for row, mask in enumerate(masks):  # a supervised target: a token after the first
        if not mask[1:].any():
            chat = names[0] in ("messages", "conversations")
            why = "the conversation has no assistant tokens" if chat else (
                "the completion is empty (no completion tokens)")  # fmt: skip
            raise InvalidInput(
                f"{origin.locate(row)}: {why}, so nothing would be trained"
                f"{' with assistant_only_loss=True' if objective.assistant_only_loss else ''}"
                " — give it one, or drop the row"
            )
    offsets = offsets_of(np.fromiter((x.shape[0] for x in ids), dtype=np.int64, count=len(ids)))
    tokens = np.concatenate([np.zeros(0, np.int32), *ids]).astype(np.int32, copy=False)
    return tokens, offsets, np.concatenate([np.zeros(0, bool), *masks])


def _is_chat(table: pa.Table, name: str) -> bool:
    kind = table.schema.field(name).type
    return pa.types.is_list(kind) or pa.types.is_large_list(kind)


def _strings(table: pa.Table, name: str, origin: Origin) -> list[str]:
    col = column(table, name)
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        raise origin.type_error(
            f"{name} has type {col.type}; give text, or a list of {{role, content}} messages"
            " for both prompt and completion",
        )
    if col.null_count:
        row = first(pc.is_null(col).to_numpy(zero_copy_only=False))
        raise InvalidInput(f"{origin.locate(row)}: {name} is missing — give every row {name}")
    return col.to_pylist()


def _chats(table: pa.Table, name: str, origin: Origin) -> list[list[dict[str, Any]]]:
    """A column of conversations: non-empty lists of messages with a role each."""
    col = column(table, name)
    if not _is_chat(table, name):
        raise origin.type_error(f"{name} has type {col.type}; give a list of messages per row")
    rows = col.to_pylist()
    for row, chat in enumerate(rows):
        if not chat or not all(isinstance(m, dict) for m in chat):
            raise InvalidInput(
                f"{origin.locate(row)}: {name} is {'empty' if not chat else 'not messages'} —"
                " give a list of {role, content} messages"
            )
        if name == "conversations":  # ShareGPT's keys, renamed as TRL's maybe_convert_to_chatml
            rename = {"from": "role", "value": "content"}
            rows[row] = chat = [{rename.get(k, k): v for k, v in m.items()} for m in chat]
        if any(not isinstance(m.get("role"), str) for m in chat):
            raise InvalidInput(
                f"{origin.locate(row)}: a message in {name} has no role — give every message a"
                " role (system, user, assistant, ...) and content"
            )
    return rows


def _chat_rows(
    table: pa.Table, origin: Origin, tokenizer: Tokenizer, objective: Objective, name: str | None
) -> Encoded:
    """Conversations of column ``name``, or conversational prompt-completion (None)."""
    what = f"{name} rows" if name else "conversational prompt-completion rows"
    backend, template = chat_tokenizer(tokenizer, origin, what)
    assistant = objective.assistant_only_loss
    if assistant and not _GENERATION.search(template):
        raise InvalidInput(
            f"{origin.parts[0][0]}: assistant_only_loss=True trains the assistant turns of"
            f" {what} only, and the chat template marks none — as TRL says, the chat template"
            " is not training-compatible (missing {% generation %} markers): pass"
            " --chat-template FILE with the assistant content inside {% generation %} ..."
            " {% endgeneration %} (trl.chat_template_utils.get_training_chat_template(tokenizer)"
            " gives one for the models TRL knows), or drop --assistant-only-loss to train the"
            " whole conversation"
        )
    if name is None:
        prompts, completions = _chats(table, "prompt", origin), _chats(table, "completion", origin)
        chats = [p + c for p, c in zip(prompts, completions, strict=True)]
    else:
        chats = _chats(table, name, origin)
    extras = template_extras(table, origin)
    if name is None:
        heads = render(backend, template, prompts, extras, origin, add_generation_prompt=True)
    whole = render(backend, template, chats, extras, origin, return_assistant_tokens_mask=assistant)
    ids = [e["input_ids"] for e in whole]
    if name is None:
        heads = [h["input_ids"] for h in heads]
        masks = _completion_masks(heads, ids, objective.completion_only(True), origin, tokenizer)
    else:
        masks = [np.ones(x.shape[0], dtype=bool) for x in ids]
    if assistant:
        masks = [m & e["assistant_masks"] for m, e in zip(masks, whole, strict=True)]
    return ids, masks


def _text_prompt_completion(
    table: pa.Table, origin: Origin, tokenizer: Tokenizer, objective: Objective
) -> Encoded:
    prompts = _strings(table, "prompt", origin)
    completions = _strings(table, "completion", origin)
    if isinstance(tokenizer, HFTokenizer):
        eos = None if tokenizer.kind == "tokenizers" else tokenizer.backend.eos_token
        if not isinstance(eos, str):
            raise InvalidInput(
                f"{origin.parts[0][0]}: prompt-completion rows end with the tokenizer's EOS"
                " token, and this tokenizer names none — pass a save_pretrained folder whose"
                " tokenizer_config.json sets eos_token"
            )
        completions = [c if c.endswith(eos) else c + eos for c in completions]
    elif not isinstance(tokenizer, ByteTokenizer):
        raise InvalidInput(f"{origin.parts[0][0]}: prompt-completion rows need --tokenizer")
    head_ids, head_offsets = tokenizer.encode_batch(prompts)
    full_ids, full_offsets = tokenizer.encode_batch(
        [p + c for p, c in zip(prompts, completions, strict=True)]
    )
    heads = [head_ids[a:b] for a, b in itertools.pairwise(head_offsets)]
    ids = [full_ids[a:b] for a, b in itertools.pairwise(full_offsets)]
    return ids, _completion_masks(heads, ids, objective.completion_only(True), origin, tokenizer)


def _completion_masks(
    heads: Sequence[np.ndarray], ids: Sequence[np.ndarray], completion_only: bool,
    origin: Origin, tokenizer: Tokenizer
) -> list[np.ndarray]:  # fmt: skip
    """Per row, True from where ``ids`` (prompt + completion) stops agreeing with ``heads``
    (the prompt alone; TRL's ``common_prefix_length``), everywhere unless
    ``completion_only``. When the prompt is not a prefix (a chat template that renders it
    differently alone, tokens merging across the boundary) the completion still starts
    where they diverge, and a warning says so, as TRL's does."""
    masks, bent = [], []
    for row, (head, full) in enumerate(zip(heads, ids, strict=True)):
        head, full = np.asarray(head), np.asarray(full)
        mask = np.ones(full.shape[0], dtype=bool)
        if completion_only:
            n = min(head.shape[0], full.shape[0])
            differ = np.flatnonzero(head[:n] != full[:n])
            common = int(differ[0]) if differ.size else n
            mask[:common] = False
            # an end-of-text token the tokenizer appends to every text (the byte
            # tokenizer's EOS) ends both: the prompt alone is a prefix but for it
            suffix = common == head.shape[0] - 1 and head[-1] == full[-1]
            if common < head.shape[0] and not suffix:
                bent.append((row, head[common:]))
        masks.append(mask)
    if bent:
        row, tail = bent[0]
        warnings.warn(
            f"{origin.locate(row)}: the tokenized prompt is not a prefix of the tokenized"
            f" prompt + completion ({len(bent)} of {len(ids)} rows read together), usually"
            " because the chat template renders the prompt alone differently or tokens merge"
            " across the boundary; as in TRL, the completion is trained from where they"
            f" diverge and the prompt's end {tokenizer.decode(tail)!r} is left out — use a"
            " chat template that renders the prompt the same way in both, or end the prompt"
            " on a token boundary",
            UserWarning,
            stacklevel=2,
        )
    return masks


def chat_tokenizer(tokenizer: Tokenizer, origin: Origin, what: str) -> tuple[Any, str]:
    """The transformers tokenizer and the chat template (text) to render with."""
    if not isinstance(tokenizer, HFTokenizer) or tokenizer.kind != "transformers":
        raise InvalidInput(
            f"{origin.parts[0][0]}: {what} need a chat template and a transformers tokenizer —"
            " pass --tokenizer with a save_pretrained folder (tokenizer_config.json), and"
            " --chat-template FILE if it has no template"
        )
    none = f"{origin.parts[0][0]}: {what} need a chat template, and the tokenizer has none"
    with foreign(none, "pass --chat-template FILE (a Jinja template)", (ValueError,)):
        template = tokenizer.backend.get_chat_template(tokenizer.chat_template)
    return tokenizer.backend, template


def template_extras(table: pa.Table, origin: Origin) -> list[dict[str, Any]] | None:
    """Each row's ``tools`` / ``chat_template_kwargs`` for the template, or None."""
    present = [n for n in TEMPLATE_COLUMNS if n in table.column_names]
    if not present:
        return None
    out: list[dict[str, Any]] = [{} for _ in range(table.num_rows)]
    for name in present:
        for row, value in enumerate(column(table, name).to_pylist()):
            if name == "tools":
                # the row is located (a file re-read) only on error
                with foreign(lambda row=row: f"{origin.locate(row)}: tools is not JSON"):
                    out[row]["tools"] = json.loads(value) if isinstance(value, str) else value
            elif value is not None:
                out[row].update(_template_kwargs(value, origin, row))
    return out


def _template_kwargs(value: Any, origin: Origin, row: int) -> dict[str, Any]:
    """A row's ``chat_template_kwargs``: a mapping of template variables, checked."""
    if not isinstance(value, dict):
        raise InvalidInput(
            f"{origin.locate(row)}: chat_template_kwargs is {type(value).__name__}, not a"
            ' mapping — give {name: value} template variables (e.g. {"enable_thinking": false})'
        )
    for key in value:
        if not isinstance(key, str) or key in SETTINGS or key.startswith("return_"):
            raise InvalidInput(
                f"{origin.locate(row)}: chat_template_kwargs names {key!r}, a tokenizer or"
                " apply_chat_template setting, not a template variable — exactpack passes template"
                " variables only (padding, truncation and lengths would change the tokens);"
                " drop the key"
            )
    return value


def render(
    backend: Any,
    template: str,
    chats: list[list[dict[str, Any]]],
    extras: list[dict[str, Any]] | None,
    origin: Origin,
    **kwargs: Any,
) -> list[dict[str, np.ndarray]]:
    """``apply_chat_template`` on the conversations in order under
    :mod:`exactpack.io.templates`' limits: :data:`CHAT_BATCH` a call when no row has
    extras, else (and again after a batch's error, to name the row) one a call; ids int32
    and the assistant mask bool each."""
    from exactpack.io.templates import TemplateLimit, bounded, rendered  # jinja2 only here

    size = CHAT_BATCH if extras is None else 1
    extras = extras or [{}] * len(chats)
    settings = {"chat_template": template, "tokenize": True, "return_dict": True, **kwargs}
    out: list[dict[str, np.ndarray]] = []
    with bounded(template, _template_name(backend, template)):
        while (lo := len(out)) < len(chats):
            part = chats[lo : lo + size]
            try:  # Jinja raises TemplateError and the template's own errors
                with foreign(lambda lo=lo: f"{origin.locate(lo)}: {REFUSED}",
                             "fix the row or the template", (Exception,)):  # fmt: skip
                    enc = backend.apply_chat_template(part, **extras[lo], **settings)
            except TemplateLimit as err:  # conversations render in order: the last one
                at = rendered() - 1 if size > 1 else lo
                raise TemplateLimit(f"{origin.locate(at)}: {err}") from None
            except InvalidInput:
                if size == 1:
                    raise
                size = 1
                continue
            out.extend(_arrays({k: enc[k][i] for k in enc}) for i in range(len(part)))
    return out


def _template_name(backend: Any, template: str) -> str:
    own = getattr(backend, "__dict__", {}).get("_real", backend)  # never load it for this
    source = getattr(own, "name_or_path", None) or getattr(backend, "_path", "the tokenizer")
    kind = "its own" if template == getattr(own, "chat_template", None) else "--chat-template"
    return f"the chat template ({kind}, tokenizer {source})"


def _arrays(enc: Any) -> dict[str, np.ndarray]:
    """One conversation's ids (int32) and assistant mask (bool) as arrays."""
    out = {"input_ids": np.asarray(enc["input_ids"], dtype=np.int32)}
    if "assistant_masks" in enc:
        out["assistant_masks"] = np.asarray(enc["assistant_masks"], dtype=bool)
    return out
