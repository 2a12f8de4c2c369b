"""Rename the code to the glossary of docs/architecture.md (issue 20, "one word per concept").

Run from the repository root, as often as you like (a second run changes nothing)::

    python scripts/codemods/vocab.py          # rewrite in place, then ruff fix + format
    python scripts/codemods/vocab.py --check  # exit 1 and list the files it would change

It rewrites ``src/``, ``tests/``, ``docs/``, ``examples/``, ``benchmarks/``, ``scripts/``
and ``README.md``. Python is edited through its syntax tree (identifiers, parameters,
keywords, imports, exact string constants) so a word is renamed only where it is the
name in question; comments, docstrings and Markdown get word-bounded regular
expressions for the names that cannot mean anything else. The old public spellings keep
working for one release: the script writes a module ``__getattr__``
(:func:`seqpack._renames.renamed_names`) where a renamed public name is defined or
exported, and ``@renamed_kwargs(old="new")`` on the public functions whose keyword it
renamed. Not renamed here: the CLI flags and ``PackOptions`` fields (the CLI's own
rename), on-disk keys (manifests and saved states keep their format).
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOTS = ("src", "tests", "docs", "examples", "benchmarks", "scripts", "README.md")
SUFFIXES = (".py", ".md", ".patch", ".sh", ".toml")
#: Files that must keep the old words: this script, the glossary test, the shims, and
#: the design notes' history.
SKIP = ("scripts/codemods/", "docs/design-notes")  # path prefixes
SKIP_NAMES = ("test_glossary.py", "test_renamed_spellings.py", "_renames.py")  # wherever they move
MARK = "# vocab codemod: the 0.2 names, kept for one release"  # a block with its own import
SHORT = "# the 0.2 names (vocab codemod), kept for one release"  # one line, import at the top


# ---------------------------------------------------------------------------- the rules


@dataclass(frozen=True)
class Name:
    """A module-level name (class, function, constant) renamed wherever it is an identifier.

    ``prose``: also in comments, docstrings and Markdown (word-bounded; only for names
    that mean nothing else). ``contexts``: which identifier uses are renamed (``def``,
    ``name``, ``attr``, ``import``, ``param``, ``kwarg``, ``str`` -- an exact string
    constant -- or ``all``, a string of ``__all__`` only). ``only_if``: rename in a
    Python file only when it defines or imports the name from seqpack (for a common
    word such as ``Layout``). ``public``: the old name keeps working (a module
    ``__getattr__`` where the new one is defined or exported).
    """

    old: str
    new: str
    prose: bool = True
    contexts: tuple[str, ...] = ("def", "name", "attr", "import", "str", "param", "kwarg")
    only_if: bool = False
    public: bool = True
    calls_only: bool = False  # ``name`` / ``attr`` only where called: ``split_long(...)``
    #: module-level assignments whose strings stay (on-disk keys of a saved state)
    keep: tuple[str, ...] = ()


@dataclass(frozen=True)
class Keyword:
    """A parameter ``old`` of the functions ``functions`` (``name`` or ``Class.method``)
    renamed to ``new``: the parameter, its uses in the body, the keyword in every call of
    ``callees``; the public ones get ``@renamed_kwargs(old="new")``."""

    old: str
    new: str
    functions: tuple[str, ...]
    callees: tuple[str, ...]
    decorate: tuple[str, ...] = ()


@dataclass(frozen=True)
class Attr:
    """An attribute ``old`` renamed to ``new`` only on the objects whose source text is
    one of ``receivers`` (``opts.partition``, never ``batch.partition``)."""

    old: str
    new: str
    receivers: tuple[str, ...]


@dataclass(frozen=True)
class Text:
    """A regular expression for prose (comments, strings, Markdown) in files whose path
    matches ``files`` (a regular expression; default every file)."""

    pattern: str
    repl: str
    files: str = ""
    code: bool = False  # also in Python code (outside strings and comments)
    whole: bool = False  # over the whole Python source (a pattern spanning tokens)


NAMES = (
    # train / validation / test is a split (datasets' word); the data digest is not one.
    Name("PartitionMismatch", "SplitMismatch"),
    Name("Partition", "Split"),
    Name("expected_partition", "expected_split", public=False),
    Name("split_digest", "data_digest"),
    # cutting a long document into ranges says so (split means train/validation/test).
    Name(
        "split_long",
        "cut_long",
        prose=False,
        contexts=("def", "name", "attr", "import", "all"),
        calls_only=True,
    ),
    # ... and so does the option (PackOptions.cut_long, StreamDataset(cut_long=)); the
    # 0.2 keyword split_long= and flag --split-long still work (seqpack._renames).
    Name(
        "split_long",
        "cut_long",
        prose=False,
        contexts=("name", "attr", "param", "kwarg", "str"),
        public=False,
        keep=("_CONFIG",),  # StreamDataset's saved state keeps its key
    ),
    # one class is called Layout: AttentionLayout; the others say what they hold.
    Name("VerifyLayout", "VerifyCase", public=False),
    Name("ShardLayout", "ShardCuts", public=False),
    Name("TrieLayout", "TrieOrder", public=False),
    Name("Layout", "StoredColumns", prose=False, only_if=True, public=False),
    # window meant three things: the stream packer's look-ahead, the attention sliding
    # window, an example's span. The distinctive names here; the keywords ``window=`` of
    # StreamPacker (lookahead=) and of the attention functions (sliding_window=) below.
    Name("DEFAULT_WINDOW", "DEFAULT_LOOKAHEAD"),
    Name("STREAM_WINDOW_BYTES", "STREAM_LOOKAHEAD_BYTES", public=False),
    Name("check_window", "check_sliding_window"),
    Name("layer_window", "layer_sliding_window", public=False),
    Name("window_labels", "span_labels", public=False),
    # max_length: the row width in tokens wherever a user gives it (the packer's own
    # PackConfig.capacity keeps its name: cells, always equal)
    Name("FIXTURE_CAPACITY", "FIXTURE_MAX_LENGTH", prose=False, keep=("_MOVED",)),
    Name("check_tree_capacity", "check_max_length"),
    # --tree auto groups documents within fixed consecutive blocks: no look-ahead, no
    # window (the manifest's tree record keeps its key window)
    Name("tree_window", "tree_block", prose=False, public=False),
    # the rest of the retired words in public names
    Name("SplitDigest", "DataDigest", public=False),
    Name("check_partition", "check_split"),
    Name("Piece", "InputSlice", prose=False, public=False),  # rows [start, stop) of an input
    Name("read_piece", "read_slice", public=False),
)

#: The functions and methods whose ``window=`` is the attention sliding window.
_SLIDING = (
    # core: the permission predicate and its views
    "check_sliding_window",
    "permitted",
    "pairwise",
    "key_bounds",
    "allowed_key",
    "key_ranges",
    "dense_mask",
    "edges",
    "tiled_edges",
    "PackedBatch.allowed_key",
    "PackedBatch.key_ranges",
    "PackedBatch.dense_mask",
    "PackedBatch.edges",
    "TreeBatch.dense_mask",
    "TreeBatch.key_spans",
    # nn: the layout's views and the backends
    "AttentionLayout.key_bounds",
    "AttentionLayout.dense_mask",
    "AttentionLayout.range_mask",
    "ranges_attention",
    "dense_attention",
    "attention",
    "auto_attention",
    "permission_mod",
    "flex_block_mask",
    "flex_attention",
    "band_mask",
    "grouped_attention",
    "segment_attention",
    "varlen_attention",
    "flash_kernel.flash_attn_kernel",
    "flash_kernel.torch_kernel",
    "flash_attention",
    "tree_attention",
    "tree_flash_attention",
    "tree_mask_mod",
    # hf: the masks seqpack builds for transformers
    "hf_allowed",
    "bool_mask",
    "additive_mask",
    "block_mask",
)
_CLASSES = ("PackedBatch", "TreeBatch", "AttentionLayout")

KEYWORDS = (
    # verify is numerical equivalence (seqpack verify); checksums are integrity.
    Keyword(
        "verify",
        "integrity",
        # PackedBatches: the read path's name for the dataset of model calls
        functions=("load_packed", "load_trl", "PackedDataset.__init__", "PackedBatches.__init__"),
        callees=("load_packed", "load_trl", "PackedDataset", "PackedBatches"),
        decorate=("load_packed", "load_trl", "PackedDataset.__init__", "PackedBatches.__init__"),
    ),
    Keyword(
        "split_long",
        "cut_long",
        functions=(),
        callees=(),
        decorate=("StreamDataset.__init__",),
    ),
    Keyword(  # PackOptions(split=) and the entry points that take its fields as keywords
        "partition",
        "split",
        functions=(),
        callees=("PackOptions", "of", "pack_path", "stats_path", "pack_dataset", "_pack"),
    ),
    Keyword(  # the stream packer's look-ahead (an attention window is sliding_window)
        "window",
        "lookahead",
        functions=(
            "StreamPacker.__init__",
            "StreamPacker.check_settings",
            "stream_best_fit",
            "stream_bytes",
            "check_stream_memory",
            "StreamDataset.__init__",
        ),
        # pack_table / pack_dataset pass it on as a policy option; stream: a test's
        # StreamDataset factory
        callees=(
            "StreamPacker",
            "check_settings",
            "stream_best_fit",
            "StreamDataset",
            "plan_rows",
            "pack_table",
            "pack_dataset",
            "stream",
        ),
        decorate=("StreamPacker.__init__", "StreamDataset.__init__"),
    ),
    Keyword(  # the attention sliding window (transformers' word): a query sees at most
        # its last sliding_window positions. Not the tree blocks (file_groups'
        # window=), nor on-disk keys; the functions transformers calls keep its keywords.
        "window",
        "sliding_window",
        functions=_SLIDING,
        callees=(*_SLIDING, "key_bounds", "dense_mask", "range_mask", "key_spans"),
        decorate=tuple(f for f in _SLIDING if "." not in f or f.split(".")[0] in _CLASSES),
    ),
    Keyword(  # max_length in tokens, as pack_dataset's (the packer's capacity equals it)
        "capacity",
        "max_length",
        functions=("pack_tree", "pack_tree_dataset", "StreamDataset.__init__"),
        callees=("pack_tree", "pack_tree_dataset", "StreamDataset"),
        decorate=("pack_tree", "pack_tree_dataset", "StreamDataset.__init__"),
    ),
    Keyword(
        "expected_partition",
        "expected_split",
        functions=(),
        callees=(),
        decorate=("load_packed", "PackedDataset.__init__", "PackedBatches.__init__"),
    ),
)

#: the objects that are a PackOptions in seqpack's code and tests
_OPTIONS = ("opts", "options", "self.opts", "self.spec.opts", "self.options")
ATTRS = (
    # PackOptions.split (train / validation / test); batches and tables keep partition
    Attr("partition", "split", _OPTIONS),
)

TEXTS = (
    Text(r"(?<![\w-])--tree-window ROWS\b", "--tree-block DOCUMENTS"),
    Text(r"(?<![\w-])--tree-window\b", "--tree-block"),
    Text(r"`--tree-block DOCUMENTS` consecutive rows", "`--tree-block` consecutive documents"),
    # the cut_long option in prose and messages
    Text(r"(?<![\w-])--split-long\b", "--cut-long"),
    Text(r"---split-long\b", "---cut-long"),  # the Markdown anchor of its heading
    Text(r"pre-split with --cut-long", "cut it with --cut-long"),
    Text(r"\bsplit_long(?==|`| must be)", "cut_long"),
    Text(r"(?<=\.)split_long\b(?!\()", "cut_long"),
    Text(r'\["split_long"\]', '["cut_long"]'),
    Text(r"\bsplit sources longer than a row\b", "cut documents longer than a row into spans"),
    # the split option (PackOptions.split, --split); the stored key stays partition
    Text(r"(?<![\w-])--partition\b", "--split"),
    Text(r"\bpass partition= with\b", "pass split= with"),
    # the stream packer's look-ahead: --option lookahead=N, StreamPacker(lookahead=)
    Text(r"(write e\.g\.|--option) window=", r"\1 lookahead="),
    Text(r"\bwindow=(\d[\d_]*), max_open_rows\b", r"lookahead=\1, max_open_rows"),
    Text(r"\bstream-best-fit window=", "stream-best-fit lookahead="),
    Text(r"`window=(\d)", r"`lookahead=\1", files=r"docs/(datasets|policies)\.md"),
    Text(r"\bper `window` slot\b", "per `lookahead` slot"),
    Text(r"\b(StreamPacker|plan_rows)\(([^()\n]*?)\bwindow=", r"\1(\2lookahead="),
    Text(r"\bStreamDataset\(([^()\n]*?)\bcapacity\b", r"StreamDataset(\1max_length"),
    Text(r"\blower window( or max_open_rows\b|\"$)", r"lower lookahead\1"),
    Text(r"\b(takes no option|its options: engine,) window\b", r"\1 lookahead"),
    Text(r"\bwindow must be an integer in", "lookahead must be an integer in"),
    Text(r"(?<=stream-best-fit)( takes| options?:? )``window``", r"\1``lookahead``"),
    Text(r"\bthe policy's window\b", "the policy's lookahead"),
    Text(r'"--option", "window=', '"--option", "lookahead=', whole=True),
    # the attention sliding window in prose and the docs' examples
    Text(
        r"\b(permitted|pairwise|key_bounds|allowed_key|key_ranges|key_spans|dense_mask|edges"
        r"|range_mask|attention|additive_mask|bool_mask|block_mask)\(([^()\n]*?)\bwindow=",
        r"\1(\2sliding_window=",
    ),
    Text(r"pos\[0, None\], window=2\)", "pos[0, None], sliding_window=2)", files=r"\.md$"),
    # the memory bound reads the option under its new name (PackOptions renames it)
    Text(r'opts\.get\("window"\)', 'opts.get("lookahead")', files=r"budget\.py$", whole=True),
    Text(r"\b((?:seqpack\.|examples\.)?)split_long\(", r"\1cut_long("),
    Text(r":func:`(~?[\w.]*?)split_long`", r":func:`\1cut_long`"),
    Text(r"`long_ranges`, `split_long`", "`long_ranges`, `cut_long`"),
    Text(r":class:`Piece`", ":class:`InputSlice`"),
    Text(
        r"\bverify must be True, False or 'full'",
        "integrity must be True, False or 'full'",
        code=True,
    ),
    Text(r"\b(load_packed|load_trl|PackedDataset)\(([^()\n]*?)\bverify=", r"\1(\2integrity="),
    Text(r"`verify=", "`integrity="),
    Text(
        r"``verify``(?=[^\n]*(?:checks the manifest|: ``True``"
        r"|\(see :mod:`seqpack\.io\.integrity))",
        "``integrity``",
    ),
    Text(r"``verify=(True|False|\"full\")``", r"``integrity=\1``"),
    Text(r"(\| )verify=(True|\"full\"|False)", r"\1integrity=\2"),
    Text(r"cache_shards=4, verify=True\)", "cache_shards=4, integrity=True)"),
    Text(r"\nverify=True, expected_split=None\)", "\nintegrity=True, expected_split=None)"),
    Text(r"(?<=load_packed\(path, )verify=", "integrity="),
    # the fuzzed arguments of load_packed (dict keys and names, strings across tokens)
    Text(r'"expected_binding", "verify", ', '"expected_binding", "integrity", ', whole=True),
    Text(
        r'"path": packed / "out", "verify": True',
        '"path": packed / "out", "integrity": True',
        whole=True,
    ),
)


# ----------------------------------------------------------------------------- the engine


@dataclass
class Edit:
    line: int  # 1-based
    col: int  # byte offset in the line
    old: str
    new: str


@dataclass
class Report:
    changed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def _qualnames(tree: ast.AST) -> dict[ast.AST, str]:
    names: dict[ast.AST, str] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                q = f"{prefix}{child.name}"
                names[child] = q
                walk(child, q + ".")
            else:
                walk(child, prefix)

    walk(tree, "")
    return names


def _is_shim_call(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("renamed_names", "renamed_kwargs")
    )


def _walk(node: ast.AST):
    """ast.walk that does not enter the shims' own calls (they name the old spellings)."""
    todo = [node]
    while todo:
        n = todo.pop()
        if _is_shim_call(n):
            continue
        yield n
        todo.extend(ast.iter_child_nodes(n))


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}


