"""Chat SFT data to packed rows: exactpack against TRL 1.16's own preparation, in one run.

    nice -n 10 .venv/bin/python benchmarks/bench_sft.py              # 20,000 chats
    .venv/bin/python benchmarks/bench_sft.py --chats 2000            # a quick look

What a user runs, each in a fresh process (peak RSS = its ``ru_maxrss``):

- exactpack: ``pack_dataset(ds, 4096, format="trl", tokenizer=tok,
  assistant_only_loss=True)`` on an
  in-memory ``datasets.Dataset`` of ``messages`` (rendered with the folder's
  chat template, assistant-only loss, packed best-fit-decreasing);
- TRL: ``SFTTrainer(model, SFTConfig(assistant_only_loss=True, packing=True,
  max_length=4096, padding_free=True), train_dataset=ds, processing_class=tok)``,
  whose constructor tokenizes, builds the labels and packs (bfd).

The tokenizer (and TRL's tiny model) are loaded before the clock starts.

Both see the same conversations and the same tokenizer folder: a byte-level
BPE trained on the standard library (:mod:`corpus`) with chat tokens and a
ChatML-like template whose assistant turns sit in ``{% generation %}``
markers. The conversations are paragraphs of standard-library source as
user and assistant turns (2 to 6 turns, deterministic). Both outputs are
checked to hold the same tokens and the same number of supervised targets.
Ratios are TRL seconds / exactpack seconds in this run; the load average is
printed with the table. One thread for torch (the tokenizers use all cores
in both).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from corpus import CACHE, stdlib_texts, train_tokenizer

MAX_LENGTH = 4096
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}<|end|>{% endgeneration %}"
    "{% else %}{{ m['content'] }}<|end|>{% endif %}\n{% endfor %}"
)


def chat_folder() -> Path:
    """The stdlib BPE as a transformers folder with chat tokens and :data:`TEMPLATE`."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    folder = CACHE / "chat-bpe"
    if (folder / "tokenizer_config.json").exists():
        return folder
    rust = Tokenizer.from_file(str(train_tokenizer()))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=rust, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.add_special_tokens({"additional_special_tokens": ["<|user|>", "<|assistant|>", "<|end|>"]})
    fast.chat_template = TEMPLATE
    fast.save_pretrained(str(folder))
    return folder


def chats(n: int) -> list[list[dict[str, str]]]:
    """``n`` conversations of stdlib paragraphs (at most 600 characters a turn)."""
    paragraphs = [
        p.strip()[:600] for _, text in stdlib_texts() for p in text.split("\n\n") if p.strip()
    ]
    out, i = [], 0
    for k in range(n):
        turns = 2 + 2 * (k % 3)
        out.append(
            [
                {
                    "role": "user" if t % 2 == 0 else "assistant",
                    "content": paragraphs[(i + t) % len(paragraphs)],
                }
                for t in range(turns)
            ]
        )
        i += turns
    return out


def run_exactpack(ds, folder: Path) -> tuple[float, list, list, list]:
    from transformers import AutoTokenizer

    from exactpack.hf import pack_dataset

    tok = AutoTokenizer.from_pretrained(str(folder))  # loaded before the clock, as for TRL
    started = time.perf_counter()
    packed = pack_dataset(ds, MAX_LENGTH, format="trl", tokenizer=tok, assistant_only_loss=True)
    seconds = time.perf_counter() - started
    return seconds, packed["input_ids"], packed["labels"], packed["seq_lengths"]


def run_trl(ds, folder: Path, out: Path) -> tuple[float, list, list, list]:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from trl import SFTConfig, SFTTrainer

    tok = AutoTokenizer.from_pretrained(str(folder))
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    args = SFTConfig(
        output_dir=str(out), report_to=[], use_cpu=True, assistant_only_loss=True,
        packing=True, padding_free=True, max_length=MAX_LENGTH, shuffle_dataset=False,
    )  # fmt: skip
    started = time.perf_counter()
    trainer = SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
    seconds = time.perf_counter() - started
    packed = trainer.train_dataset
    return seconds, packed["input_ids"], packed["labels"], packed["seq_lengths"]


def child(tool: str, n: int, out: Path) -> None:
    import datasets
    import torch

    torch.set_num_threads(1)
    datasets.disable_progress_bars()
    ds = datasets.Dataset.from_dict({"messages": chats(n)})
    folder = chat_folder()
    run = run_exactpack if tool == "exactpack" else (lambda d, f: run_trl(d, f, out))
    seconds, ids, labels, lengths = run(ds, folder)
    tokens = sum(len(r) for r in ids)
    supervised = 0
    for row, lens in zip(labels, lengths, strict=True):
        start = 0
        for n_tok in lens:  # TRL's collator drops each example's first label; count pairs
            supervised += sum(x != -100 for x in row[start + 1 : start + n_tok])
            start += n_tok
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"tool": tool, "seconds": seconds, "rows": len(ids), "tokens": tokens,
                      "supervised": supervised, "rss_mb": rss}))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chats", type=int, default=20_000)
    parser.add_argument("--child", choices=["exactpack", "trl"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    out = CACHE / "bench-sft"
    if args.child:
        child(args.child, args.chats, out)
        return
    chat_folder()
    results = {}
    for tool in ("exactpack", "trl"):
        done = subprocess.run(
            [sys.executable, __file__, "--child", tool, "--chats", str(args.chats)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        results[tool] = json.loads(done.stdout.strip().splitlines()[-1])
    a, b = results["exactpack"], results["trl"]
    assert (a["tokens"], a["supervised"]) == (b["tokens"], b["supervised"]), results
    print(f"{args.chats:,} chats, {a['tokens']:,} tokens, {a['supervised']:,} supervised targets,"
          f" max_length {MAX_LENGTH}; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"{'tool':<10}{'seconds':>10}{'rows':>8}{'peak RSS MB':>14}")
    for r in (a, b):
        print(f"{r['tool']:<10}{r['seconds']:>10.2f}{r['rows']:>8}{r['rss_mb']:>14.0f}")
    ratio = b["seconds"] / a["seconds"], b["rss_mb"] / a["rss_mb"]
    print(f"TRL / exactpack: {ratio[0]:.2f}x time, {ratio[1]:.2f}x peak RSS")


if __name__ == "__main__":
    main()
