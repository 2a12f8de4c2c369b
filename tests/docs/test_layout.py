"""The house rules of the source tree (issue 11), checked on every run.

- the layer contract in ``pyproject.toml`` holds (``lint-imports``, import-linter);
- ``import exactpack`` loads none of the heavy dependencies;
- no module imports a private name of another package (its own package's it may);
- the public packages export at most 100 names in all (the rest stay in their modules);
- no two modules share a base name, no function over 80 lines;
- no public name of a package is shadowed by a submodule of the same name;
- every packing option is declared once, in ``PackOptions`` (and ``RayOptions``);
- the old name appears nowhere, nothing is deprecated before a release;
- every planted mutant (``tests/mutants/*.patch``) still applies to ``src/``;
- every test has a time limit (pytest-timeout), so a hung wait fails one test, not the run.
"""

import ast
import dataclasses
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "exactpack"
HEAVY = ("torch", "pyarrow", "transformers", "datasets", "ray", "matplotlib", "tokenizers", "tqdm")
MAX_FUNCTION_LINES = 80


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


def test_import_exactpack_loads_no_heavy_dependency():
    code = (
        "import sys, exactpack\n"
        "from exactpack.verify.fixture import fixture_batch\n"
        "from exactpack.verify.trace import demo_trace\n"
        "fixture_batch(); demo_trace(model=False)\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout


def test_the_core_runs_with_torch_missing():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import exactpack, exactpack.io.tokenizers\n"
        "from exactpack.verify.trace import demo_trace\n"
        "trace = demo_trace()\n"
        "assert 'skipped' in trace['model'], trace['model']\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_no_module_imports_a_private_name_of_another_package():
    """A ``_private`` name is shared inside its subpackage (``exactpack.hf.*``), never across."""
    offences = []
    for path, tree in _modules():
        own = ("exactpack", path.relative_to(SRC).with_suffix("").parts[0])
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("exactpack"):
                theirs = tuple(node.module.split(".")[:2])
                for alias in node.names:
                    if alias.name.startswith("_") and theirs != own:
                        offences.append(f"{path.relative_to(ROOT)}: {node.module}.{alias.name}")
    assert offences == []


def test_module_base_names_are_distinct():
    homes: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        if path.stem not in ("__init__", "__main__"):
            homes.setdefault(path.stem, []).append(str(path.relative_to(SRC)))
    assert {name: paths for name, paths in homes.items() if len(paths) > 1} == {}


#: The packages whose names users import.
PUBLIC_PACKAGES = (
    "exactpack",
    "exactpack.hf",
    "exactpack.io",
    "exactpack.nn",
    "exactpack.pipeline",
    "exactpack.ray",
    "exactpack.training",
    "exactpack.verify",
)


def test_no_public_name_is_shadowed_by_a_submodule():
    """Importing a submodule sets it on its package, replacing an exported name it shares:
    ``from exactpack.hf import capability`` once gave the module, not the function."""
    code = (
        "import importlib, pkgutil, sys, types, exactpack\n"
        "for m in pkgutil.walk_packages(exactpack.__path__, 'exactpack.'):\n"
        "    if not m.name.endswith('__main__'):\n"
        "        importlib.import_module(m.name)\n"
        f"for name in {PUBLIC_PACKAGES!r}:\n"
        "    package = sys.modules[name]\n"
        "    lazy = '__getattr__' in vars(package)\n"
        "    exported = getattr(package, '__all__', None) or (dir(package) if lazy else [])\n"
        "    assert exported, name\n"
        "    for public in exported:\n"
        "        value = getattr(package, public)\n"
        "        if isinstance(value, types.ModuleType):\n"
        "            print(f'{name}.{public} is the module {value.__name__}')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "", proc.stdout


#: The most names the public packages export in all (issue 34): what a user needs; the
#: rest stay in their modules (``from exactpack.core.plan import Plan``).
MAX_PUBLIC_NAMES = 100


def test_the_public_surface_stays_small():
    import importlib

    exported = {}
    for name in PUBLIC_PACKAGES:
        package = importlib.import_module(name)
        exported[name] = getattr(package, "__all__", None) or dir(package)
    assert sum(map(len, exported.values())) <= MAX_PUBLIC_NAMES, exported


def test_functions_stay_small():
    long_functions = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = node.end_lineno - node.lineno + 1
                if size > MAX_FUNCTION_LINES:
                    long_functions.append(f"{path.relative_to(ROOT)}:{node.name} {size} lines")
    assert long_functions == []


def _option_fields():
    from exactpack.pipeline.options import PackOptions
    from exactpack.ray.ray_options import RayOptions

    return {f.name for cls in (PackOptions, RayOptions) for f in dataclasses.fields(cls)}


def test_entry_points_declare_no_packing_option_of_their_own():
    from exactpack.hf.datasets_io import pack_dataset
    from exactpack.pipeline.local import pack_path
    from exactpack.pipeline.stats import stats_path
    from exactpack.ray.driver import pack

    fields = _option_fields()
    for fn in (pack_path, stats_path, pack, pack_dataset):
        params = inspect.signature(fn).parameters.values()
        redeclared = [p.name for p in params if p.name in fields and p.default is not None]
        assert redeclared == [], (fn.__qualname__, redeclared)


def test_every_option_flag_reaches_the_command_line():
    from exactpack.cli import build_parser
    from exactpack.cli.flags import cli_flags

    sub = build_parser()._subparsers._group_actions[0].choices
    for command in ("pack", "stats"):
        flags = {s for a in sub[command]._actions for s in a.option_strings}
        assert set(cli_flags(command)) <= flags, command
    assert {"--block-examples", "--ray-address", "--ray-num-cpus"} <= {
        s for a in sub["pack"]._actions for s in a.option_strings
    }


def _text_files(*roots: Path):
    for root in roots:
        paths = [root] if root.is_file() else sorted(root.rglob("*"))
        for path in paths:
            if path.is_file() and path.suffix in (".py", ".md", ".c", ".toml", ".txt", ".sh"):
                yield path


#: The name of another package on the index (not ours; see CHANGELOG.md): ours is exactpack.
OLD_NAME = "seq" + "pack"


def test_no_file_of_the_product_spells_the_old_name():
    hits = [
        f"{path.relative_to(ROOT)}:{i}"
        for path in _text_files(SRC, ROOT / "docs", ROOT / "README.md", ROOT / "pyproject.toml")
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if OLD_NAME in line.lower()
    ]
    assert hits == []


def test_the_command_line_never_prints_the_old_name():
    """Every command's --help, and a refusal, in a fresh process."""
    outputs = []
    for args in (["--help"], ["--version"], ["bogus"]):
        proc = subprocess.run(
            [sys.executable, "-m", "exactpack", *args], capture_output=True, text=True
        )
        outputs.append(proc.stdout + proc.stderr)
    from exactpack.cli import build_parser

    sub = build_parser()._subparsers._group_actions[0].choices
    outputs += [parser.format_help() for parser in sub.values()]
    assert len(outputs) > 5 and not [o for o in outputs if OLD_NAME in o.lower()]


def test_nothing_is_deprecated_before_a_release():
    """No release exists (docs/architecture.md, "Deprecation once released"): a rename is a
    rename, so src/ holds no DeprecationWarning, no alias finder and no renamed keyword."""
    import exactpack

    releases = re.findall(r"^## \[(.+?)\]", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert releases and all(r == "Unreleased" for r in releases), releases
    assert exactpack.__version__.startswith("0.")
    hits = [
        str(path.relative_to(ROOT))
        for path in _text_files(SRC)
        if re.search(r"DeprecationWarning|_compat|_renames|renamed_kwargs", path.read_text())
    ]
    assert hits == []


def test_the_old_module_paths_are_gone():
    code = (
        "import importlib, sys\n"
        "for old in ('exactpack.store', 'exactpack.batch', 'exactpack.training.hf',"
        " 'exactpack.core.trie', 'exactpack.hf.preflight'):\n"
        "    try:\n"
        "        importlib.import_module(old)\n"
        "    except ModuleNotFoundError:\n"
        "        continue\n"
        "    sys.exit(old + ' imports')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr + proc.stdout


@pytest.mark.parametrize("patch", sorted((ROOT / "tests" / "mutants").glob("*.patch")), ids=str)
def test_every_planted_mutant_still_applies(patch):
    # a patch whose lines left src/ plants nothing: scripts/mutation_planted.py would
    # report no killer for a bug that is not there
    target, hunks = None, []
    for line in patch.read_text().splitlines():
        if line.startswith("--- a/"):
            target = ROOT / line[len("--- a/") :]
        elif line.startswith("@@"):
            hunks.append([])
        elif hunks and line[:1] in (" ", "-"):
            hunks[-1].append(line[1:])
        elif hunks and line == "":
            hunks[-1].append("")
    assert target is not None and hunks, f"{patch.name} changes nothing"
    text = target.read_text()
    for old in hunks:
        assert "\n".join(old) in text, f"{patch.name} no longer applies to {target.name}"


#: The longest any one test may run, in seconds (the default and every marked exception).
MAX_TEST_SECONDS = 600


def test_every_test_has_a_time_limit(request):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    default = project["tool"]["pytest"]["ini_options"].get("timeout")
    assert isinstance(default, int) and 0 < default <= MAX_TEST_SECONDS, (
        "set timeout = 300 in [tool.pytest.ini_options] (pytest-timeout)"
    )
    assert any(
        r.startswith("pytest-timeout") for r in project["project"]["optional-dependencies"]["dev"]
    )
    lock = (ROOT / "requirements" / "lock.txt").read_text()
    assert re.search(r"^pytest-timeout==[0-9.]+$", lock, re.MULTILINE), "pin it in lock.txt"
    assert request.config.pluginmanager.hasplugin("timeout"), "pytest-timeout is not installed"
    assert float(request.config.getini("timeout")) == default
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        for seconds in re.findall(r"mark\.timeout\(([^)]*)\)", path.read_text()):
            assert 0 < float(seconds) <= MAX_TEST_SECONDS, f"{path.name}: timeout({seconds})"