def _callee(call: ast.Call) -> str | None:
    f = call.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f.attr
    return None


def _def_name_col(lines: list[bytes], node: ast.AST, name: str) -> tuple[int, int]:
    line = lines[node.lineno - 1]
    m = re.compile(rb"\b(?:def|class)\s+(" + re.escape(name.encode()) + rb")\b").search(
        line, node.col_offset
    )
    assert m, (node.lineno, line)
    return node.lineno, m.start(1)


def _defines_or_imports(tree: ast.AST, name: str, defines: bool) -> bool:
    """Whether the file imports ``name`` from seqpack (or, with ``defines``, defines it)."""
    for node in ast.walk(tree):
        if defines and isinstance(node, ast.ClassDef) and node.name == name:
            return True
        if (
            isinstance(node, ast.ImportFrom)
            and (node.module or "").startswith("seqpack")
            and any(a.name == name for a in node.names)
        ):
            return True
    return False


def name_edits(tree: ast.AST, lines: list[bytes], rule: Name, path: str) -> list[Edit]:
    if rule.only_if and not _defines_or_imports(tree, rule.old, path.startswith("src/")):
        return []
    parents = _parents(tree)
    edits: list[Edit] = []
    ctx = set(rule.contexts)

    def constants_of(names: tuple[str, ...]) -> set[int]:
        return {
            id(c)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Assign, ast.AnnAssign))
            and any(
                isinstance(t, ast.Name) and t.id in names
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            )
            for c in ast.walk(node.value)
        }

    in_all, kept = constants_of(("__all__",)), constants_of(rule.keep)

    def called(node: ast.AST) -> bool:
        p = parents.get(node)
        return isinstance(p, ast.Call) and p.func is node

    for node in _walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == rule.old and "def" in ctx:
                edits.append(Edit(*_def_name_col(lines, node, rule.old), rule.old, rule.new))
        elif isinstance(node, ast.Name) and node.id == rule.old and "name" in ctx:
            if not rule.calls_only or called(node):
                edits.append(Edit(node.lineno, node.col_offset, rule.old, rule.new))
        elif isinstance(node, ast.Attribute) and node.attr == rule.old and "attr" in ctx:
            if not rule.calls_only or called(node):
                col = node.end_col_offset - len(rule.old)
                edits.append(Edit(node.end_lineno, col, rule.old, rule.new))
        elif (
            (isinstance(node, ast.alias) and node.name == rule.old and "import" in ctx)
            or (isinstance(node, ast.arg) and node.arg == rule.old and "param" in ctx)
            or (isinstance(node, ast.keyword) and node.arg == rule.old and "kwarg" in ctx)
        ):
            edits.append(Edit(node.lineno, node.col_offset, rule.old, rule.new))
        elif (
            isinstance(node, ast.Constant)
            and node.value == rule.old
            and ("str" in ctx or ("all" in ctx and id(node) in in_all))
            and id(node) not in kept
            and node.lineno == node.end_lineno
        ):
            col = node.col_offset + 1  # past the opening quote
            if lines[node.lineno - 1][col : col + len(rule.old)] == rule.old.encode():
                edits.append(Edit(node.lineno, col, rule.old, rule.new))
    return edits


