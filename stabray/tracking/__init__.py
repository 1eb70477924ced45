"""MLflow tracking. The only package of stabray that imports mlflow."""

from stabray.tracking.store import Store, checkpoint_dir_of, log_artifacts, resolve_tracking_uri

__all__ = ["Store", "checkpoint_dir_of", "log_artifacts", "resolve_tracking_uri"]
