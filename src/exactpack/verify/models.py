"""Prove that a ``transformers`` causal LM honours packing, or show where it leaks.

:func:`verify_hf` runs the same examples twice with the same parameters:

    separate  each example alone, ``model(input_ids (1, L), use_cache=False)``
    packed    all of them packed next-fit into rows of ``capacity`` (one call)

An example is a group of one; groups of sequences that share prefixes (DPO pairs, GRPO
groups, :func:`tree_groups`) are tree-packed instead, each sequence compared as an example.

and compares every vocabulary logit at every real cell, the token-weighted loss (raw
NLL sum over eligible targets / their count, :mod:`exactpack.core.loss`, in the model's
dtype) and every parameter-gradient coordinate of that loss. The packed call is fed
as ``mode`` says:

``adapter``    :func:`exactpack.hf.adapter.hf_inputs` with the model's config; the
               model's own loss from its ``labels``/``shift_labels`` is checked too
``naive``      ``input_ids`` and ``position_ids`` only, default settings (a cache
               exists, so the row attends across examples); tree rows: each trie one
               causal sequence with column positions (siblings see each other)
``bool-mask``  **boolean** 4-D block masks, ``use_cache=False``: right on ``sdpa``,
               silently wrong on ``eager``

A refused architecture or a crash inside the model (:class:`ModelCrashed`) is ``exactpack
verify`` exit 2; exit 1 means the model mixed examples, the report's ``hint`` naming the
first divergent layer (:mod:`exactpack.verify.diagnose`). Tolerances follow the model's real
dtype path (:mod:`exactpack.verify.tolerances`); ``model_loss`` always gets float32's.
"""

from __future__ import annotations

import dataclasses
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

from exactpack.core.batch import Occurrences, PackedBatch
from exactpack.core.binding import Binding
from exactpack.core.compact import pack_examples
from exactpack.core.config import PackConfig
from exactpack.core.errors import FOREIGN, BudgetExceeded, InvalidInput, NotAvailable, foreign
from exactpack.core.examples import SequenceExample
from exactpack.core.tree import SequenceGroups, pack_tree
from exactpack.hf.adapter import IMPLEMENTATIONS, build_inputs, cell_logits, hf_loss_sum
from exactpack.hf.architectures import Architecture
from exactpack.hf.capabilities import capability
from exactpack.hf.kinds import MASK_KINDS, attention_kind, tree_kind
from exactpack.hf.mixers import restart_mixers
from exactpack.io.tokenizers import MAX_TOKENIZER_FILE
from exactpack.nn.logprobs import sequence_cells, sequence_logprobs
from exactpack.verify.diagnose import (
    ModelCrashed,
    culprit,
    guarded,
    hint,
    run_alone,
)
from exactpack.verify.layouts import separate
from exactpack.verify.tolerances import (
    Float64Islands,
    compare,
    grad_vector,
    observe,
    tally,
    tolerance,
)

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
#: Config fields that bound a row's positions (mpt's ALiBi table, big_bird's embeddings).
POSITION_FIELDS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")
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
            f" {layout.capacity}, or pass --lengths/--max-length that fit"
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
    """Examples of random ids with ``layout``'s lengths (default: :func:`verification_layout`
    for ``max_positions``, which checks it); example 2 has a 3-target prompt."""
    layout = layout or verification_layout(None, max_positions)
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


