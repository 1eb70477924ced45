"""Ray Tune integration. The only package of stabray that imports ray.

from ray import tune
from stabray.tune import trainable
tuner = tune.Tuner(trainable, param_space={"task": {"name": "dijkstra"}, ...})
"""

from stabray.tune.trainable import trainable

__all__ = ["trainable", "run_sweep", "run_configs"]


def __getattr__(name):  # the sweep runner pulls in optuna and mlflow; load it on demand
    if name in ("run_sweep", "run_configs"):
        from stabray.tune import sweep

        return getattr(sweep, name)
    raise AttributeError(name)
