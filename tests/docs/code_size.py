"""How big ``src/`` is and how many concepts it implements more than once (issue 34).

Run it: ``python tests/docs/code_size.py`` prints the code lines of ``src/`` (counted as
``/work/shared/hooks/before-stop`` counts them: tokens only, so docstrings, comments and
blank lines are not counted) and, for each concept of :data:`CONCEPTS`, the
implementations of it that still exist. A concept is *implemented twice* while more than
one of its listed names is defined at the top level of its module; the count drops by
itself as a duplicate is deleted (its module or its name gone). When a concept gains a
new place, add it here: the list is the project's own census of its parallel stacks.
``tests/docs/test_code_size.py`` holds both numbers to ratchets.
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "exactpack"

#: concept -> the ``module:name`` of each place it is implemented (module relative to the
#: package, without ``.py``). One entry left per concept is the goal.
CONCEPTS: dict[str, tuple[str, ...]] = {
    "batch type": ("core/batch:PackedBatch", "core/tree:TreeBatch"),
    "compact form": ("core/compact:CompactRows",),
    "gather": ("core/compact:gather_rows", "core/tree:materialize"),
    "on-disk format": (
        "io/shards:shard_table",
        "io/tree_store:TREE_SCHEMA",
        "io/tree_rows:tree_table",
    ),
    "writer": ("io/store:write_shards", "io/tree_store:write_tree_shards"),
    "store": ("io/store:PackedStore", "io/tree_store:TreeStore"),
    "integrity check": ("io/integrity:check_shard", "io/integrity:check_tree_record"),
    "reader": (
        "pipeline/corpus:read_corpus",
        "io/tree_store:file_groups",
        "pipeline/pack_tree:file_groups",
    ),
    "pipeline": (
        "pipeline/local:pack_path",
        "pipeline/pack_tree:pack_tree_path",
        "pipeline/pack_tree:pack_tree_into",
    ),
    "pack_dataset": ("hf/datasets_io:pack_dataset",),
    "HF input builder": ("hf/adapter:hf_inputs", "hf/tree_inputs:tree_inputs"),
    "registered attention function": (
        "hf/attention_impl:exactpack_varlen_attention",
        "hf/attention_impl:exactpack_tree_attention",
        "hf/attention_impl:exactpack_attention",
    ),
    "attention plan": (
        "nn/varlen:VarlenPlan",
        "nn/tree_attention:TreePlan",
        "nn/varlen:PathPlan",
        "nn/tree_attention:FlashPlan",
    ),
    "flash lookup": ("nn/flash:flash_varlen",),
    "collator": (
        "training/packed_data:PackedCollator",
        "hf/collator:HFCollator",
        "hf/tree_inputs:TreeCollator",
    ),
    "loss": ("core/loss:token_weighted_sum", "core/tree:tree_loss_sum"),
    "verifier": ("verify/models:verify_hf",),
    "verify command": ("cli/verify:cmd_verify", "cli/verify_tree:cmd_verify_tree"),
    "stream engine": ("pipeline/stream_engine:StreamPass",),
    "options class": ("pipeline/options:PackOptions",),
    "per-sequence views": ("nn/logprobs:sequence_logprobs",),
    "border for foreign errors": ("core/errors:foreign",),
}


def code_lines(path: Path) -> int:
    """Lines of ``path`` that hold a token other than a comment, a blank line or a docstring
    (the count of the before-stop hook, byte for byte)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    skip: set[int] = set()
    try:
        for node in ast.walk(ast.parse(text)):
            body = getattr(node, "body", None)
            if (
                isinstance(body, list)
                and body
                and isinstance(body[0], ast.Expr)
                and isinstance(getattr(body[0], "value", None), ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                skip.update(range(body[0].lineno, body[0].end_lineno + 1))
        lines: set[int] = set()
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type not in (
                tokenize.COMMENT,
                tokenize.NL,
                tokenize.NEWLINE,
                tokenize.INDENT,
                tokenize.DEDENT,
                tokenize.ENDMARKER,
            ):
                lines.update(range(tok.start[0], tok.end[0] + 1))
    except (SyntaxError, tokenize.TokenError):
        return 0
    return len(lines - skip)


def src_code_lines(root: Path = SRC) -> int:
    """Code lines of every ``*.py`` under ``root``."""
    return sum(code_lines(p) for p in root.rglob("*.py"))


def defined(place: str) -> bool:
    """True when ``module:name`` is defined at the top level of its module."""
    module, name = place.split(":")
    path = PACKAGE / f"{module}.py"
    if not path.is_file():
        return False
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == name:
                return True
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
    return False


def implementations() -> dict[str, list[str]]:
    """Each concept's places that exist now."""
    return {c: [p for p in places if defined(p)] for c, places in CONCEPTS.items()}


def twice(found: dict[str, list[str]]) -> list[str]:
    """The concepts implemented more than once."""
    return [c for c, places in found.items() if len(places) > 1]


def main() -> int:
    found = implementations()
    repeated = twice(found)
    for concept, places in found.items():
        mark = "TWICE" if concept in repeated else "once " if places else "NONE "
        print(f"{mark} {concept}: {', '.join(places) or '-'}")
    print(f"code lines in src/: {src_code_lines()}")
    print(f"concepts implemented more than once: {len(repeated)} of {len(found)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
