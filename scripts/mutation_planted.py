"""Planted mutants: small realistic bugs, applied one at a time, and the tests that catch each.

Usage (through ``scripts/mutation.sh planted``)::

    python scripts/mutation_planted.py [NAME ...]       # every tests/mutants/*.patch, or some
    python scripts/mutation_planted.py --report         # the tables of the last results
    PLANTED_BASELINE=1 ...                              # also run each selection unmutated
    PLANTED_TESTS="tests/unit/test_store.py" ...        # override every patch's selection
    PLANTED_WORK=.cache/planted-2 ...                   # a second run beside the first

Each ``tests/mutants/NAME.patch`` is a unified diff against ``src/`` headed by
``# key: value`` lines: ``about`` (the bug in words), ``class`` (what kind of bug)
and ``tests`` (the test files to run; absent: every test file but the slow ones in
:data:`SLOW`). For each mutant a fresh scratch copy of the project is made at
``.cache/planted/work/`` (never the worktree), the patch applied there with
``git apply``, and pytest run on the selection with ``PYTHONPATH`` at the copy's
``src/`` (subprocesses inherit it) and the derandomized ``mutation`` hypothesis
profile. The copy keeps one path and the sources' modification times, and the
built C kernels (``exactpack/core/native*.so``), so a patch to a Python kernel runs
only where the tests ask for the python kernels.
A test *kills* the mutant when it fails or errors; killers are counted per test
function (parametrized cases together). ``.cache/planted/results.json`` keeps every
result and the Markdown table (docs/testing.md) is printed; a mutant with fewer than
:data:`FEW` killers is flagged.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = ROOT / "tests" / "mutants"
#: Scratch copy and results; ``PLANTED_WORK`` gives a second run its own.
WORK = Path(os.environ.get("PLANTED_WORK", ROOT / ".cache" / "planted"))
COPIED = ("src", "tests", "docs", "examples", "README.md", "pyproject.toml")
#: Left out of the default selection: minutes per run (the suite's slowest files).
SLOW = ("test_ray.py", "test_ray_cluster.py", "test_architectures.py", "test_stress.py",
        "test_hostile.py", "test_trl_train.py", "test_races.py")  # fmt: skip
#: Fewer killers than this and the mutant is flagged: one test is one refactor from none.
FEW = 3
#: Killers in these files need trl or Ray (skipped where those are missing).
NEEDS_TRL_OR_RAY = re.compile(r"test_(ray|trl|sft_columns|peer_collators)")
TIMEOUT = int(os.environ.get("PLANTED_TIMEOUT", "1800"))


def header(patch: Path) -> dict[str, str]:
    """The ``# key: value`` lines before the diff."""
    out = {}
    for line in patch.read_text().splitlines():
        match = re.match(r"# (\w+): (.*)", line)
        if not match:
            break
        out[match[1]] = match[2].strip()
    return out


def selection(head: dict[str, str]) -> list[str]:
    if os.environ.get("PLANTED_TESTS"):
        return os.environ["PLANTED_TESTS"].split()
    if "tests" in head:
        return head["tests"].split()
    files = sorted((ROOT / "tests").glob("*/test_*.py"))
    return [str(p.relative_to(ROOT)) for p in files if p.name not in SLOW]


def scratch() -> Path:
    """A fresh copy of the project for one mutant, always at the same path."""
    work = WORK / "work"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis")
    for rel in COPIED:
        src = ROOT / rel
        if src.is_dir():
            shutil.copytree(src, work / rel, ignore=ignore)
        elif src.exists():
            shutil.copy2(src, work / rel)
    return work


def run_tests(work: Path, tests: list[str], junit: Path) -> tuple[dict[str, str], float, str]:
    """``({node id: outcome}, seconds, tail of the output)`` of pytest on ``tests`` in ``work``."""
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(work / "src"),
        HYPOTHESIS_PROFILE="mutation",
        MPLCONFIGDIR=str(WORK / "matplotlib"),
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
    )
    env.pop("CI", None)  # a user's run: a missing optional dependency skips, it is no kill
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
           "-o", "addopts=", *tests]  # fmt: skip
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT)  # fmt: skip
        tail = (proc.stdout + proc.stderr)[-2000:]
    except subprocess.TimeoutExpired:
        tail = f"timed out after {TIMEOUT} s"
    seconds = time.monotonic() - start
    outcomes: dict[str, str] = {}
    if junit.exists():
        for case in ET.parse(junit).getroot().iter("testcase"):
            node = case.get("classname", "").replace(".", "/") + ".py::" + case.get("name", "")
            kinds = {child.tag for child in case}
            outcome = "failed" if kinds & {"failure", "error"} else "passed"
            outcomes[node] = "skipped" if "skipped" in kinds else outcome
    return outcomes, seconds, tail


