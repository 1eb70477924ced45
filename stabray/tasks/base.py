"""What a task is: a seeded generator of examples with intermediate steps.

An `Example` holds the question (with and without the hint line), the intermediate steps and the
final answer as text. The answer the model is trained on is rendered from a subset of the steps, so
methods that drop or compress steps (Algorithm 1, Implicit CoT) share one format.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import numpy as np

from stabray.errors import UserError
from stabray.registry import Registry

STEP_SEP = ", "  # between intermediate steps
FINAL_SEP = " | "  # between the last step and the final answer
END = "\n\n"  # after the final answer (EOS follows in training)


@dataclass(frozen=True)
class Example:
    question: str  # prompt that asks for trace and answer, e.g. "dijkstra:\n...\ntrace | pi:\n"
    steps: tuple[str, ...]  # intermediate steps, in order; the final answer is not repeated here
    final: str  # the final answer, e.g. "[1 1 1 2 3]"
    question_nohint: str  # prompt that asks for the answer only, e.g. "dijkstra:\n...\npi:\n"
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def render_answer(self, steps: tuple[str, ...] | list[str] | None) -> str:
        """The answer text for the given kept steps: "s1, s2 | final". An empty tuple still writes
        the separator ("| final"), so every chain-of-thought answer has the same shape; None means
        answer only (No CoT: the final alone, asked for by `question_nohint`)."""
        if steps is None:
            body = self.final
        elif steps:
            body = f"{STEP_SEP.join(steps)}{FINAL_SEP}{self.final}"
        else:
            body = f"{FINAL_SEP.lstrip()}{self.final}"
        return body + END

    @property
    def answer(self) -> str:
        """The full answer with every step, exactly as SFT-CoT trains on it."""
        return self.render_answer(self.steps)

    def to_record(self) -> dict[str, Any]:
        return {
            "question": self.question,
            "steps": list(self.steps),
            "final": self.final,
            "answer": self.answer,
            "question_nohint": self.question_nohint,
        }


# The tokens of the task texts: a decimal number, an integer, a word, or one symbol. Answers are
# compared token by token (normalize_answer), and the embedded tokenizer has one entry per token.
TOKEN_RE = re.compile(r"\d+\.\d+|\d+|[A-Za-z_]+|[^\s\w]")


def normalize_answer(text: str) -> str:
    """Canonical token string of an answer, so "[1  2]" and "[1 2]" compare equal but "[12]" not."""
    return " ".join(TOKEN_RE.findall(text))


def extract_final(generated: str) -> str:
    """The final answer in a generated answer: the text after the last '|', or all of it."""
    text = generated
    if "|" in text:
        text = text.rsplit("|", 1)[1]
    return text.strip()


class Task:
    """A seeded example generator. Subclasses set `name`, `version`, `Params`, `size_field`, and
    implement `sample(rng, size)`.

    `version` is the text-format version: bump it whenever the rendered text changes, so cached
    datasets keyed by it are rebuilt and results logged with it stay comparable.
    """

    name: ClassVar[str]
    version: ClassVar[str] = "1"
    Params: ClassVar[type]  # frozen dataclass of generator parameters
    size_field: ClassVar[str]  # the parameter that length generalization grows (nodes, variables)
    runner: ClassVar[str] = "text"  # the trial runner (stabray.train.runner.RUNNERS) that trains on it
    min_size: ClassVar[int] = 2

    def __init__(self, **params: Any):
        names = {f.name for f in dataclasses.fields(self.Params)}
        for key in params:
            if key not in names:
                raise UserError(f"task {self.name!r}: unknown parameter {key!r}; known: {', '.join(sorted(names))}")
        self.params = self.Params(**params)
        size = getattr(self.params, self.size_field)
        self.check_size(size)

    @property
    def size(self) -> int:
        return int(getattr(self.params, self.size_field))

    def check_size(self, size: int) -> None:
        if not isinstance(size, (int, np.integer)) or size < self.min_size:
            raise UserError(
                f"task {self.name!r}: {self.size_field} must be an integer >= {self.min_size}, got {size!r}"
            )

    def long_sizes(self) -> dict[str, int]:
        """Length-generalization sizes: 10% and 20% longer inputs (rounded up, at least +1, +2)."""
        s = self.size
        return {"test_long": max(s + 1, int(np.ceil(s * 1.1))), "test_longer": max(s + 2, int(np.ceil(s * 1.2)))}

    def sample(self, rng: np.random.RandomState, size: int) -> Example:
        raise NotImplementedError

    def is_correct(self, example: Example, predicted_final: str) -> bool:
        """Exact match of the final answer after token normalization (sat3 overrides: it evaluates)."""
        return normalize_answer(predicted_final) == normalize_answer(example.final)

    def trivial_baselines(self) -> dict[str, Callable[[Example], str]]:
        """Rules that need no learning, to put a model's accuracy in context: name -> predicted final."""
        return {}

    def baseline_accuracy(self, examples: list[Example]) -> dict[str, float]:
        """Accuracy of each trivial rule on `examples` (empty when the task names none)."""
        if not examples:
            return {}
        return {
            name: sum(self.is_correct(e, rule(e)) for e in examples) / len(examples)
            for name, rule in self.trivial_baselines().items()
        }

    def describe(self) -> dict[str, Any]:
        return {"task": self.name, "version": self.version, **dataclasses.asdict(self.params)}


TASKS: Registry[type[Task]] = Registry("task")


def get_task(name: str, **params: Any) -> Task:
    return TASKS.get(name)(**params)
