"""Prepare a scratch copy of the project for one mutmut run (see docs/testing.md).

Usage: ``python scripts/mutation_prepare.py WORKDIR MODULE TEST_FILE...``

``WORKDIR`` holds a copy of ``src/``, ``tests/`` and ``pyproject.toml``. Two
changes make the copy mutable by mutmut 3, which never mutates a decorated
function and replaces each mutated function by a trampoline (a closure):

- the planning and streaming kernels are registered after their definitions
  (``kernel(name)`` at the end of the module) instead of with ``@kernel``, so
  mutmut mutates them and the python engine runs their trampolines;
- the python engine's copy of a kernel keeps the function's closure (a
  trampoline has one).

Nothing else changes. The ``[tool.mutmut]`` table of the copy's
``pyproject.toml`` is rewritten to mutate only ``src/exactpack/MODULE`` (a comma-separated
list mutates several) and to
select tests from ``TEST_FILE...``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib

KERNEL_MODULES = ("core/engine.py", "core/policies.py", "core/stream_packer.py")


def undecorate_kernels(path: Path) -> None:
    text = path.read_text()
    names = re.findall(r"^@kernel\n(?:def) (\w+)\(", text, flags=re.M)
    if not names:
        return
    text = re.sub(r"^@kernel\n(?=def )", "", text, flags=re.M)
    text += "\n\nfor _kernel in (" + ", ".join(names) + ",):\n    kernel(_kernel)\n"
    path.write_text(text)


def keep_closures(path: Path) -> None:
    text = path.read_text()
    old = "FunctionType(fn.__code__, space, name, fn.__defaults__)"
    if old not in text:
        raise SystemExit(f"{path}: the python engine's copy is not where mutation_prepare expects")
    new = "FunctionType(fn.__code__, space, name, fn.__defaults__, fn.__closure__)"
    path.write_text(text.replace(old, new))


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def rewrite_config(pyproject: Path, module: str, tests: list[str]) -> None:
    text = pyproject.read_text()
    table = dict(tomllib.loads(text)["tool"]["mutmut"])
    table["only_mutate"] = [f"src/exactpack/{m}" for m in module.split(",")]
    table["pytest_add_cli_args_test_selection"] = tests
    head, sep, _ = text.partition("[tool.mutmut]")
    if not sep:
        raise SystemExit(f"{pyproject} has no [tool.mutmut] table")
    body = "".join(f"{k} = {toml_value(v)}\n" for k, v in table.items())
    pyproject.write_text(head + "[tool.mutmut]\n" + body)


def main(argv: list[str]) -> None:
    work, module, *tests = argv
    root = Path(work)
    for rel in KERNEL_MODULES:
        undecorate_kernels(root / "src/exactpack" / rel)
    keep_closures(root / "src/exactpack/core/engine.py")
    rewrite_config(root / "pyproject.toml", module, tests)


if __name__ == "__main__":
    main(sys.argv[1:])
