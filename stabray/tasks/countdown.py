"""Countdown (the numbers game; as in Stream of Search and the multi-token-prediction paper): combine
all the given numbers with + - * / to reach the target.

Rules: every number is used exactly once; each operation combines two numbers into a new one, and
every intermediate result must be a non-negative integer (so `-` writes larger - smaller and `/`
only divides exactly).

Sampling: `n_numbers` numbers uniform in 1..max_number; a random planted solution (random pairs,
random valid operations) gives the target, redrawn until it lies in 1..max_target. The planted
solution only guarantees that one exists: the steps come from a deterministic depth-first solver
(pairs in list order, operations in the order + - * /, a combined number appended at the end of the
list), so the steps are a function of the question alone.

Steps: the operations of the solver's solution, one per step, e.g. `7 * 4 = 28` - a solution, not a
search trace (no dead ends are written). Final: the same solution as one expression, every
operation but the last parenthesized, e.g. `(7 * 4) - (3 + 1)`. `is_correct` evaluates the
predicted expression: any expression that uses exactly the given numbers, keeps every intermediate
result a non-negative integer and equals the target is right, whether or not it is the solver's.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

import numpy as np

from stabray.errors import UserError
from stabray.tasks.base import TASKS, TOKEN_RE, Example, Task

OPS = ("+", "-", "*", "/")


def apply_op(a: int, op: str, b: int) -> int | None:
    """a op b under the rules (a >= b for - and /), or None where it is not allowed."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b if a >= b else None
    if op == "*":
        return a * b
    return a // b if b != 0 and a % b == 0 else None


def solve(numbers: list[int], target: int) -> list[tuple[int, str, int, int]] | None:
    """The first solution in depth-first order as (a, op, b, result) operations, or None."""
    failed: set[tuple[int, ...]] = set()

    def go(nums: list[int]) -> list | None:
        if len(nums) == 1:
            return [] if nums[0] == target else None
        key = tuple(sorted(nums))
        if key in failed:
            return None
        for i in range(len(nums)):
            for j in range(i + 1, len(nums)):
                a, b = max(nums[i], nums[j]), min(nums[i], nums[j])
                rest = [x for k, x in enumerate(nums) if k not in (i, j)]
                for op in OPS:
                    r = apply_op(a, op, b)
                    if r is None:
                        continue
                    sub = go(rest + [r])
                    if sub is not None:
                        return [(a, op, b, r)] + sub
        failed.add(key)
        return None

    return go(list(numbers))


def expression(numbers: list[int], ops: list[tuple[int, str, int, int]]) -> str:
    """The solution as one expression (each intermediate parenthesized; the outermost bare)."""
    pool = [(n, str(n)) for n in numbers]  # (value, text)
    for a, op, b, r in ops:
        ia = next(k for k, (v, _) in enumerate(pool) if v == a)
        ta = pool.pop(ia)[1]
        ib = next(k for k, (v, _) in enumerate(pool) if v == b)
        tb = pool.pop(ib)[1]
        pool.append((r, f"({ta} {op} {tb})"))
    ((_, text),) = pool
    return text[1:-1] if text.startswith("(") else text


class _Parser:
    """Recursive descent over + - * / and parentheses with the usual precedence; collects the
    number literals and checks that every intermediate result is a non-negative integer."""

    def __init__(self, text: str):
        self.toks = TOKEN_RE.findall(text)
        self.i = 0
        self.literals: list[int] = []

    def peek(self):
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self):
        t = self.peek()
        self.i += 1
        return t

    def binop(self, a: Fraction, op: str, b: Fraction) -> Fraction:
        if op == "/" and b == 0:
            raise ValueError("division by zero")
        r = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else None}[op]
        if r.denominator != 1 or r < 0:
            raise ValueError("intermediate result not a non-negative integer")
        return r

    def expr(self) -> Fraction:
        v = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            v = self.binop(v, op, self.term())
        return v

    def term(self) -> Fraction:
        v = self.factor()
        while self.peek() in ("*", "/"):
            op = self.take()
            v = self.binop(v, op, self.factor())
        return v

    def factor(self) -> Fraction:
        t = self.take()
        if t == "(":
            v = self.expr()
            if self.take() != ")":
                raise ValueError("unbalanced parentheses")
            return v
        if t is not None and t.isdigit():
            self.literals.append(int(t))
            return Fraction(int(t))
        raise ValueError(f"unexpected token {t!r}")


