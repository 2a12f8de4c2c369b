"""The driver: lay out blocks, run the tasks, merge statistics, publish atomically.

The manifest's ``engine`` record says where the run went: a block's read/tokenize/plan
seconds and CPU seconds are its plan task's; its write seconds are its share, by rows, of
the shards holding its rows (a shard of 6 rows of block 0 and 2 of block 1 written in
0.4 s: 0.3 s and 0.1 s); ``nodes`` sums each node's task times, busiest first.
"""

from __future__ import annotations

import logging
import socket
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from exactpack.core.binding import Binding, data_digest
from exactpack.core.errors import ExactpackError, InvalidInput, NotAvailable
from exactpack.io.atomic import Output, open_output
from exactpack.io.documents import make_binding
from exactpack.io.shards import manifest_record
from exactpack.pipeline.local import duplicate_report
from exactpack.pipeline.options import PackOptions, check_pad_id
from exactpack.pipeline.pack_tree import COUNTED, TRL_REFUSAL, tree_manifest
from exactpack.pipeline.progress import status
from exactpack.ray.blocks import Block, block_origin, dataset_blocks, file_blocks, group_blocks
from exactpack.ray.ray_options import DEFAULT_BLOCK_EXAMPLES, RayOptions
from exactpack.ray.shard_layout import (
    RayTaskFailed,
    Shard,
    ShardCuts,
    check_written,
    merge_statistics,
)
from exactpack.ray.tasks import Settings, plan_block, write_shard

if TYPE_CHECKING:
    import ray.data

#: Timings of the plan task and of the write task; where a task ran.
PLAN_TIMES = ("read_seconds", "tokenize_seconds", "plan_seconds", "plan_cpu_seconds")
WRITE_TIMES = ("write_seconds", "write_cpu_seconds")
WHERE = ("node", "node_ip")


