"""The driver: lay out blocks, run the tasks, merge statistics, publish atomically."""

from __future__ import annotations

import logging
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from ..batch import PackConfig
from ..errors import InvalidInput, NotAvailable, SeqpackError
from ..examples import Binding, Partition, split_digest
from ..io import Documents, Origin, resolve_binding
from ..pipeline import (
    DEFAULT_POLICY,
    DEFAULT_ROWS_PER_BATCH,
    _status,
    _tokenizer,
    duplicate_report,
)
from ..policies import plan_rows, positive_int
from ..store import FORMAT, SHARD_TOKENS, VERSION, check_output, publish_packed, temp_output
from ..tokenizers import Tokenizer
from .blocks import Block, block_origin, dataset_blocks, file_blocks
from .layout import Layout, RayTaskFailed, check_written, merge_statistics
from .tasks import Settings, TaskHook, plan_block, write_shard

if TYPE_CHECKING:
    import ray.data

#: Examples per block for a ``ray.data.Dataset`` input (it has no shards to follow).
DEFAULT_BLOCK_EXAMPLES = 10_000

_NO_DOCUMENTS = Documents(
    np.zeros(0, np.int32),
    np.zeros(1, np.int64),
    np.zeros(0, bool),
    np.zeros(0, object),
    Origin((("", 0, "row"),)),
)


def _ray() -> Any:
    try:
        import ray
        import ray.data  # registers Ray's Arrow extension types
    except ImportError as err:
        raise NotAvailable("the ray engine needs Ray Data: pip install 'seqpack[ray]'") from err
    return ray


@contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None) -> Iterator[Any]:
    """The running Ray instance, or one started here and shut down on exit.

    Without ``address`` a local instance sized to the machine starts
    (``num_cpus`` overrides its size); ``address`` (``auto``, ``HOST:PORT``,
    ``ray://HOST:PORT``) joins a cluster. An instance already initialised
    by the caller is used as is and left running.
    """
    ray = _ray()
    if ray.is_initialized():
        yield ray
        return
    if address:
        ray.init(address=address, logging_level=logging.WARNING)
    else:
        ray.init(
            address="local",
            num_cpus=num_cpus,
            include_dashboard=False,
            logging_level=logging.WARNING,
        )
    try:
        yield ray
    finally:
        ray.shutdown()


def run_tasks(
    ray: Any,
    blocks: list[Block],
    inputs: list[list[Any]],
    settings: Settings,
    tmp: Path,
    remote_args: dict[str, Any],
    show: bool,
) -> tuple[list[dict[str, Any]], Layout, list[dict[str, Any]], pa.Array]:
    """Plan every block, write shards as their rows become known; (block stats, layout,
    shards, every block's ids in input order).

    A task that raised a seqpack error re-raises it here unchanged; any other
    failure (out of retries, lost worker) is :class:`RayTaskFailed`.
    """
    from tqdm import tqdm

    plan = ray.remote(plan_block).options(num_returns=2, **remote_args)
    write = ray.remote(write_shard).options(**remote_args)
    shared = ray.put(settings)
    planned = [plan.remote(b, shared, *refs) for b, refs in zip(blocks, inputs, strict=True)]
    tables: list[Any] = [p[1] for p in planned]
    position = {p[0]: k for k, p in enumerate(planned)}
    pending = [p[0] for p in planned]
    layout = Layout(len(blocks), settings.max_rows_per_batch)
    stats: dict[int, dict[str, Any]] = {}
    ids: dict[int, Any] = {}
    writes: list[Any] = []
    bar = tqdm(total=len(blocks), desc="seqpack: blocks", unit="block", disable=not show)
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=0.1)
            for ref, value in zip(ready, ray.get(ready), strict=True):
                ids[position[ref]] = value.pop("ids")
                stats[position[ref]] = value
            bar.update(len(ready))
            while len(layout.blocks) in stats:
                for shard in layout.add(stats[len(layout.blocks)]):
                    spans = tuple((a, b, e) for _, a, b, e in shard.spans)
                    args = [tables[j] for j, *_ in shard.spans]
                    writes.append(
                        write.remote(str(tmp), shard.index, shard.first_row, spans, shared, *args)
                    )
                    for j in range(layout.consumed):
                        tables[j] = None  # the write tasks hold what they still need
        entries = ray.get(writes)
    except BaseException as err:
        for ref in [p[0] for p in planned] + writes:
            ray.cancel(ref)
        ray.wait(writes, num_returns=len(writes), timeout=60)  # let writers stop before cleanup
        if isinstance(err, ray.exceptions.RayTaskError) and isinstance(err.cause, SeqpackError):
            raise err.cause from None
        if isinstance(err, ray.exceptions.RayError):
            raise RayTaskFailed(f"a Ray task failed ({err}) — see the Ray logs") from err
        raise
    finally:
        bar.close()
    merged = pa.concat_arrays([ids[k] for k in range(len(blocks))])
    return [stats[k] for k in range(len(blocks))], layout, entries, merged


