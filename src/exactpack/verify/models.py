"""Prove that a ``transformers`` causal LM honours packing, or show where it leaks.

:func:`verify_hf` runs the same examples twice with the same parameters:

    separate  each example alone, ``model(input_ids (1, L), use_cache=False)``
    packed    all of them packed next-fit into rows of ``capacity`` (one call)

and compares every vocabulary logit at every real cell, the token-weighted loss (raw
NLL sum over eligible targets / their count, :mod:`exactpack.core.loss`, in the model's
dtype) and every parameter-gradient coordinate of that loss. The packed call is fed
as ``mode`` says:

``adapter``    :func:`exactpack.hf.adapter.hf_inputs` with the model's config; the
               model's own loss from its ``labels``/``shift_labels`` is checked too
``naive``      ``input_ids`` and ``position_ids`` only, default settings (a cache
               exists, so the row attends across examples)
``bool-mask``  **boolean** 4-D block masks, ``use_cache=False``: right on ``sdpa``,
               silently wrong on ``eager``

A refused architecture or a crash inside the model (:class:`ModelCrashed`) is ``exactpack
verify`` exit 2; exit 1 means the model mixed examples, the report's ``hint`` naming the
first divergent layer (:mod:`exactpack.verify.diagnose`). Tolerances follow the model's real
dtype path (:mod:`exactpack.verify.tolerances`); ``model_loss`` always gets float32's.
"""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from exactpack.core.batch import PackedBatch
from exactpack.core.binding import Binding
from exactpack.core.compact import pack_examples
from exactpack.core.config import PackConfig
from exactpack.core.errors import FOREIGN, BudgetExceeded, InvalidInput, NotAvailable, foreign
from exactpack.core.examples import SequenceExample
from exactpack.core.loss import masked_nll_sum
from exactpack.hf.adapter import IMPLEMENTATIONS, build_inputs, cell_logits, hf_loss_sum
from exactpack.hf.architectures import Architecture
from exactpack.hf.capabilities import architecture_of, capability
from exactpack.hf.kinds import MASK_KINDS, attention_kind
from exactpack.hf.mixers import restart_mixers
from exactpack.io.tokenizers import MAX_TOKENIZER_FILE
from exactpack.verify.diagnose import (
    ModelCrashed,
    culprit,
    example_tokens,
    guarded,
    hint,
    run_alone,
)
from exactpack.verify.tolerances import FLOAT32_TOLERANCE, compare, grad_vector, observe, tolerance

MODES = ("adapter", "naive", "bool-mask")
DTYPES = {"float64": torch.float64, "float32": torch.float32}
#: Prediction pairs of the default verification examples (no window), and their row width.
LENGTHS = (6, 3, 8, 4, 5, 2)
CAPACITY = 12
#: Targets of example 2 left out of the loss (a prompt), so ``-100`` labels are exercised.
PROMPT_TARGETS = 3
MAX_WIDTH = 1024  # the widest default row
PICKLED = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
#: The most token ids a verification draws (every example, or every tree sequence, and
#: one row's width): its forward and backward passes run on one machine.
MAX_VERIFY_TOKENS = 1 << 20
#: What a model built for verification may take (parameters x dtype bytes, estimated from
#: its config before anything is built) unless ``max_model_bytes=`` says otherwise.
DEFAULT_MAX_MODEL_BYTES = 2 << 30
#: More layers than any released model: a config past it is refused before the meta build
#: (a module per layer; a million took minutes and gigabytes before any weight).
MAX_LAYERS = 1024
#: Parameter counts and layer counts by the names configs use for them.
_WIDTH = ("hidden_size", "d_model", "n_embd", "dim")
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")


@dataclass(frozen=True)
class VerifyCase:
    """Lengths (prediction pairs) of the examples, the row width, and the window they test."""

    lengths: tuple[int, ...]
    capacity: int
    window: int | None = None

    @property
    def window_exercised(self) -> bool:
        """True when some example is longer than the window (or there is none)."""
        return self.window is None or max(self.lengths) > self.window