def keyword_edits(tree: ast.AST, lines: list[bytes], rule: Keyword) -> list[Edit]:
    quals = _qualnames(tree)
    edits: list[Edit] = []
    targets = set(rule.functions)
    for node, q in quals.items():
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or q not in targets:
            continue
        args = node.args
        if rule.old not in [a.arg for a in args.args + args.kwonlyargs + args.posonlyargs]:
            continue
        for sub in _walk(node):
            if (isinstance(sub, ast.arg) and sub.arg == rule.old) or (
                isinstance(sub, ast.Name) and sub.id == rule.old
            ):
                edits.append(Edit(sub.lineno, sub.col_offset, rule.old, rule.new))
    for node in _walk(tree):
        if isinstance(node, ast.Call) and _callee(node) in rule.callees:
            for kw in node.keywords:
                if kw.arg == rule.old:
                    edits.append(Edit(kw.lineno, kw.col_offset, rule.old, rule.new))
    return edits


def attr_edits(tree: ast.AST, rule: Attr) -> list[Edit]:
    return [
        Edit(node.end_lineno, node.end_col_offset - len(rule.old), rule.old, rule.new)
        for node in _walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr == rule.old
        and ast.unparse(node.value) in rule.receivers
    ]


def apply_edits(text: str, edits: list[Edit]) -> str:
    lines = text.encode().split(b"\n")
    seen: set[tuple[int, int]] = set()
    for e in sorted(edits, key=lambda e: (e.line, e.col), reverse=True):
        if (e.line, e.col) in seen:
            continue
        seen.add((e.line, e.col))
        line = lines[e.line - 1]
        old = e.old.encode()
        assert line[e.col : e.col + len(old)] == old, (e, line)
        lines[e.line - 1] = line[: e.col] + e.new.encode() + line[e.col + len(old) :]
    return b"\n".join(lines).decode()


