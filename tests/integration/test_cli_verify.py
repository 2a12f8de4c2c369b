"""``exactpack verify``: exit codes 0 (pass), 1 (fail), 2 (bad input); JSON on the last line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from exactpack.cli import main

torch.set_num_threads(1)
CONFIG = str(Path(__file__).parents[1] / "data" / "tiny_llama.json")


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
    from exactpack.verify.models import load_model

    load_model(config=CONFIG, seed=2).save_pretrained(tmp_path)
    code, out, _ = verify(capsys, "--hf-model", str(tmp_path), "--json", "--seed", "2")
    report = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and report["pass"] and report["model"]["source"] == str(tmp_path)


def test_a_pickled_model_is_refused_before_anything_is_unpickled(capsys, tmp_path):
    """A folder whose weights are only a pickle (``pytorch_model.bin``) is one line, exit 2:
    unpickling can run code, so exactpack never does it."""
    from exactpack.verify.models import load_model

    model = load_model(config=CONFIG, seed=2)
    model.save_pretrained(tmp_path)  # transformers 5 writes safetensors only: replace them
    for weights in tmp_path.glob("*.safetensors"):
        weights.unlink()
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")  # a pickle
    capsys.readouterr()  # save_pretrained's own progress bar
    code, _, err = verify(capsys, "--hf-model", str(tmp_path))
    assert code == 2 and "pickled weights" in err and "safe_serialization=True" in err
    assert len(err.strip().splitlines()) == 1


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


def write_config(tmp_path, **changes):
    config = json.loads(Path(CONFIG).read_text()) | changes
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


@pytest.mark.parametrize("attn", ["eager", "sdpa", "exactpack_varlen"])
def test_windowed_model_passes_with_its_own_lengths_and_the_naive_control_fails(
    capsys, tmp_path, attn
):
    config = write_config(tmp_path, model_type="mistral", sliding_window=16)
    code, out, _ = verify(
        capsys, "--hf-config", config, "--attn", attn, "--lengths", "40,20,9,3", "--json"
    )
    report = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and report["pass"], report
    assert report["lengths"] == [40, 20, 9, 3] and report["capacity"] == 64
    assert report["architecture"] == {
        "layer_types": [],
        "windows": {"all": 16},
        "window_exercised": True,
        "supported": True,
        "refusal": None,
        "positions": "position_ids",
        "position_offset": 0,
        "conditions": [],
        "verdict": "exact",
        "condition_checks": [],
    }
    if attn == "exactpack_varlen":
        return
    code, out, _ = verify(capsys, "--hf-config", config, "--attn", attn, "--mode", "naive")
    last = out.strip().splitlines()[-1]
    assert code == 1 and last.startswith("FAIL: the model mixed examples")
    assert "(MistralAttention): attention" in last


@pytest.mark.parametrize(
    "changes",
    [
        {"model_type": "lfm2", "layer_types": ["conv", "full_attention"], "conv_L_cache": 3},
        {"model_type": "mamba", "state_size": 4, "expand": 2, "conv_kernel": 3},
    ],
    ids=["lfm2", "mamba"],
)
def test_hybrids_pass_flat_and_as_trees_with_their_mixers_restarted(capsys, tmp_path, changes):
    config = write_config(tmp_path, **changes)
    code, out, _ = verify(capsys, "--hf-config", config, "--attn", "eager", "--json")
    report = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and report["pass"] is True, report
    assert "restarts its" in report["architecture"]["verdict"]
    assert report["failures"] == dict.fromkeys(report["failures"], 0)
    # tree rows: each branch's mixer state forks its parent's; the naive rows (a branch
    # starts from its sibling's state) fail
    tree = ("--hf-config", config, "--attn", "eager", "--tree-lengths", "6:3,2;3:2", "--json")
    code, out, _ = verify(capsys, *tree)
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["pass"] is True
    code, out, _ = verify(capsys, *tree, "--mode", "naive")
    assert code == 1 and json.loads(out.strip().splitlines()[-1])["pass"] is False


def test_default_examples_exercise_the_window(capsys, tmp_path):
    config = write_config(
        tmp_path, model_type="qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=1
    )
    code, out, _ = verify(capsys, "--hf-config", config)
    assert code == 0 and out.strip().splitlines()[-1].startswith("PASS")
    assert "examples of [19, 3, 9, 10, 5, 2] pairs" in out
    assert "attention windows: full_attention unbounded, sliding_attention 8" in out


def test_a_pass_states_its_conditions_and_where_max_length_breaks_them(capsys, tmp_path):
    """LongRoPE picks its frequencies from the batch's largest position: exact only while
    every example <= original_max_position_embeddings; the report says so, and whether the
    max_length asked for (else the model's positions) can break it."""
    phi3 = {"model_type": "phi3", "vocab_size": 266, "hidden_size": 16, "intermediate_size": 32,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
            "max_position_embeddings": 128, "original_max_position_embeddings": 32,
            "pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 1,
            "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 4,
                             "long_factor": [2.0] * 4}}  # fmt: skip
    path = tmp_path / "phi3.json"
    path.write_text(json.dumps(phi3))
    condition = "PASS holds while every example <= 32 pairs (longrope RoPE"
    for extra, reach in (((), 128), (("--max-length", "40"), 40), (("--max-length", "24"), None)):
        code, out, _ = verify(capsys, "--hf-config", str(path), *extra)
        assert code == 0 and out.strip().splitlines()[-1].startswith("PASS"), out
        (line,) = [x for x in out.splitlines() if x.startswith(condition)]
        breaks = f"at max_length {reach} an example longer than 32 breaks it"
        assert (breaks in line) if reach else ("breaks" not in line), line
    # model_loss is compared at float32's tolerance, and the line says so
    assert "; model_loss: 1e-05 + 0.0001*max, transformers computes its loss in float32)" in out


