"""The Ray engine's own options: :class:`RayOptions`, *where* and *in what pieces* a run
goes (*what* is packed is :class:`~exactpack.pipeline.options.PackOptions`'). Their flags
(``--block-examples``, ``--ray-address``, ``--ray-num-cpus``) are in the field metadata."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from exactpack.core.errors import InvalidInput, positive_int
from exactpack.pipeline.options import PackOptions, flag

#: Examples per block for a ``ray.data.Dataset`` input (it has no shards to follow).
DEFAULT_BLOCK_EXAMPLES = 10_000

#: Seconds the driver waits for *some* task to finish before it gives up on the run: a
#: worker the memory monitor killed over and over, or one stuck, never reports back.
DEFAULT_TASK_TIMEOUT = 3600
#: The longest ``task_timeout`` accepted: a week.
MAX_TASK_TIMEOUT = 7 * 24 * 3600

#: ``task_hook(stage, index)``: called in the worker once a task's output exists
#: (``"plan"`` with the block index, ``"write"`` with the shard index).
TaskHook = Callable[[str, int], None]


@dataclass(frozen=True)
class RayOptions:
    """Where and in what pieces a Ray packing runs (frozen, validated).

    ``block_examples``: examples per block (None: one per input shard; a Dataset:
    :data:`DEFAULT_BLOCK_EXAMPLES`). ``address`` / ``num_cpus``: see
    :func:`exactpack.ray.driver.ray_session`. ``remote_args``: every task's ``.options``
    (e.g. ``{"num_cpus": 2, "max_retries": 5}``; a task whose worker dies is retried
    ``max_retries`` times, Ray's default 3). ``task_timeout``: seconds the driver waits with
    no task finishing before the run fails (:data:`DEFAULT_TASK_TIMEOUT`). ``task_hook``:
    logging, fault injection.
    """

    block_examples: int | None = field(
        default=None,
        metadata=flag(
            "--block-examples", "ray: examples per block (default: a shard)", metavar="N", type=int
        ),
    )
    address: str | None = field(
        default=None,
        metadata=flag("--ray-address", "ray: join this cluster (e.g. auto)", metavar="ADDR"),
    )
    num_cpus: int | None = field(
        default=None,
        metadata=flag("--ray-num-cpus", "ray: size of a local instance", metavar="N", type=int),
    )
    remote_args: Mapping[str, Any] = field(
        default_factory=dict, metadata=flag(None, "every Ray task's .options(...)")
    )
    task_timeout: int = field(
        default=DEFAULT_TASK_TIMEOUT,
        metadata=flag(
            "--ray-task-timeout",
            "ray: fail when no task finishes for this many seconds (default 3600)",
            metavar="S",
            type=int,
        ),
    )
    task_hook: TaskHook | None = field(
        default=None, metadata=flag(None, "called in the worker after each task")
    )

    def __post_init__(self) -> None:
        for name in ("block_examples", "num_cpus"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, positive_int(name, getattr(self, name)))
        timeout = positive_int("task_timeout", self.task_timeout, MAX_TASK_TIMEOUT)
        object.__setattr__(self, "task_timeout", timeout)
        object.__setattr__(self, "remote_args", MappingProxyType(dict(self.remote_args)))

    @classmethod
    def split(
        cls,
        options: PackOptions | None = None,
        engine: RayOptions | None = None,
        **overrides: Any,
    ) -> tuple[PackOptions, RayOptions]:
        """Both option objects, each override sent to whichever declares it."""
        mine = {f.name for f in dataclasses.fields(cls)}
        ours = {k: overrides.pop(k) for k in list(overrides) if k in mine}
        ray_opts = dataclasses.replace(engine or cls(), **ours) if ours else (engine or cls())
        if options is None and not overrides:
            raise InvalidInput("the ray engine needs at least max_length= (or a PackOptions)")
        return PackOptions.of(options, **overrides), ray_opts