def duplicates(blocks: list[Block], ids: pa.Array) -> dict[str, Any]:
    """The local pipeline's ``duplicate_ids`` (and ``duplicate_first``) over all blocks.

    ``ids`` holds every block's ids end to end in input order (an Arrow
    string array on the driver: about 4 bytes plus the id's length per
    example, exact — no hashing); repeats within and across blocks count.
    """
    starts = np.array([b.first for b in blocks], dtype=np.int64)

    def locate(global_row: int) -> str:
        block = blocks[int(np.searchsorted(starts, global_row, side="right")) - 1]
        return block_origin(block).locate(global_row - block.first)

    return duplicate_report(ids, locate)


def _manifest(
    settings: Settings,
    binding: Binding,
    layout: Layout,
    block_stats: list[dict[str, Any]],
    shards: list[dict[str, Any]],
    source: str,
    block_examples: int | None,
) -> dict[str, Any]:
    """The local pipeline's manifest, statistics merged over blocks, plus an ``engine`` record."""
    stats = merge_statistics(block_stats, layout, settings.max_rows_per_batch)
    receipt = settings.split_id or split_digest(
        "seqpack-split-blocks", settings.partition.value, *(s["split_id"] for s in block_stats)
    )
    return {
        "format": FORMAT,
        "version": VERSION,
        "binding": Binding(binding.vocab_size, binding.tokenizer_id, receipt).to_dict(),
        "partition": settings.partition.value,
        "config": {
            "capacity": settings.capacity,
            "max_rows_per_batch": settings.max_rows_per_batch,
        },
        "rows": layout.rows,
        "occurrences": layout.examples,
        "policy": {"name": settings.policy, "options": settings.options},
        "statistics": stats,
        "input": {"source": source, "text_field": settings.text_field},
        "engine": {
            "name": "ray",
            "block_examples": block_examples,
            "blocks": len(layout.blocks),
            "block_lower_bound": sum(s["lower_bound"] for s in block_stats),
            "rows_over_lower_bound": stats["rows"] / stats["lower_bound"],
            "per_block": layout.blocks,
        },
        "shards": shards,
    }


