"""Tiny random configs of every causal-LM model type the installed ``transformers`` ships.

:func:`tiny_config` starts from the type's default config and shrinks every
size it knows by field name (width 16, 2 layers, 2 heads, 1 key/value head,
head dimension 8, vocabulary 266, 64 positions, 4 experts of which 2 per
token) and gives every model that has a sliding window a window of
:data:`WINDOW` (smaller than the longest verification example, so the
window is exercised). Sub-configs (a multimodal model's text and vision
configs) are shrunk the same way. A type whose config cannot be shrunk or
whose model cannot be built on CPU is reported as such by the sweep
(``scripts/sweep_architectures.py``), never skipped silently.
"""

from __future__ import annotations

import dataclasses
from typing import Any

WINDOW = 4
VOCAB = 266
#: field name -> tiny value (applied where the config class has the field).
SIZES: dict[str, Any] = {
    **dict.fromkeys(
        ("vocab_size", "vocab_size_per_layer_input", "encoder_hash_byte_group_vocab"), VOCAB
    ),
    "hidden_size_per_layer_input": 8,
    **dict.fromkeys(
        (
            "hidden_size",
            "d_model",
            "n_embd",
            "embed_dim",
            "model_dim",
            "word_embed_proj_dim",
            "hidden_dim",
            "projection_dim",
            "text_hidden_size",
            "embedding_size",
        ),
        16,
    ),
    **dict.fromkeys(
        (
            "num_hidden_layers",
            "n_layer",
            "n_layers",
            "num_layers",
            "decoder_layers",
            "num_decoder_layers",
            "encoder_layers",
            "num_encoder_layers",
        ),
        2,
    ),
    **dict.fromkeys(
        (
            "num_attention_heads",
            "n_head",
            "n_heads",
            "decoder_attention_heads",
            "num_heads",
            "encoder_attention_heads",
        ),
        2,
    ),
    **dict.fromkeys(
        (
            "num_key_value_heads",
            "num_kv_heads",
            "n_kv_heads",
            "multi_query_group_num",
            "num_key_value_groups",
        ),
        1,
    ),
    **dict.fromkeys(("head_dim", "kv_channels", "d_kv", "attention_head_dim", "v_head_dim"), 8),
    **dict.fromkeys(
        (
            "intermediate_size",
            "ffn_dim",
            "decoder_ffn_dim",
            "encoder_ffn_dim",
            "n_inner",
            "ffn_hidden_size",
            "d_ff",
            "inner_hidden_size",
            "intermediate_size_mlp",
            "dim_ff",
        ),
        32,
    ),
    **dict.fromkeys(
        (
            "moe_intermediate_size",
            "expert_intermediate_size",
            "shared_expert_intermediate_size",
            "moe_shared_expert_intermediate_size",
            "expert_dim",
        ),
        16,
    ),
    **dict.fromkeys(
        (
            "max_position_embeddings",
            "n_positions",
            "max_seq_len",
            "n_ctx",
            "seq_length",
            "max_sequence_length",
            "max_target_positions",
            "max_source_positions",
        ),
        64,
    ),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), 4),
    **dict.fromkeys(
        ("num_experts_per_tok", "moe_topk", "num_experts_per_token", "moe_k", "top_k"), 2
    ),
    **dict.fromkeys(("n_shared_experts", "num_shared_experts", "moe_num_shared_experts"), 1),
    "n_group": 1,
    "topk_group": 1,
    "q_lora_rank": 8,
    "kv_lora_rank": 8,
    "qk_rope_head_dim": 4,
    "qk_nope_head_dim": 4,
    "first_k_dense_replace": 1,
    "index_n_heads": 2,
    "index_head_dim": 8,
    "index_topk": 8,
}
#: Starting configs of types whose default config fails its own validation.
ASSISTANT_TEXT = {
    "model_type": "gemma4_text",
    "hidden_size_per_layer_input": 0,
    "vocab_size_per_layer_input": 0,
    "enable_moe_block": False,
    "use_double_wide_mlp": False,
}
BASES: dict[str, dict[str, Any]] = {"gemma4_assistant": {"text_config": ASSISTANT_TEXT}}
ROPE = {"rope_type": "default", "rope_theta": 10000.0}
#: Per-type extras where the generic sizes break a config's own consistency checks.
MLA = {"num_key_value_heads": 2}
HYBRID = ["linear_attention", "full_attention"]
OVERRIDES: dict[str, dict[str, Any]] = {
    **{
        t: MLA
        for t in (
            "axk2",
            "deepseek_v2",
            "deepseek_v32",
            "glm4_moe_lite",
            "glm_moe_dsa",
            "longcat_flash",
        )
    },
    **{t: {"rotary_dim": 4} for t in ("codegen", "gptj")},
    "bamba": {"mamba_n_heads": 4, "mamba_d_head": 8, "mamba_d_state": 8, "attn_layer_indices": [1]},
    "granitemoehybrid": {
        "mamba_n_heads": 4,
        "mamba_d_head": 8,
        "mamba_d_state": 8,
        "layer_types": HYBRID,
    },
    "mamba2": {"num_heads": 4, "head_dim": 8, "state_size": 8, "n_groups": 1},
    "diffllama": {"num_key_value_heads": 2},
    "dots3_note_text": {"num_key_value_heads": 2},
    "dots3_note_vision_encoder": {
        "mlp_layer_types": ["dense"] * 2,
        **dict.fromkeys(("adapter_in_dim", "adapter_out_dim"), 16),
    },
    "dots3_note_audio_encoder": dict.fromkeys(("adapter_input_size", "adapter_out_dim"), 16),
    "gpt_neo": {"attention_types": [[["global", "local"], 1]], "window_size": WINDOW},
    "recurrent_gemma": {"block_types": ["recurrent", "attention"], "lru_width": 16},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1},
    # hybrids: one mixer layer and one attention layer (the default tiny depth has only one kind)
    "lfm2": {"layer_types": ["conv", "full_attention"], "conv_L_cache": 3},
    "qwen3_next": {"layer_types": HYBRID},
    **{t: {"text_config": {"layer_types": HYBRID}} for t in ("qwen3_5", "qwen3_5_moe")},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1},
    "falcon_h1": {"mamba_d_ssm": 32, "mamba_n_heads": 4, "mamba_d_state": 8, "mamba_chunk_size": 8},
    "nemotron_h": {
        "ssm_state_size": 8,
        "mamba_num_heads": 4,
        "mamba_head_dim": 8,
        "n_groups": 1,
        "chunk_size": 8,
    },
    "zaya": {"num_experts_per_tok": 1},
    "xmod": {"default_language": "en_XX"},
    "gemma3n_text": {"num_kv_shared_layers": 0},  # the default 15 of 35 layers
    # defaults that cannot build (or run) their own model
    "cohere_compass_text": {"rope_parameters": dict.fromkeys(("full_attention",), ROPE)},
    "dbrx": {"attn_config": {"rope_theta": ROPE["rope_theta"], "clip_qkv": 8.0}},  # None: crash
    "reformer": {"axial_pos_embds_dim": (8, 8), "axial_pos_shape": (8, 8)},
    **{t: {"layers_block_type": ["linear_attention", "hybrid"]} for t in ("zamba", "zamba2")},
    **{  # every layer reads the target model's keys and values
        t: {"text_config": ASSISTANT_TEXT | {"num_kv_shared_layers": 2}}
        for t in ("gemma4_assistant", "gemma4_unified_assistant")
    },
}
#: Window fields: set to WINDOW where the config has them (and their switches on).
WINDOWS = ("sliding_window", "attention_window_size", "window_size")
SWITCHES = {"use_sliding_window": True, "max_window_layers": 1}
#: Fields reset so the config derives them again for the tiny depth.
DERIVED = (
    "layer_types",
    "mlp_layer_types",
    "block_types",
    "layers_block_type",
    "per_layer_config",
    "activation_sparsity_pattern",
    "no_rope_layers",
    "moe_layers",
)


