"""A small local chat tokenizer for the SFT tests, and TRL 1.16's own preprocessing of rows.

:func:`chat_tokenizer` trains a byte-level BPE (``tokenizers``) on a few
sentences, wraps it as ``transformers.PreTrainedTokenizerFast`` with BOS /
EOS / PAD and a chat template whose assistant turns sit inside
``{% generation %}`` markers, and saves it with ``save_pretrained`` (no
network). :func:`trl_prepared` runs ``trl.SFTTrainer``'s dataset preparation
(tokenize, ``build_labels``) on a ``datasets.Dataset`` and returns its
``input_ids`` and ``labels``: the reference every exactpack reading is held to.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: A ChatML-like template: the assistant's content and end-of-turn token are trained.
TEMPLATE = (
    "{{ bos_token }}{% if tools %}<|system|>\n{{ tools | tojson }}<|end|>\n{% endif %}"
    "{% if greeting is defined %}<|system|>\n{{ greeting }}<|end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<|assistant|>\n"
    "{% generation %}{{ m['content'] }}<|end|>{% endgeneration %}\n"
    "{% else %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
#: The same rendering without generation markers (assistant tokens cannot be told apart).
PLAIN_TEMPLATE = TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", "")
SPECIAL = ["<unk>", "<s>", "</s>", "<pad>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
CORPUS = [
    "What color is the sky?",
    "It is blue, mostly.",
    "Hello there, how are you today?",
    "I am fine, thanks for asking.",
    "You are a helpful assistant.",
    "Pack the examples without joining their contexts.",
]

CHATS = [
    [
        {"role": "user", "content": "What color is the sky?"},
        {"role": "assistant", "content": "It is blue."},
    ],
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hello there, how are you?"},
        {"role": "assistant", "content": "I am fine."},
        {"role": "user", "content": "Thanks for asking?"},
        {"role": "assistant", "content": "You are welcome, mostly."},
    ],
    [
        {"role": "user", "content": "Pack the examples."},
        {"role": "assistant", "content": "Without joining their contexts."},
    ],
]
#: Text prompt-completion rows: the second's completion already ends with EOS, the third's
#: prompt ends mid-word, so BPE merges across the boundary (TRL's common prefix decides).
PROMPTS = ["What color is the sky?", "Hello there,", "What col"]
COMPLETIONS = [" It is blue.", " how are you?</s>", "or is the sky?"]


def chat_tokenizer(folder: Path, template: str | None = TEMPLATE) -> Path:
    """Train, wrap and save the test tokenizer in ``folder``; returns ``folder``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 10, trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", bos)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
    )
    if template is not None:
        fast.chat_template = template
    fast.save_pretrained(str(folder))
    return folder


def trl_prepared(dataset: Any, folder: Path, tmp: Path, **config: Any) -> dict[str, list]:
    """``input_ids`` and ``labels`` of TRL 1.16's ``SFTTrainer`` preparation of ``dataset``
    (``config``: ``SFTConfig`` fields, e.g. ``assistant_only_loss=True``)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from trl import SFTConfig, SFTTrainer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
        )
    )
    args = SFTConfig(
        output_dir=str(tmp / "trl"), report_to=[], max_length=None, use_cpu=True, **config
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    prepared = trainer.train_dataset
    return {"input_ids": prepared["input_ids"], "labels": prepared["labels"]}


def trl_dpo_prepared(rows: dict[str, list], folder: Path, tmp: Path) -> list[tuple[list, list]]:
    """TRL 1.16 ``DPOTrainer``'s own tokenization of DPO ``rows``: per pair, chosen then
    rejected, the sequence ``prompt_ids + answer_ids`` and its per-target supervision
    (the collator's completion mask, shifted by one)."""
    import datasets
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from trl import DPOConfig, DPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    torch.manual_seed(0)
    sizes = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1}
    config = LlamaConfig(
        vocab_size=len(tokenizer), num_attention_heads=2, num_key_value_heads=2, **sizes
    )
    args = DPOConfig(output_dir=str(tmp / "trl"), report_to=[], use_cpu=True, max_length=None)
    trainer = DPOTrainer(model=LlamaForCausalLM(config), ref_model=LlamaForCausalLM(config),
                         args=args, train_dataset=datasets.Dataset.from_dict(rows),
                         processing_class=tokenizer)  # fmt: skip
    out = []
    for row in trainer.train_dataset:
        prompt = row["prompt_ids"]
        for answer in (row["chosen_ids"], row["rejected_ids"]):
            out.append((prompt + answer, [False] * (len(prompt) - 1) + [True] * len(answer)))
    return out
