"""Chat templates applied as transformers applies them, under seqpack's limits.

:func:`render` calls the tokenizer's own
``transformers.PreTrainedTokenizerBase.apply_chat_template`` (its Jinja
renderer, ``add_special_tokens=False``, assistant masks from the character
spans of the ``{% generation %}`` blocks) inside
:func:`seqpack.io.templates.bounded` (a sandbox with a step, time and size
bound), batched when no row has extras and row by row otherwise, so an
error names its row. A row's ``tools`` (a list or JSON text) and
``chat_template_kwargs`` (a mapping of template variables; tokenizer and
``apply_chat_template`` settings such as ``padding``, ``truncation``,
``max_length`` or ``return_*`` are refused: they would change the tokens)
reach the template as in TRL.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pyarrow as pa

from seqpack.core.errors import InvalidInput
from seqpack.io.cells import column
from seqpack.io.documents import Origin
from seqpack.io.template_limits import TemplateLimit, rendered
from seqpack.io.tokenizers import HFTokenizer, Tokenizer

#: Per-row extras the chat template receives, as in TRL.
TEMPLATE_COLUMNS = ("tools", "chat_template_kwargs")
#: Conversations rendered per ``apply_chat_template`` call.
CHAT_BATCH = 256
_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")


def chat_tokenizer(tokenizer: Tokenizer, origin: Origin, what: str) -> tuple[Any, str]:
    """The transformers tokenizer and the chat template (text) to render with."""
    if not isinstance(tokenizer, HFTokenizer) or tokenizer.kind != "transformers":
        raise InvalidInput(
            f"{origin.parts[0][0]}: {what} need a chat template and a transformers tokenizer —"
            " pass --tokenizer with a save_pretrained folder (tokenizer_config.json), and"
            " --chat-template FILE if it has no template"
        )
    try:
        template = tokenizer.backend.get_chat_template(tokenizer.chat_template)
    except ValueError:
        raise InvalidInput(
            f"{origin.parts[0][0]}: {what} need a chat template, and the tokenizer has none —"
            " pass --chat-template FILE (a Jinja template)"
        ) from None
    return tokenizer.backend, template


def template_extras(table: pa.Table, origin: Origin) -> list[dict[str, Any]] | None:
    """Each row's ``tools`` / ``chat_template_kwargs`` for the template, or None."""
    present = [n for n in TEMPLATE_COLUMNS if n in table.column_names]
    if not present:
        return None
    out: list[dict[str, Any]] = [{} for _ in range(table.num_rows)]
    for name in present:
        for row, value in enumerate(column(table, name).to_pylist()):
            if name == "tools" and isinstance(value, str):
                try:
                    value = json.loads(value)
                except ValueError as err:
                    raise InvalidInput(f"{origin.locate(row)}: tools is not JSON ({err})") from None
            if name == "tools":
                out[row]["tools"] = value
            elif value is not None:
                out[row].update(_template_kwargs(value, origin, row))
    return out


#: ``apply_chat_template``'s and the tokenizer's own arguments: a ``chat_template_kwargs``
#: key of these names would change the tokens (padding, length) or clash with seqpack's.
SETTINGS = frozenset(
    [
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "sanitize_control_tokens",
        "padding",
        "truncation",
        "max_length",
        "tokenizer_kwargs",
        "add_special_tokens",
        "stride",
        "pad_to_multiple_of",
        "padding_side",
        "is_split_into_words",
        "text",
        "text_target",
        "verbose",
    ]
)


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
                " apply_chat_template setting, not a template variable — seqpack passes template"
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
) -> list[dict[str, Any]]:
    """``apply_chat_template`` per conversation (batched when no row has extras), under
    the limits of :mod:`seqpack.io.templates`."""
    from seqpack.io.templates import bounded  # jinja2 (~90 ms) only where chats are rendered

    with bounded(template, _template_name(backend, template)):
        if extras is None:
            try:
                return _render_batches(backend, template, chats, kwargs)
            except TemplateLimit as err:  # conversations render in order: the last one
                raise TemplateLimit(f"{origin.locate(rendered() - 1)}: {err}") from None
            except Exception:  # a template error: row by row, to name the row
                extras = [{} for _ in chats]
        return [
            _render_one(backend, template, chat, extra, origin, row, kwargs)
            for row, (chat, extra) in enumerate(zip(chats, extras, strict=True))
        ]


def _template_name(backend: Any, template: str) -> str:
    own = getattr(backend, "__dict__", {}).get("_real", backend)  # never load it for this
    source = getattr(own, "name_or_path", None) or getattr(backend, "_path", "the tokenizer")
    kind = "its own" if template == getattr(own, "chat_template", None) else "--chat-template"
    return f"the chat template ({kind}, tokenizer {source})"


def _render_batches(
    backend: Any, template: str, chats: list[list[dict[str, Any]]], kwargs: dict[str, Any]
) -> list[dict[str, Any]]:
    out = []
    for lo in range(0, len(chats), CHAT_BATCH):
        part = chats[lo : lo + CHAT_BATCH]
        enc = backend.apply_chat_template(
            part, chat_template=template, tokenize=True, return_dict=True, **kwargs
        )
        out.extend(_arrays({k: enc[k][i] for k in enc}) for i in range(len(part)))
    return out


def _render_one(
    backend: Any,
    template: str,
    chat: list[dict[str, Any]],
    extra: dict[str, Any],
    origin: Origin,
    row: int,
    kwargs: dict[str, Any],
) -> dict[str, Any]:
    try:
        enc = backend.apply_chat_template(
            chat, chat_template=template, tokenize=True, return_dict=True, **extra, **kwargs
        )
    except TemplateLimit as err:
        raise TemplateLimit(f"{origin.locate(row)}: {err}") from None
    except Exception as err:  # Jinja raises TemplateError and the template's own errors
        why = " ".join(str(err).split())
        raise InvalidInput(
            f"{origin.locate(row)}: the chat template refuses this conversation"
            f" ({type(err).__name__}: {why[:300]}) — fix the row or the template"
        ) from None
    return _arrays(enc)


def _arrays(enc: Any) -> dict[str, np.ndarray]:
    """One conversation's ids (int32) and assistant mask (bool) as arrays: a chunk's
    Python int lists live for one batch of :data:`CHAT_BATCH` only."""
    out = {"input_ids": np.asarray(enc["input_ids"], dtype=np.int32)}
    if "assistant_masks" in enc:
        out["assistant_masks"] = np.asarray(enc["assistant_masks"], dtype=bool)
    return out


def require_markers(template: str, origin: Origin, what: str) -> None:
    if not _GENERATION.search(template):
        raise InvalidInput(
            f"{origin.parts[0][0]}: assistant_only_loss=True trains the assistant turns of"
            f" {what} only, and the chat template marks none — as TRL says, the chat template"
            " is not training-compatible (missing {% generation %} markers): pass"
            " --chat-template FILE with the assistant content inside {% generation %} ..."
            " {% endgeneration %} (trl.chat_template_utils.get_training_chat_template(tokenizer)"
            " gives one for the models TRL knows), or drop --assistant-only-loss to train the"
            " whole conversation"
        )
