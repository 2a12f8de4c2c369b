"""The house rules of the source tree (issue 11), checked on every run.

- the layer contract in ``pyproject.toml`` holds (``lint-imports``, import-linter);
- ``import seqpack`` loads none of the heavy dependencies;
- no module imports another module's private name;
- no two modules share a base name, no function over 80 lines;
- no public name uses a word the glossary retired (``docs/architecture.md``);
- every packing option is declared once, in ``PackOptions`` (and ``RayOptions``);
- the 0.1 module paths still import, with a DeprecationWarning.
"""

import ast
import dataclasses
import inspect
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "seqpack"
HEAVY = ("torch", "pyarrow", "transformers", "datasets", "ray", "matplotlib", "tokenizers", "tqdm")
MAX_FUNCTION_LINES = 80
ARCHITECTURE = ROOT / "docs" / "architecture.md"
#: Used while ``docs/architecture.md`` has no ``## Glossary`` yet: words issue 20 retires
#: that no public name uses any more (a placed example is not a *document* or an
#: *ordinal*; *engine* meant both numba-vs-Python and local-vs-Ray).
RETIRED_WITHOUT_GLOSSARY = ("document", "ordinal", "engine")


def _modules():
    for path in sorted(SRC.rglob("*.py")):
        yield path, ast.parse(path.read_text(), filename=str(path))