def function_of(node: str) -> str:
    return node.split("[", 1)[0]


def plant(patch: Path) -> dict:
    name = patch.stem
    head = header(patch)
    tests = selection(head)
    work = scratch()
    out = WORK / name
    out.mkdir(parents=True, exist_ok=True)
    result = {"name": name, "about": head.get("about", ""), "class": head.get("class", ""),
              "tests": tests}  # fmt: skip
    if os.environ.get("PLANTED_BASELINE") == "1":
        base, _, _ = run_tests(work, tests, out / "junit-baseline.xml")
        result["baseline_failures"] = sorted(n for n, o in base.items() if o == "failed")
    # The copy may lie inside a git worktree (the default .cache/planted/ does): stop git
    # from finding it, or ``git apply`` skips every path outside the copy and plants nothing.
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(work.parent))
    applied = subprocess.run(["git", "apply", "--verbose", str(patch)], cwd=work, env=env,
                             capture_output=True, text=True)  # fmt: skip
    if applied.returncode != 0 or "Skipped patch" in applied.stderr:
        result["error"] = "patch does not apply: " + applied.stderr.strip()[-500:]
        return result
    outcomes, seconds, tail = run_tests(work, tests, out / "junit-mutant.xml")
    known = set(result.get("baseline_failures", []))
    killed = sorted(n for n, o in outcomes.items() if o == "failed" and n not in known)
    functions = sorted({function_of(n) for n in killed})
    result.update(
        seconds=round(seconds, 1),
        ran=sum(o != "skipped" for o in outcomes.values()),
        skipped=sum(o == "skipped" for o in outcomes.values()),
        killed_cases=killed,
        killers=functions,
        without_trl_or_ray=[f for f in functions if not NEEDS_TRL_OR_RAY.search(f)],
        few=len(functions) < FEW,
    )
    if not outcomes:
        result["error"] = "no test results: " + tail
    return result


def table(results: list[dict]) -> str:
    lines = [
        "| mutant | class | killers (functions) | without trl/Ray | cases failed | ran | flag |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| `{r['name']}` | {r['class']} | — | — | — | — | {r['error'][:80]} |")
            continue
        flag = f"**< {FEW} killers**" if r["few"] else ""
        lines.append(
            f"| `{r['name']}` | {r['class']} | {len(r['killers'])} |"
            f" {len(r['without_trl_or_ray'])} | {len(r['killed_cases'])} | {r['ran']} | {flag} |"
        )
    return "\n".join(lines)


def killers_list(results: list[dict]) -> str:
    """Per mutant: what it does and every test function that killed it."""
    lines = []
    for r in results:
        names = ", ".join(f"`{k.removeprefix('tests/')}`" for k in r.get("killers", []))
        lines.append(f"- `{r['name']}` ({r['about']}): {names or '**none**'}")
    return "\n".join(lines)


def main(names: list[str]) -> int:
    if names == ["--report"]:
        saved = json.loads((WORK / "results.json").read_text())
        results = [saved[k] for k in sorted(saved)]
        print(table(results) + "\n\n" + killers_list(results))
        return 0
    patches = sorted(MUTANTS.glob("*.patch"))
    if names:  # in the order given
        by_name = {p.stem: p for p in patches}
        patches = [by_name[n] for n in names if n in by_name]
        missing = set(names) - set(by_name)
        if missing:
            print(f"no such planted mutant: {', '.join(sorted(missing))}", file=sys.stderr)
            return 2
    WORK.mkdir(parents=True, exist_ok=True)
    store = WORK / "results.json"
    saved = json.loads(store.read_text()) if store.exists() else {}
    for patch in patches:
        print(f"== {patch.stem}", flush=True)
        result = plant(patch)
        saved[patch.stem] = result
        store.write_text(json.dumps(saved, indent=1))
        print(f"   killers: {len(result.get('killers', []))} {result.get('error', '')}", flush=True)
    print(table([saved[k] for k in sorted(saved)]))
    return 1 if any(r.get("few") or "error" in r for r in saved.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
