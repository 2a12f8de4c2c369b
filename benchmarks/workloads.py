"""The benchmark workloads W1-W3, generated exactly as DESIGN.md specifies, and a text corpus.

Lengths are int64 arrays of tokens per example; each workload's sha256
prefix is checked so numbers compare with the reference runs. The text
corpus is W3's files as documents, with a byte-level BPE trained on them
here (:func:`train_bpe`; no downloads), for the text -> packed paths.
"""

from __future__ import annotations

import hashlib
import math
import os
import sysconfig
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Workload:
    name: str
    lengths: np.ndarray  # int64 [n]
    capacity: int

    @property
    def tokens(self) -> int:
        return int(self.lengths.sum())

    @property
    def lower_bound(self) -> int:
        return -(-self.tokens // self.capacity)

    @property
    def sha(self) -> str:
        return digest(self.lengths)


def digest(lengths: np.ndarray) -> str:
    return hashlib.sha256(lengths.astype("<i8").tobytes()).hexdigest()[:16]


def w1_sft() -> Workload:
    rng = np.random.default_rng(20240601)
    mu = math.log(350) - 0.5
    lengths = np.clip(np.rint(rng.lognormal(mu, 1.0, 200_000)), 8, 4096).astype(np.int64)
    return Workload("W1 sft", lengths, 4096)


def w2_short() -> Workload:
    lengths = np.random.default_rng(20240602).integers(16, 513, size=1_000_000).astype(np.int64)
    return Workload("W2 short", lengths, 2048)


def stdlib_files() -> list[str]:
    """Every ``*.py`` under the stdlib, sorted walk, skipping site-/dist-packages."""
    root = sysconfig.get_paths()["stdlib"]
    out = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "dist-packages"))
        out.extend(os.path.join(folder, f) for f in sorted(files) if f.endswith(".py"))
    return out


def stdlib_texts(min_bytes: int = 0, max_bytes: int | None = None) -> list[tuple[str, str]]:
    """``(path relative to the stdlib, source text)`` of W3's files in W3's order, whose
    UTF-8 size is within ``[min_bytes, max_bytes]`` (undecodable bytes replaced)."""
    root = sysconfig.get_paths()["stdlib"]
    out = []
    for path in stdlib_files():
        size = os.path.getsize(path)
        if size >= min_bytes and (max_bytes is None or size <= max_bytes):
            with open(path, encoding="utf-8", errors="replace") as f:
                out.append((os.path.relpath(path, root), f.read()))
    return out


def train_bpe(texts: Iterable[str], vocab_size: int, path: Path) -> Path:
    """A byte-level BPE ``tokenizers`` model trained on ``texts``, saved as ``path``.

    Every encoding is ``[<s>=0, ..., </s>=1]`` (a template post-processor), as
    a model's own tokenizer adds BOS/EOS.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 1)]
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def w3_real(limit: int = 8192) -> Workload:
    lengths = np.array([os.path.getsize(p) + 2 for p in stdlib_files()], dtype=np.int64)
    return Workload("W3 real", lengths[lengths <= limit], limit)


EXPECTED_SHA = {"W1 sft": "635b65bb03693f60", "W2 short": "1343900eef594bcc"}


def all_workloads() -> list[Workload]:
    out = [w1_sft(), w2_short(), w3_real()]
    for w in out:
        want = EXPECTED_SHA.get(w.name)
        if want is not None and w.sha != want:
            raise SystemExit(f"{w.name}: lengths sha {w.sha} != reference {want}")
    return out


if __name__ == "__main__":
    for w in all_workloads():
        print(
            f"{w.name}: n={w.lengths.size} tokens={w.tokens}"
            f" lower_bound={w.lower_bound} sha={w.sha}"
        )