def test_unsupported_architectures_and_crashes_exit_2_with_one_line(capsys, tmp_path):
    rwkv = write_config(tmp_path, model_type="rwkv", attention_hidden_size=16)
    code, out, err = verify(capsys, "--hf-config", rwkv)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "rwkv cannot be packed exactly: its linear attention layer" in err
    assert "exactpack restarts only the mixers it knows" in err
    bloom = tmp_path / "bloom"
    bloom.mkdir()
    (bloom / "config.json").write_text(
        json.dumps({"model_type": "bloom", "vocab_size": 266, "hidden_size": 16, "n_layer": 1})
    )
    code, out, err = verify(capsys, "--hf-config", str(bloom))
    assert code == 2 and "bloom cannot be packed exactly: its ALiBi bias" in err
    # Gemma 2 soft-caps its logits; exactpack_varlen says so instead of a traceback.
    gemma2 = write_config(tmp_path, model_type="gemma2", sliding_window=4)
    code, out, err = verify(capsys, "--hf-config", gemma2, "--attn", "exactpack_varlen")
    assert code == 2 and out == "" and "soft-caps" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("lengths", "message"), [("40,x", "comma-separated"), ("40,0", "positive")]
)
def test_lengths_that_are_not_positive_ints_are_a_usage_error(capsys, lengths, message):
    code, out, err = verify(capsys, "--hf-config", CONFIG, "--lengths", lengths)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith("exactpack verify: error: argument --lengths") and message in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hf-config", CONFIG, "--lengths", "70"], "max_position_embeddings 64"),
        (["--hf-config", CONFIG, "--lengths", "40,20", "--max-length", "30"], "does not fit"),
        (["--lengths", "4,2"], "transformers models"),
    ],
)
def test_lengths_that_do_not_fit_exit_2_with_one_line(capsys, args, message):
    code, out, err = verify(capsys, *args)
    assert code == 2 and out == "" and message in err and len(err.strip().splitlines()) == 1


def _tiny_dir(tmp_path, model_type, **options):
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1]))
    from support.architecture_tiny import tiny_config

    folder = tmp_path / model_type
    tiny_config(model_type, **options).save_pretrained(folder)
    return str(folder)


def test_configs_without_pad_token_id_verify_and_exit_1_means_only_mixed(capsys, tmp_path):
    """codegen packs exactly without a pad id; cpmant is refused on one line, exit 2."""
    codegen = _tiny_dir(tmp_path, "codegen", pad_token_id=None)
    assert json.loads((Path(codegen) / "config.json").read_text()).get("pad_token_id") is None
    code, out, err = verify(capsys, "--hf-config", codegen)
    assert code == 0 and out.strip().splitlines()[-1].startswith("PASS"), err
    code, out, err = verify(capsys, "--hf-config", _tiny_dir(tmp_path, "cpmant"))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "cpmant cannot be packed exactly: it takes no position_ids" in err