def verification_layout(
    window: int | None = None,
    max_positions: int | None = None,
    lengths: tuple[int, ...] | None = None,
    capacity: int | None = None,
    max_example: int | None = None,
) -> VerifyCase:
    """The examples' lengths and row width for a model with ``window`` and ``max_positions``.

    Without a window :data:`LENGTHS` at capacity 12 (rows ``[6, 3 | 3 pad]``, ``[8, 4]``,
    ``[5, 2 | 5 pad]``). With window ``w`` the longest example has ``2w + 3`` pairs (capped
    to the row the model holds, at most :data:`MAX_WIDTH`) and shares its row; a window
    too long for that keeps the default (not exercised). ``lengths``: the user's own, the
    row width their sum where it fits. ``max_example``: caps the default lengths.
    """
    limit = MAX_WIDTH if max_positions is None else min(int(max_positions), MAX_WIDTH)
    if lengths is not None:
        if not lengths or min(lengths) < 1:
            raise InvalidInput(f"--lengths {list(lengths)}: give positive prediction-pair counts")
        check_verify_tokens(sum(n + 1 for n in lengths), "--lengths")
        if max_positions is not None and max(lengths) > max_positions:
            raise InvalidInput(
                f"--lengths: an example of {max(lengths):,} pairs is longer than the model's"
                f" max_position_embeddings {max_positions:,} — give shorter --lengths"
            )
        width = capacity or min(sum(lengths), max(limit, max(lengths)))
        layout = VerifyCase(tuple(int(n) for n in lengths), int(width), window)
    elif window is None or window >= limit - 3:
        layout = VerifyCase(LENGTHS, capacity or CAPACITY, window)
    else:
        long = min(2 * window + 3, limit - 3)
        mid = min(window + 1, long - 1)
        layout = VerifyCase((long, 3, mid, long - mid, 5, 2), capacity or long + 3, window)
    if lengths is None and max_example is not None and max(layout.lengths) > max_example:
        capped = tuple(min(n, max_example) for n in layout.lengths)
        layout = VerifyCase(capped, layout.capacity, window)
    check_verify_tokens(layout.capacity, "--max-length")
    if max(layout.lengths) > layout.capacity:
        raise InvalidInput(
            f"an example of {max(layout.lengths)} pairs does not fit rows of {layout.capacity}"
            " — raise --max-length"
        )
    if max_positions is not None and layout.capacity > max_positions:
        raise InvalidInput(
            f"the model has max_position_embeddings {max_positions}; the verification packs"
            f" rows of {layout.capacity} positions — use a config with at least"
            f" {layout.capacity}, or pass --lengths/--capacity that fit"
        )
    return layout


def check_verify_tokens(tokens: int, flag: str) -> None:
    """Refuse a verification of more than :data:`MAX_VERIFY_TOKENS` ids before any is drawn."""
    if tokens > MAX_VERIFY_TOKENS:
        raise BudgetExceeded(
            f"{flag} asks for {tokens:,} tokens; a verification runs at most"
            f" {MAX_VERIFY_TOKENS:,} through the model (separately and packed) — give"
            " fewer or shorter examples: a few hundred tokens exercise every mask"
        )


def verification_examples(
    vocab_size: int,
    seed: int,
    max_positions: int | None = None,
    *,
    layout: VerifyCase | None = None,
) -> list[SequenceExample]:
    """Examples of random ids with ``layout``'s lengths; example 2 has a 3-target prompt."""
    layout = layout or verification_layout(None, max_positions)
    check_verify_tokens(sum(n + 1 for n in layout.lengths), "--lengths")
    if max_positions is not None and layout.capacity > max_positions:
        verification_layout(layout.window, max_positions, layout.lengths, layout.capacity)
    rng = np.random.default_rng(seed)
    binding = Binding(vocab_size, "exactpack/verify-random-ids", f"verify-seed-{seed}")
    out = []
    for i, length in enumerate(layout.lengths):
        prompt = min(PROMPT_TARGETS, length - 1)
        mask = np.arange(length) >= prompt if i == 2 and prompt > 0 else None
        tokens = rng.integers(0, vocab_size, size=length + 1)
        out.append(
            SequenceExample.from_document(
                tokens, source_id=f"random-{i}", partition="train", binding=binding, loss_mask=mask
            )
        )
    return out