def tree_groups(
    spec: list[tuple[int, tuple[int, ...]]],
    vocab_size: int,
    seed: int,
    max_positions: int | None = None,
) -> SequenceGroups:
    """Random-id groups of ``spec`` (``[(prompt, (completion, ...)), ...]`` token counts);
    each completion after the first repeats 0-2 of the previous one's first tokens (the
    second always one). Refused before any id is drawn: more than :data:`MAX_VERIFY_TOKENS`
    ids, or a sequence longer than ``max_positions``."""
    check_verify_tokens(sum(p + sum(comps) for p, comps in spec), "--tree-lengths")
    longest = max(p + max(comps) - 1 for p, comps in spec)  # pairs: tokens - 1
    if max_positions is not None and longest > max_positions:
        raise InvalidInput(
            f"a sequence of {longest:,} pairs is longer than the model's"
            f" max_position_embeddings {max_positions:,} — shorten --tree-lengths"
        )
    rng = np.random.default_rng(seed)
    prompts, completions = [], []
    for prompt_len, lens in spec:
        prompts.append(rng.integers(0, vocab_size, prompt_len))
        comps = [rng.integers(0, vocab_size, n) for n in lens]
        for j in range(1, len(comps)):
            share = 1 if j == 1 else int(rng.integers(0, 3))
            share = min(share, len(comps[j]) - 1, len(comps[j - 1]))
            comps[j][:share] = comps[j - 1][:share]
        completions.append(comps)
    binding = Binding(vocab_size, "exactpack/verify-random-ids", f"verify-tree-seed-{seed}")
    return SequenceGroups.from_prompt_completions(prompts, completions, binding)


def _check_available(attn_implementation: str, device: torch.device) -> None:
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
    _check_available(attn_implementation, device)
    path = Path(config if config is not None else model)
    if not path.exists():
        raise InvalidInput(f"{path} does not exist — pass a local config.json or model folder")
    from transformers import AutoConfig, AutoModelForCausalLM

    # an unset trust_remote_code asks on stdin
    options: dict[str, Any] = {"attn_implementation": attn_implementation, "dtype": dtype}
    options["trust_remote_code"] = False
    if dtype == torch.float64:
        options["experts_implementation"] = "eager"
    local = {"local_files_only": True, "trust_remote_code": False}
    _check_config_files(path)
    cfg = _built(path, lambda: AutoConfig.from_pretrained(str(path), **local))
    _check_model_size(cfg, dtype, max_model_bytes, path, weights=model is not None)
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


def _check_config_files(path: Path) -> None:
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


def _parameter_estimate(text: Any, layers: int) -> int:
    """About how many parameters ``cfg``'s decoder holds, from its sizes alone: embeddings
    (and an untied head), then per layer attention (q, k, v, o), a gated MLP (times its
    experts) and norms. Python ints: a config's absurd sizes give an absurd count, never
    an overflow."""
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
    return _config_int(text, ("vocab_size",)) * width * heads_out + layers * layer


def _check_model_size(
    cfg: Any, dtype: torch.dtype, max_bytes: int | None, path: Path, weights: bool = False
) -> None:
    """Refuse ``cfg``'s model before it is built: more than :data:`MAX_LAYERS` layers, or
    more than ``max_bytes`` (None: no limit) of parameters in ``dtype`` by
    :func:`_parameter_estimate` or (``weights``) of ``.safetensors`` files in ``path``."""
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    layers = _config_int(text, _LAYERS)
    if layers > MAX_LAYERS:
        raise InvalidInput(
            f"{path}: the config has {layers:,} layers, more than the {MAX_LAYERS:,} any"
            " model has — it is damaged or not a model to verify; fix num_hidden_layers"
        )
    if max_bytes is None:
        return
    need = _parameter_estimate(text, layers) * dtype.itemsize
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


def _packed_kwargs(
    batch: PackedBatch, mode: str, attn: str, param: torch.Tensor, pad: int | None, arch: Any
) -> dict:
    """What ``mode`` feeds the model for ``batch`` (see the module docstring), on the
    dtype and device of the model's parameter ``param``, padding cells ``pad`` (0 where it
    is no id of the vocabulary: codegen, cpmant have no pad id at all)."""
    device = param.device
    pad = int(pad) if isinstance(pad, int) and 0 <= pad < batch.binding.vocab_size else 0
    if mode == "naive" and batch.is_tree:  # siblings see each other
        mode, batch = "adapter", _naive_batch(batch)
    if mode == "adapter":
        return build_inputs(batch, attn, arch, dtype=param.dtype, device=device, pad_token_id=pad)
    if mode == "bool-mask":
        if attn not in ("eager", "sdpa"):
            raise InvalidInput("--mode bool-mask feeds 4-D masks: use --attn eager or sdpa")
        # The sdpa form (boolean) handed to whichever implementation runs: the control.
        return build_inputs(
            batch, "sdpa", arch, mask="bool", device=device, pad_token_id=pad, labels=False
        )
    ids = np.where(batch.input_valid, batch.inputs, pad).astype(np.int64)
    return {
        "input_ids": torch.as_tensor(ids, device=device),
        "position_ids": torch.as_tensor(batch.position_ids(), device=device),
    }