def test_exactpack_varlen_on_a_model_without_the_interface_is_one_line(capsys, tmp_path):
    code, out, err = verify(
        capsys, "--hf-config", _tiny_dir(tmp_path, "gpt_neo"), "--attn", "exactpack_varlen"
    )
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "gpt_neo cannot run attn_implementation='exactpack_varlen'" in err


def test_a_crash_outside_the_model_is_exit_2_not_1(capsys, monkeypatch):
    from exactpack.verify import models as hf_verify

    def broken(*args, **kwargs):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(hf_verify, "verify_hf", broken)
    code, out, err = verify(capsys, "--hf-config", CONFIG)
    assert (
        code == 2
        and out == ""
        and err.strip().endswith("verify crashed: RuntimeError: boom second line")
    )


def test_a_model_whose_own_loss_alone_disagrees_is_not_reported_as_mixed(capsys, tmp_path):
    """whisper's decoder packs exactly but computes its loss from unshifted labels."""
    code, out, err = verify(capsys, "--hf-config", _tiny_dir(tmp_path, "whisper"), "--json")
    report = json.loads(out.strip().splitlines()[-1])
    assert code == 2 and not report["pass"] and not report["mixed"]
    assert set(k for k, n in report["failures"].items() if n) == {"model_loss"}
    assert "hf_loss" in err and len(err.strip().splitlines()) == 1


def test_a_model_over_the_byte_budget_is_refused_before_it_is_built(capsys):
    from exactpack import BudgetExceeded
    from exactpack.verify import load_model

    code, out, err = verify(capsys, "--hf-config", CONFIG, "--max-model-bytes", "1K")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "the model needs about" in err and "but max_model_bytes is 1,024" in err
    assert "raise --max-model-bytes" in err
    with pytest.raises(BudgetExceeded, match="max_model_bytes is 1,024"):
        load_model(config=CONFIG, max_model_bytes=1024)
    assert load_model(config=CONFIG, max_model_bytes=None) is not None


def test_huge_configs_are_refused_from_the_config_alone(tmp_path):
    """30B parameters, or a million layers (a module each: minutes and gigabytes on the
    meta device before any weight): one line in seconds, in a child capped at 4 GiB, so a
    regression fails instead of swapping the machine."""
    (tmp_path / "wide").mkdir()
    (tmp_path / "deep").mkdir()
    wide = write_config(tmp_path / "wide", hidden_size=16384, intermediate_size=53248,
                        num_hidden_layers=64, vocab_size=256_000)  # fmt: skip
    deep = write_config(tmp_path / "deep", num_hidden_layers=1_000_000)
    for config, needle in (
        (wide, "but max_model_bytes is 2,147,483,648 — verify a smaller config"),
        (deep, "the config has 1,000,000 layers, more than the 1,024 any model has"),
    ):
        proc = subprocess.run(
            [sys.executable, "-c",
             "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30));"
             "from exactpack.cli import main; sys.exit(main(sys.argv[1:]))",
             "verify", "--hf-config", config],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr[-1000:]
        assert needle in proc.stderr, proc.stderr


@pytest.mark.timeout(60)  # a FIFO hung the config read forever
def test_a_config_that_is_no_regular_file_or_too_big_is_refused_unread(capsys, tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    code, out, err = verify(capsys, "--hf-config", str(fifo))
    assert code == 2 and out == "" and f"{fifo} is not a regular file" in err
    folder = tmp_path / "big"
    folder.mkdir()
    with open(folder / "config.json", "wb") as f:
        f.truncate(600 << 20)  # sparse: 600 MB without writing them
    code, out, err = verify(capsys, "--hf-config", str(folder))
    assert code == 2 and err.count("\n") == 1
    assert "holds 629,145,600 bytes, more than the 134,217,728 a config file may hold" in err


def test_tree_lengths_past_the_positions_are_refused_before_any_id(capsys, monkeypatch):
    from exactpack.verify import models

    drawn = []
    monkeypatch.setattr(models.np.random, "default_rng", lambda *a: drawn.append(a))
    code, out, err = verify(capsys, "--hf-config", CONFIG, "--tree-lengths", "10:60;3:4")
    assert code == 2 and out == "" and drawn == []
    assert "a sequence of 69 pairs is longer than the model's max_position_embeddings 64" in err
