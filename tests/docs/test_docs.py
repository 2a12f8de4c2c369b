"""Every ``python`` and ``bash`` block of README.md and docs/*.md runs, so the docs cannot rot.

One test per page. A page's blocks run in order in a fresh temporary folder
(the working directory), as a user at the repository root would type them:
the folder holds links to the repository's ``.venv`` (this interpreter's
environment), ``examples/``, ``benchmarks/`` and ``tests/data/``, so
``.venv/bin/python examples/train_tiny.py`` and
``exactpack verify --hf-config tests/data/tiny_llama.json`` work as written.

- ``python`` blocks share one namespace per page and run in this process
  (imports are paid once), with the page and line in every traceback;
- ``bash`` blocks run with ``bash -euo pipefail`` and the environment's
  ``bin/`` first on ``PATH`` (so ``exactpack ...`` and ``python`` are ours);
- a block preceded by ``<!-- docs-test: skip (reason) -->`` is not run. The
  reason is required; each skipped block is reported as a
  :class:`DocsBlockSkipped` warning (the warnings summary lists them).

Any other fenced block must say what it is (``text``, ``json``, ``toml``), so a
shell or Python example cannot slip past the test with a bare fence.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN = {"python", "bash"}
INERT = {"text", "json", "toml"}
SKIP = re.compile(r"<!--\s*docs-test:\s*skip\s*(?:\((?P<reason>[^)]*)\))?\s*-->")
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[^`\s]*)\s*$")
#: Repository folders a block may use as if the working directory were the root.
LINKED = ("examples", "benchmarks", "tests/data")
BASH_TIMEOUT_S = 180


class DocsBlockSkipped(UserWarning):
    """A docs block marked ``docs-test: skip (reason)``: named so the run lists it."""


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    skip: str | None  # the skip reason, None when the block runs

    @property
    def where(self) -> str:
        first = next((s.strip() for s in self.code.splitlines() if s.strip()), "")
        return f"{self.page}:{self.line} ({self.lang}, `{first[:80]}`)"


def blocks_of(path: Path, page: str | None = None) -> list[Block]:
    """The fenced blocks of one Markdown page (named ``page`` in messages), with skip markers."""
    page = page or str(path.relative_to(ROOT))
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang, indent = i, m["lang"], len(m["indent"])
        if not lang:
            raise AssertionError(f"{page}:{i + 1}: a fence needs a language (python/bash/text)")
        i += 1
        body = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        if i == len(lines):
            raise AssertionError(f"{page}:{start + 1}: the ```{lang} block is never closed")
        i += 1
        marker = _marker_before(lines, start)
        if marker is not None:
            reason = (marker["reason"] or "").strip()
            if not reason:
                raise AssertionError(f"{page}:{start}: a docs-test skip needs a (reason)")
            if lang not in RUN:
                raise AssertionError(f"{page}:{start}: skip marker before a ```{lang} block")
        skip = (marker["reason"] or "").strip() if marker is not None else None
        out.append(Block(page, start + 1, lang, "\n".join(body) + "\n", skip))
    return out


def _marker_before(lines: list[str], fence: int):
    """The skip marker on the last non-blank line before ``fence``, if any."""
    j = fence - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    return SKIP.fullmatch(lines[j].strip()) if j >= 0 else None


def _workdir(tmp: Path) -> None:
    """Link what a block may use from the repository into its working folder."""
    (tmp / ".venv").symlink_to(Path(sys.prefix))
    for rel in LINKED:
        target = tmp / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(ROOT / rel)


def _environment(tmp: Path) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return os.environ | {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "HF_HUB_OFFLINE": "1",
        "MPLCONFIGDIR": str(tmp / ".cache" / "matplotlib"),
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "OMP_NUM_THREADS": "1",
    }


def _run_python(block: Block, namespace: dict) -> None:
    name = f"{block.page}:{block.line}"
    code = compile(block.code, name, "exec")
    try:
        exec(code, namespace)
    except Exception as err:
        frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == name]
        at = ""
        if frames:
            lineno = frames[-1].lineno or 0
            source = block.code.splitlines()[lineno - 1].strip() if lineno else ""
            at = f"\n  at {block.page}:{block.line + lineno}: {source}"
        raise AssertionError(f"{block.where} failed: {type(err).__name__}: {err}{at}") from err


def _run_bash(block: Block, tmp: Path, env: dict[str, str]) -> None:
    try:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block.code],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
            timeout=BASH_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{block.where} ran past {BASH_TIMEOUT_S} s") from None
    if done.returncode != 0:
        raise AssertionError(
            f"{block.where} exited {done.returncode}\n"
            f"--- stdout (tail)\n{done.stdout[-3000:]}\n--- stderr (tail)\n{done.stderr[-3000:]}"
        )


def test_every_page_is_collected():
    names = {p.name for p in PAGES}
    assert "README.md" in names and len(PAGES) > 1, names


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_page_blocks_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Run ``page``'s python and bash blocks in order in a fresh folder."""
    blocks = [b for b in blocks_of(page) if b.lang in RUN]
    _workdir(tmp_path)
    env = _environment(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    namespace: dict = {"__name__": "__docs__"}
    # One torch thread: the examples are tiny, and on a shared 2-core machine a second
    # intra-op thread only spins (a training example took 10x longer under load).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for block in blocks:
            if block.skip is not None:
                warnings.warn(f"{block.where} not run: {block.skip}", DocsBlockSkipped, 1)
            elif block.lang == "python":
                _run_python(block, namespace)
            else:
                _run_bash(block, tmp_path, env)
    finally:
        torch.set_num_threads(threads)


def test_blocks_parse_skip_markers(tmp_path: Path):
    """The extractor: languages, skip reasons, indented fences; a reason-less skip is refused."""
    page = tmp_path / "page.md"
    page.write_text(
        "intro\n\n```python\nx = 1\n```\n\n<!-- docs-test: skip (needs a GPU) -->\n"
        "```bash\nnvidia-smi\n```\n\n- item\n\n  ```text\n  a table\n  ```\n",
        encoding="utf-8",
    )
    found = blocks_of(page, "page.md")
    assert [(b.lang, b.line, b.skip) for b in found] == [
        ("python", 3, None),
        ("bash", 8, "needs a GPU"),
        ("text", 14, None),
    ]
    assert found[2].code == "a table\n"
    assert found[1].where == "page.md:8 (bash, `nvidia-smi`)"
    page.write_text("<!-- docs-test: skip -->\n```bash\nls\n```\n", encoding="utf-8")
    with pytest.raises(AssertionError, match="needs a \\(reason\\)"):
        blocks_of(page, "page.md")
    page.write_text("```\nbare\n```\n", encoding="utf-8")
    with pytest.raises(AssertionError, match="needs a language"):
        blocks_of(page, "page.md")


LINK = re.compile(r"\[[^\]]*\]\((?P<target>[^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    fenced, out = False, set()
    for line in lines:
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            out.add(_anchor(line.lstrip("#")))
    return out


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_page_links_resolve(page: Path):
    """Every relative link names a file that exists and, with ``#anchor``, a heading in it."""
    broken = []
    for m in LINK.finditer(page.read_text(encoding="utf-8")):
        target = m["target"]
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked here
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{target}: no heading with that anchor in {path.name}")
    assert broken == [], f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_anchor_rule():
    assert _anchor(" Long sources: `--cut-long`") == "long-sources---cut-long"
    assert _anchor("Example: `examples/train_tiny.py`") == "example-examplestrain_tinypy"