def _naive_batch(batch: PackedBatch) -> PackedBatch:
    """Each root's subtree as one flat causal sequence: positions count columns (the control)."""
    occ = batch.occurrences
    roots = np.flatnonzero(batch.node_parent < 0)  # type: ignore[operator]
    root_of = roots[np.searchsorted(roots, np.arange(len(occ)), side="right") - 1]
    nodes = batch.segments.astype(np.int64)
    cell_root = np.where(batch.input_valid, root_of[np.maximum(nodes, 0)], -1)
    rank = np.searchsorted(roots, np.maximum(cell_root, 0))
    cols = np.arange(batch.shape[1])[None, :]
    positions = np.where(batch.input_valid, cols - occ.col_start[np.maximum(cell_root, 0)], 0)
    ends = np.zeros(roots.shape[0], dtype=np.int64)
    np.add.at(ends, np.searchsorted(roots, root_of), occ.lengths)
    picked = {f.name: getattr(occ, f.name)[roots] for f in dataclasses.fields(occ)}
    picked |= {
        "col_end": occ.col_start[roots] + ends,
        "segment": np.arange(roots.shape[0], dtype=np.int32),
    }
    return dataclasses.replace(
        batch,
        segments=np.where(batch.input_valid, rank, -1).astype(np.int32),
        node_ends=np.where(batch.input_valid, rank + 1, -1).astype(np.int32),
        positions=positions.astype(np.int32),
        occurrences=Occurrences(**picked),
        node_parent=np.full(roots.shape[0], -1, dtype=np.int64),
    )


def _params(model: torch.nn.Module) -> list[torch.Tensor]:
    """The model's own trainable set (roformer's sinusoidal table stays frozen)."""
    return [p for p in model.parameters() if p.requires_grad]


def _reference_implementation(model: torch.nn.Module, attn: str) -> str:
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


def _prepare(
    model: torch.nn.Module, mode: str, allow_unsupported: bool, tree: bool
) -> Architecture:
    modes = MODES[:2] if tree else MODES
    if mode not in modes:
        rows = " for tree rows (--tree-lengths)" if tree else ""
        raise InvalidInput(f"--mode {mode!r} is not one of {', '.join(modes)}{rows}")
    arch = capability(model)
    if not allow_unsupported and (tree or mode == "adapter"):  # tree naive feeds hf inputs too
        attn = model.config._attn_implementation
        arch.check(tree_kind(attn) if tree else attention_kind(attn), tree=tree)
    experts = getattr(model.config, "_experts_implementation", None)
    if next(model.parameters()).dtype == torch.float64 and experts == "grouped_mm":
        model.set_experts_implementation("eager")  # grouped_mm has no float64 kernel
    if arch.mixers:  # restarted on the packed calls that carry seq_idx (not naive ones)
        restart_mixers(model)
    return arch


