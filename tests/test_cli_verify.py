"""``seqpack verify``: exit codes 0 (pass), 1 (fail), 2 (bad input); JSON on the last line."""

import json
from pathlib import Path

import pytest
import torch

from seqpack.cli import main

torch.set_num_threads(1)
CONFIG = str(Path(__file__).parent / "data" / "tiny_llama.json")


def verify(capsys, *args):
    code = main(["verify", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_hf_config_adapter_passes_and_naive_fails(capsys, attn):
    code, out, _ = verify(capsys, "--hf-config", CONFIG, "--attn", attn, "--json")
    report = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and report["pass"] is True
    assert set(report["max_abs_diff"]) >= {"logits", "loss", "gradients"}
    assert report["model"]["attn_implementation"] == attn

    code, out, _ = verify(
        capsys, "--hf-config", CONFIG, "--attn", attn, "--mode", "naive", "--json"
    )
    report = json.loads(out.strip().splitlines()[-1])
    assert code == 1 and report["pass"] is False
    assert report["max_abs_diff"]["logits"] > 1e-2


def test_bool_mask_on_eager_is_flagged_and_human_output(capsys):
    code, out, _ = verify(capsys, "--hf-config", CONFIG, "--attn", "eager", "--mode", "bool-mask")
    assert code == 1
    assert out.strip().splitlines()[-1].startswith("FAIL")
    assert "as numbers" in out
    code, out, _ = verify(capsys, "--hf-config", CONFIG, "--attn", "sdpa", "--dtype", "float32")
    assert code == 0 and "PASS" in out.splitlines()[-1] and "float32" in out


def test_hf_model_dir(capsys, tmp_path):
    from seqpack.hf.verify import load_model

    load_model(config=CONFIG, seed=2).save_pretrained(tmp_path)
    code, out, _ = verify(capsys, "--hf-model", str(tmp_path), "--json", "--seed", "2")
    report = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and report["pass"] and report["model"]["source"] == str(tmp_path)


def test_tiny_decoder_without_hf_arguments(capsys):
    code, out, _ = verify(capsys, "--json")
    report = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and report["pass"] and report["target"] == "tiny-decoder"
    assert report["layouts"] >= 2
    code, out, _ = verify(capsys, "--mode", "naive")
    assert code == 1 and out.strip().splitlines()[-1].startswith("FAIL")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hf-config", "/nonexistent/config.json"], "does not exist"),
        (["--hf-config", CONFIG, "--attn", "flash_attention_2"], "flash-attn"),
        (["--hf-config", CONFIG, "--attn", "flex_attention"], "no backward"),
        (["--hf-config", CONFIG, "--attn", "magic"], "choose one of"),
        (["--mode", "bool-mask"], "transformers models only"),
        (["--dtype", "float32"], "float64"),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys, args, message):
    code, out, err = verify(capsys, *args)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err


def test_config_that_is_not_a_model(capsys, tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"model_type": "no-such-model"}))
    code, _, err = verify(capsys, "--hf-config", str(bad))
    assert code == 2 and "cannot build a causal LM" in err and len(err.strip().splitlines()) == 1
