"""What a task is: a seeded generator of examples with intermediate steps.

An `Example` holds the question (with and without the hint line), the intermediate steps and the
final answer as text. The answer the model is trained on is rendered from a subset of the steps, so
methods that drop or compress steps (Algorithm 1, Implicit CoT) share one format.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import numpy as np

from stabray.errors import UserError, did_you_mean
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


def extract_steps(generated: str) -> str | None:
    """The chain of a generated answer, normalized (`normalize_answer`): the text before the last '|'
    ("" for "| final", an empty chain); None when there is no '|' (no chain written)."""
    return normalize_answer(generated.rsplit("|", 1)[0]) if "|" in generated else None


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


# A Params field's type -> (what a value must be, the check): Task._check_types.
PARAM_TYPES: dict[type, tuple[str, Callable[[Any], bool]]] = {
    int: ("an integer", _is_int),
    float: ("a finite number", lambda v: _is_int(v) or isinstance(v, (float, np.floating)) and bool(np.isfinite(v))),
    bool: ("true or false", lambda v: isinstance(v, (bool, np.bool_))),
    str: ("a string", lambda v: isinstance(v, str)),
}

# Task parameters every task accepts besides its generator's Params (Task.__init__).
SIZE_OPTIONS = ("train_sizes", "train_size_weights", "train_size_schedule", "long_sizes")


def sized_split(size: int) -> str:
    """The name of an evaluation split at an explicit size: `test_n5`."""
    return f"test_n{int(size)}"


class Task:
    """A seeded example generator. Subclasses set `name`, `version`, `Params`, `size_field`, and
    implement `sample(rng, size)`.

    `version` is the text-format version: bump it whenever the rendered text changes, so cached
    datasets keyed by it are rebuilt and results logged with it stay comparable
    (`tests/test_task_versions.py` pins each task's text to its version and fails when it drifts).
    """

    name: ClassVar[str]
    version: ClassVar[str] = "1"
    Params: ClassVar[type]  # frozen dataclass of generator parameters
    size_field: ClassVar[str]  # the parameter that length generalization grows (nodes, variables)
    runner: ClassVar[str] = "text"  # the trial runner (stabray.train.runner.RUNNERS) that trains on it
    min_size: ClassVar[int] = 2
    max_size: ClassVar[int | None] = None  # the largest size one example can be generated at (None: no bound)

    def __init__(
        self,
        train_sizes: list[int] | tuple[int, ...] | None = None,
        long_sizes: list[int] | tuple[int, ...] | None = None,
        train_size_weights: list[float] | tuple[float, ...] | None = None,
        train_size_schedule: dict[int, list[float]] | None = None,
        **params: Any,
    ):
        """`params`: the generator's Params. `train_sizes` (optional): the training, validation and
        test splits mix these sizes, each example's size drawn uniformly; the task's `size` is then
        their maximum and the size parameter is not used. `train_size_weights` (optional, with
        `train_sizes` only): one positive weight per training size, in ascending size order; the
        *training* split draws each example's size with these relative weights (e.g. [1, 3] with
        sizes [3, 4]: three in four examples at 4 nodes), while validation and test stay uniform over
        `train_sizes`, so in-distribution accuracy means the same thing under any weighting.
        `train_size_schedule` (optional, with `train_sizes` only): a size curriculum, {E: weights}
        meaning "after E completed epochs, draw the training sizes with these weights" (same form as
        `train_size_weights`, which hold until the first entry; uniform when not given); e.g.
        {0: [3, 1], 80: [1, 3]} starts mostly at 3 nodes and moves to mostly 4 after 80 epochs. An
        entry after epoch 0 needs `resample_train` (a fresh training split every epoch).
        `long_sizes` (optional): evaluate at these explicit sizes (splits `test_n<k>`, metrics
        `test_acc_n<k>`) instead of 10% and 20% above `size` (splits `test_long`, `test_longer`)."""
        names = {f.name for f in dataclasses.fields(self.Params)}
        for key in params:
            if key not in names:
                allowed = sorted(names | set(SIZE_OPTIONS))
                hint = did_you_mean(key, allowed, before="; ")
                raise UserError(f"task {self.name!r}: unknown parameter {key!r}{hint}; known: {', '.join(allowed)}")
        self._check_types(params)
        self.params = self.Params(**params)
        self.train_sizes = self._size_list("train_sizes", train_sizes)
        self.explicit_long_sizes = self._size_list("long_sizes", long_sizes)
        self.train_size_weights = self._weights(train_sizes, train_size_weights)
        self.train_size_schedule = self._schedule(train_sizes, train_size_schedule)
        if self.train_sizes is None:
            self.check_size(getattr(self.params, self.size_field))
        else:  # the size parameter is the largest training size: given, it must agree; else it is set
            given = params.get(self.size_field)
            if given is not None and given != max(self.train_sizes):
                raise UserError(
                    f"task {self.name!r}: {self.size_field}={given!r} disagrees with train_sizes "
                    f"{list(self.train_sizes)} (it is their maximum; leave it out or set it to {max(self.train_sizes)})"
                )
            self.params = dataclasses.replace(self.params, **{self.size_field: max(self.train_sizes)})
        if self.explicit_long_sizes is not None and min(self.explicit_long_sizes) <= self.size:
            raise UserError(
                f"task {self.name!r}: long_sizes must all be larger than the largest training size {self.size}, "
                f"got {list(self.explicit_long_sizes)}"
            )

    def _size_list(self, key: str, sizes: Any) -> tuple[int, ...] | None:
        if sizes is None:
            return None
        if not isinstance(sizes, (list, tuple)) or not sizes or len(set(sizes)) != len(sizes):
            raise UserError(
                f"task {self.name!r}: {key} must be a non-empty list of distinct {self.size_field} values, "
                f"got {sizes!r}"
            )
        for s in sizes:
            self.check_size(s, key)
        return tuple(sorted(int(s) for s in sizes))

    def _weights(self, sizes: Any, weights: Any) -> tuple[float, ...] | None:
        if weights is None:
            return None
        if sizes is None:
            raise UserError(f"task {self.name!r}: train_size_weights needs train_sizes (one weight per training size)")
        if list(sizes) != sorted(sizes):
            raise UserError(
                f"task {self.name!r}: write train_sizes in ascending order when train_size_weights is set "
                f"(the weights follow that order), got {list(sizes)}"
            )
        ok = isinstance(weights, (list, tuple)) and all(
            isinstance(w, (int, float)) and not isinstance(w, bool) and np.isfinite(w) and w > 0 for w in weights
        )
        if not ok or len(weights) != len(sizes):
            raise UserError(
                f"task {self.name!r}: train_size_weights must be {len(sizes)} positive numbers, one per size in "
                f"train_sizes {list(sizes)}, got {weights!r}"
            )
        return tuple(float(w) for w in weights)

    def _schedule(self, sizes: Any, schedule: Any) -> tuple[tuple[int, tuple[float, ...]], ...] | None:
        if schedule is None:
            return None
        if not isinstance(schedule, dict) or not schedule:
            raise UserError(
                f"task {self.name!r}: train_size_schedule must be a mapping {{epoch: weights}}, e.g. "
                f"{{0: [3, 1], 80: [1, 3]}}, got {schedule!r}"
            )
        out = []
        for epoch, weights in schedule.items():
            if isinstance(epoch, str) and epoch.isdigit():  # a JSON round trip turns the keys into strings
                epoch = int(epoch)
            if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
                raise UserError(
                    f"task {self.name!r}: train_size_schedule keys are numbers of completed epochs (integers "
                    f">= 0), got {epoch!r}"
                )
            try:
                out.append((epoch, self._weights(sizes, weights)))
            except UserError as e:
                raise UserError(str(e).replace("train_size_weights", f"train_size_schedule[{epoch}]")) from None
        return tuple(sorted(out))

    def train_size_weights_at(self, epoch: int) -> tuple[float, ...] | None:
        """The training sizes' weights after `epoch` completed epochs: the last `train_size_schedule`
        entry at or before it, else `train_size_weights` (None: uniform)."""
        weights = self.train_size_weights
        for start, w in self.train_size_schedule or ():
            if start <= epoch:
                weights = w
        return weights

    def train_size_probs_at(self, epoch: int) -> tuple[float, ...] | None:
        """The probability of each of `in_dist_sizes` in the training split drawn after `epoch`
        completed epochs (None: uniform)."""
        weights = self.train_size_weights_at(epoch)
        if weights is None:
            return None
        total = sum(weights)
        return tuple(w / total for w in weights)

    @property
    def train_size_probs(self) -> tuple[float, ...] | None:
        """The first training split's probability of each of `in_dist_sizes` (None: uniform)."""
        return self.train_size_probs_at(0)

    @property
    def size(self) -> int:
        """The largest in-distribution size (the size parameter, or max(train_sizes))."""
        if self.train_sizes is not None:
            return max(self.train_sizes)
        return int(getattr(self.params, self.size_field))

    @property
    def in_dist_sizes(self) -> tuple[int, ...]:
        """The sizes the train, validation and test splits are drawn at (one, or a uniform mix)."""
        return self.train_sizes if self.train_sizes is not None else (self.size,)

    def _check_types(self, params: dict[str, Any]) -> None:
        """An error naming the parameter when a value is not of its Params field's type (int, float,
        bool or str; a bool is not a number), before any range check compares it. The size field is
        left to check_size, whose message names its range."""
        hints = typing.get_type_hints(self.Params)
        for key, value in params.items():
            kind = PARAM_TYPES.get(hints.get(key))
            if key != self.size_field and kind is not None and not kind[1](value):
                raise UserError(f"task {self.name!r}: {key} must be {kind[0]}, got {value!r}")

    def check_size(self, size: int, key: str | None = None) -> None:
        """An error unless `size` is a valid size; `key` (e.g. "long_sizes") names the list it is in."""
        big = _is_int(size) and self.max_size is not None and size > self.max_size
        if not _is_int(size) or size < self.min_size or big:
            what = f"{key}: every entry (a {self.size_field} value)" if key else self.size_field
            bounds = f"in {self.min_size}..{self.max_size}" if self.max_size is not None else f">= {self.min_size}"
            raise UserError(f"task {self.name!r}: {what} must be an integer {bounds}, got {size!r}")

    def long_sizes(self) -> dict[str, int]:
        """Length-generalization splits and their sizes: the explicit `long_sizes` as `test_n<k>`,
        else 10% and 20% larger inputs than the largest in-distribution size (rounded up, at least
        +1, +2) as `test_long`, `test_longer`."""
        if self.explicit_long_sizes is not None:
            return {sized_split(k): k for k in self.explicit_long_sizes}
        s = self.size
        return {"test_long": max(s + 1, int(np.ceil(s * 1.1))), "test_longer": max(s + 2, int(np.ceil(s * 1.2)))}

    def long_splits(self, requested: list[str] | tuple[str, ...] | None = None) -> tuple[str, ...]:
        """The length-generalization splits to evaluate: `requested` (eval.long_splits), each one
        of `long_sizes()`, or all of them when None."""
        known = tuple(self.long_sizes())
        if requested is None:
            return known
        for split in requested:
            if split not in known:
                raise UserError(
                    f"eval.long_splits: task {self.name!r} has no split {split!r}; its long splits: {', '.join(known)}"
                )
        return tuple(requested)

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
        """What determines the task's examples (the dataset cache key holds it). The size options
        appear only when set, so a task without them keeps its cache keys."""
        d = {"task": self.name, "version": self.version, **dataclasses.asdict(self.params)}
        if self.train_sizes is not None:
            d["train_sizes"] = list(self.train_sizes)
        if self.train_size_weights is not None:
            d["train_size_weights"] = list(self.train_size_weights)
        if self.train_size_schedule is not None:
            d["train_size_schedule"] = {str(e): list(w) for e, w in self.train_size_schedule}
        if self.explicit_long_sizes is not None:
            d["long_sizes"] = list(self.explicit_long_sizes)
        return d


TASKS: Registry[type[Task]] = Registry("task")


def get_task(name: str, **params: Any) -> Task:
    return TASKS.get(name)(**params)