def pack(
    source: str | Path | ray.data.Dataset,
    out: str | Path,
    *,
    capacity: int,
    policy: str = DEFAULT_POLICY,
    block_examples: int | None = None,
    vocab_size: int | None = None,
    tokenizer: str | Tokenizer | None = None,
    partition: Partition | str = "train",
    split_long_sources: bool = False,
    overwrite: bool = False,
    max_rows_per_batch: int = DEFAULT_ROWS_PER_BATCH,
    text_field: str = "text",
    tokenizer_id: str | None = None,
    split_id: str | None = None,
    policy_options: dict[str, Any] | None = None,
    progress: bool | None = None,
    address: str | None = None,
    num_cpus: int | None = None,
    ray_remote_args: dict[str, Any] | None = None,
    shard_tokens: int = SHARD_TOKENS,
    task_hook: TaskHook | None = None,
    max_metadata_bytes: int | None = None,
) -> dict[str, Any]:
    """Pack Parquet shards (or a ``ray.data.Dataset``) on Ray into the packed directory ``out``.

    Options and statistics are :func:`seqpack.pipeline.pack_path`'s, plus:
    ``block_examples`` (None: one block per input shard; a Dataset defaults
    to :data:`DEFAULT_BLOCK_EXAMPLES`), ``address`` / ``num_cpus`` (see
    :func:`ray_session`), ``ray_remote_args`` (every task's ``.options``,
    e.g. ``{"num_cpus": 2, "max_retries": 5}``) and ``task_hook(stage,
    index)``, called in the worker once a task's output exists (``"plan"``
    with the block, ``"write"`` with the shard) — for logging or fault
    injection. ``max_metadata_bytes`` is the local budget applied to each
    block alone (its :func:`seqpack.pipeline.packing_bytes` plus one model
    call, checked in the task before planning; ``BudgetExceeded`` names the
    block). ``duplicate_ids`` / ``duplicate_first`` count repeated ids across
    all blocks, as locally. Statistics add ``blocks``, ``block_examples``,
    ``block_lower_bound`` (sum of the blocks' lower bounds) and
    ``rows_over_lower_bound`` (rows / the global ``ceil(tokens / capacity)``).

    Without ``split_id`` the split receipt is the digest of the blocks'
    digests in order (:meth:`seqpack.io.Documents.digest` of each block): it
    depends on the block layout, so pin it when several layouts must agree.
    """
    started = time.perf_counter()
    _ray()  # say how to install it before anything else
    config = PackConfig(capacity, max_rows_per_batch, max_metadata_bytes=max_metadata_bytes)
    options = dict(policy_options or {})
    plan_rows(np.zeros(0, dtype=np.int64), config.capacity, policy, **options)  # check early
    if block_examples is not None:
        positive_int("block_examples", block_examples)
    out = check_output(out, overwrite)
    show = sys.stderr.isatty() if progress is None else progress
    say = _status(show)
    tok = _tokenizer(tokenizer)
    part = Partition.parse(partition)
    # The vocabulary and tokenizer checks now; the split receipt once the blocks are read.
    binding = resolve_binding(
        _NO_DOCUMENTS,
        part,
        vocab_size=vocab_size,
        tokenizer=tok,
        tokenizer_id=tokenizer_id,
        split_id=split_id or "pending",
    )
    settings = Settings(
        capacity=config.capacity,
        policy=policy,
        options=options,
        max_rows_per_batch=config.max_rows_per_batch,
        shard_tokens=shard_tokens,
        partition=part,
        vocab_size=vocab_size,
        tokenizer=tok,
        tokenizer_id=tokenizer_id,
        split_id=split_id,
        text_field=text_field,
        split_long=split_long_sources,
        hook=task_hook,
        max_metadata_bytes=max_metadata_bytes,
    )
    from_path = isinstance(source, (str, Path))
    if from_path:
        if not Path(source).exists():
            raise InvalidInput(f"input {str(source)!r} does not exist")
        blocks = file_blocks(Path(source), block_examples)
        inputs: list[list[Any]] = [[] for _ in blocks]
    else:
        block_examples = block_examples or DEFAULT_BLOCK_EXAMPLES
    with ray_session(address, num_cpus) as ray:
        if not from_path:
            if not isinstance(source, ray.data.Dataset):
                raise InvalidInput(
                    "the ray engine reads a Parquet file, a folder of Parquet shards or a"
                    f" ray.data.Dataset, not a {type(source).__name__}"
                )
            say("materialising the dataset in order")
            blocks, inputs = dataset_blocks(ray, source, block_examples, text_field, show)
        if not blocks:
            raise InvalidInput(f"{source} holds no rows — nothing to pack")
        say(f"planning {len(blocks):,} block(s) with {policy} on Ray")
        tmp = temp_output(out)
        try:
            block_stats, layout, shards, ids = run_tasks(
                ray, blocks, inputs, settings, tmp, dict(ray_remote_args or {}), show
            )
            check_written(layout, shards, tmp)
            name = str(source) if from_path else "ray.data.Dataset"
            manifest = _manifest(
                settings, binding, layout, block_stats, shards, name, block_examples
            )
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        publish_packed(tmp, out, manifest)
    engine = manifest["engine"]
    return (
        manifest["statistics"]
        | duplicates(blocks, ids)
        | {
            "blocks": engine["blocks"],
            "block_examples": block_examples,
            "block_lower_bound": engine["block_lower_bound"],
            "rows_over_lower_bound": engine["rows_over_lower_bound"],
            "shards": len(shards),
            "out": str(out),
            "seconds": time.perf_counter() - started,
        }
    )
