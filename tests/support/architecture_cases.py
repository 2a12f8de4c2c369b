"""The architecture matrix: tiny random configs of transformers model types, and what to expect.

Each case is a model type with a tiny config (width 16, 2-4 layers, window 4
where the architecture has one, vocabulary 266) built inside the tests; it
is either ``exact`` on the listed attention implementations (packed ==
separate within the tolerance of its real dtype path) or ``refused`` up front
with the layer kind that would mix examples. ``tests/integration/test_architectures.py``
asserts it; ``tests/gen_architectures.py`` writes the table of
``docs/transformers.md`` from the same cases.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Every tiny config starts from these (model-specific names are added per case).
BASE = {
    "vocab_size": 266,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 8,
    "max_position_embeddings": 64,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 2,
}
WINDOW = 4
MOE = {"num_local_experts": 4, "num_experts_per_tok": 2}
#: The implementations every standard decoder is checked on.
STANDARD = ("eager", "sdpa", "exactpack_varlen")


@dataclass(frozen=True)
class Case:
    """One row of the matrix.

    ``attns``: implementations checked (``exact`` cases must pass every one);
    ``refused``: the layer kind named by the refusal (``None``: exact); ``restarts``: its
    mixers restart per example (the naive control, no ``seq_idx``, must fail);
    ``flex``: also compare a FlexAttention forward on CPU (float32, no grad).
    """

    name: str
    model_type: str
    options: dict[str, Any] = field(default_factory=dict)
    attns: tuple[str, ...] = STANDARD
    refused: str | None = None
    flex: bool = False
    note: str = ""
    drop: tuple[str, ...] = ()  # base keys this config derives itself
    tiny: bool = False  # start from architecture_tiny.tiny_config (every size shrunk)
    restarts: bool = False  # mixers that carry state along the row, restarted per example

    @property
    def windowed(self) -> bool:
        return "sliding_window" in self.options


def sliding(**extra: Any) -> dict[str, Any]:
    return {"sliding_window": WINDOW, **extra}


CASES: tuple[Case, ...] = (
    Case("llama", "llama", flex=True),
    Case("mistral (window 4)", "mistral", sliding(), flex=True),
    Case("mixtral (MoE)", "mixtral", MOE),
    Case("mixtral (MoE, window 4)", "mixtral", sliding(**MOE)),
    Case("qwen2", "qwen2"),
    Case(
        "qwen2 (window 4 on layer 1)",
        "qwen2",
        sliding(use_sliding_window=True, max_window_layers=1),
        flex=True,
    ),
    Case(
        "qwen3 (window 4 on layer 1)",
        "qwen3",
        sliding(use_sliding_window=True, max_window_layers=1),
    ),
    Case(
        "qwen3_moe",
        "qwen3_moe",
        {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16},
    ),
    Case("phi", "phi", {"partial_rotary_factor": 0.5}),
    Case("phi3 (window 4)", "phi3", sliding(original_max_position_embeddings=64)),
    Case("olmo2", "olmo2"),
    Case("olmo3 (sliding/full layers)", "olmo3", sliding(num_hidden_layers=4)),
    Case("gpt_neox", "gpt_neox", {"rotary_pct": 0.5}),
    Case("granite", "granite"),
    Case("starcoder2 (window 4)", "starcoder2", sliding()),
    Case(
        "smollm3 (sliding NoPE layers)",
        "smollm3",
        sliding(use_sliding_window=True, no_rope_layer_interval=2),
    ),
    Case("gpt2", "gpt2", {"n_embd": 16, "n_layer": 2, "n_head": 2, "n_positions": 64}),
    Case("opt", "opt", {"ffn_dim": 32, "word_embed_proj_dim": 16}),
    Case(
        "falcon (rotary)",
        "falcon",
        {"alibi": False, "num_kv_heads": 1},
        drop=("head_dim",),
        attns=("eager", "sdpa"),
        note="transformers' falcon takes no registered attention function",
    ),
    Case("gemma", "gemma"),
    Case(
        "gemma2 (sliding/full layers)",
        "gemma2",
        sliding(attn_logit_softcapping=None),
        attns=("eager", "exactpack_varlen"),
        note="transformers has no sdpa for gemma2",
    ),
    Case(
        "gemma2 (soft-capped logits)",
        "gemma2",
        sliding(),
        attns=("eager",),
        note="exactpack_varlen refuses soft-capping",
    ),
    Case(
        "gemma3_text (sliding/full layers)",
        "gemma3_text",
        sliding(sliding_window_pattern=2),
        flex=True,
    ),
    Case(
        "cohere2 (sliding/full layers)",
        "cohere2",
        sliding(layer_types=["sliding_attention", "full_attention"]),
    ),
    Case(
        "gpt_oss (MoE, sinks, sliding/full layers)",
        "gpt_oss",
        sliding(**MOE),
        attns=("eager",),
        note="transformers has no sdpa for gpt_oss; exactpack_varlen refuses sinks",
    ),
    Case("ministral (sliding layers)", "ministral", sliding()),
    Case(
        "exaone4 (sliding/full layers)",
        "exaone4",
        sliding(sliding_window_pattern=2, num_hidden_layers=2),
    ),
    Case(
        "falcon (ALiBi, rows <= 256 columns)",
        "falcon",
        {"alibi": True, "num_kv_heads": 1},
        attns=("eager", "sdpa"),
        drop=("head_dim",),
        note="exact while rows <= 256 columns (bfloat16 ALiBi); falcon has no attention interface",
    ),
    Case(
        "llama4_text (chunked attention by each example's positions, NoPE layer)",
        "llama4_text",
        {
            "attention_chunk_size": 4,
            "num_local_experts": 2,
            "intermediate_size_mlp": 32,
            "no_rope_layers": [1, 0],
            "floor_scale": 32,
        },
        attns=("eager", "sdpa"),
        note="exact while rows < floor_scale; exactpack_varlen refuses chunked layers",
    ),
    Case("moshi (window in its config, none in its code)", "moshi", tiny=True),
    Case("roberta (positions from padding_idx + 1)", "roberta", tiny=True),
    Case("codegen (no pad_token_id)", "codegen", {"pad_token_id": None}, tiny=True),
    Case("laguna (float32 softplus gate)", "laguna", tiny=True),
    Case("minimax_m2 (float32 sigmoid router)", "minimax_m2", tiny=True),
    Case(
        "roformer (frozen sinusoidal rotary table)",
        "roformer",
        tiny=True,
        attns=("eager",),
        note="no sdpa in transformers; its attention takes no registered function",
    ),
    Case("lfm2 (no conv layers)", "lfm2", {"layer_types": ["full_attention"] * 2}, tiny=True),
    Case(
        "deepseek_v32 (indexer, examples <= index_topk)",
        "deepseek_v32",
        {"index_topk": 12},
        tiny=True,
        attns=("eager", "sdpa"),
        note="exact while every example <= index_topk; exactpack_varlen refuses the indexer",
    ),
    Case(
        "mpt (ALiBi, relative)",
        "mpt",
        {"d_model": 16, "n_heads": 2, "n_layers": 2, "expansion_ratio": 2, "max_seq_len": 64},
        attns=("eager",),
    ),
    Case("gemma3n_text (padding off its zero embedding row)", "gemma3n_text", tiny=True),
    Case("gemma4_text (per-layer input embeddings)", "gemma4_text", tiny=True),
    Case("xmod (its default language's adapters)", "xmod", tiny=True),
    # Hybrids: mixers that carry state along the row restart per example (exactpack.hf.mixers).
    Case(
        "lfm2 (short convolutions, restarted)",
        "lfm2",
        {"layer_types": ["conv", "full_attention"], "conv_L_cache": 3},
        restarts=True,
    ),
    Case("mamba (selective scan, restarted)", "mamba", tiny=True, attns=("eager",), restarts=True),
    Case(
        "bamba (Mamba-2 hybrid, restarted)",
        "bamba",
        {"attn_layer_indices": [1]},
        tiny=True,
        restarts=True,
    ),
    Case(
        "qwen3_next (gated delta rule, restarted)",
        "qwen3_next",
        {
            "layer_types": ["linear_attention", "full_attention"],
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 16,
            "shared_expert_intermediate_size": 16,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 2,
            "linear_key_head_dim": 8,
            "linear_value_head_dim": 8,
        },
        restarts=True,
    ),
    Case(
        "jamba (Mamba hybrid, restarted)",
        "jamba",
        {
            "attn_layer_period": 2,
            "attn_layer_offset": 1,
            "expert_layer_period": 2,
            "expert_layer_offset": 1,
            "num_experts": 2,
            "mamba_d_state": 4,
            "mamba_dt_rank": 4,
            "mamba_expand": 2,
            "use_mamba_kernels": False,
        },
        restarts=True,
    ),
    # Refused up front: the named layer kind mixes examples.
    Case(
        "openai-gpt (its own mask from a 2-D padding mask)",
        "openai-gpt",
        tiny=True,
        attns=("eager",),
        refused="attention",
    ),
    Case("bart (decoder positions from columns)", "bart", tiny=True, refused="positions"),
    Case("cpmant (positions from columns)", "cpmant", tiny=True, refused="positions"),
    Case("xlstm (recurrence)", "xlstm", tiny=True, refused="linear attention"),
    Case(
        "recurrent_gemma (width-4 convolution)",
        "recurrent_gemma",
        tiny=True,
        refused="convolution",
    ),
    Case(
        "bert (is_decoder=False: bidirectional)",
        "bert",
        {"is_decoder": False},
        tiny=True,
        refused="attention",
    ),
    Case(
        "bloom (ALiBi)", "bloom", {"n_layer": 2, "n_head": 2}, attns=("eager",), refused="attention"
    ),
)


def build(case: Case, attn: str, dtype: Any = None, seed: int = 0) -> Any:
    """The case's tiny model on ``attn`` (float64 by default), seeded, eval mode, grads on."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    import exactpack.hf.attention_impl  # noqa: F401  (registers exactpack_varlen)

    dtype = dtype or torch.float64
    if case.tiny:
        from support.architecture_tiny import tiny_config

        config = tiny_config(case.model_type, **case.options)
    else:
        base = {k: v for k, v in BASE.items() if k not in case.drop}
        config = AutoConfig.for_model(case.model_type, **(base | case.options))
    torch.manual_seed(seed)
    options = {"experts_implementation": "eager"} if dtype == torch.float64 else {}
    model = AutoModelForCausalLM.from_config(
        config, attn_implementation=attn, dtype=dtype, **options
    )
    return model.eval()


def run(case: Case, attn: str, mode: str = "adapter", **verify_options: Any) -> dict[str, Any]:
    """``verify_hf`` of the case on ``attn`` with the default examples for its window."""
    dtype = verify_options.pop("dtype", None)
    return verify_default(build(case, attn, dtype), mode=mode, **verify_options)


def verify_default(model: Any, **verify_options: Any) -> dict[str, Any]:
    """``verify_hf`` of ``model`` on the default examples for its window and conditions."""
    from exactpack.hf.capabilities import capability
    from exactpack.verify.models import verification_examples, verification_layout, verify_hf

    config = model.config.get_text_config()
    arch = capability(model)
    limits = [c.limit for c in arch.conditions if c.what == "example"]
    layout = verification_layout(
        arch.window,
        getattr(config, "max_position_embeddings", None),
        max_example=min(limits) if limits else None,
    )
    examples = verification_examples(config.vocab_size, 0, layout=layout)
    return verify_hf(model, examples, max_length=layout.capacity, **verify_options)


__all__ = ["BASE", "CASES", "STANDARD", "WINDOW", "Case", "build", "run", "verify_default"]
