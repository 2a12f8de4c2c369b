"""Chat templates rendered under limits: a sandbox with a step, time and size bound.

:func:`bounded` compiles a template in :class:`BoundedEnvironment` (transformers'
``ImmutableSandboxedEnvironment`` with transformers' own settings, filters, globals and
``{% generation %}`` extension) and has transformers' ``apply_chat_template`` use it for
exactpack's calls only, so the tokens are exactly transformers'. Per conversation: at most
:data:`MAX_STEPS` steps (a loop iteration, call or lookup; ``range(n)`` counts ``n``),
:data:`MAX_SECONDS` seconds, and no value or output over :data:`MAX_CHARS` characters
(``*``, ``+``, ``%``, ``~``, ``**``, ``join``, ``replace`` and buffers are sized before
they allocate; a :data:`SIZED` callable's integer argument over it is refused).
Exceeding one raises :class:`TemplateLimit` naming the template; the budget is a
context variable, so other threads and tasks keep their own.
"""

from __future__ import annotations

import contextlib
import functools
import re
import time
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from jinja2 import Template, TemplateError, nodes
from jinja2.compiler import CodeGenerator
from jinja2.nodes import EvalContext
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment

from exactpack.core.errors import InvalidInput, foreign

#: Steps one conversation's rendering may take (a real template takes a few thousand).
MAX_STEPS = 1 << 22
#: Seconds one conversation's rendering may take.
MAX_SECONDS = 5.0
#: The longest value or rendered conversation, in characters (32 Mi).
MAX_CHARS = 1 << 25
#: A format width or precision of 8 digits or more (``{:>99999999}``, ``%099999999d``).
WIDE = re.compile(r"\d{8,}")
#: Filters and callables whose integer arguments size what they build (``center(10**10)``);
#: other integers (a tool call's number, a timestamp) are data and pass.
SIZED = frozenset(("center", "indent", "wordwrap", "truncate", "batch", "slice", "ljust",
                   "rjust", "zfill", "expandtabs", "generate_lorem_ipsum"))  # fmt: skip


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
            f"{self.name} takes {what} to render one conversation — exactpack renders a chat"
            f" template under limits ({MAX_STEPS:,} steps, {MAX_SECONDS:g} s, {MAX_CHARS:,}"
            " characters); fix the template"
        )


BUDGET: ContextVar[Budget | None] = ContextVar("exactpack_template_budget", default=None)
#: Conversations rendered so far inside :func:`bounded` (so a batch's failure names its row).
RENDERED: ContextVar[list[int] | None] = ContextVar("exactpack_rendered", default=None)
_ACTIVE: ContextVar[dict[str, Any] | None] = ContextVar("exactpack_templates", default=None)


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


def grown(size: int) -> None:
    if size > MAX_CHARS:
        budget().fail(f"a value of {size:,} characters")