def check_available(attn_implementation: str, device: torch.device) -> None:
    """Raise :class:`NotAvailable` when ``attn_implementation`` cannot be verified here."""
    if attn_implementation not in IMPLEMENTATIONS:
        raise InvalidInput(
            f"--attn {attn_implementation!r} is not a transformers attention implementation"
            f" exactpack can feed; choose one of {', '.join(IMPLEMENTATIONS)}"
        )
    if device.type == "cuda" and not torch.cuda.is_available():
        raise NotAvailable("--device cuda: no CUDA device is available here — use --device cpu")
    if attn_implementation == "flex_attention" and device.type == "cpu":
        raise NotAvailable(
            f"flex_attention cannot run the verification on CPU: FlexAttention has no backward"
            f" there (torch {torch.__version__}) — run with --device cuda on a GPU machine, or"
            " verify --attn sdpa (or exactpack_varlen) here"
        )
    if attn_implementation == "flash_attention_2":
        from transformers.utils import is_flash_attn_2_available

        if device.type != "cuda" or not is_flash_attn_2_available():
            raise NotAvailable(
                "flash_attention_2 needs a CUDA device and the flash-attn package"
                f" (device {device.type}, flash-attn"
                f" {'present' if is_flash_attn_2_available() else 'missing'}) — run with"
                " --device cuda where flash-attn is installed, or verify --attn sdpa here"
            )
    if attn_implementation == "exactpack_varlen":
        from exactpack.hf.attention_impl import register

        register()


def load_model(
    *,
    config: str | Path | None = None,
    model: str | Path | None = None,
    attn_implementation: str = "sdpa",
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
    device: str | torch.device = "cpu",
    refuse: bool = True,
    max_model_bytes: int | None = DEFAULT_MAX_MODEL_BYTES,
) -> torch.nn.Module:
    """A causal LM from a local config (seeded random weights) or a local pretrained dir.

    Nothing is downloaded and no folder's own code runs; ``eval()``, the model's own
    trainable set kept; float64 MoE experts run ``"eager"``. With ``refuse`` an
    architecture exactpack cannot make exact is refused from its config, before any weights.
    The config file is read under the tokenizer files' size limit, and a model whose
    parameters x ``dtype`` bytes (estimated from the config) or whose weight files exceed
    ``max_model_bytes`` (None: no limit), or with more than :data:`MAX_LAYERS` layers, is
    refused before it is built.
    """
    if (config is None) == (model is None):
        raise InvalidInput("pass exactly one of config= (a config file or dir) or model= (a dir)")
    device = torch.device(device)
    check_available(attn_implementation, device)
    path = Path(config if config is not None else model)
    if not path.exists():
        raise InvalidInput(f"{path} does not exist — pass a local config.json or model folder")
    from transformers import AutoConfig, AutoModelForCausalLM

    options: dict[str, Any] = {"attn_implementation": attn_implementation, "dtype": dtype}
    options["trust_remote_code"] = False  # an unset one asks on stdin
    if dtype == torch.float64:
        options["experts_implementation"] = "eager"
    local = {"local_files_only": True, "trust_remote_code": False}
    check_config_files(path)
    cfg = _built(path, lambda: AutoConfig.from_pretrained(str(path), **local))
    check_model_size(cfg, dtype, max_model_bytes, path, weights=model is not None)
    if refuse:  # the config's capability, from its modules built on the meta device
        capability(cfg).check(attention_kind(attn_implementation))
    auto = AutoModelForCausalLM
    if config is not None:
        torch.manual_seed(seed)
        build = functools.partial(auto.from_config, cfg, **options)
    else:  # safetensors only: a pickled checkpoint can run code on load
        _refuse_pickled_weights(path)
        build = functools.partial(
            auto.from_pretrained, str(path), local_files_only=True, use_safetensors=True, **options
        )
    return _built(path, build).to(device).eval()


