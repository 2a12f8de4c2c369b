"""The text corpus of the user-path benchmarks: Python standard-library source, and a BPE.

    .venv/bin/python benchmarks/corpus.py --megabytes 100      # writes .cache/bench/...

:func:`stdlib_texts` reads every ``*.py`` of the standard library in the
sorted walk of :func:`workloads.stdlib_files` (W3's files; about 31 MB on
Python 3.11). :func:`write_corpus` writes JSON Lines ``{"id", "text"}`` of a
requested size by repeating that list (each repetition gets new ids), so a
10 GB corpus is the same text 320 times. :func:`train_tokenizer` trains a
byte-level BPE (8,192 ids, ``<s>`` ... ``</s>`` around every document) on
the files once and caches it; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from workloads import stdlib_files

CACHE = Path(__file__).resolve().parents[1] / ".cache" / "bench"
VOCAB = 8192


def stdlib_texts() -> list[tuple[str, str]]:
    """(relative path, text) of every standard-library source file, in W3's order."""
    files = stdlib_files()
    root = os.path.commonpath(files)
    out = []
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            out.append((os.path.relpath(path, root), f.read()))
    return out


def write_corpus(path: Path, megabytes: float) -> dict:
    """JSON Lines of stdlib files, repeated until ``megabytes`` MB of text; returns counts."""
    texts = stdlib_texts()
    target = int(megabytes * 1e6)
    written = docs = 0
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    with tmp.open("w", encoding="utf-8") as f:
        rep = 0
        while written < target:
            for name, text in texts:
                f.write(json.dumps({"id": f"{rep}/{name}", "text": text}) + "\n")
                written += len(text.encode("utf-8"))
                docs += 1
                if written >= target:
                    break
            rep += 1
    os.replace(tmp, path)
    return {"path": str(path), "documents": docs, "text_bytes": written}


def corpus(megabytes: float) -> Path:
    """The cached corpus of ``megabytes`` MB (written on first use)."""
    path = CACHE / f"stdlib-{megabytes:g}MB.jsonl"
    if not path.exists():
        write_corpus(path, megabytes)
    return path


def train_tokenizer(path: Path | None = None) -> Path:
    """A byte-level BPE trained on the standard library, saved as ``tokenizer.json``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    path = path or CACHE / "stdlib-bpe" / "tokenizer.json"
    if path.exists():
        return path
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((text for _, text in stdlib_texts()), trainer=trainer)
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", bos), ("</s>", eos)]
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=20)
    parser.add_argument("--out", type=Path, help="write the corpus here (default: the cache)")
    args = parser.parse_args()
    print("tokenizer:", train_tokenizer())
    if args.out is not None:
        print(json.dumps(write_corpus(args.out, args.megabytes)))
    else:
        print("corpus:", corpus(args.megabytes))


if __name__ == "__main__":
    main()
