"""Models and examples for ``seqpack verify``: a local causal LM and row shapes that test it.

:func:`load_model` builds a ``transformers`` causal LM from a local config
(seeded random weights) or a local pretrained folder, never downloading.
In float64 it runs MoE experts with ``experts_implementation="eager"``
(``torch._grouped_mm`` has no float64 kernel), which computes the same
experts one by one.

:func:`verification_layout` picks the examples' lengths and the row width.
Without a window: :data:`LENGTHS` at capacity 12 (rows ``[6, 3 | 3 pad]``,
``[8, 4]`` exact, ``[5, 2 | 5 pad]``). With the model's window ``w``, the
longest example has ``2w + 3`` pairs (capped to the row the model can hold,
at most :data:`MAX_WIDTH`), so every sliding layer truncates real queries,
and it shares its row with a short one; a window too long for that row
keeps the small default and the report says the window was not exercised
(``--lengths`` can exercise it). ``--lengths`` gives a user's own
shapes; the row width defaults to their sum (one shared row) where it fits.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seqpack.core.binding import Binding
from seqpack.core.errors import InvalidInput, NotAvailable
from seqpack.core.examples import SequenceExample
from seqpack.hf.adapter import IMPLEMENTATIONS
from seqpack.hf.capability import capability
from seqpack.hf.kinds import attention_kind

DTYPES = {"float64": torch.float64, "float32": torch.float32}
#: Prediction pairs of the default verification examples (no window).
LENGTHS = (6, 3, 8, 4, 5, 2)
CAPACITY = 12
#: Targets of example 2 left out of the loss (a prompt), so ``-100`` labels are exercised.
PROMPT_TARGETS = 3
#: The widest default row: windows longer than about half of it are not exercised by default.
MAX_WIDTH = 1024


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

    ``max_example``: the longest example the model is exact for (a stated
    condition such as ``index_topk``); default lengths are capped to it.
    """
    limit = MAX_WIDTH if max_positions is None else min(int(max_positions), MAX_WIDTH)
    if lengths is not None:
        if not lengths or min(lengths) < 1:
            raise InvalidInput(f"--lengths {list(lengths)}: give positive prediction-pair counts")
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


def verification_examples(
    vocab_size: int,
    seed: int,
    max_positions: int | None = None,
    *,
    layout: VerifyCase | None = None,
) -> list[SequenceExample]:
    """Examples of random ids with ``layout``'s lengths; example 2 has a 3-target prompt."""
    layout = layout or verification_layout(None, max_positions)
    if max_positions is not None and layout.capacity > max_positions:
        verification_layout(layout.window, max_positions, layout.lengths, layout.capacity)
    rng = np.random.default_rng(seed)
    binding = Binding(vocab_size, "seqpack/verify-random-ids", f"verify-seed-{seed}")
    out = []
    for i, length in enumerate(layout.lengths):
        prompt = min(PROMPT_TARGETS, length - 1)
        mask = np.arange(length) >= prompt if i == 2 and prompt > 0 else None
        out.append(
            SequenceExample.from_document(
                rng.integers(0, vocab_size, size=length + 1),
                source_id=f"random-{i}",
                partition="train",
                binding=binding,
                loss_mask=mask,
            )
        )
    return out


def check_available(attn_implementation: str, device: torch.device) -> None:
    """Raise :class:`NotAvailable` when ``attn_implementation`` cannot be verified here."""
    if attn_implementation not in IMPLEMENTATIONS:
        raise InvalidInput(
            f"--attn {attn_implementation!r} is not a transformers attention implementation"
            f" seqpack can feed; choose one of {', '.join(IMPLEMENTATIONS)}"
        )
    if device.type == "cuda" and not torch.cuda.is_available():
        raise NotAvailable("--device cuda: no CUDA device is available here — use --device cpu")
    if attn_implementation == "flex_attention" and device.type == "cpu":
        raise NotAvailable(
            f"flex_attention cannot run the verification on CPU: FlexAttention has no backward"
            f" there (torch {torch.__version__}) — run with --device cuda on a GPU machine, or"
            " verify --attn sdpa (or seqpack_varlen) here"
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
    if attn_implementation == "seqpack_varlen":
        from seqpack.hf.attention_impl import register

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
) -> torch.nn.Module:
    """A causal LM from a local config (seeded random weights) or a local pretrained dir.

    Nothing is downloaded (``local_files_only=True``). Dropout is turned off
    (``eval()``); the model's own trainable set is kept (a frozen sinusoidal
    position table stays frozen). With ``refuse`` an
    architecture seqpack cannot make exact is refused from its config,
    before any weights are built or loaded.
    """
    if (config is None) == (model is None):
        raise InvalidInput("pass exactly one of config= (a config file or dir) or model= (a dir)")
    device = torch.device(device)
    check_available(attn_implementation, device)
    path = Path(config if config is not None else model)
    if not path.exists():
        raise InvalidInput(f"{path} does not exist — pass a local config.json or model folder")
    from transformers import AutoConfig, AutoModelForCausalLM

    # MoE experts: grouped_mm has no float64 kernel; eager runs the same experts one by one.
    options = {
        "attn_implementation": attn_implementation,
        "dtype": dtype,
        "trust_remote_code": False,
    }
    if dtype == torch.float64:
        options["experts_implementation"] = "eager"
    # trust_remote_code=False: never run a folder's own Python code (an auto_map) and
    # never ask about it on stdin, which transformers does when it is unset
    cfg = _built(
        path,
        lambda: AutoConfig.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=False
        ),
    )
    if refuse:  # the config's capability, from its modules built on the meta device
        capability(cfg).check(attention_kind(attn_implementation))
    if config is not None:
        torch.manual_seed(seed)
        built = _built(path, lambda: AutoModelForCausalLM.from_config(cfg, **options))
    else:
        _refuse_pickled_weights(path)
        # safetensors only: a pickled checkpoint (pytorch_model.bin) can run code on load
        built = _built(
            path,
            lambda: AutoModelForCausalLM.from_pretrained(
                str(path), local_files_only=True, use_safetensors=True, **options
            ),
        )
    return built.to(device).eval()


def _built(path: Path, build: Any) -> Any:
    """``build()``, its errors turned into one :class:`InvalidInput` line naming ``path``."""
    try:
        return build()
    except (OSError, ValueError, KeyError, TypeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InvalidInput(f"cannot build a causal LM from {path}: {first}") from err


PICKLED = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


def _refuse_pickled_weights(folder: Path) -> None:
    """Refuse a model folder whose weights are only pickles (unpickling can run code)."""
    if not folder.is_dir() or any(folder.glob("*.safetensors")):
        return
    pickled = sorted(p.name for p in folder.iterdir() if p.suffix.lower() in PICKLED)
    if pickled:
        raise InvalidInput(
            f"{folder} holds pickled weights ({pickled[0]}) and no .safetensors file; seqpack"
            " never unpickles a model (it can run code) — save the model with"
            " save_pretrained(..., safe_serialization=True) or pass --hf-config"
        )
