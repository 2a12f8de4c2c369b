"""Ratchets on the size of ``src/`` and its parallel stacks (issue 34, ``code_size.py``).

Lower a ceiling when a change deletes code or folds a duplicate in; never raise one to let
a change through: extend the one path instead (STYLE.md 8).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

#: Code lines of src/ (tokens only) may not grow past this.
CODE_LINES_CEILING = 16918
#: Concepts implemented more than once (code_size.CONCEPTS) may not grow past this.
TWICE_CEILING = 0

_spec = importlib.util.spec_from_file_location(
    "code_size", Path(__file__).with_name("code_size.py")
)
code_size = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(code_size)


def test_the_counter_counts_code_only(tmp_path):
    (tmp_path / "m.py").write_text(
        '"""Doc\nstring."""\n\n# a comment\nx = (1,\n     2)  # trailing\n\n\n'
        'def f():\n    """doc"""\n    return x\n'
    )
    assert code_size.src_code_lines(tmp_path) == 4  # x = (1, / 2) / def f(): / return x


def test_every_declared_place_names_a_module_and_a_name():
    for concept, places in code_size.CONCEPTS.items():
        assert places, concept
        for place in places:
            module, _, name = place.partition(":")
            assert module and name.isidentifier(), f"{concept}: {place!r}"


def test_src_does_not_grow_and_no_concept_gains_a_copy(capsys):
    lines = code_size.src_code_lines()
    found = code_size.implementations()
    repeated = code_size.twice(found)
    with capsys.disabled():
        print(f"\nsrc/ code lines: {lines}; concepts implemented twice: {len(repeated)}")
    assert all(found.values()), [c for c, p in found.items() if not p]  # a rename: update
    assert lines <= CODE_LINES_CEILING, (lines, CODE_LINES_CEILING)
    assert len(repeated) <= TWICE_CEILING, (repeated, TWICE_CEILING)
