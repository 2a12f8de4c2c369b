"""A streamed corpus packed on the fly and trained by ``transformers.Trainer`` (any world size).

    python examples/trainer_stream.py --out out/stream                      # one process
    torchrun --nproc-per-node 2 examples/trainer_stream.py --out out/stream  # two ranks

The corpus is a generator of ``{"id", "input_ids"}`` rows (here made up; in
practice ``load_dataset(..., streaming=True)``). ``exactpack.hf.pack_dataset``
returns a ``datasets.IterableDataset`` of packed rows, packed with streaming
best fit as it is read; ``Trainer`` keeps accelerate's defaults
(``dispatch_batches``: rank 0 reads the stream and hands each rank its rows).
exactpack shards nothing itself and pads the stream's end with empty rows to a
multiple of ``world_size * max_rows_per_batch``, so with
``per_device_train_batch_size`` dividing ``max_rows_per_batch`` every example
is trained on exactly once per epoch, on one rank. ``hf_collator`` builds each
call's block-causal masks; with ``config.use_cache`` False (``Trainer`` sets
it) every value is a tensor of rows, which dispatching needs.

``--record FILE`` writes, per step, the examples each rank trained on (found
from the batch: the token after each example's first), its world size and the
final parameters — what ``tests/integration/test_trainer_stream.py`` checks.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

EXAMPLES = 48
CAPACITY = 24
ROWS = 2  # rows per model call, and per_device_train_batch_size
FIRST_ID = 3  # example i's second token is FIRST_ID + i


def corpus():
    """Example ``i``: BOS 0, the token ``FIRST_ID + i``, 1..14 others, EOS 1."""
    rng = np.random.default_rng(0)
    for i in range(EXAMPLES):
        body = rng.integers(FIRST_ID + EXAMPLES, 266, size=int(rng.integers(1, 15))).tolist()
        yield {"id": f"ex-{i}", "input_ids": [0, FIRST_ID + i, *body, 1]}


def seen_examples(inputs: dict) -> list[int]:
    """The examples in a collated call: the token after each example's first cell."""
    ids, pos, labels = inputs["input_ids"], inputs["position_ids"], inputs["labels"]
    starts = (pos[:, :-1] == 0) & (labels[:, 1:] != -100)
    return (ids[:, 1:][starts] - FIRST_ID).tolist()


def main(argv: list[str] | None = None) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    import exactpack.hf

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--record", default=None)
    parser.add_argument("--batch", type=int, default=ROWS, help="per-device rows per step")
    parser.add_argument(
        "--no-dispatch",
        action="store_true",
        help="accelerator_config dispatch_batches=False: every rank reads the stream",
    )
    cli = parser.parse_args(argv)
    torch.set_num_threads(1)

    args = TrainingArguments(
        output_dir=cli.out,
        per_device_train_batch_size=cli.batch,
        max_steps=1,  # set below, once the stream's length per epoch is known
        learning_rate=0.1,
        optim="sgd",
        lr_scheduler_type="constant",
        remove_unused_columns=False,  # hf_collator reads the packed columns
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        accelerator_config={"dispatch_batches": False} if cli.no_dispatch else None,
    )
    packed = exactpack.hf.pack_dataset(
        corpus, CAPACITY, vocab_size=266, max_rows_per_batch=ROWS, tokenizer_id="example"
    )
    world = args.world_size
    rows = sum(1 for _ in packed)  # padded to a multiple of world * ROWS under torchrun
    args.max_steps = cli.epochs * -(-rows // (world * cli.batch))

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=266, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=CAPACITY,
        bos_token_id=0, eos_token_id=1, pad_token_id=2, attn_implementation="sdpa",
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    collate = exactpack.hf.collator_for(packed, "sdpa", config=model.config)
    record: list[dict] = []

    class Recording(Trainer):
        def compute_loss(self, model, inputs, *rest, **kw):
            record.append({"step": self.state.global_step, "examples": seen_examples(inputs)})
            return super().compute_loss(model, inputs, *rest, **kw)

    trainer = Recording(model=model, args=args, train_dataset=packed, data_collator=collate)
    trainer.train()
    rank = args.process_index
    print(f"rank {rank} of {world}: {trainer.state.global_step} steps over {rows} rows")
    if cli.record:
        params = {n: p.detach().reshape(-1).tolist() for n, p in model.named_parameters()}
        state = {"world": world, "rank": rank, "rows": rows, "steps": trainer.state.global_step}
        with open(f"{cli.record}.{rank}.json", "w") as f:
            json.dump(state | {"calls": record, "params": params}, f)


if __name__ == "__main__":
    main()