def test_the_layer_contract_holds():
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run(
        [str(lint), "--no-cache", "--no-logo"], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout and "3 kept" in proc.stdout, proc.stdout


def test_import_seqpack_loads_no_heavy_dependency():
    code = (
        "import sys, seqpack\n"
        "from seqpack.verify.fixture import fixture_batch\n"
        "from seqpack.verify.trace import demo_trace\n"
        "fixture_batch(); demo_trace(model=False)\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout


def test_the_core_runs_with_torch_missing():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import seqpack, seqpack.io.tokenizers\n"
        "from seqpack.verify.trace import demo_trace\n"
        "trace = demo_trace()\n"
        "assert 'skipped' in trace['model'], trace['model']\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_no_module_imports_a_private_name_of_another():
    offences = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("seqpack"):
                for alias in node.names:
                    if alias.name.startswith("_") and alias.name != "_compat":
                        offences.append(f"{path.relative_to(ROOT)}: {node.module}.{alias.name}")
    assert offences == []


def test_module_base_names_are_distinct():
    homes: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        if path.stem not in ("__init__", "__main__"):
            homes.setdefault(path.stem, []).append(str(path.relative_to(SRC)))
    assert {name: paths for name, paths in homes.items() if len(paths) > 1} == {}


def test_functions_stay_small():
    long_functions = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = node.end_lineno - node.lineno + 1
                if size > MAX_FUNCTION_LINES:
                    long_functions.append(f"{path.relative_to(ROOT)}:{node.name} {size} lines")
    assert long_functions == []


def word_parts(name: str) -> list[str]:
    """The lower-case words of a snake_case or CamelCase name: ``SplitMismatch`` ->
    ``["partition", "mismatch"]``, ``read_HF_config`` -> ``["read", "hf", "config"]``."""
    pattern = r"[A-Z]+(?=[A-Z][a-z]|\d|$)|[A-Z]?[a-z]+|[A-Z]+|\d+"
    return [w.lower() for chunk in name.split("_") for w in re.findall(pattern, chunk)]


def public_names() -> dict[str, str]:
    """``{name: module path}`` of every ``__all__`` entry and public module-level def or
    class under ``src/seqpack`` (old names kept through a module ``__getattr__`` are not
    seen: they are the deprecated ones)."""
    names = {}
    for path, tree in _modules():
        where = str(path.relative_to(ROOT))
        for node in tree.body:
            defined = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            if defined and not node.name.startswith("_"):
                names.setdefault(node.name, where)
            targets = (
                node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            )
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                for elt in getattr(node.value, "elts", []):
                    if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                        names.setdefault(elt.value, where)
    return names


def glossary(text: str) -> tuple[list[str], list[str]] | None:
    """``(terms, retired words)`` of the table under ``## Glossary`` in ``text``, or None
    when there is no such heading. The first column holds the term in backticks; the
    column headed ``not`` lists the words it retires (backticked, or comma-separated)."""
    match = re.search(r"^## Glossary[^\n]*\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    if match is None:
        return None
    rows = [line.strip().strip("|").split("|") for line in match[1].splitlines()]
    rows = [[c.strip() for c in row] for row in rows if len(row) > 1]
    header, body = rows[0], [r for r in rows[2:] if len(r) == len(rows[0])]
    words = [(c.strip("`* ").lower().split() or [""])[0] for c in header]
    assert "not" in words, f"the glossary table has no 'not' column: {header}"
    column = words.index("not")
    terms = [w for row in body for w in re.findall(r"`([^`]+)`", row[0])]
    retired = []
    for row in body:
        cell = row[column]
        retired += re.findall(r"`([^`]+)`", cell) or [w for w in re.split(r"[,;]\s*", cell) if w]
    return terms, [w.strip() for w in retired if w.strip() not in ("", "-", "—")]


def names_using_retired_words(
    names: dict[str, str], retired: list[str], terms: tuple[str, ...] | list[str] = ()
) -> list[str]:
    """Each name one of whose word parts (or run of parts, for a retired ``pair_counts``)
    is a retired word, outside a glossary term: the term ``sliding_window`` does not read
    as the retired ``window``, but the term ``split`` does not excuse a retired ``split_id``."""

    def runs(parts, words):
        n = len(words)
        return [range(i, i + n) for i in range(len(parts) - n + 1) if parts[i : i + n] == words]

    offences = []
    for name, where in sorted(names.items()):
        parts = word_parts(name)
        inside = {k for t in terms for run in runs(parts, word_parts(t)) for k in run}
        used = [
            w
            for w in retired
            if word_parts(w) and any(not set(run) <= inside for run in runs(parts, word_parts(w)))
        ]
        if used:
            offences.append(f"{where}: {name} uses retired {', '.join(used)}")
    return offences


def test_word_parts_and_the_retired_word_check():
    assert word_parts("SplitMismatch") == ["partition", "mismatch"]
    assert word_parts("read_HFConfig") == ["read", "hf", "config"]
    names = {
        "sliding_window_mask": "a",
        "check_sliding_window": "b",
        "pair_counts_of": "c",
        "pairs": "d",
    }
    got = names_using_retired_words(names, ["window", "pair_counts"], ["sliding_window"])
    assert got == [
        "b: check_sliding_window uses retired window",
        "c: pair_counts_of uses retired pair_counts",
    ]
    table = "## Glossary\n\n| term | means | not |\n|---|---|---|\n| `split` | a | `partition` |\n"
    assert glossary(table + "\n## Next\n") == (["split"], ["partition"])
    other = "## Glossary\n| Term | Not (retired) |\n|--|--|\n| `span` | window, range |\n"
    assert glossary(other) == (["span"], ["window", "range"])
    assert glossary("# no glossary\n") is None


def test_no_public_name_uses_a_retired_word():
    """The vocabulary check: the glossary's retired words, or (before the glossary
    exists) :data:`RETIRED_WITHOUT_GLOSSARY`, in no public name of ``src/seqpack``."""
    found = glossary(ARCHITECTURE.read_text())
    terms, retired = found if found is not None else ([], list(RETIRED_WITHOUT_GLOSSARY))
    assert retired, "the glossary of docs/architecture.md retires no word"
    assert names_using_retired_words(public_names(), retired, terms) == []


def _option_fields():
    from seqpack.pipeline.options import PackOptions
    from seqpack.ray.ray_options import RayOptions

    return {f.name for cls in (PackOptions, RayOptions) for f in dataclasses.fields(cls)}


def test_entry_points_declare_no_packing_option_of_their_own():
    from seqpack.hf.datasets_io import pack_dataset
    from seqpack.pipeline.local import pack_path
    from seqpack.pipeline.stats import stats_path
    from seqpack.ray.driver import pack

    fields = _option_fields()
    for fn in (pack_path, stats_path, pack, pack_dataset):
        params = inspect.signature(fn).parameters.values()
        redeclared = [p.name for p in params if p.name in fields and p.default is not None]
        assert redeclared == [], (fn.__qualname__, redeclared)


def test_every_option_flag_reaches_the_command_line():
    from seqpack.cli import build_parser
    from seqpack.cli.flags import cli_flags

    sub = build_parser()._subparsers._group_actions[0].choices
    for command in ("pack", "stats"):
        flags = {s for a in sub[command]._actions for s in a.option_strings}
        assert set(cli_flags(command)) <= flags, command
    assert {"--block-examples", "--ray-address", "--ray-num-cpus"} <= {
        s for a in sub["pack"]._actions for s in a.option_strings
    }


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("seqpack.stream_packer", "seqpack.core.stream_packer"),
        ("seqpack.permission", "seqpack.core.permission"),
        ("seqpack.loss", "seqpack.core.loss"),
    ],
)
def test_old_module_paths_still_import_with_a_deprecation_warning(old, new):
    code = (
        "import importlib, warnings\n"
        "warnings.simplefilter('error', DeprecationWarning)\n"
        "import seqpack\n"
        f"new = importlib.import_module({new!r})\n"
        "try:\n"
        f"    importlib.import_module({old!r})\n"
        "except DeprecationWarning as w:\n"
        f"    assert {new!r} in str(w), w\n"
        "else:\n"
        "    raise SystemExit('no DeprecationWarning')\n"
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        f"assert importlib.import_module({old!r}) is new\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr + proc.stdout


def test_split_long_sources_still_works_with_a_deprecation_warning():
    from seqpack.pipeline.options import PackOptions

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        options = PackOptions.of(capacity=8, split_long_sources=True)
    assert options.split_long is True
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)


@pytest.mark.parametrize(
    ("old", "names"),
    [
        ("seqpack.batch", ["PackedBatch", "PackConfig", "materialize"]),
        ("seqpack.store", ["load_packed", "write_packed", "SCHEMA", "rows_to_arrow"]),
        ("seqpack.training.hf", ["hf_inputs", "HFCollator"]),
        ("seqpack.policies", ["plan_rows", "Plan", "positive_int"]),
    ],
)
def test_split_modules_keep_their_old_names(old, names):
    code = (
        "import importlib, warnings\n"
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        f"old = importlib.import_module({old!r})\n"
        "import seqpack.core.batch, seqpack.core.config, seqpack.io.store, seqpack.io.shards\n"
        "import seqpack.hf.adapter, seqpack.hf.collator, seqpack.core.plan, seqpack.core.checks\n"
        "import seqpack.core.policies, seqpack.core.compact\n"
        "homes = [seqpack.core.batch, seqpack.core.config, seqpack.io.store, seqpack.io.shards,\n"
        "         seqpack.hf.adapter, seqpack.hf.collator, seqpack.core.plan,\n"
        "         seqpack.core.checks, seqpack.core.policies, seqpack.core.compact]\n"
        f"for name in {names!r}:\n"
        "    assert any(getattr(h, name, None) is getattr(old, name) for h in homes), name\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr + proc.stdout