# -- prose: comments and string tokens of Python, every line of other files


def _prose_rules() -> list[tuple[re.Pattern[str], str, str, bool]]:
    rules = [
        (re.compile(rf"(?<![\w-]){re.escape(n.old)}(?![\w-])"), n.new, "", False)
        for n in NAMES
        if n.prose
    ]
    rules += [(re.compile(t.pattern), t.repl, t.files, t.code) for t in TEXTS if not t.whole]
    return rules


WHOLE = [(re.compile(t.pattern), t.repl, t.files) for t in TEXTS if t.whole]


PROSE = _prose_rules()


def _sub_all(text: str, path: str, code: bool) -> str:
    for pattern, repl, files, in_code in PROSE:
        if files and not re.search(files, path):
            continue
        if code and not in_code:
            continue
        text = pattern.sub(repl, text)
    return text


def prose_python(text: str, path: str) -> str:
    """Apply the prose rules to the comments and strings of a Python source."""
    import io
    import tokenize

    toks = list(tokenize.generate_tokens(io.StringIO(text).readline))
    lines = text.split("\n")
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line) + 1)
    out, pos = [], 0
    for tok in toks:
        if tok.type not in (tokenize.COMMENT, tokenize.STRING):
            continue
        start = offsets[tok.start[0] - 1] + tok.start[1]
        end = offsets[tok.end[0] - 1] + tok.end[1]
        out.append(_sub_all(text[pos:start], path, code=True))
        out.append(_sub_all(text[start:end], path, code=False))
        pos = end
    out.append(_sub_all(text[pos:], path, code=True))
    return "".join(out)


