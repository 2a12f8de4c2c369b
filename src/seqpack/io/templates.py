"""Chat templates rendered under limits: a sandbox with a step, time and size bound.

A chat template is code from the tokenizer folder (or ``--chat-template``):
Jinja, which transformers renders in ``jinja2.sandbox.ImmutableSandboxedEnvironment``
(no attribute escapes, no mutation of the data) but without any bound on
work or size — a loop of 10^10 iterations runs forever, a template that
multiplies a string renders gigabytes. seqpack compiles the same template in
:class:`BoundedEnvironment`, a subclass of that sandbox with transformers'
own settings, filters, globals and ``{% generation %}`` extension, and hands
it to transformers' ``apply_chat_template`` for the duration of seqpack's
own calls (:func:`bounded`; the user's other renders are untouched), so the
tokens are still exactly transformers' (and TRL's). Per rendered
conversation:

- at most :data:`MAX_STEPS` steps (a loop iteration, a call, an attribute
  or item lookup; a ``range(n)`` counts ``n``) and :data:`MAX_SECONDS`
  seconds;
- no value or output longer than :data:`MAX_CHARS` characters: string and
  list ``*``, ``+``, ``%``, ``~``, ``**``, ``join`` and ``replace`` are sized
  *before* they allocate; calls and filters with an integer argument above
  the bound to a callable that sizes its result with it (``center``,
  ``indent``, ``ljust``, ``lipsum``, a format width) are refused;
  every buffer (``{% set %}`` blocks, macros, ``{% generation %}`` bodies)
  is sized before it is joined, and the output as it is produced.

Exceeding a limit is :class:`TemplateLimit`, an
:class:`~seqpack.core.errors.InvalidInput` naming the template and the limit.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from jinja2 import Template, TemplateError, nodes
from jinja2.compiler import CodeGenerator
from jinja2.sandbox import ImmutableSandboxedEnvironment

from seqpack.core.errors import InvalidInput
from seqpack.io.template_limits import (
    BUDGET,
    MAX_CHARS,
    RENDERED,
    WIDE,
    Budget,
    TemplateLimit,
    bounded_filter,
    budget,
    check_args,
    check_value,
    counted,
    grown,
    joined,
    replaced,
    size_of,
)


class _Generator(CodeGenerator):
    def visit_Concat(self, node: Any, frame: Any) -> None:  # ``a ~ b``: sized first
        self.write("environment.seqpack_concat((")
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
        count = RENDERED.get()
        if count is not None:
            count[0] += 1
        token = BUDGET.set(Budget(self.environment.seqpack_name))
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
    seqpack_name = "the chat template"

    def _parse(self, source: str, name: str | None, filename: str | None) -> Any:
        tree = super()._parse(source, name, filename)
        for loop in tree.find_all(nodes.For):  # every loop counts its iterations
            counted = nodes.EnvironmentAttribute("seqpack_steps")
            loop.iter = nodes.Call(counted, [loop.iter], [], None, None, lineno=loop.lineno)
        return tree

    @staticmethod
    def seqpack_steps(iterable: Any) -> Iterator[Any]:
        return counted(iterable)

    @staticmethod
    def seqpack_concat(parts: tuple[Any, ...]) -> str:
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
        owner = getattr(__obj, "__self__", None)
        method = getattr(__obj, "__name__", "")
        check_args(method, args, kwargs)
        if isinstance(owner, str):
            if method == "replace" and len(args) >= 2:
                replaced(owner, *args[:3])
            if method == "join" and args:
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
        elif operator == "%" and isinstance(left, str) and WIDE.search(left):
            budget().fail("a format width of 8 digits or more")
        return check_value(super().call_binop(context, operator, left, right))

    def getattr(self, obj: Any, attribute: str) -> Any:
        spent = budget()
        spent.step()
        if isinstance(obj, str) and attribute in ("format", "format_map") and WIDE.search(obj):
            spent.fail("a format width of 8 digits or more")
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        budget().step()
        return super().getitem(obj, argument)


@functools.lru_cache(maxsize=16)
def compile_bounded(template: str, name: str) -> Any:
    """``template`` compiled as transformers compiles it, in :class:`BoundedEnvironment`."""
    from transformers.utils import chat_template_utils as ctu

    # transformers' environment, from an empty template: compiling the user's there would
    # fold its constants unbounded (``'x' * 10**10`` is computed at compile time)
    base = _original(ctu)("").environment
    env = BoundedEnvironment(
        trim_blocks=base.trim_blocks,
        lstrip_blocks=base.lstrip_blocks,
        keep_trailing_newline=base.keep_trailing_newline,
        extensions=[type(e) for e in base.extensions.values()],
    )
    env.filters.update({k: bounded_filter(k, f) for k, f in base.filters.items()})
    env.globals.update(base.globals)
    env.seqpack_name = name
    return env.from_string(template)


_ACTIVE: ContextVar[dict[str, Any] | None] = ContextVar("seqpack_templates", default=None)


def _original(ctu: Any) -> Any:
    return getattr(ctu._compile_jinja_template, "seqpack_original", ctu._compile_jinja_template)


def _install() -> None:
    """Route transformers' template compilation through :data:`_ACTIVE` (once)."""
    from transformers.utils import chat_template_utils as ctu

    if hasattr(ctu._compile_jinja_template, "seqpack_original"):
        return
    original = ctu._compile_jinja_template

    def compile_template(chat_template: Any) -> Any:
        active = _ACTIVE.get()
        if active is not None and chat_template in active:
            return active[chat_template]
        return original(chat_template)

    compile_template.seqpack_original = original  # type: ignore[attr-defined]
    compile_template.cache_info = getattr(original, "cache_info", None)  # type: ignore[attr-defined]
    ctu._compile_jinja_template = compile_template


@contextlib.contextmanager
def bounded(template: str, name: str) -> Iterator[None]:
    """Within the block, transformers renders ``template`` (only in this thread or task)
    with :func:`compile_bounded`'s limits; ``name`` names it in a limit's message."""
    _install()
    try:
        compiled = compile_bounded(template, name)
    except TemplateError as err:  # a syntax error: one line naming the template
        why = " ".join(str(err).split())[:300]
        raise InvalidInput(f"{name} does not compile ({why}) — fix the template") from None
    token = _ACTIVE.set({**(_ACTIVE.get() or {}), template: compiled})
    counted = RENDERED.set([0])
    try:
        yield
    finally:
        RENDERED.reset(counted)
        _ACTIVE.reset(token)
