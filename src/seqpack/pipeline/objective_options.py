"""The two SFT objective switches of :class:`~seqpack.pipeline.options.PackOptions`.

TRL 1.16 ``SFTConfig``'s ``assistant_only_loss`` (default False) and
``completion_only_loss`` (default None), declared as the options' fields
with their command-line flags ``--assistant-only-loss`` and
``--completion-only-loss {true,false}`` (see
:class:`~seqpack.core.supervision.Objective` for what they mean).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from seqpack.core.errors import InvalidInput

_HELP = {
    "assistant_only_loss": (
        "train only the assistant turns of chat rows (TRL SFTConfig's assistant_only_loss;"
        " default: the whole conversation, as TRL; needs generation markers in the template)"
    ),
    "completion_only_loss": (
        "true: train only the completion of prompt-completion rows (and completion_mask);"
        " false: the whole sequence (TRL SFTConfig's completion_only_loss; default: true"
        " for prompt-completion rows only, as TRL)"
    ),
}


def objective_field(name: str) -> Any:
    """The dataclass field of switch ``name``, with its flag (``pack`` and ``stats``)."""
    flag = "--" + name.replace("_", "-")
    if name == "assistant_only_loss":
        default, argparse = False, {"action": "store_true"}
    else:
        default, argparse = None, {"metavar": "{true,false}"}
    meta = {"flag": flag, "help": _HELP[name], "commands": ("pack", "stats"), "argparse": argparse}
    return dataclasses.field(default=default, metadata=meta)


def parse_switch(text: str, flag: str) -> bool:
    """``true`` / ``false`` (any case; also 1/0, yes/no) as a bool, else one line naming it."""
    value = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
    try:
        return value[text.strip().lower()]
    except KeyError:
        raise InvalidInput(f"{flag} takes true or false, not {text!r}") from None