def prose_markdown(text: str, path: str) -> str:
    """Apply the prose rules to a Markdown (or other text) file; the glossary keeps the
    retired words it lists."""
    parts = re.split(r"(?m)^(?=## )", text)
    return "".join(p if p.startswith("## Glossary") else _sub_all(p, path, False) for p in parts)


# -- shims


def _module_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _exported(tree: ast.Module) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            try:
                return set(ast.literal_eval(node.value))
            except ValueError:
                return set()
    return set()


def _strip_block(text: str) -> str:
    for mark in (MARK, SHORT):
        i = text.find(mark)
        if i >= 0:
            return text[:i].rstrip("\n") + "\n"
    return text


def add_module_aliases(text: str, path: str, style: str = "short") -> str:
    """The module ``__getattr__`` answering each renamed public name this module defines
    or exports (composed with a ``__getattr__`` it already has): in ``style`` "block"
    (its own import, under :data:`MARK`) or "short" (one line under :data:`SHORT`)."""
    if not path.startswith("src/"):
        return text
    base = text
    tree = ast.parse(base)
    defined, exported = _module_level_names(tree), _exported(tree)
    renames = {
        n.old: n.new
        for n in NAMES
        if n.public and (n.new in defined or n.new in exported) and n.old not in defined
    }
    if not renames:
        return text
    if style == "block":  # as ruff formats it (magic trailing commas)
        pairs = "".join(f'        "{o}": "{n}",\n' for o, n in sorted(renames.items()))
        fallback = "    fallback=__getattr__,\n" if "__getattr__" in defined else ""
        return base + (
            f"\n\n{MARK}\n"
            "from seqpack._renames import renamed_names  # noqa: E402\n\n"
            f"__getattr__ = renamed_names(\n    __name__,\n    {{\n{pairs}    }},\n{fallback})\n"
        )
    pairs = ", ".join(f'"{o}": "{n}"' for o, n in sorted(renames.items()))
    fallback = ", fallback=__getattr__" if "__getattr__" in defined else ""
    import_line = "from seqpack._renames import renamed_names"
    if import_line not in base:
        base = _add_import(base, import_line)
    return base + f"\n\n{SHORT}\n__getattr__ = renamed_names(__name__, {{{pairs}}}{fallback})\n"


