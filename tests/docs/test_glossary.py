"""The glossary of docs/architecture.md is what the public names say (issue 20).

Every public name -- each package's ``__all__``, every public module-level function
and class under ``src/exactpack``, every flag of every ``exactpack`` command -- is cut
into word parts (``snake_case``, ``CamelCase``, ``--kebab-case``); none may hold a
word the glossary retired (its ``not`` column) unless the name is listed in
:data:`ALLOWED` with the reason it stays for now. A retired word that is itself a
term (``verify``, ``engine``) is left to review; a term that contains a retired word
(``sliding_window``) is taken out of a name before the retired words are looked for.
Nothing was released, so an old spelling of a renamed name is gone, not deprecated.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "exactpack"
PACKAGES = (
    "exactpack",
    "exactpack.io",
    "exactpack.pipeline",
    "exactpack.training",
    "exactpack.nn",
    "exactpack.hf",
    "exactpack.ray",
    "exactpack.verify",
)

#: Names that keep a retired word for now, and why (remove an entry when its rename lands).
#: (``exactpack.ray.blocks.PARTITION_COLUMN``, the data's own column name, is no longer public.)
ALLOWED: dict[str, str] = {}

#: Renames that landed: each old public spelling is gone (no alias, no hidden flag), and
#: its new spelling is there.
LANDED = {
    "--capacity": "--max-length",
    "--split-long": "--cut-long",
    "--partition": "--split",
    "--tree-window": "--tree-block",
    "FIXTURE_CAPACITY": "FIXTURE_MAX_LENGTH",
    "check_tree_capacity": "check_max_length",
}
#: Keywords renamed: (old, new, functions "module:qualname" that take the new one only).
LANDED_KEYWORDS = (
    (
        "window",
        "sliding_window",
        (
            "exactpack.core.permission:permitted",
            "exactpack.core.permission:dense_mask",
            "exactpack.core.batch:PackedBatch.dense_mask",
            "exactpack.core.batch:PackedBatch.key_spans",
            "exactpack.nn.attention:attention",
            "exactpack.nn.attention:AttentionLayout.key_bounds",
            "exactpack.nn.varlen:varlen_attention",
            "exactpack.nn.flex:flex_attention",
            "exactpack.nn.flash:flash_attention",
            "exactpack.nn.auto:auto_attention",
            "exactpack.nn.varlen:path_attention",
            "exactpack.hf.masks:additive_mask",
        ),
    ),
)
#: PackOptions fields renamed: the old keyword is no field, the new one is.
LANDED_FIELDS = {"capacity": "max_length", "split_long": "cut_long", "partition": "split"}

_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z]|\d|\b)|[A-Z]?[a-z]+|[A-Z]+|\d+")


def parts(name: str) -> list[str]:
    """``expected_split`` -> ``["expected", "split"]``; ``SplitMismatch`` ->
    ``["split", "mismatch"]``; ``--max-length`` -> ``["max", "length"]``."""
    out: list[str] = []
    for chunk in re.split(r"[_\-\s.]+", name.strip("-_`")):
        out += [p.lower() for p in _CAMEL.findall(chunk)]
    return out


def glossary() -> list[tuple[str, list[str]]]:
    """(term, retired words) per row of the glossary table."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Glossary", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("term", "") or set(cells[0]) <= {"-"}:
            continue
        term = re.findall(r"`([^`]+)`", cells[0])
        assert len(term) == 1, f"a glossary row names one term in backticks: {line}"
        rows.append((term[0], re.findall(r"`([^`]+)`", cells[2])))
    return rows


def test_the_glossary_has_the_terms_of_issue_20():
    terms = {t for t, _ in glossary()}
    need = {
        "row",
        "cell",
        "example",
        "span",
        "segment",
        "lookahead",
        "sliding_window",
        "Split",
        "data_digest",
        "max_length",
        "integrity",
        "verify",
        "layout",
        "kernels",
        "engine",
        "cut_long",
        "shard",
        "manifest",
        "binding",
        "policy",
    }
    assert need <= terms, sorted(need - terms)
    assert 15 <= len(terms) <= 25


def _contains(name_parts: list[str], word: list[str]) -> bool:
    n = len(word)
    return any(name_parts[i : i + n] == word for i in range(len(name_parts) - n + 1))


def _without_terms(name_parts: list[str], terms: list[list[str]]) -> list[str]:
    """``name_parts`` with every multi-part term in it blanked (``sliding_window``)."""
    out = list(name_parts)
    for term in terms:
        n = len(term)
        if n < 2:
            continue
        for i in range(len(out) - n + 1):
            if out[i : i + n] == term:
                out[i : i + n] = [""] * n
    return out


def public_names() -> dict[str, str]:
    """Every public name -> where it is."""
    names: dict[str, str] = {}
    for package in PACKAGES:
        module = importlib.import_module(package)
        for name in getattr(module, "__all__", ()):
            names.setdefault(name, f"{package}.__all__")
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        if any(p.startswith("_") and p != "__init__" for p in rel.parts):
            continue
        for node in ast.parse(path.read_text()).body:
            is_def = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            if is_def and not node.name.startswith("_"):
                names.setdefault(node.name, ".".join(rel.parts))
    names.update({flag: f"exactpack {cmd}" for cmd, flag in cli_flags()})
    return names


def cli_flags() -> list[tuple[str, str]]:
    """(command, flag) of every ``exactpack`` flag, hidden ones included."""
    from exactpack.cli import build_parser

    out = []
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            for cmd, sub in action.choices.items():
                for act in sub._actions:
                    out += [(cmd, o) for o in act.option_strings if o.startswith("--")]
    return out


