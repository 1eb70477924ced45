"""The one place that calls Ray's reporting API (it has changed four times in four years)."""

from __future__ import annotations

import tempfile
from typing import Any, Callable


def get_checkpoint_dir(load: Callable[[str], None]) -> bool:
    """If Ray restored this trial from a checkpoint, call `load(dir)` on it; return whether it did."""
    from ray import tune

    ckpt = tune.get_checkpoint()
    if ckpt is None:
        return False
    with ckpt.as_directory() as d:
        load(d)
    return True


def report(metrics: dict[str, Any], save: Callable[[str], None] | None = None) -> None:
    """Report metrics, with a checkpoint written by `save(dir)` when given."""
    from ray import tune

    if save is None:
        tune.report(metrics)
        return
    with tempfile.TemporaryDirectory() as d:
        save(d)
        tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(d))


def in_ray_worker() -> bool:
    """Whether this process is a Ray worker (a trial). Asked without `ray.get_runtime_context()`,
    which would start a Ray instance in a plain Python process."""
    import ray

    return ray.is_initialized() and ray._private.worker.global_worker.mode == ray.WORKER_MODE


def assigned_cpus(default: int = 1) -> int:
    """The CPUs Ray assigned to this trial (`default` outside a Ray worker)."""
    if not in_ray_worker():
        return default
    import ray

    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", default)
    return max(1, int(round(cpus)))


def placement() -> dict[str, Any]:
    """Where the trial runs: Ray node id and the number of GPUs Ray assigned (reported per epoch);
    nothing outside a Ray worker."""
    if not in_ray_worker():
        return {}
    import ray

    return {"node_id": ray.get_runtime_context().get_node_id(), "gpus_assigned": float(len(ray.get_gpu_ids()))}
