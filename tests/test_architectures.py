"""The architecture matrix: every case exact on its implementations, or refused up front.

Tiny random configs (``tests/architecture_cases.py``) of more than 25
transformers model types, float64, with examples longer than the window
wherever there is one. ``docs/transformers.md`` carries the table
``tests/gen_architectures.py`` measures from the same cases.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from architecture_cases import CASES, WINDOW, build, run
from seqpack import PackConfig, pack_examples
from seqpack.hf.adapter import build_inputs, cell_logits, hf_inputs
from seqpack.hf.architectures import UnsupportedArchitecture, describe
from seqpack.hf.diagnose import example_tokens
from seqpack.hf.verify import ModelCrashed, verify_hf

from dtype_path import observed_tolerance, unlabelled

os.environ["HF_HUB_OFFLINE"] = "1"
torch.set_num_threads(1)
EXACT = [c for c in CASES if c.refused is None]
REFUSED = [c for c in CASES if c.refused is not None]
DOCS = Path(__file__).parent.parent / "docs" / "transformers.md"
#: The model types the issue names (windowed variants are separate cases).
NAMED = {
    "llama", "qwen2", "qwen3", "phi", "phi3", "olmo2", "gpt_neox", "granite", "starcoder2",
    "smollm3", "gpt2", "opt", "falcon", "mixtral", "mistral", "gemma", "gemma2", "gemma3_text",
    "cohere2", "gpt_oss", "bloom", "lfm2", "qwen3_next", "jamba",
}  # fmt: skip


def test_the_matrix_covers_the_named_types_and_more_than_25():
    types = {c.model_type for c in CASES}
    assert types >= NAMED and len(types) >= 25
    assert sum(c.windowed for c in EXACT) >= 10  # windowed variants: single mask and per type
    assert {"convolution", "linear attention", "attention"} <= {c.refused for c in REFUSED}


@pytest.mark.parametrize(
    ("case", "attn"),
    [(c, a) for c in EXACT for a in c.attns],
    ids=lambda v: v if isinstance(v, str) else v.name,
)
def test_exact_cases_pass_with_examples_longer_than_the_window(case, attn):
    report = run(case, attn)
    assert report["pass"], (report["max_abs_diff"], report.get("hint"))
    arch = report["architecture"]
    assert arch["supported"] and arch["window_exercised"]
    if case.windowed:
        assert max(report["lengths"]) == 2 * WINDOW + 3 and WINDOW in arch["windows"].values()
    # Every comparison ran: all logits, the loss, every gradient coordinate, the model's loss.
    assert report["comparisons"]["gradients"] == report["model"]["parameters"]
    assert report["failures"] == dict.fromkeys(report["failures"], 0)


@pytest.mark.parametrize("case", [c for c in EXACT if c.windowed], ids=lambda c: c.name)
def test_windowed_cases_leak_without_their_windows_and_in_the_naive_control(case):
    """The per-layer-type windowed masks are what makes them exact."""
    attn = case.attns[0]
    model = build(case, attn)
    examples = _examples(model.config)
    (batch,) = pack_examples("train", examples, examples[0].binding, PackConfig(14, 6)).batches
    kwargs = hf_inputs(batch, attn, config=model.config)
    # Exact = within the tolerance of the model's dtype path, observed (tests/dtype_path.py):
    # float64 throughout keeps 1e-10 + 1e-9*max; an island (eager's float32 softmax, which
    # these cases run on; Gemma's float32 norm) takes float32's 1e-5 + 1e-4*max.
    atol, rtol = observed_tolerance(model, unlabelled(kwargs))
    with torch.no_grad():
        windowed = leak(model, batch, examples, kwargs)
        unwindowed = leak(model, batch, examples, build_inputs(batch, attn, None))
        scale = max(float(model(input_ids=torch.as_tensor(ex.inputs[None]).long()).logits.abs()
                          .max()) for ex in examples)  # fmt: skip
    # A dropped window moves logits by 0.09-0.31 (shared/DESIGN.md): far outside the bound.
    assert windowed <= atol + rtol * scale < 1e-3 < unwindowed
    naive = run(case, attn, mode="naive")
    assert not naive["pass"] and naive["first_divergence"]["kind"] == "attention"


def leak(model, batch, examples, kwargs):
    """Largest logit difference between the packed call and the examples run alone."""
    alone = [model(input_ids=torch.as_tensor(ex.inputs[None]).long()).logits[0] for ex in examples]
    kwargs = kwargs | {"labels": None, "shift_labels": None}
    if "attention_mask" in kwargs:  # the model's dtype (build_inputs defaults to float32)
        masks = kwargs["attention_mask"]
        cast = lambda m: None if m is None else m.to(torch.float64)  # noqa: E731
        masks = {k: cast(m) for k, m in masks.items()} if isinstance(masks, dict) else cast(masks)
        kwargs["attention_mask"] = masks
    logits = cell_logits(model(**kwargs).logits, batch)
    packed = logits.reshape(-1, logits.shape[-1])[example_tokens(batch, flattened=False)]
    return float((packed - torch.cat(alone)).abs().max())


def _examples(config):
    from seqpack.hf.verify import verification_examples, verification_layout

    layout = verification_layout(describe(config).window, config.max_position_embeddings)
    assert layout.capacity == 14 and layout.lengths[0] == 11
    return verification_examples(config.vocab_size, 1, layout=layout)


@pytest.mark.parametrize("case", REFUSED, ids=lambda c: c.name)
def test_refused_cases_are_refused_up_front_and_really_leak(case):
    model = build(case, case.attns[0])
    arch = describe(model.config)
    assert arch.refusal and arch.kind == case.refused
    with pytest.raises(UnsupportedArchitecture, match=re.escape(case.model_type)) as err:
        verify_hf(model, _examples_for(model))
    assert "\n" not in str(err.value)
    (batch,) = pack_examples(
        "train", _examples_for(model), _examples_for(model)[0].binding, PackConfig(14, 6)
    ).batches
    with pytest.raises(UnsupportedArchitecture, match="cannot be packed exactly"):
        hf_inputs(batch, case.attns[0], config=model.config)
    # Run anyway, the refusal is not overcautious: the named layer kind mixes examples
    # (ALiBi models cannot even take a block mask: a crash, named on one line).
    try:
        report = verify_hf(model, _examples_for(model), allow_unsupported=True)
    except ModelCrashed as crash:
        assert case.refused == "attention" and "crashed in its forward" in str(crash)
        return
    assert not report["pass"] and not report["architecture"]["supported"]
    expected = "attention" if case.refused == "chunked attention" else case.refused
    assert report["first_divergence"]["kind"] == expected, report["first_divergence"]


def _examples_for(model):
    from seqpack.hf.verify import verification_examples

    return verification_examples(model.config.get_text_config().vocab_size, 0)


def test_exact_cases_pass_in_float32_on_sdpa():
    """float32 models get float32's tolerance and pass the same comparisons."""
    for case in [c for c in EXACT if "sdpa" in c.attns]:
        report = run(case, "sdpa", dtype=torch.float32)
        assert report["pass"], (case.name, report["max_abs_diff"])
        assert report["tolerance"]["abs"] == 1e-5


def test_flex_attention_forward_on_cpu_takes_the_windowed_block_masks():
    """transformers' flex path compiles FlexAttention (float32, forward only on CPU).

    In a fresh process: a failed compile would leave the compiled wrapper on the
    unfused path for the rest of this one (see seqpack.nn.flex).
    """
    script = (
        "import sys, torch; sys.path.insert(0, 'tests'); torch.set_num_threads(1)\n"
        "from architecture_cases import CASES, run\n"
        "case = next(c for c in CASES if c.model_type == 'gemma3_text')\n"
        "r = run(case, 'flex_attention', dtype=torch.float32, gradients=False)\n"
        "print(r['pass'], r['architecture']['layer_types'], r['max_abs_diff']['logits'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=Path(__file__).parent.parent,
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ | {"HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("True ") and "sliding_attention" in last and "full_attention" in last


def test_docs_table_lists_every_case_with_its_verdict():
    text = DOCS.read_text()
    for case in CASES:
        row = next(
            (line for line in text.splitlines() if line.startswith(f"| {case.name} |")), None
        )
        assert row is not None, f"{case.name} missing: run tests/gen_architectures.py"
        assert ("refused" in row) == (case.refused is not None), row