def test_landed_renames_stay_landed(capsys):
    """An old spelling of ``LANDED`` is no public name, field or flag, hidden or not; an old
    field is refused as an unknown option and an old flag as an unknown argument."""
    import dataclasses

    from exactpack import InvalidInput
    from exactpack.cli import main
    from exactpack.pipeline.options import PackOptions

    names = public_names()
    assert not sorted(set(LANDED) & set(names)), "a renamed public name came back"
    assert set(LANDED.values()) <= set(names)
    fields = {f.name for f in dataclasses.fields(PackOptions)}
    assert not set(LANDED_FIELDS) & fields and set(LANDED_FIELDS.values()) <= fields
    for old in LANDED_FIELDS:
        with pytest.raises(InvalidInput, match=f"unknown packing option.*{old}"):
            PackOptions.of(max_length=8, **{old: 8})
    flags = {flag for _, flag in cli_flags()}
    assert not {k for k in LANDED if k[:2] == "--"} & flags
    assert main(["pack", "x.jsonl", "--max-length", "8", "--capacity", "8", "--out", "o"]) == 2
    assert "unrecognized arguments: --capacity 8" in capsys.readouterr().err


def test_no_public_name_uses_a_retired_word():
    rows = glossary()
    term_parts = [parts(t) for t, _ in rows]
    retired = {
        word
        for _, nots in rows
        for word in nots
        if parts(word) not in term_parts  # verify, engine: terms of their own
    }
    bad = []
    for name, where in sorted(public_names().items()):
        if name in ALLOWED:
            continue
        name_parts = _without_terms(parts(name), term_parts)
        hits = [w for w in sorted(retired) if _contains(name_parts, parts(w))]
        if hits:
            bad.append(f"{name} ({where}) uses {', '.join(hits)}")
    assert not bad, "retired words in public names (rename, or list in ALLOWED):\n" + "\n".join(bad)


def test_every_allowed_name_still_exists():
    """An ALLOWED entry goes when its rename lands (so the list cannot rot)."""
    names = public_names()
    assert not sorted(set(ALLOWED) - set(names))


@pytest.mark.parametrize(
    ("module", "old", "new"),
    [
        ("exactpack", "Partition", "Split"),
        ("exactpack", "PartitionMismatch", "SplitMismatch"),
        ("exactpack", "split_digest", "data_digest"),
        ("exactpack", "split_long", "cut_long"),
        ("exactpack.core.binding", "Partition", "Split"),
        ("exactpack.core.binding", "split_digest", "data_digest"),
        ("exactpack.core.errors", "PartitionMismatch", "SplitMismatch"),
        ("exactpack.core.examples", "split_long", "cut_long"),
        ("exactpack.core.stream_packer", "DEFAULT_WINDOW", "DEFAULT_LOOKAHEAD"),
        ("exactpack.core.permission", "check_window", "check_sliding_window"),
        ("exactpack.core.errors", "check_tree_capacity", "check_max_length"),
        ("exactpack.verify.fixture", "FIXTURE_CAPACITY", "FIXTURE_MAX_LENGTH"),
        ("exactpack.training.packed_data", "PackedDataset", "PackedBatches"),
        ("exactpack.training.labels", "hf_labels", "shift_labels"),
    ],
)
def test_old_names_are_gone(module, old, new):
    mod = importlib.import_module(module)
    assert not hasattr(mod, old)
    assert getattr(mod, new) is not None


def test_old_keywords_are_refused(tmp_path):
    from exactpack.io.store import load_packed

    for old in ("verify", "expected_partition"):
        value = "train" if old == "expected_partition" else True
        with pytest.raises(TypeError, match=old):
            load_packed(tmp_path, **{old: value})


def test_landed_keywords_stay_landed():
    """A renamed keyword is no parameter again."""
    import inspect

    for old, new, functions in LANDED_KEYWORDS:
        for where in functions:
            module, qualname = where.split(":")
            fn = importlib.import_module(module)
            for part in qualname.split("."):
                fn = getattr(fn, part)
            params = inspect.signature(fn).parameters
            assert new in params and old not in params, where


#: What a user calls with keywords: none takes a retired word as a parameter (the packer's
#: own ``capacity`` and the batches' on-disk ``partition`` stay inside the library).
USER_CALLS = (
    "exactpack.hf.collator:hf_collator",
    "exactpack.hf.adapter:hf_inputs",
    "exactpack.hf.datasets_io:pack_dataset",
    "exactpack.verify.models:verify_hf",
    "exactpack.pipeline.local:pack_path",
    "exactpack.pipeline.local:pack_table",
    "exactpack.pipeline.stats:stats_path",
    "exactpack.pipeline.stats:plot_stats",
    "exactpack.training.stream:StreamDataset",
    "exactpack.training.packed_data:PackedBatches",
    "exactpack.io.store:load_packed",
    "exactpack.core.tree:pack_tree",
)
RETIRED_KEYWORDS = {"capacity", "partition", "expected_partition", "split_long", "verify",
                    "window", "engine", "tree_window"}  # fmt: skip


@pytest.mark.parametrize("where", USER_CALLS)
def test_no_user_facing_call_takes_a_retired_keyword(where):
    import inspect

    module, qualname = where.split(":")
    fn = getattr(importlib.import_module(module), qualname)
    params = set(inspect.signature(fn).parameters)
    assert not params & RETIRED_KEYWORDS, (where, sorted(params & RETIRED_KEYWORDS))