def _fields(cls: type) -> set[str]:
    names = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    for klass in cls.__mro__:
        names |= set(getattr(klass, "__annotations__", {}))
    return names | set(getattr(cls, "attribute_map", {}))


def tiny_options(cls: type, defaults: Any, window: bool = True) -> dict[str, Any]:
    """The overrides that make a config of class ``cls`` tiny (``defaults``: its default)."""
    names = _fields(cls)
    out = {k: v for k, v in SIZES.items() if k in names}
    if window:
        out |= {k: WINDOW for k in WINDOWS if k in names}
        out |= {k: v for k, v in SWITCHES.items() if k in names}
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    out |= {k: None for k in DERIVED if k in fields and getattr(defaults, k, None) is not None}
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"):
        value = getattr(defaults, name, None)
        if isinstance(value, int) and not 0 <= value < VOCAB:
            out[name] = {"bos_token_id": 0, "eos_token_id": 1}.get(name, 2)
        elif isinstance(value, list):
            out[name] = 1
    return out


def tiny_config(model_type: str, window: bool = True, **extra: Any) -> Any:
    """A tiny config of ``model_type`` (sub-configs shrunk too), ``extra`` applied last."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    defaults = cls(**BASES.get(model_type, {}))
    options = tiny_options(cls, defaults, window)
    for name, sub_cls in getattr(cls, "sub_configs", {}).items():
        sub = getattr(defaults, name, None)
        if sub is None or not hasattr(sub_cls, "__mro__") or sub_cls.__name__ == "AutoConfig":
            sub_cls = type(sub) if sub is not None else None
        if sub_cls is not None and sub is not None:
            kept = {k: v for k, v in sub.to_dict().items() if k not in DERIVED}
            kept |= {k: v for k, v in SIZES.items() if k in kept}  # blt's head_dim: no field
            options[name] = kept | tiny_options(sub_cls, sub, window)
            options[name] |= OVERRIDES.get(getattr(sub, "model_type", ""), {})
    if "kv_lora_rank" in _fields(cls):  # multi-head latent attention: keys of every head
        options["num_key_value_heads"] = options.get("num_attention_heads", 2)
    if "is_decoder" in _fields(cls):
        options["is_decoder"] = True  # the causal-LM use of an encoder-decoder family
    for key, value in (OVERRIDES.get(model_type, {}) | extra).items():
        both = isinstance(value, dict) and isinstance(options.get(key), dict)
        options[key] = options[key] | value if both else value  # a sub-config: merged
    config = AutoConfig.for_model(model_type, **options)
    return _causal_part(model_type, config)


def _causal_part(model_type: str, config: Any) -> Any:
    """The sub-config the type's causal-LM class takes (musicgen: its decoder), else ``config``."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    lm = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type, ""), None)
    wanted = getattr(lm, "config_class", None)
    if wanted is None or isinstance(config, wanted):
        return config
    subs = (getattr(config, name, None) for name in getattr(type(config), "sub_configs", {}))
    return next((sub for sub in subs if isinstance(sub, wanted)), config)


__all__ = ["OVERRIDES", "SIZES", "VOCAB", "WINDOW", "tiny_config", "tiny_options"]


def tree_model(config: Any, attn: str) -> Any:
    """``config``'s causal LM in float64 (seed 0, eager experts) for the tree check on
    ``attn``: built on sdpa or eager, with ``exactpack_tree*`` installed on top of eager."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        config,
        attn_implementation="sdpa" if attn == "sdpa" else "eager",
        dtype=torch.float64,
        experts_implementation="eager",
    ).eval()
    if attn.startswith("exactpack_tree"):
        model.set_attn_implementation(attn)
    return model
