"""Logged trials -> selected configurations -> the paper's tables (md/tex/csv) and figures (png).

See analysis/README.md for the commands and the MLflow / Ray Tune logging schema this reads; the
trial record itself (params, metric names, statuses) is `stabray.record`.
"""

from analysis.load import Loaded, load, load_mlflow, load_ray
from analysis.select import mean_std, seeds_of, select_best
from analysis.tables import Table, all_tables, latex_escape

__all__ = [
    "Loaded",
    "Table",
    "all_tables",
    "latex_escape",
    "load",
    "load_mlflow",
    "load_ray",
    "mean_std",
    "seeds_of",
    "select_best",
]
