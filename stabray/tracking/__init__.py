"""MLflow tracking. The only package of stabray that imports mlflow."""

from stabray.tracking.store import (
    Store,
    check_experiment,
    check_store,
    checkpoint_dir_of,
    ended_status,
    experiment_links,
    log_artifacts,
    resolve_tracking_uri,
    run_data,
)

__all__ = [
    "Store",
    "check_experiment",
    "check_store",
    "checkpoint_dir_of",
    "ended_status",
    "experiment_links",
    "log_artifacts",
    "resolve_tracking_uri",
    "run_data",
]
