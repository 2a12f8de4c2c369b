"""The limits a chat template renders under (see :mod:`seqpack.io.templates`).

Per rendered conversation: at most :data:`MAX_STEPS` steps and
:data:`MAX_SECONDS` seconds, no value or output longer than
:data:`MAX_CHARS` characters, each size checked before the allocation it
bounds. The budget of the conversation being rendered lives in a context
variable, so renders in other threads or tasks keep their own. No jinja2
import here: readers import this module whether or not a template is used.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from seqpack.core.errors import InvalidInput

#: Steps one conversation's rendering may take (a real template takes a few thousand).
MAX_STEPS = 1 << 22
#: Seconds one conversation's rendering may take.
MAX_SECONDS = 5.0
#: The longest value or rendered conversation, in characters (32 Mi).
MAX_CHARS = 1 << 25
#: A format width or precision of 8 digits or more (``{:>99999999}``, ``%099999999d``).
WIDE = re.compile(r"\d{8,}")


class TemplateLimit(InvalidInput):
    """A chat template exceeded a rendering limit (steps, time or size)."""


class Budget:
    __slots__ = ("deadline", "name", "steps")

    def __init__(self, name: str) -> None:
        self.name, self.steps, self.deadline = name, 0, time.monotonic() + MAX_SECONDS

    def step(self, n: int = 1) -> None:
        self.steps += n
        if self.steps > MAX_STEPS:
            self.fail(f"more than {MAX_STEPS:,} steps (a loop that does not end?)")
        if self.steps & 1023 < n and time.monotonic() > self.deadline:
            self.fail(f"more than {MAX_SECONDS:g} s")

    def fail(self, what: str) -> None:
        raise TemplateLimit(
            f"{self.name} takes {what} to render one conversation — seqpack renders a chat"
            f" template under limits ({MAX_STEPS:,} steps, {MAX_SECONDS:g} s, {MAX_CHARS:,}"
            " characters); fix the template"
        )


BUDGET: ContextVar[Budget | None] = ContextVar("seqpack_template_budget", default=None)
#: Conversations rendered so far inside :func:`bounded` (so a batch's failure names its row).
RENDERED: ContextVar[list[int] | None] = ContextVar("seqpack_rendered", default=None)


def rendered() -> int:
    """How many conversations the innermost :func:`bounded` block has started to render."""
    count = RENDERED.get()
    return count[0] if count else 0


def budget() -> Budget:
    """The budget of the conversation being rendered (a fresh one outside a render)."""
    current = BUDGET.get()
    return current if current is not None else Budget("the chat template")


def size_of(value: Any) -> int:
    return len(value) if isinstance(value, (str, list, tuple, dict)) else 0


def check_value(value: Any) -> Any:
    if size_of(value) > MAX_CHARS:
        budget().fail(f"a value of {size_of(value):,} items or characters")
    return value


#: Filters and callables whose integer arguments size what they build (``center(10**10)``);
#: other integers (a tool call's number, a timestamp) are data and pass.
SIZED = frozenset(
    (
        *("center", "indent", "wordwrap", "truncate", "batch", "slice"),  # filters
        *("ljust", "rjust", "zfill", "expandtabs"),  # str methods (and center)
        "generate_lorem_ipsum",  # the lipsum global
    )
)


def check_args(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse an integer argument above :data:`MAX_CHARS` to a :data:`SIZED` callable."""
    if name not in SIZED:
        return
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_CHARS:
            budget().fail(f"an argument of {value:,}")


def replaced(text: Any, old: Any, new: Any, count: Any = -1) -> None:
    """Size ``text.replace(old, new)`` before it is computed."""
    if isinstance(text, str) and isinstance(old, str) and isinstance(new, str):
        hits = len(text) + 1 if old == "" else text.count(old)
        if isinstance(count, int) and count >= 0:
            hits = min(hits, count)
        grown(len(text) + hits * (len(new) - len(old)))


def grown(size: int) -> None:
    if size > MAX_CHARS:
        budget().fail(f"a value of {size:,} characters")


def joined(sep: Any, items: list[Any]) -> None:
    size = sum(len(x) if isinstance(x, str) else 16 for x in items)
    grown(size + len(str(sep)) * max(0, len(items) - 1))


def bounded_filter(name: str, func: Any) -> Any:
    """``func`` (a Jinja filter) with its arguments and result sized (see the module)."""

    @functools.wraps(func)  # keeps jinja's pass_context / pass_eval_context marks
    def bounded(*args: Any, **kwargs: Any) -> Any:
        spent = budget()
        spent.step()
        values = [a for a in args if not _is_context(a)]
        check_args(name, tuple(values[1:]), kwargs)
        if name == "join" and values:
            items = list(values[0])
            joined(values[1] if len(values) > 1 else kwargs.get("d", ""), items)
            args = tuple(items if a is values[0] else a for a in args)
        elif name == "replace" and len(values) >= 3:
            replaced(*values[:4])
        elif name == "format" and values and isinstance(values[0], str) and WIDE.search(values[0]):
            spent.fail("a format width of 8 digits or more")
        return check_value(func(*args, **kwargs))

    return bounded


def _is_context(value: Any) -> bool:
    from jinja2.nodes import EvalContext
    from jinja2.runtime import Context

    return isinstance(value, (Context, EvalContext))


def counted(iterable: Any) -> Iterator[Any]:
    """``iterable``, one step per item (every ``{% for %}`` loop iterates through it)."""
    spent = budget()
    for item in iterable:
        spent.step()
        yield item