def check_args(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse an integer argument above :data:`MAX_CHARS` to a :data:`SIZED` callable."""
    if name in SIZED:
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


def joined(sep: Any, items: list[Any]) -> None:
    size = sum(len(x) if isinstance(x, str) else 16 for x in items)
    grown(size + len(str(sep)) * max(0, len(items) - 1))


def wide(text: Any) -> None:
    if isinstance(text, str) and WIDE.search(text):
        budget().fail("a format width of 8 digits or more")


def bounded_filter(name: str, func: Any) -> Any:
    """``func`` (a Jinja filter) with its arguments and result sized."""

    @functools.wraps(func)  # keeps jinja's pass_context / pass_eval_context marks
    def bounded(*args: Any, **kwargs: Any) -> Any:
        budget().step()
        values = [a for a in args if not isinstance(a, (Context, EvalContext))]
        check_args(name, tuple(values[1:]), kwargs)
        if name == "join" and values:
            items = list(values[0])
            joined(values[1] if len(values) > 1 else kwargs.get("d", ""), items)
            args = tuple(items if a is values[0] else a for a in args)
        elif name == "replace" and len(values) >= 3:
            replaced(*values[:4])
        elif name == "format" and values:
            wide(values[0])
        return check_value(func(*args, **kwargs))

    return bounded


def counted(iterable: Any) -> Iterator[Any]:
    """``iterable``, one step per item (every ``{% for %}`` loop iterates through it)."""
    spent = budget()
    for item in iterable:
        spent.step()
        yield item


class _Generator(CodeGenerator):
    def visit_Concat(self, node: Any, frame: Any) -> None:  # ``a ~ b``: sized first
        self.write("environment.exactpack_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class BoundedTemplate(Template):
    """A template whose output is sized as it is produced, with a fresh budget per render."""

    def render(self, *args: Any, **kwargs: Any) -> str:
        return "".join(self.generate(*args, **kwargs))

    def generate(self, *args: Any, **kwargs: Any) -> Iterator[str]:
        ctx = self.new_context(dict(*args, **kwargs))
        if (count := RENDERED.get()) is not None:
            count[0] += 1
        token = BUDGET.set(Budget(self.environment.exactpack_name))
        total = 0
        try:
            for block in self.root_render_func(ctx):
                total += len(block)
                if total > MAX_CHARS:
                    budget().fail(f"more than {MAX_CHARS:,} characters of output")
                yield block
        except TemplateLimit:
            raise
        except Exception:
            yield self.environment.handle_exception()
        finally:
            BUDGET.reset(token)


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """transformers' sandbox, counting steps and sizing values (see the module)."""

    intercepted_binops = frozenset(["*", "**", "+", "%"])
    code_generator_class = _Generator
    template_class = BoundedTemplate
    exactpack_name = "the chat template"

    def _parse(self, source: str, name: str | None, filename: str | None) -> Any:
        tree = super()._parse(source, name, filename)
        for loop in tree.find_all(nodes.For):  # every loop counts its iterations
            steps = nodes.EnvironmentAttribute("exactpack_steps")
            loop.iter = nodes.Call(steps, [loop.iter], [], None, None, lineno=loop.lineno)
        return tree

    exactpack_steps = staticmethod(counted)

    @staticmethod
    def exactpack_concat(parts: tuple[Any, ...]) -> str:
        texts = [str(p) for p in parts]
        grown(sum(map(len, texts)))
        return "".join(texts)

    def concat(self, parts: Any) -> str:  # buffers: macros, set blocks, generation
        parts = list(parts)
        grown(sum(len(p) for p in parts))
        return "".join(parts)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        spent = budget()
        spent.step()
        owner, method = getattr(__obj, "__self__", None), getattr(__obj, "__name__", "")
        check_args(method, args, kwargs)
        if isinstance(owner, str) and method == "replace" and len(args) >= 2:
            replaced(owner, *args[:3])
        elif isinstance(owner, str) and method == "join" and args:
            items = list(args[0])
            joined(owner, items)
            args = (items, *args[1:])
        result = super().call(__context, __obj, *args, **kwargs)
        if isinstance(result, range):
            spent.step(len(result))
        return check_value(result)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        budget().step()
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(times, int) and isinstance(seq, (str, list, tuple)):
                    grown(len(seq) * max(times, 0))
        elif operator == "+" and size_of(left) and size_of(right):
            grown(size_of(left) + size_of(right))
        elif operator == "**" and isinstance(left, int) and isinstance(right, int):
            if right > 0 and abs(left) > 1 and right * abs(left).bit_length() > 1 << 16:
                budget().fail(f"a power of {right:,}")
        elif operator == "%":
            wide(left)
        return check_value(super().call_binop(context, operator, left, right))

    def getattr(self, obj: Any, attribute: str) -> Any:
        budget().step()
        if attribute in ("format", "format_map"):
            wide(obj)
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        budget().step()
        return super().getitem(obj, argument)


@functools.lru_cache(maxsize=16)
def compile_bounded(template: str, name: str) -> Any:
    """``template`` compiled as transformers compiles it, in :class:`BoundedEnvironment`."""
    from transformers.utils import chat_template_utils as ctu

    # from an empty template: the user's would fold constants unbounded (``'x' * 10**10``)
    original = ctu._compile_jinja_template
    base = getattr(original, "exactpack_original", original)("").environment
    env = BoundedEnvironment(
        trim_blocks=base.trim_blocks,
        lstrip_blocks=base.lstrip_blocks,
        keep_trailing_newline=base.keep_trailing_newline,
        extensions=[type(e) for e in base.extensions.values()],
    )
    env.filters.update({k: bounded_filter(k, f) for k, f in base.filters.items()})
    env.globals.update(base.globals)
    env.exactpack_name = name
    return env.from_string(template)


def _install() -> None:
    """Route transformers' template compilation through :data:`_ACTIVE` (once)."""
    from transformers.utils import chat_template_utils as ctu

    if hasattr(ctu._compile_jinja_template, "exactpack_original"):
        return
    original = ctu._compile_jinja_template

    def compile_template(chat_template: Any) -> Any:
        active = _ACTIVE.get()
        if active is not None and chat_template in active:
            return active[chat_template]
        return original(chat_template)

    compile_template.exactpack_original = original  # type: ignore[attr-defined]
    compile_template.cache_info = getattr(original, "cache_info", None)  # type: ignore[attr-defined]
    ctu._compile_jinja_template = compile_template


@contextlib.contextmanager
def bounded(template: str, name: str) -> Iterator[None]:
    """Within the block, transformers renders ``template`` (only in this thread or task)
    with :func:`compile_bounded`'s limits; ``name`` names it in a limit's message."""
    _install()
    with foreign(f"{name} does not compile", "fix the template", (TemplateError,)):
        compiled = compile_bounded(template, name)  # a syntax error: one line naming it
    token = _ACTIVE.set({**(_ACTIVE.get() or {}), template: compiled})
    count = RENDERED.set([0])
    try:
        yield
    finally:
        RENDERED.reset(count)
        _ACTIVE.reset(token)
