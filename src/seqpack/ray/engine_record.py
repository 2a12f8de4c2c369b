"""Where a Ray packing ran: the ``engine`` record's per-block, per-shard and per-node parts.

Bookkeeping on the driver. A block's read/tokenize/plan seconds and CPU seconds are its
plan task's; its write seconds are its share, by rows, of the shards holding its rows
(a shard of 6 rows of block 0 and 2 of block 1 written in 0.4 s: 0.3 s and 0.1 s).
``nodes`` sums each node's task times, busiest (the one the run waited for) first.
"""

from __future__ import annotations

from typing import Any

from seqpack.ray.shard_layout import Shard, ShardCuts

#: Per-block timings measured in the plan task (wall clock, then its CPU time).
PLAN_TIMES = ("read_seconds", "tokenize_seconds", "plan_seconds", "plan_cpu_seconds")
#: Per-shard timings measured in the write task.
WRITE_TIMES = ("write_seconds", "write_cpu_seconds")
#: Keys a task adds to its result about where it ran.
WHERE = ("node", "node_ip")


def split_entry(entry: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A write task's result as (the shard's manifest entry, where and how long it ran)."""
    run = {k: entry.pop(k) for k in (*WHERE, *WRITE_TIMES)}
    return entry, run


def per_block(
    layout: ShardCuts,
    block_stats: list[dict[str, Any]],
    shards: list[Shard],
    runs: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """Each block's layout record plus its node, its read / tokenize / plan seconds and CPU
    seconds, and its share of the write seconds and write CPU seconds."""
    write = [dict.fromkeys(WRITE_TIMES, 0.0) for _ in block_stats]
    for shard, run in zip(shards, runs, strict=True):
        rows = sum(b - a for _, a, b, _ in shard.spans)
        for j, a, b, _ in shard.spans:
            for k in WRITE_TIMES:
                write[j][k] += run[k] * (b - a) / rows
    return [
        laid | {k: stats[k] for k in WHERE} | {k: stats[k] for k in PLAN_TIMES} | write[j]
        for j, (laid, stats) in enumerate(zip(layout.blocks, block_stats, strict=True))
    ]


def per_shard(shards: list[Shard], runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each shard's writer: shard index, node, node IP, seconds."""
    return [{"shard": s.index} | run for s, run in zip(shards, runs, strict=True)]


def per_node(blocks: list[dict[str, Any]], shards: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Work per node, busiest first: blocks planned, examples, tokens, shards written, the
    seconds of each stage and their CPU time, ``busy_seconds`` (the wall-clock sum) and
    ``plan_tokens_per_second`` (prediction pairs read, tokenized and planned per second
    of those stages)."""
    nodes: dict[str, dict[str, Any]] = {}

    def node(name: str, ip: str) -> dict[str, Any]:
        zero = dict.fromkeys(("blocks", "examples", "tokens", "shards"), 0)
        times = dict.fromkeys((*PLAN_TIMES, *WRITE_TIMES), 0.0)
        return nodes.setdefault(name, {"node": name, "node_ip": ip} | zero | times)

    for b in blocks:
        n = node(b["node"], b["node_ip"])
        n["blocks"] += 1
        n["examples"] += b["examples"]
        n["tokens"] += b["tokens"]
        for k in PLAN_TIMES:
            n[k] += b[k]
    for s in shards:
        n = node(s["node"], s["node_ip"])
        n["shards"] += 1
        for k in WRITE_TIMES:
            n[k] += s[k]
    for n in nodes.values():
        planning = n["read_seconds"] + n["tokenize_seconds"] + n["plan_seconds"]
        n["busy_seconds"] = planning + n["write_seconds"]
        n["plan_tokens_per_second"] = n["tokens"] / planning if planning else 0.0
    return sorted(nodes.values(), key=lambda n: -n["busy_seconds"])