def _decorator_line(indent: str, renames: dict[str, str]) -> str:
    args = ", ".join(f'{o}="{n}"' for o, n in sorted(renames.items()))
    return f"{indent}@renamed_kwargs({args})"


def decorator_renames(text: str) -> dict[str, dict[str, str]]:
    """The ``@renamed_kwargs(old="new")`` a source already has, by function qualname (the
    shims another change wrote, e.g. ``engine="kernels"``, are written back with ours)."""
    tree = ast.parse(text)
    out: dict[str, dict[str, str]] = {}
    for node, q in _qualnames(tree).items():
        for dec in getattr(node, "decorator_list", []):
            if _is_shim_call(dec) and dec.func.id == "renamed_kwargs":
                out.setdefault(q, {}).update(
                    {
                        k.arg: k.value.value
                        for k in dec.keywords
                        if isinstance(k.value, ast.Constant)
                    }
                )
    return out


def add_kwarg_shims(text: str, path: str, kept: dict[str, dict[str, str]] | None = None) -> str:
    """``@renamed_kwargs(old="new")`` on the public functions a Keyword rule renamed, with
    the renames ``kept`` from the source (:func:`decorator_renames`)."""
    kept = kept or {}
    if not path.startswith("src/"):
        return text
    tree = ast.parse(text)
    quals = _qualnames(tree)
    lines = text.split("\n")
    inserts: list[tuple[int, str]] = []  # (0-based line, decorator)
    for node, q in quals.items():
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        params = {a.arg for a in node.args.args + node.args.kwonlyargs + node.args.posonlyargs}
        renames = dict(kept.get(q, {}))
        renames |= {k.old: k.new for k in KEYWORDS if q in k.decorate and k.new in params}
        if not renames:
            continue
        first = node.lineno - 1  # innermost: under @staticmethod and @classmethod
        indent = re.match(r"\s*", lines[node.lineno - 1]).group(0)
        inserts.append((first, _decorator_line(indent, renames)))
    if not inserts:
        return text
    for at, line in sorted(inserts, reverse=True):
        lines.insert(at, line)
    text = "\n".join(lines)
    if "from seqpack._renames import renamed_kwargs" not in text:
        text = _add_import(text, "from seqpack._renames import renamed_kwargs")
    return text


