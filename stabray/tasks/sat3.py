"""Random satisfiable 3-SAT with a DPLL trace (the SAT task of the multi-token-prediction paper).

Sampling: a planted assignment uniform over {0, 1}^n; clauses of 3 distinct variables with random
signs, rejected when the planted assignment falsifies them, until `round(ratio * n)` distinct
clauses (fewer if fewer exist). Variables are 1..n; a clause is written in DIMACS style with its
variables ascending, `(1 -3 4)` meaning x1 or not x3 or x4.

Steps: the trace of a plain DPLL (unit propagation, then branching; no pure-literal rule, no
learning), one event per step:
- `unit v = b`: the first clause (in the listed order) with one unassigned literal and none true
  forces x_v = b; propagation rescans from the first clause after every assignment;
- `conflict`: a clause has every literal false; the search backtracks to the most recent decision
  whose value 0 is untried;
- `decide v = b`: branch on the lowest unassigned variable that occurs in a clause not yet
  satisfied, value 1 first, then 0 after a conflict below it. A `decide v = 0` line therefore
  undoes every assignment made since the matching `decide v = 1`.
The search stops when every clause is satisfied. Final: the assignment DPLL found as a vector of
bits, x1 first, e.g. `[1 0 0 1 1]`; variables DPLL never had to set are 1. `is_correct` evaluates
the formula under the predicted assignment: any satisfying assignment is right.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from math import comb
from typing import Callable

import numpy as np

from stabray.errors import UserError
from stabray.tasks.base import TASKS, TOKEN_RE, Example, Task

Clause = tuple[int, ...]  # signed variable indices, e.g. (1, -3, 4)


def satisfied(clause: Clause, assign: dict[int, int]) -> bool:
    return any(assign.get(abs(lit)) == (lit > 0) for lit in clause)


def dpll(n: int, clauses: list[Clause]) -> tuple[list[str], dict[int, int] | None]:
    """(trace, assignment or None if unsatisfiable), in the format of the module docstring."""
    trace: list[str] = []
    assign: dict[int, int] = {}

    def propagate() -> bool:
        while True:
            for c in clauses:
                if satisfied(c, assign):
                    continue
                free = [lit for lit in c if abs(lit) not in assign]
                if not free:
                    trace.append("conflict")
                    return False
                if len(free) == 1:
                    v, b = abs(free[0]), int(free[0] > 0)
                    assign[v] = b
                    trace.append(f"unit {v} = {b}")
                    break
            else:
                return True

    def search() -> bool:
        if not propagate():
            return False
        open_vars = sorted(
            {abs(lit) for c in clauses if not satisfied(c, assign) for lit in c if abs(lit) not in assign}
        )
        if not open_vars:
            return True
        v = open_vars[0]
        saved = dict(assign)
        for b in (1, 0):
            assign.clear()
            assign.update(saved)
            assign[v] = b
            trace.append(f"decide {v} = {b}")
            if search():
                return True
        assign.clear()
        assign.update(saved)
        return False

    ok = search()
    return trace, ({v: assign.get(v, 1) for v in range(1, n + 1)} if ok else None)


def fmt_clause(c: Clause) -> str:
    return "(" + " ".join(str(lit) for lit in c) + ")"


def parse_question(question: str) -> tuple[int, list[Clause]]:
    line = question.split("\n")[1]  # "vars: 5, clauses: (1 -3 4) (2 3 -5) ..."
    n = int(line.split("vars: ")[1].split(",")[0])
    clauses = [tuple(int(x) for x in g.split()) for g in re.findall(r"\(([^()]*)\)", line)]
    return n, clauses


def parse_assignment(text: str, n: int) -> dict[int, int] | None:
    toks = TOKEN_RE.findall(text)
    if len(toks) != n + 2 or toks[0] != "[" or toks[-1] != "]" or any(t not in ("0", "1") for t in toks[1:-1]):
        return None
    return {v: int(t) for v, t in enumerate(toks[1:-1], start=1)}


@dataclass(frozen=True)
class Sat3Params:
    n_vars: int = 5  # variables x1..xn
    ratio: float = 4.0  # clauses per variable (4.26 is the random 3-SAT threshold)


@TASKS.register("sat3")
class Sat3(Task):
    """Planted 3-SAT: steps are the DPLL trace, the final a satisfying assignment (checked by evaluation).

    Example (n_vars=3, ratio=2; `draw(get_task('sat3', n_vars=3, ratio=2.0), "test", 1, seed=0,
    size=3)[0]`, question then answer; the answer ends with a blank line):

        sat3:
        vars: 3, clauses: (-1 -2 3) (1 2 3) (1 -2 3) (-1 -2 -3) (1 -2 -3) (-1 2 3)
        trace | assignment:
        decide 1 = 1, decide 2 = 1, unit 3 = 1, conflict, decide 2 = 0, unit 3 = 1 | [1 0 1]
    """

    Params = Sat3Params
    size_field = "n_vars"
    min_size = 3

    def check_size(self, size: int, key: str | None = None) -> None:
        super().check_size(size, key)
        p = self.params  # set before Task.__init__ checks the size
        if not p.ratio > 0:
            raise UserError(f"task {self.name!r}: ratio must be > 0, got {p.ratio}")

    def sample(self, rng: np.random.RandomState, size: int) -> Example:
        self.check_size(size)
        n = int(size)
        planted = {v: int(b) for v, b in enumerate(rng.randint(2, size=n).tolist(), start=1)}
        m = min(max(1, round(self.params.ratio * n)), 7 * comb(n, 3))  # 7 of 8 sign patterns survive
        clauses: list[Clause] = []
        seen: set[Clause] = set()
        while len(clauses) < m:
            vs = sorted((rng.choice(n, 3, replace=False) + 1).tolist())
            signs = rng.randint(2, size=3).tolist()
            c = tuple(v if s else -v for v, s in zip(vs, signs))
            if c in seen or not satisfied(c, planted):
                continue
            seen.add(c)
            clauses.append(c)
        trace, found = dpll(n, clauses)
        assert found is not None  # the planted assignment satisfies every clause
        head = f"{self.name}:\nvars: {n}, clauses: {' '.join(fmt_clause(c) for c in clauses)}\n"
        return Example(
            question=head + "trace | assignment:\n",
            steps=tuple(trace),
            final="[" + " ".join(str(found[v]) for v in range(1, n + 1)) + "]",
            question_nohint=head + "assignment:\n",
            meta={"n": n, "clauses": [list(c) for c in clauses], "planted": [planted[v] for v in range(1, n + 1)]},
        )

    def is_correct(self, example: Example, predicted_final: str) -> bool:
        n, clauses = parse_question(example.question)
        assign = parse_assignment(predicted_final, n)
        return assign is not None and all(satisfied(c, assign) for c in clauses)

    def trivial_baselines(self) -> dict[str, Callable[[Example], str]]:
        return {"every variable 1": lambda ex: "[" + " ".join(["1"] * parse_question(ex.question)[0]) + "]"}
