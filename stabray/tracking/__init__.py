"""MLflow tracking. The only package of stabray that imports mlflow."""

from stabray.tracking.store import Store, log_artifacts, resolve_tracking_uri

__all__ = ["Store", "log_artifacts", "resolve_tracking_uri"]
