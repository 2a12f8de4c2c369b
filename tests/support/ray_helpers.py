"""Ray for the tests: every node on 127.0.0.1, under a private temporary folder."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def private_loopback_ray() -> Iterator[str]:
    """Environment for Ray servers started inside: loopback only, a private folder.

    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` binds every node to 127.0.0.1
    (Ray reads it when it is imported, so the imported constant is set too);
    ``RAY_TMPDIR`` keeps the session and the ``ray_current_cluster`` address
    file private, so no other Ray user on the machine connects to ours. The
    folder's path is short: Ray's socket paths have a length limit.
    """
    from ray._private import ray_constants

    folder = tempfile.mkdtemp(prefix="sqr", dir="/tmp")
    env = {"RAY_TMPDIR": folder, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    saved = {k: os.environ.get(k) for k in env}
    flag = ray_constants.ENABLE_RAY_CLUSTER
    os.environ.update(env)
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield folder
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = flag
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(folder, ignore_errors=True)