def per_block(
    layout: ShardCuts,
    block_stats: list[dict[str, Any]],
    shards: list[Shard],
    runs: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """Each block's layout record, node, plan timings and share of the write timings."""
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


def per_node(blocks: list[dict[str, Any]], shards: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Work per node, busiest first: counts, stage seconds, ``busy_seconds`` (their wall-clock
    sum) and ``plan_tokens_per_second`` (pairs per second of read, tokenize and plan)."""
    nodes: dict[str, dict[str, Any]] = {}
    zero = dict.fromkeys(("blocks", "examples", "tokens", "shards"), 0)
    zero |= dict.fromkeys((*PLAN_TIMES, *WRITE_TIMES), 0.0)
    sums = (
        (blocks, "blocks", ("examples", "tokens", *PLAN_TIMES)),
        (shards, "shards", WRITE_TIMES),
    )
    for items, counted, summed in sums:
        for item in items:
            n = nodes.setdefault(item["node"], {k: item[k] for k in WHERE} | zero)
            n[counted] += 1
            for k in summed:
                n[k] += item[k]
    for n in nodes.values():
        planning = n["read_seconds"] + n["tokenize_seconds"] + n["plan_seconds"]
        n["busy_seconds"] = planning + n["write_seconds"]
        n["plan_tokens_per_second"] = n["tokens"] / planning if planning else 0.0
    return sorted(nodes.values(), key=lambda n: -n["busy_seconds"])


def _ray() -> Any:
    try:
        import ray
        import ray.data  # registers Ray's Arrow extension types
    except ImportError as err:
        raise NotAvailable("the ray engine needs Ray Data: pip install 'exactpack[ray]'") from err
    return ray


@contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None) -> Iterator[Any]:
    """The running Ray instance (left running), or one started here and shut down on exit:
    local (``num_cpus``) without ``address``, else joining the cluster at ``address``."""
    ray = _ray()
    if ray.is_initialized():
        yield ray
        return
    local = {} if address else {"num_cpus": num_cpus, "include_dashboard": False}
    if address:
        check_reachable(address)
    try:
        ray.init(address=address or "local", logging_level=logging.WARNING, **local)
    except (ConnectionError, RuntimeError, ValueError) as err:
        if not address:
            raise
        raise NotAvailable(
            f"cannot join the Ray cluster at {address!r} ({str(err).splitlines()[0]}) —"
            " check --ray-address (ray status on the head node prints it)"
        ) from None
    try:
        yield ray
    finally:
        ray.shutdown()


#: Seconds a Ray head's port has to answer.
CONNECT_SECONDS = 5.0


def check_reachable(address: str, timeout: float = CONNECT_SECONDS) -> None:
    """Refuse a ``[ray://]HOST:PORT`` that accepts no connection within ``timeout`` seconds."""
    if address in ("auto", "local"):
        return
    target = address.split("://", 1)[-1]
    host, _, port = target.rpartition(":")
    if not host and port and not port.isdigit():
        return  # a bare host name: Ray resolves it (and its default port) itself
    if not host or not port.isdigit():
        raise InvalidInput(
            f"--ray-address {address!r} is not HOST:PORT, ray://HOST:PORT or auto — e.g."
            " --ray-address 10.0.0.5:6379"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as err:
        raise NotAvailable(
            f"no Ray cluster answers at {address!r} within {timeout:g} s"
            f" ({err.strerror or err}) — start one (ray start --head) or fix --ray-address"
        ) from None


@dataclass
class TaskResults:
    """What the tasks returned, in input order."""

    blocks: list[Block]
    block_stats: list[dict[str, Any]]
    layout: ShardCuts
    entries: list[dict[str, Any]]
    shards: list[Shard]
    runs: list[dict[str, Any]]
    ids: pa.Array


def lost_task(ray: Any, err: BaseException, timeout: float) -> BaseException:
    """A Ray failure as one line naming its cause (:class:`RayTaskFailed`); a task's own
    exactpack error unchanged; anything else (``KeyboardInterrupt``) as it is."""
    if isinstance(err, ray.exceptions.RayTaskError) and isinstance(err.cause, ExactpackError):
        return err.cause
    if not isinstance(err, ray.exceptions.RayError):
        return err
    said = (str(err).strip().splitlines() or [""])[0].split(". ")[0][:200]
    kind = type(err).__name__
    if isinstance(err, ray.exceptions.GetTimeoutError):
        why = (
            f"no task finished in {timeout:g} s: a worker was lost or is stuck (Ray's memory"
            " monitor kills workers on a node low on memory)"
        )
        fix = "give the tasks more memory or fewer examples (--block-examples), or raise"
        fix += " --ray-task-timeout"
    elif isinstance(err, ray.exceptions.OutOfMemoryError):
        why = f"Ray's memory monitor killed its worker on every try ({kind})"
        fix = "use fewer examples per block (--block-examples) or give each task more memory"
    elif isinstance(err, (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError)):
        why = f"its worker died on every try ({kind}: {said})"
        fix = "see the Ray logs (python-core-worker-*.log) or raise max_retries in remote_args"
    else:
        why = f"{kind}: {said}"
        fix = "see the Ray logs"
    return RayTaskFailed(f"a Ray task failed: {why} — nothing was published; {fix}")


#: Seconds between the driver's looks at its pending tasks.
POLL_SECONDS = 0.1


def wait_some(ray: Any, pending: list[Any], timeout: float, since: float) -> tuple[list, list]:
    """The refs of ``pending`` finished now and those still running (every
    :data:`POLL_SECONDS`); Ray's ``GetTimeoutError`` once none has finished for ``timeout``
    seconds after ``since``."""
    if not pending:
        return [], []
    ready, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_SECONDS)
    if not ready and time.monotonic() - since > timeout:
        raise ray.exceptions.GetTimeoutError(f"no task finished in {timeout:g} s")
    return ready, pending


def run_tasks(
    ray: Any,
    blocks: Iterable[tuple[Block, list[Any]]],
    settings: Settings,
    output: Output,
    ray_opts: RayOptions,
    show: bool,
) -> TaskResults:
    """Plan the ``(block, its input refs)`` as they come, at most two per CPU planned and not
    yet laid out (a bounded share of the input in the object store); write shards as their
    rows become known. A task's exactpack error is re-raised unchanged; any other failure,
    or no task finishing for ``task_timeout`` s, is :class:`RayTaskFailed` (:func:`lost_task`)."""
    from tqdm import tqdm

    timeout = ray_opts.task_timeout
    # plan tasks SPREAD over the nodes unless remote_args says otherwise; writes near their rows
    spread = {"scheduling_strategy": "SPREAD"} | dict(ray_opts.remote_args)
    plan = ray.remote(plan_block).options(num_returns=2, **spread)
    write = ray.remote(write_shard).options(**ray_opts.remote_args)
    window = max(2, 2 * int(ray.cluster_resources().get("CPU", 1)))
    shared, source, since = ray.put(settings), iter(blocks), time.monotonic()
    started: list[Block] = []
    tables: list[Any] = []  # each block's planned rows, dropped once its shards are sent
    position: dict[Any, int] = {}
    pending: list[Any] = []
    layout = ShardCuts(None, settings.options.max_rows_per_batch)
    stats: dict[int, dict[str, Any]] = {}  # a plan task's statistics and ids, by block
    writes: dict[Any, int] = {}  # a write task's ref: its shard's place in ``shards``
    written: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
    shards: list[Shard] = []
    more, bar = True, tqdm(desc="exactpack: blocks", unit="block", disable=not show)

    def send(shard: Shard) -> None:
        spans = tuple((a, b, e) for _, a, b, e in shard.spans)
        args = (str(output.path), output.shard(shard.index), shard.index, shard.first_row)
        ref = write.remote(*args, spans, shared, *[tables[j] for j, *_ in shard.spans])
        writes[ref] = len(shards)
        pending.append(ref)
        shards.append(shard)

    try:
        while more or pending:  # plan and write tasks alike: any one finishing is progress
            while more and len(started) - len(layout.blocks) < window:
                block, refs = next(source, (None, None))
                if block is None:
                    more, layout.num_blocks = False, len(started)
                    break
                done, table = plan.remote(block, shared, *refs)
                position[done] = len(started)
                started.append(block)
                tables.append(table)
                pending.append(done)
            ready, pending = wait_some(ray, pending, timeout, since)
            since = time.monotonic() if ready else since
            for ref, value in zip(ready, ray.get(ready, timeout=timeout), strict=True):
                if ref in writes:
                    written[writes[ref]] = value, {k: value.pop(k) for k in (*WHERE, *WRITE_TIMES)}
                    continue
                stats[position[ref]] = value
                bar.update(1)
            # a block is laid out once it is known whether it is the last
            while (j := len(layout.blocks)) in stats and (not more or j + 1 < len(started)):
                for shard in layout.add(stats[j]):
                    send(shard)
            # once every shard of a block is sent: its writers hold what they need
            for j in range(layout.consumed):
                tables[j] = None
    except BaseException as err:
        # never ray.cancel (design notes): writers finish before the folder's cleanup
        ray.wait(list(writes), num_returns=len(writes), timeout=60)
        mapped = lost_task(ray, err, timeout)
        if mapped is err:
            raise
        raise mapped from (None if mapped is getattr(err, "cause", None) else err)
    finally:
        bar.close()
    merged = pa.concat_arrays([stats[k].pop("ids") for k in range(len(started))])
    entries, runs = ([written[k][i] for k in range(len(shards))] for i in (0, 1))
    block_stats = [stats[k] for k in range(len(started))]
    return TaskResults(started, block_stats, layout, entries, shards, runs, merged)


def _manifest(
    options: PackOptions,
    binding: Binding,
    results: TaskResults,
    source: str,
    block_examples: int | None,
    pad_token_id: int | None = None,
    receipt: str | None = None,
) -> dict[str, Any]:
    """The local pipeline's manifest (``--tree``: the local tree manifest, its split
    ``receipt`` read by the driver), statistics merged over blocks, plus ``engine``."""
    layout, block_stats = results.layout, results.block_stats
    lower = -(-sum(s["tokens"] for s in block_stats) // options.capacity)
    blocks = per_block(layout, block_stats, results.shards, results.runs)
    shards = [{"shard": s.index} | run for s, run in zip(results.shards, results.runs, strict=True)]
    engine = {
        "name": "ray",
        "block_examples": block_examples,
        "blocks": len(layout.blocks),
        "block_lower_bound": sum(-(-s["tokens"] // options.capacity) for s in block_stats),
        "rows_over_lower_bound": layout.rows / lower,
        "nodes": per_node(blocks, shards),
        "per_block": blocks,
        "per_shard": shards,
    }
    if options.tree is not None:
        totals = {k: sum(s[k] for s in block_stats) for k in COUNTED}
        totals["batches"] = -(-layout.rows // options.max_rows_per_batch)  # shards end on calls
        final = Binding(binding.vocab_size, binding.tokenizer_id, options.split_id or receipt)
        return tree_manifest(options, final, totals, results.entries, source, engine=engine)
    fields = options.manifest_fields(pad_token_id)
    stats = merge_statistics(block_stats, layout, options.max_rows_per_batch)
    receipt = options.split_id or data_digest(
        "exactpack-split-blocks", options.split.value, *(s["split_id"] for s in block_stats)
    )
    return manifest_record(
        binding=Binding(binding.vocab_size, binding.tokenizer_id, receipt),
        partition=options.split,
        config=fields["config"],
        shards=results.entries,
        rows=layout.rows,
        occurrences=layout.examples,
        policy=fields["policy"],
        statistics=stats,
        input={"source": source, "text_field": options.text_field},
        engine=engine,
    )


def pack(
    source: str | Path | ray.data.Dataset,
    out: str | Path,
    options: PackOptions | None = None,
    engine: RayOptions | None = None,
    /,
    **overrides: Any,
) -> dict[str, Any]:
    """Pack Parquet or JSON Lines shards — token ids or text — (or a ``ray.data.Dataset``)
    on Ray into the packed directory ``out``.

    ``options`` (:class:`~exactpack.pipeline.options.PackOptions`) and ``engine``
    (:class:`~exactpack.ray.ray_options.RayOptions`); keywords override fields of either
    (``max_length=4096, block_examples=10_000``). Text is tokenized in the tasks with the
    tokenizer the driver loaded. Statistics: :func:`exactpack.pipeline.local.pack_path`'s
    plus ``blocks``, ``block_examples``, ``block_lower_bound``, ``rows_over_lower_bound``
    (rows / the global lower bound) and ``nodes`` (Ray nodes). ``max_metadata_bytes``
    applies to each block alone. Without ``split_id`` the split receipt digests the blocks'
    digests in order, so it depends on the block layout: pin it when several layouts must
    agree. With ``tree=`` the driver reads blocks of whole groups and the output, statistics
    (``nodes``: trie nodes) and split receipt are ``pack_path(..., tree=)``'s.
    """
    _ray()  # say how to install it before anything else
    opts, ray_opts = RayOptions.split(options, engine, **overrides)
    if opts.format == "trl" and opts.tree is not None:
        raise InvalidInput(TRL_REFUSAL)
    if opts.format != "exactpack":
        raise InvalidInput(
            f"--format {opts.format} is written by the local engine only — drop --engine ray"
        )
    if opts.truncation_mode is not None:
        raise InvalidInput(
            "--truncation-mode runs on the local engine only: drop --engine ray (or use --cut-long)"
        )
    with open_output(out, opts.overwrite, inputs=[source]) as output:
        return pack_into(source, output, opts, ray_opts)


def pack_into(
    source: str | Path | ray.data.Dataset, output: Output, opts: PackOptions, ray_opts: RayOptions
) -> dict[str, Any]:
    """:func:`pack`'s work, holding the output folder (``output``) until the commit."""
    started = time.perf_counter()
    show = opts.show_progress(sys.stderr)
    say = status(show)
    tok = opts.load_tokenizer()  # the binding's split receipt pending; every task gets tok
    binding = make_binding(
        lambda: "pending", vocab_size=opts.vocab_size, tokenizer=tok,
        tokenizer_id=opts.tokenizer_id, split_id=opts.split_id,
    )  # fmt: skip
    settings = Settings(PackOptions.of(opts, tokenizer=tok), ray_opts.task_hook, binding)
    pad = check_pad_id(opts, binding.vocab_size, settings.options.tokenizer)
    files = isinstance(source, (str, Path, list, tuple)) and opts.tree is None
    hasher, block_examples = None, ray_opts.block_examples
    if files:  # laid out before Ray starts: a bad input fails fast
        say(f"laying out blocks of {source}")
        laid = file_blocks(source, ray_opts.block_examples)
        if not laid:
            raise InvalidInput(f"{source} holds no rows — nothing to pack")
        blocks: Iterable[tuple[Block, list[Any]]] = ((b, []) for b in laid)
        name = str(source)
    with ray_session(ray_opts.address, ray_opts.num_cpus) as ray:
        if opts.tree is not None:  # read here as planned, so a group never straddles blocks
            say(f"reading {source} in blocks of whole groups")
            blocks, name, hasher = group_blocks(ray, source, opts, block_examples)
        elif not files:
            if not isinstance(source, ray.data.Dataset):
                raise InvalidInput(
                    "the ray engine reads a Parquet or JSON Lines file, a folder of such shards"
                    f" or a ray.data.Dataset, not a {type(source).__name__}"
                )
            block_examples = ray_opts.block_examples or DEFAULT_BLOCK_EXAMPLES
            name = "ray.data.Dataset"
            say("materialising the dataset in order")
            try:
                laid, inputs = dataset_blocks(
                    ray, source, block_examples, opts.text_field, show, ray_opts.task_timeout
                )
            except ray.exceptions.RayError as err:
                raise lost_task(ray, err, ray_opts.task_timeout) from None
            blocks = zip(laid, inputs, strict=True)
        say("reading, tokenizing and planning the blocks on Ray")
        results = run_tasks(ray, blocks, settings, output, ray_opts, show)
        check_written(results.layout, results.entries, output.path)
        receipt = None if hasher is None else hasher.hexdigest()
        manifest = _manifest(opts, binding, results, name, block_examples, pad, receipt)
        output.commit(manifest)
    meta, starts = manifest["engine"], np.array([b.first for b in results.blocks])

    def locate(row: int) -> str:  # a global row: repeats within and across blocks count
        block = results.blocks[int(np.searchsorted(starts, row, side="right")) - 1]
        return block_origin(block).locate(row - block.first)

    return (
        {"nodes": len(meta["nodes"])}  # Ray nodes; --tree's statistics count trie nodes
        | manifest["statistics"]
        | duplicate_report(results.ids, locate)
        | {
            "blocks": meta["blocks"],
            "block_examples": block_examples,
            "block_lower_bound": meta["block_lower_bound"],
            "rows_over_lower_bound": meta["rows_over_lower_bound"],
            "shards": len(results.entries),
            "out": str(output.path),
            "recovered": output.notes,
            "seconds": time.perf_counter() - started,
        }
    )