def verify_hf(
    model: torch.nn.Module,
    examples: Sequence[SequenceExample] | SequenceGroups,
    *,
    mode: str = "adapter",
    max_length: int | None = None,
    pad_token_id: int | None = None,
    gradients: bool = True,
    allow_unsupported: bool = False,
) -> dict[str, Any]:
    """Separate vs packed for a ``transformers`` causal LM; a report dict with ``pass``.

    ``examples``: flat examples (each a group of one) packed next-fit, or
    :class:`~exactpack.core.tree.SequenceGroups` tree-packed (the report's ``layout`` is
    ``"tree"``; each sequence's supervised log-probability sum is compared too, and every
    run is inside :class:`~exactpack.verify.tolerances.Float64Islands`, the report's
    ``widened`` naming the casts it kept). ``max_length``: the row width (default
    :data:`CAPACITY`, or the longest example + 3; for groups, every trie in one row).
    ``gradients=False`` compares logits and losses only. ``allow_unsupported`` runs a
    refused architecture anyway, to measure its leak (``"supported": False``, never passes).
    """
    tree = isinstance(examples, SequenceGroups)
    if not len(examples):
        raise InvalidInput("verify_hf needs at least one example")
    arch = _prepare(model, mode, allow_unsupported, tree)
    with nullcontext() if gradients else torch.no_grad():
        report, kwargs, batch, tol = _compare(
            model, arch, examples, mode, max_length, pad_token_id, gradients
        )
    if not gradients:
        report["note"] = "gradients not compared (no backward for this implementation here)"
    report["pass"] = not any(report["failures"].values()) and arch.refusal is None
    # the model's own loss alone disagreeing is how it reads labels, not a leak
    report["mixed"] = any(n for k, n in report["failures"].items() if k != "model_loss")
    attn = model.config._attn_implementation
    if any(report["failures"].values()) and not report["mixed"]:
        report["hint"] = (
            f"packed == separate (logits, loss and gradients agree), but {type(model).__name__}"
            " computes its own loss without transformers' ForCausalLMLoss (it does not read"
            " labels / shift_labels as causal LMs do) — train it with"
            " exactpack.hf.hf_loss(logits, batch), not the model's loss"
        )
    elif report["mixed"] and tree:
        report["hint"] = (
            "the naive layout lets siblings see each other and restarts no branch positions"
            if mode == "naive"
            else f"{attn} mixed the branches of a trie: report this architecture"
        )
    elif report["mixed"]:
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
        if mode != "adapter" or "labels" not in kwargs:
            raise
    unlabelled = {k: v for k, v in kwargs.items() if k not in ("labels", "shift_labels")}
    out = guarded(model, "forward", lambda: model(**unlabelled))
    out.loss = torch.full((1,), torch.nan)
    return out