def evaluate(text: str) -> tuple[Fraction, list[int]]:
    """(value, number literals) of an expression; ValueError if it breaks the rules or the grammar."""
    p = _Parser(text)
    v = p.expr()
    if p.peek() is not None:
        raise ValueError(f"trailing tokens from {p.peek()!r}")
    return v, p.literals


def parse_question(question: str) -> tuple[list[int], int]:
    line = question.split("\n")[1]  # "numbers: [3 5 2 4], target: 12"
    nums = line.split("[")[1].split("]")[0].split()
    return [int(x) for x in nums], int(line.rsplit("target: ", 1)[1])


@dataclass(frozen=True)
class CountdownParams:
    n_numbers: int = 4  # numbers given (all must be used)
    max_number: int = 20  # numbers are uniform in 1..max_number
    max_target: int = 100  # targets lie in 1..max_target


@TASKS.register("countdown")
class Countdown(Task):
    """Countdown: steps are the solver's operations, the final the same solution as an expression.

    Example (n_numbers=3; `draw(get_task('countdown', n_numbers=3), "test", 1, seed=0, size=3)[0]`,
    question then answer; the answer ends with a blank line):

        countdown:
        numbers: [2 9 2], target: 9
        trace | expression:
        9 + 2 = 11, 11 - 2 = 9 | (9 + 2) - 2
    """

    Params = CountdownParams
    size_field = "n_numbers"
    min_size = 2

    def check_size(self, size: int, key: str | None = None) -> None:
        super().check_size(size, key)
        p = self.params  # set before Task.__init__ checks the size
        for name in ("max_number", "max_target"):  # 0 would draw from an empty range, or never find a target
            if getattr(p, name) < 1:
                raise UserError(f"task {self.name!r}: {name} must be >= 1, got {getattr(p, name)}")
        if size > 8:
            raise UserError(
                f"task {self.name!r}: n_numbers must be <= 8 (the solver's search grows factorially), got {size}"
            )

    def sample(self, rng: np.random.RandomState, size: int) -> Example:
        self.check_size(size)
        p = self.params
        while True:
            numbers = (rng.randint(p.max_number, size=int(size)) + 1).tolist()
            pool = list(numbers)
            while len(pool) > 1:  # planted solution: random pair, random allowed operation
                i, j = rng.choice(len(pool), 2, replace=False).tolist()
                a, b = max(pool[i], pool[j]), min(pool[i], pool[j])
                r = apply_op(a, OPS[rng.randint(4)], b)
                if r is None:
                    continue
                pool = [x for k, x in enumerate(pool) if k not in (i, j)] + [r]
            target = pool[0]
            if 1 <= target <= p.max_target:
                break
        ops = solve(numbers, target)
        assert ops is not None  # the planted solution exists
        head = f"{self.name}:\nnumbers: [{' '.join(map(str, numbers))}], target: {target}\n"
        return Example(
            question=head + "trace | expression:\n",
            steps=tuple(f"{a} {op} {b} = {r}" for a, op, b, r in ops),
            final=expression(numbers, ops),
            question_nohint=head + "expression:\n",
            meta={"n": int(size), "numbers": numbers, "target": target},
        )

    def is_correct(self, example: Example, predicted_final: str) -> bool:
        numbers, target = parse_question(example.question)
        try:
            value, literals = evaluate(predicted_final)
        except (ValueError, ZeroDivisionError):
            return False
        return value == target and sorted(literals) == sorted(numbers)

    def trivial_baselines(self) -> dict[str, Callable[[Example], str]]:
        return {"the sum of all numbers": lambda ex: " + ".join(map(str, parse_question(ex.question)[0]))}