def check_config_files(path: Path) -> None:
    """Refuse a config that is not a regular file within the tokenizer files' limit
    (:data:`~exactpack.io.tokenizers.MAX_TOKENIZER_FILE`) before transformers reads it."""
    files = [path / "config.json"] if path.is_dir() else [path]
    for file in files:
        try:
            info = os.stat(file)
        except FileNotFoundError:
            continue  # transformers names what is missing
        if not stat.S_ISREG(info.st_mode):
            raise InvalidInput(
                f"{file} is not a regular file — pass a config.json or a model folder holding one"
            )
        if info.st_size > MAX_TOKENIZER_FILE:
            raise InvalidInput(
                f"{file} holds {info.st_size:,} bytes, more than the {MAX_TOKENIZER_FILE:,} a"
                " config file may hold — it is not a transformers config; pass the model's"
                " config.json"
            )


def _config_int(cfg: Any, names: Sequence[str], default: int = 0) -> int:
    """The first of ``names`` that ``cfg`` sets to a positive int, else ``default``."""
    for name in names:
        try:  # some configs raise for a per-layer attribute read globally (gemma4's head_dim)
            value = getattr(cfg, name, None)
        except Exception:
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return default


def parameter_estimate(cfg: Any) -> int:
    """About how many parameters ``cfg``'s decoder holds, from its sizes alone: embeddings
    (and an untied head), then per layer attention (q, k, v, o), a gated MLP (times its
    experts) and norms. Python ints: a config's absurd sizes give an absurd count, never
    an overflow."""
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    width = _config_int(text, _WIDTH)
    heads = _config_int(text, ("num_attention_heads", "n_head"), 1)
    kv_heads = _config_int(text, ("num_key_value_heads",), heads)
    head_dim = _config_int(text, ("head_dim",), max(width // heads, 1))
    inner = _config_int(text, ("intermediate_size", "ffn_dim", "n_inner", "d_ff"), 4 * width)
    experts = _config_int(text, ("num_local_experts", "num_experts", "n_routed_experts"), 1)
    if experts > 1:
        inner = _config_int(text, ("moe_intermediate_size",), inner) * experts
    attention = 2 * width * heads * head_dim + 2 * width * kv_heads * head_dim
    layer = attention + 3 * width * inner + 2 * width
    heads_out = 1 if getattr(text, "tie_word_embeddings", True) else 2
    return _config_int(text, ("vocab_size",)) * width * heads_out + layer_count(cfg) * layer


def layer_count(cfg: Any) -> int:
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return _config_int(text, _LAYERS)


def check_model_size(
    cfg: Any, dtype: torch.dtype, max_bytes: int | None, path: Path, weights: bool = False
) -> None:
    """Refuse ``cfg``'s model before it is built: more than :data:`MAX_LAYERS` layers, or
    more than ``max_bytes`` (None: no limit) of parameters in ``dtype`` by
    :func:`parameter_estimate` or (``weights``) of ``.safetensors`` files in ``path``."""
    layers = layer_count(cfg)
    if layers > MAX_LAYERS:
        raise InvalidInput(
            f"{path}: the config has {layers:,} layers, more than the {MAX_LAYERS:,} any"
            " model has — it is damaged or not a model to verify; fix num_hidden_layers"
        )
    if max_bytes is None:
        return
    need = parameter_estimate(cfg) * dtype.itemsize
    if weights and path.is_dir():
        need = max(need, sum(f.stat().st_size for f in path.glob("*.safetensors")))
    if need > max_bytes:
        raise BudgetExceeded(
            f"{path}: the model needs about {need:,} bytes ({layers:,} layers, in"
            f" {str(dtype).removeprefix('torch.')}) but max_model_bytes is {max_bytes:,} —"
            " verify a smaller config of the same architecture (fewer layers, a narrower"
            " width), or raise --max-model-bytes"
        )


def _built(path: Path, build: Callable[[], Any]) -> Any:
    """``build()``, its errors turned into one :class:`InvalidInput` line naming ``path``."""
    with foreign(f"cannot build a causal LM from {path}", kinds=(*FOREIGN, KeyError, TypeError)):
        return build()


def _refuse_pickled_weights(folder: Path) -> None:
    """Refuse a model folder whose weights are only pickles (unpickling can run code)."""
    if not folder.is_dir() or any(folder.glob("*.safetensors")):
        return
    pickled = sorted(p.name for p in folder.iterdir() if p.suffix.lower() in PICKLED)
    if pickled:
        raise InvalidInput(
            f"{folder} holds pickled weights ({pickled[0]}) and no .safetensors file; exactpack"
            " never unpickles a model (it can run code) — save the model with"
            " save_pretrained(..., safe_serialization=True) or pass --hf-config"
        )


def packed_kwargs(
    batch: PackedBatch,
    mode: str,
    attn_implementation: str,
    dtype: torch.dtype,
    device: torch.device,
    pad_token_id: int = 0,
    arch: Architecture | None = None,
) -> dict[str, Any]:
    """What ``mode`` feeds the model for ``batch`` (see the module docstring)."""
    if mode == "adapter":
        return build_inputs(
            batch, attn_implementation, arch, dtype=dtype, device=device, pad_token_id=pad_token_id
        )
    if mode == "bool-mask":
        if attn_implementation not in ("eager", "sdpa"):
            raise InvalidInput("--mode bool-mask feeds 4-D masks: use --attn eager or sdpa")
        # The sdpa form (boolean) handed to whichever implementation runs: the control.
        return build_inputs(
            batch, "sdpa", arch, mask="bool", device=device, pad_token_id=pad_token_id, labels=False
        )
    ids = np.where(batch.input_valid, batch.inputs, pad_token_id).astype(np.int64)
    return {
        "input_ids": torch.as_tensor(ids, device=device),
        "position_ids": torch.as_tensor(batch.position_ids(), device=device),
    }


def _params(model: torch.nn.Module) -> list[torch.Tensor]:
    """The model's own trainable set (roformer's sinusoidal table stays frozen)."""
    return [p for p in model.parameters() if p.requires_grad]


def reference_implementation(model: torch.nn.Module, attn: str) -> str:
    """The implementation the separate runs use: ``attn`` when it is the model's own (sdpa,
    eager, flex), else the model's sdpa, or its eager where it has no sdpa."""
    kind = attention_kind(attn) if isinstance(attn, str) else None
    if kind in MASK_KINDS:
        return attn
    return "sdpa" if getattr(model, "_supports_sdpa", False) else "eager"


@contextmanager
def running(model: torch.nn.Module, attn: str) -> Iterator[None]:
    """Run ``model`` on ``attn`` inside the block, back to its own implementation after."""
    previous = model.config._attn_implementation
    if attn != previous:
        model.set_attn_implementation(attn)
    try:
        yield
    finally:
        if attn != previous:
            model.set_attn_implementation(previous)


def observed(model: torch.nn.Module, tokens: np.ndarray, backward: bool = True) -> tuple:
    """``(islands, casts)`` (:func:`~exactpack.verify.tolerances.observe`) of one forward (and
    backward) of ``tokens`` alone through a float64 model; ``({}, [])`` for any other dtype.
    A flex model is observed on ``sdpa`` (dispatch modes cannot follow FlexAttention).
    """
    if next(model.parameters()).dtype != torch.float64:
        return {}, []

    def run() -> None:
        logits = run_alone(model, tokens).logits
        if backward:
            logits.sum().backward()

    flex = model.config._attn_implementation == "flex_attention"
    with running(model, "sdpa") if flex else nullcontext():
        found = observe(run)
    model.zero_grad(set_to_none=True)
    return found


def _prepare(model: torch.nn.Module, mode: str, allow_unsupported: bool) -> Architecture:
    if mode not in MODES:
        raise InvalidInput(f"--mode {mode!r} is not one of {', '.join(MODES)}")
    arch = architecture_of(model)
    if mode == "adapter" and not allow_unsupported:
        arch.check(attention_kind(model.config._attn_implementation))
    experts = getattr(model.config, "_experts_implementation", None)
    if next(model.parameters()).dtype == torch.float64 and experts == "grouped_mm":
        model.set_experts_implementation("eager")  # grouped_mm has no float64 kernel
    if arch.mixers:  # restarted on the packed calls that carry seq_idx (not naive ones)
        restart_mixers(model)
    return arch


def verify_hf(
    model: torch.nn.Module,
    examples: Sequence[SequenceExample],
    *,
    mode: str = "adapter",
    max_length: int | None = None,
    pad_token_id: int | None = None,
    gradients: bool = True,
    allow_unsupported: bool = False,
) -> dict[str, Any]:
    """Separate vs packed for a ``transformers`` causal LM; a report dict with ``pass``.

    ``max_length``: the row width (default :data:`CAPACITY`, or the longest example + 3).
    ``gradients=False`` compares logits and losses only. ``allow_unsupported`` runs a
    refused architecture anyway, to measure its leak (``"supported": False``, never passes).
    """
    if not examples:
        raise InvalidInput("verify_hf needs at least one example")
    arch = _prepare(model, mode, allow_unsupported)
    with nullcontext() if gradients else torch.no_grad():
        report, kwargs, batch, tol = _compare(
            model, arch, examples, mode, max_length, pad_token_id, gradients
        )
    if not gradients:
        report["note"] = "gradients not compared (no backward for this implementation here)"
    report["pass"] = not any(report["failures"].values()) and arch.refusal is None
    # the model's own loss alone disagreeing is how it reads labels, not a leak
    report["mixed"] = any(n for k, n in report["failures"].items() if k != "model_loss")
    if any(report["failures"].values()) and not report["mixed"]:
        report["hint"] = (
            f"packed == separate (logits, loss and gradients agree), but {type(model).__name__}"
            " computes its own loss without transformers' ForCausalLMLoss (it does not read"
            " labels / shift_labels as causal LMs do) — train it with"
            " exactpack.hf.hf_loss(logits, batch), not the model's loss"
        )
    elif report["mixed"]:
        attn = model.config._attn_implementation
        found = culprit(model, examples, kwargs, batch, attn, tol)
        report["first_divergence"] = found
        report["hint"] = hint(mode, attn, found)
    elif arch.refusal is not None:
        report["hint"] = f"unsupported: {arch.refusal}"
    return report


def _packed_forward(model: torch.nn.Module, kwargs: dict[str, Any], mode: str) -> Any:
    """``model(**kwargs)``; where only its own loss crashes, the logits with a NaN loss."""
    try:
        return guarded(model, "forward", lambda: model(**kwargs))
    except ModelCrashed:
        if mode != "adapter":
            raise
    unlabelled = {k: v for k, v in kwargs.items() if k not in ("labels", "shift_labels")}
    out = guarded(model, "forward", lambda: model(**unlabelled))
    out.loss = torch.full((1,), torch.nan)
    return out


def _compare(
    model: torch.nn.Module,
    arch: Architecture,
    examples: Sequence[SequenceExample],
    mode: str,
    capacity: int | None,
    pad_token_id: int | None,
    gradients: bool,
) -> tuple[dict[str, Any], dict[str, Any], PackedBatch, dict[str, Any]]:
    """The report's comparisons, and what the diagnosis reruns: kwargs, batch, tolerance."""
    attn = model.config._attn_implementation
    param = next(model.parameters())
    pad = pad_token_id if pad_token_id is not None else getattr(model.config, "pad_token_id", None)
    vocab = examples[0].binding.vocab_size  # codegen, cpmant: no pad id at all
    pad = int(pad) if isinstance(pad, int) and 0 <= pad < vocab else 0
    longest = max(len(ex) for ex in examples)
    capacity = capacity or (CAPACITY if longest <= CAPACITY else longest + 3)
    eligible = sum(int(ex.loss_mask.sum()) for ex in examples)
    reference = reference_implementation(model, attn)
    with running(model, reference):
        islands, _ = guarded(
            model, "forward", lambda: observed(model, examples[0].inputs, gradients)
        )
        sep_logits, total = guarded(model, "forward", lambda: _separate(model, examples))
    tol = tolerance(param.dtype, islands)
    first = examples[0]
    config = PackConfig(capacity, len(examples))
    (batch,) = pack_examples(first.partition, examples, first.binding, config).batches
    kwargs = packed_kwargs(batch, mode, attn, param.dtype, param.device, pad, arch)
    out = _packed_forward(model, kwargs, mode)
    sep_mean, packed_mean = total / eligible, hf_loss_sum(out.logits, batch).sum / eligible
    cells = example_tokens(batch, flattened=False).to(param.device)
    flat = cell_logits(out.logits, batch).reshape(-1, out.logits.shape[-1])
    compared = {
        "logits": compare(sep_logits, flat.index_select(0, cells), tol),
        "loss": compare(sep_mean.reshape(1), packed_mean.reshape(1), tol),
    }
    if gradients:
        params = _params(model)
        sep_grads = guarded(model, "backward", lambda: grad_vector(sep_mean, params))
        packed_grads = guarded(model, "backward", lambda: grad_vector(packed_mean, params))
        compared["gradients"] = compare(sep_grads, packed_grads, tol)
    (atol, rtol), why = FLOAT32_TOLERANCE, "transformers computes its loss in float32"
    f32 = {"abs": atol, "rel": rtol, "why": why}
    if mode == "adapter":
        compared["model_loss"] = compare(sep_mean.reshape(1), out.loss.reshape(1), f32)
    report = _report(model, arch, batch, examples, mode, capacity, eligible, tol, compared)
    report["reference"] = reference
    report["loss"] = {"separate": float(sep_mean.detach()), "packed": float(packed_mean.detach())}
    if mode == "adapter":
        report["tolerance"]["model_loss"] = f32
    return report, kwargs, batch, tol


def _separate(
    model: torch.nn.Module, examples: Sequence[SequenceExample]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of every example run alone, concatenated ``(Σl, V)``, and their loss sum."""
    logits, total = [], 0
    for ex in examples:
        out = run_alone(model, ex.inputs).logits[0]  # (L, V)
        logits.append(out)
        total = total + masked_nll_sum(out, ex.targets, ex.loss_mask).sum
    return torch.cat(logits), total


def _report(
    model: torch.nn.Module,
    arch: Architecture,
    batch: PackedBatch,
    examples: Sequence[SequenceExample],
    mode: str,
    capacity: int,
    eligible: int,
    tol: dict[str, Any],
    compared: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    lengths = [len(ex) for ex in examples]
    return {
        "target": "transformers",
        "model": model_facts(model),
        "architecture": {
            "layer_types": list(arch.mask_types),
            "windows": {k or "all": v for k, v in arch.windows.items()},
            "window_exercised": arch.window is None or max(lengths) > arch.window,
            "supported": arch.refusal is None,
            "refusal": arch.refusal,
            "positions": arch.positions,
            "position_offset": arch.position_offset,
            "conditions": [c.text() for c in arch.conditions],
            "verdict": arch.verdict,
        },
        "mode": mode,
        "examples": len(examples),
        "lengths": lengths,
        "rows": batch.shape[0],
        "capacity": capacity,
        "targets": sum(lengths),
        "eligible_targets": eligible,
        "tolerance": dict(tol),
        **tally(compared),
    }


def model_facts(model: torch.nn.Module) -> dict[str, Any]:
    """The report's ``model`` section: type, class, trainable parameters, dtype, attention."""
    param = next(model.parameters())
    return {
        "model_type": getattr(model.config, "model_type", type(model).__name__),
        "class": type(model).__name__,
        "parameters": sum(p.numel() for p in _params(model)),
        "dtype": str(param.dtype).removeprefix("torch."),
        "attn_implementation": model.config._attn_implementation,
        "device": str(param.device),
    }


def tally(compared: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``max_abs_diff``, ``comparisons`` and ``failures``, each per compared quantity."""
    keys = ("max_abs_diff", "comparisons", "failures")
    return {key: {name: c[key] for name, c in compared.items()} for key in keys}


__all__ = ["ModelCrashed", "load_model", "verification_examples", "verify_hf"]
