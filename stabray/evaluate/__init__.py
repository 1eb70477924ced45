from stabray.evaluate.generate import greedy
from stabray.evaluate.metrics import EvalResult, evaluate_split

__all__ = ["greedy", "EvalResult", "evaluate_split"]
