"""Task registry. Importing this package registers every task."""

from stabray.tasks import (  # noqa: F401  (planning tasks: star graph, trees, countdown, 3-SAT)
    clrs,  # noqa: F401  (registers the CLRS-Text tasks)
    countdown,
    icl,  # noqa: F401  (in-context GD steps: icl_linear, icl_quadratic; own runner)
    lego,  # noqa: F401  (registers the LEGO tasks)
    paths,
    sat3,
)
from stabray.tasks.base import TASKS, Example, Task, extract_final, get_task, normalize_answer

__all__ = ["TASKS", "Example", "Task", "extract_final", "get_task", "normalize_answer"]
