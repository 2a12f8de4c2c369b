"""Chat templates rendered under limits: steps, time and size, one line naming the template.

Each hostile template is rendered through the whole reading path (the
tokenizer folder's transformers renderer, as TRL uses it) in a fresh
process under a 3 GiB address-space limit: it must fail within seconds
with one ``ExactpackError`` line, never hang or abort. A sane template
renders exactly as transformers renders it without the limits.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from support.sft_helpers import CHATS, TEMPLATE, chat_tokenizer

pytest.importorskip("transformers")

HOSTILE = {
    "a loop of 10^10 iterations": (
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "steps",
    ),
    "nested loops over a string": (
        "{% set s = 'a' * 100000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
        "steps",
    ),
    "a 10 GB string": ("{{ 'x' * 10000000000 }}", "characters"),
    "gigabytes of output": (
        "{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{{ s }}{% endfor %}",
        "characters of output",
    ),
    "a string doubled in a namespace": (
        "{% set ns = namespace(s='ab') %}{% for i in range(60) %}"
        "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
        "characters",
    ),
    "gigabytes inside a generation block": (
        "{% set s = 'x' * 1000000 %}{% generation %}{% for i in range(100000) %}{{ s }}"
        "{% endfor %}{% endgeneration %}",
        "characters",
    ),
    "a filter with a huge width": ("{{ 'a'|center(10000000000) }}", "an argument of"),
    "a huge format width": ("{{ '{:>9999999999}'.format('a') }}", "format width"),
    "replace of every gap": (
        "{% set s = 'x' * 100000 %}{{ s.replace('', s) }}",
        "characters",
    ),
    "exponential macro recursion": (
        "{% macro f(n) %}{% if n > 0 %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}"
        "{{ f(40) }}",
        "steps|s to render",
    ),
}

SCRIPT = textwrap.dedent(
    """
    import json, resource, sys, time
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
    import pyarrow as pa
    from exactpack.core.errors import ExactpackError
    from exactpack.io.readers import read_documents
    from exactpack.pipeline.options import PackOptions
    folder, chats, cases = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    table = pa.Table.from_pylist([{"messages": c} for c in chats])
    for name, template in cases.items():
        tok = PackOptions(max_length=8, tokenizer=folder, chat_template=template).load_tokenizer()
        start = time.perf_counter()
        try:
            read_documents(table, tokenizer=tok)
            message = "rendered"
        except ExactpackError as err:
            message = str(err)
        print(json.dumps([name, time.perf_counter() - start, message]))
    """
)


def test_hostile_templates_fail_within_seconds_and_bounded_memory(tmp_path):
    import json

    folder = chat_tokenizer(tmp_path / "tok")
    cases = {name: t for name, (t, _) in HOSTILE.items()}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(folder), json.dumps(CHATS), json.dumps(cases)],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r[0] for r in results] == list(HOSTILE)
    import re

    for name, seconds, message in results:
        assert message != "rendered", name
        assert "row 0: the chat template (--chat-template" in message, (name, message)
        assert re.search(HOSTILE[name][1], message), (name, message)
        assert "\n" not in message
        # MAX_SECONDS is 5: a step bound fires well before it on these templates
        assert seconds < 15, (name, seconds)


def test_a_sane_template_renders_as_transformers_renders_it(tmp_path):
    from transformers import AutoTokenizer
    from transformers.utils import chat_template_utils as ctu

    from exactpack.io.templates import BoundedTemplate, bounded

    folder = chat_tokenizer(tmp_path / "tok")
    real = AutoTokenizer.from_pretrained(str(folder))
    want = [
        real.apply_chat_template(c, return_assistant_tokens_mask=True, return_dict=True)
        for c in CHATS
    ]
    with bounded(TEMPLATE, "the test template"):
        assert isinstance(ctu._compile_jinja_template(TEMPLATE), BoundedTemplate)
        got = [
            real.apply_chat_template(c, return_assistant_tokens_mask=True, return_dict=True)
            for c in CHATS
        ]
    assert [dict(g) for g in got] == [dict(w) for w in want]
    # outside exactpack's own calls, transformers compiles as it always does
    assert not isinstance(ctu._compile_jinja_template(TEMPLATE), BoundedTemplate)


def test_large_numbers_in_the_data_are_not_sizes(tmp_path):
    """A tool call's big number or a timestamp reaches ``tojson`` / ``format`` as data."""
    import pyarrow as pa

    from exactpack.io.readers import read_documents
    from exactpack.pipeline.options import PackOptions

    folder = chat_tokenizer(tmp_path / "tok")
    template = TEMPLATE.replace("{{ m['content'] }}<|end|>{% endgeneration %}",
                                "{{ m['content'] }}{{ m['n']|tojson }}{{ '%d'|format(m['n']) }}"
                                "<|end|>{% endgeneration %}")  # fmt: skip
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "n": 10**12}]
    tok = PackOptions(max_length=8, tokenizer=str(folder), chat_template=template).load_tokenizer()
    docs = read_documents(pa.Table.from_pylist([{"messages": chat}]), tokenizer=tok)
    text = tok.backend.decode(docs.tokens.tolist())
    assert text.count("1000000000000") == 2