def _add_import(text: str, stmt: str) -> str:
    tree = ast.parse(text)
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not (
            isinstance(node, ast.ImportFrom) and node.module == "__future__"
        ):
            lines = text.split("\n")
            lines.insert(node.lineno - 1, stmt)
            return "\n".join(lines)
    raise SystemExit(f"no import to put {stmt!r} beside")


# -- one file


def strip_shims(text: str) -> str:
    """The source without the shims this script wrote (it writes them again at the end)."""
    text = _strip_block(text)
    tree = ast.parse(text)
    drop: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for dec in node.decorator_list:
                if _is_shim_call(dec):
                    drop |= set(range(dec.lineno - 1, dec.end_lineno))
    if not drop:
        return text
    return "\n".join(line for i, line in enumerate(text.split("\n")) if i not in drop)


def rewrite_python(text: str, path: str) -> str:
    style = "block" if MARK in text else "short"
    kept = decorator_renames(text)
    text = strip_shims(text)
    for rule in NAMES:
        tree = ast.parse(text)
        lines = text.encode().split(b"\n")
        text = apply_edits(text, name_edits(tree, lines, rule, path))
    for rule in KEYWORDS:
        tree = ast.parse(text)
        lines = text.encode().split(b"\n")
        text = apply_edits(text, keyword_edits(tree, lines, rule))
    for rule in ATTRS:
        text = apply_edits(text, attr_edits(ast.parse(text), rule))
    text = prose_python(text, path)
    for pattern, repl, where in WHOLE:
        if not where or re.search(where, path):
            text = pattern.sub(repl, text)
    text = add_kwarg_shims(text, path, kept)
    text = add_module_aliases(text, path, style)
    ast.parse(text)
    return text