def _pack(
    model: torch.nn.Module,
    examples: Sequence[SequenceExample] | SequenceGroups,
    capacity: int | None,
) -> tuple[PackedBatch, int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """One model call of ``examples`` in rows of ``capacity`` (default: see
    :func:`verify_hf`), and each sequence's ``(inputs, targets, loss_mask)`` in the order
    of its packed cells (:func:`~exactpack.nn.logprobs.sequence_cells`)."""
    if isinstance(examples, SequenceGroups):
        lengths = examples.lengths
        if capacity is None:  # all tries in one row plus padding, within the model's positions
            text = model.config.get_text_config()
            limit = next((getattr(text, f) for f in POSITION_FIELDS if hasattr(text, f)), None)
            capacity = max(min(int(lengths.sum()) + 2, limit or 1 << 62), int(lengths.max()))
        (batch,) = pack_tree(examples, capacity).batches
        seqs = [examples.sequence(i) for i in batch.seq_index.tolist()]
        masks = [examples.pair_mask(np.array([i])) for i in batch.seq_index.tolist()]
        return batch, capacity, [(s[:-1], s[1:], m) for s, m in zip(seqs, masks, strict=True)]
    longest = max(len(ex) for ex in examples)
    capacity = capacity or (CAPACITY if longest <= CAPACITY else longest + 3)
    first = examples[0]
    config = PackConfig(capacity, len(examples))
    (batch,) = pack_examples(first.partition, examples, first.binding, config).batches
    stored = [examples[i] for i in batch.occurrences.ordinal.tolist()]
    return batch, capacity, [(ex.inputs, ex.targets, ex.loss_mask) for ex in stored]


def _compare(
    model: torch.nn.Module,
    arch: Architecture,
    examples: Sequence[SequenceExample] | SequenceGroups,
    mode: str,
    capacity: int | None,
    pad_token_id: int | None,
    gradients: bool,
) -> tuple[dict[str, Any], dict[str, Any], PackedBatch, dict[str, Any]]:
    """The report's comparisons, and what the diagnosis reruns: kwargs, batch, tolerance."""
    tree = isinstance(examples, SequenceGroups)
    attn = model.config._attn_implementation
    param = next(model.parameters())
    batch, capacity, seqs = _pack(model, examples, capacity)
    pad = pad_token_id if pad_token_id is not None else getattr(model.config, "pad_token_id", None)
    reference = _reference_implementation(model, attn)
    with running(model, reference):
        islands, widened = guarded(model, "forward", lambda: observed(model, seqs[0][0], gradients))
    with Float64Islands() if tree else nullcontext():
        with running(model, reference):
            if tree:  # what stays below float64 inside the islands
                islands, _ = observed(model, seqs[0][0], gradients)
            sep_logits, sep_sums, eligible = guarded(
                model, "forward", lambda: separate(lambda x: run_alone(model, x).logits[0], seqs)
            )
        tol = tolerance(param.dtype, islands)
        kwargs = _packed_kwargs(batch, mode, attn, param, pad, arch)
        out = _packed_forward(model, kwargs, mode)
        logits = cell_logits(out.logits, batch)  # (R, T, V)
        sep_mean = -sep_sums.sum() / eligible
        packed_mean = hf_loss_sum(logits, batch).sum / eligible
        cells = torch.as_tensor(sequence_cells(batch)[0], device=param.device)
        compared = {"logits": compare(sep_logits, logits.flatten(0, 1).index_select(0, cells), tol)}
        if tree:
            compared["sequence_logprobs"] = compare(sep_sums, sequence_logprobs(logits, batch), tol)
        compared["loss"] = compare(sep_mean.reshape(1), packed_mean.reshape(1), tol)
        if gradients:
            params = _params(model)
            sep_grads = guarded(model, "backward", lambda: grad_vector(sep_mean, params))
            packed_grads = guarded(model, "backward", lambda: grad_vector(packed_mean, params))
            compared["gradients"] = compare(sep_grads, packed_grads, tol)
    f32 = tolerance(torch.float32) | {"why": "transformers computes its loss in float32"}
    if "labels" in kwargs:
        compared["model_loss"] = compare(sep_mean.reshape(1), out.loss.reshape(1), f32)
    lengths = examples.lengths.tolist() if tree else [len(ex) for ex in examples]
    report = {
        "target": "transformers",
        "model": _model_facts(model),
        "architecture": _architecture_facts(arch, lengths),
        "mode": mode,
        "examples": len(lengths),
        "lengths": lengths,
        "rows": batch.shape[0],
        "capacity": capacity,
        "targets": sum(lengths),
        "eligible_targets": eligible,
        "tolerance": dict(tol) | ({"model_loss": f32} if "labels" in kwargs else {}),
        **tally(compared),
        "reference": reference,
        "loss": {"separate": float(sep_mean.detach()), "packed": float(packed_mean.detach())},
    }
    if tree:  # groups of sequences sharing prefixes (flat: groups of one)
        report |= {
            "layout": "tree",
            "groups": int(np.unique(examples.group).shape[0]),
            "sequences": len(lengths),
            "nodes": len(batch.occurrences),
            "tokens_stored": batch.tokens_stored,
            "tokens_flat": batch.tokens_flat,
            "widened": widened,
        }
    return report, kwargs, batch, tol


def _model_facts(model: torch.nn.Module) -> dict[str, Any]:
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


def _architecture_facts(arch: Architecture, lengths: list[int]) -> dict[str, Any]:
    """The report's ``architecture`` section, for examples of ``lengths``."""
    return {
        "layer_types": list(arch.mask_types),
        "windows": {k or "all": v for k, v in arch.windows.items()},
        "window_exercised": arch.window is None or max(lengths) > arch.window,
        "supported": arch.refusal is None,
        "refusal": arch.refusal,
        "positions": arch.positions,
        "position_offset": arch.position_offset,
        "conditions": [c.text() for c in arch.conditions],
        "verdict": arch.verdict,
    }


__all__ = ["ModelCrashed", "load_model", "tree_groups", "verification_examples", "verify_hf"]
