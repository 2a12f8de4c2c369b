"""``exactpack verify --tree-lengths``, ``pack --tree``, ``stats --tree``: the tree commands."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from exactpack.core.errors import InvalidInput

#: Implementations the tree verification feeds (the flattened kinds cannot express a tree).
TREE_IMPLEMENTATIONS = ("eager", "sdpa", "exactpack_tree", "exactpack_tree_varlen")


def cmd_verify_tree(args: argparse.Namespace, finish: Callable[[Any, dict], int]) -> int:
    """Exit 0 PASS, 1 FAIL; ``finish`` prints the report as flat verify prints its own."""
    os.environ["HF_HUB_OFFLINE"] = "1"  # never download: configs and weights are local
    if not (args.hf_config or args.hf_model):
        raise InvalidInput(
            "--tree-lengths verifies a transformers model: pass --hf-config or --hf-model"
        )
    if args.lengths:
        raise InvalidInput("--tree-lengths and --lengths are two layouts: pass one of them")
    attn = args.attn or "sdpa"
    if attn not in TREE_IMPLEMENTATIONS:
        raise InvalidInput(
            f"--attn {attn!r} cannot run tree-packed rows here; choose one of"
            f" {', '.join(TREE_IMPLEMENTATIONS)} (cu_seqlens kinds cannot express a tree;"
            " FlexAttention has no CPU backward)"
        )
    if args.mode not in ("adapter", "naive"):
        raise InvalidInput(
            f"--mode {args.mode} does not apply to --tree-lengths: use adapter or naive"
        )
    from exactpack.verify import tree_models as tree_verify

    spec = tree_verify.parse_tree_lengths(args.tree_lengths)
    tree_verify.check_tree_lengths(spec)  # the budget, before the model is built
    model = load_hf_model(args, "sdpa" if attn == "sdpa" else "eager")
    if attn.startswith("exactpack_tree"):
        tree_verify.use_tree_attention(model, attn)
    cfg = model.config.get_text_config()
    limit = getattr(cfg, "max_position_embeddings", None)
    groups = tree_verify.tree_groups(spec, cfg.vocab_size, args.seed, max_positions=limit)
    r = tree_verify.verify_tree(model, groups, mode=args.mode, max_length=args.capacity)
    r["model"]["source"] = str(args.hf_config or args.hf_model)
    return finish(args, r)


def load_hf_model(args: argparse.Namespace, attn: str, refuse: bool = True) -> Any:
    """The ``--hf-config`` / ``--hf-model`` model, in ``args``' dtype, seed and device."""
    from exactpack.verify.models import DTYPES, load_model

    where = {"config": args.hf_config, "model": args.hf_model, "device": args.device}
    if args.max_model_bytes is not None:  # else load_model's default
        where["max_model_bytes"] = args.max_model_bytes
    return load_model(
        attn_implementation=attn, dtype=DTYPES[args.dtype], seed=args.seed, refuse=refuse, **where
    )
