"""Task registry. Importing this package registers every task."""

from stabray.tasks.base import TASKS, Example, Task, extract_final, get_task, normalize_answer
from stabray.tasks import clrs  # noqa: F401  (registers the CLRS-Text tasks)
from stabray.tasks import lego  # noqa: F401  (registers the LEGO tasks)
from stabray.tasks import countdown, paths, sat3  # noqa: F401  (planning tasks: star graph, trees, countdown, 3-SAT)
from stabray.tasks import icl  # noqa: F401  (in-context GD steps: icl_linear, icl_quadratic; own runner)

__all__ = ["TASKS", "Example", "Task", "extract_final", "get_task", "normalize_answer"]