def files() -> list[Path]:
    out: list[Path] = []
    for root in ROOTS:
        p = Path(root)
        candidates = [p] if p.is_file() else sorted(p.rglob("*"))
        for f in candidates:
            rel = f.as_posix()
            if not f.is_file() or f.suffix not in SUFFIXES:
                continue
            if any(rel.startswith(s) for s in SKIP) or f.name in SKIP_NAMES or "/." in "/" + rel:
                continue
            out.append(f)
    return out


def leftovers() -> list[str]:
    """Parameters a Keyword rule renames elsewhere, left in a function it does not list
    (a function added or renamed since the rule was written: add it to the rule)."""
    olds = {k.old: k for k in KEYWORDS if k.functions}
    out = []
    for f in sorted(Path("src").rglob("*.py")):
        if f.name in SKIP_NAMES:
            continue
        tree = ast.parse(f.read_text())
        for node, q in _qualnames(tree).items():
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            args = node.args
            for a in args.args + args.kwonlyargs + args.posonlyargs:
                rule = olds.get(a.arg)
                if rule and q not in rule.functions and _looks_like(node, rule):
                    out.append(f"{f}:{node.lineno} {q}({a.arg}=) -- {rule.new}= elsewhere")
    return out


def _looks_like(node: ast.FunctionDef, rule: Keyword) -> bool:
    """A loader of packed data (the functions of the integrity keyword take a path or a
    store and the expected binding or split)."""
    names = {a.arg for a in node.args.args + node.args.kwonlyargs}
    return bool(names & {"expected_binding", "expected_split", "expected_partition", "path"})


def ruff_fixed(text: str, path: str) -> str:
    """``text`` with its imports sorted, ``__all__`` sorted and formatted, as ruff writes it."""
    venv = Path(".venv/bin/ruff")
    ruff = str(venv) if venv.exists() else shutil.which("ruff") or "ruff"
    for args in (["check", "--select", "I,RUF022", "--fix", "-q"], ["format", "-q"]):
        cmd = [ruff, *args, "--stdin-filename", path, "-"]
        out = subprocess.run(cmd, input=text, capture_output=True, text=True, check=False)
        text = out.stdout if out.stdout else text
    return text


def main(argv: list[str]) -> int:
    check = "--check" in argv
    changed: list[str] = []
    for f in files():
        rel = f.as_posix()
        old = f.read_text()
        new = rewrite_python(old, rel) if f.suffix == ".py" else prose_markdown(old, rel)
        if new != old and f.suffix == ".py":
            new = ruff_fixed(new, rel)  # as it would be written, so a second run is a no-op
        if new != old:
            changed.append(rel)
            if not check:
                f.write_text(new)
    for c in changed:
        print(("would change " if check else "changed ") + c)
    for warning in leftovers():
        print("vocab: check by hand:", warning)
    return 1 if check and changed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
