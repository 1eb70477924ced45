"""LEGO state tracking (Zhang et al. 2022, "Unveiling Transformers with LEGO"), as text chain of thought.

A chain of k variables: the root gets a constant (`a = 4`), every other variable is a group element
applied to its parent (`b = a + 2`). The clauses are shown in a random order, so the model must
find the chain; variable names are distinct random letters (`n` is never a name: it marks an
unknown value).

Question: `f"{name}:\\nvars: [b e k ...], clauses: k = e + 3; b = 4; e = b + 0; ...\\ntrace | values:\\n"`.
`vars` lists the names in alphabetical order, which is the order of every state vector. Step j
(j = 1..k) is the state once the first j variables of the chain are known, e.g. `[4 n n]`, `[4 4 n]`;
the last state (every value known) is the final answer and is not repeated as a step, so there
are k - 1 steps. Without hints the output line is `values`.

Groups:
- cyclic: Z6. Values 0..5; an operation is a shift `x + a` (mod 6), a uniform in 0..5.
- symmetry: S5, values are permutations. A permutation of 1..5 is written in one-line notation as
  5 digits with no spaces (`31452` maps 1->3, 2->1, 3->4, 4->5, 5->2), so each value is one token;
  using 1..5 rather than 0..4 avoids leading zeros. The root is a uniform permutation and an
  operation `y = 21453 * x` composes a uniform permutation s after x: y(i) = s(x(i)).
  `degree: d` (lego_symmetry only, 3..9, default 5) draws from S_d instead: `degree: 3` is S3, the
  smallest non-abelian group (6 elements, `231 * x`), a laptop-scale variant whose composition table
  (36 entries) is the size of Z6's, where S5's has 14,400.

Named states (`named_states: true`, a laptop-scale variant): every state entry is written
`name value` (`[f 3 i n s n]`), so each slot carries its variable's name; the content is the same.
Tiny from-scratch models learn LEGO only in this form (the default renders values alone).

Delta trace (`trace: delta`, a laptop-scale variant for length generalization): step j writes only
the j-th variable of the chain and its value (`f 3`), as the LEGO paper's chain of thought resolves
one variable per step, so there are k steps of the same length at every k; the final answer is the
state vector as above. A step then needs a content lookup (the clause whose right-hand side names
the variable just resolved) instead of copying a state whose length, and so the distance to copy
from, grows with k. The default (`trace: state`) writes the whole state at every step.

Delta trace with operations (`trace: delta_op`): as `delta`, and each step also writes the operation
of the variable's clause between its name and its value (`f 2 3` for `f = d + 2` with d = 1; `=` for
the root, whose clause has none: `d = 1`), so a step's value is its operation applied to the value
written one step before, and the lookup in the clauses is a copy (the operation) apart from the
arithmetic. Three tokens per step, the last the value.

Clause order (`clause: name_last`, a laptop-scale variant): every clause ends with the name it defines
(`d + 2 = f`, the root `1 = d`) instead of starting with it (`f = d + 2`, the default, as the LEGO
paper writes them). The same draws and the same equations; in a causal decoder the defined name's
own position then follows the whole clause (parent, operation), so the lookup of "the clause whose
parent is d" can land on the name it has to copy rather than on a token after it.
"""

from __future__ import annotations

import itertools
import string
from dataclasses import dataclass
from typing import Callable

import numpy as np

from stabray.errors import UserError
from stabray.tasks.base import TASKS, Example, Task

NAMES = tuple(c for c in string.ascii_lowercase if c != "n")  # "n" marks an unknown value
UNKNOWN = "n"
DEGREES = range(3, 10)  # S_d with one digit per entry of the one-line notation


def fmt_perm(p: tuple[int, ...]) -> str:
    return "".join(str(x) for x in p)


def parse_perm(text: str) -> tuple[int, ...]:
    return tuple(int(c) for c in text)


def compose(s: tuple[int, ...], x: tuple[int, ...]) -> tuple[int, ...]:
    """s after x: (s * x)(i) = s(x(i)), on 1-based one-line notation."""
    return tuple(s[xi - 1] for xi in x)


@dataclass(frozen=True)
class LegoParams:
    n_vars: int = 8  # variables in the chain (the paper: 8; length generalization: 9 and 10)
    named_states: bool = False  # write each state entry as "name value" ([f 3 i n]): a name per slot
    trace: str = "state"  # "state": the state per step; "delta": the variable resolved ("f 3"); "delta_op": "f 2 3"
    answer: str = "state"  # "state": alphabetical; "chain": the same entries in chain order; "last": the last one
    clause: str = "name_first"  # "name_first": `f = d + 2`; "name_last": `d + 2 = f` (the defined name last)


TRACES = ("state", "delta", "delta_op")
ANSWERS = ("state", "chain", "last")
CLAUSES = ("name_first", "name_last")


@dataclass(frozen=True)
class LegoSymmetryParams(LegoParams):
    degree: int = 5  # values are permutations of 1..degree (the paper: S5; laptop scale: S3)


class LegoTask(Task):
    """Shared sampling and rendering; subclasses give the group."""

    Params = LegoParams
    size_field = "n_vars"
    max_size = len(NAMES)  # one distinct letter per variable

    def __init__(self, **params):
        super().__init__(**params)
        if not isinstance(self.params.named_states, bool):
            raise UserError(f"task {self.name!r}: named_states must be true or false, got {self.params.named_states!r}")
        for key, allowed in (("trace", TRACES), ("answer", ANSWERS), ("clause", CLAUSES)):
            value = getattr(self.params, key)
            if value not in allowed:
                raise UserError(f"task {self.name!r}: {key} must be one of {', '.join(allowed)}, got {value!r}")

    def check_size(self, size: int, key: str | None = None) -> None:
        super().check_size(size, key)
        if size > self.max_size:
            raise UserError(
                f"task {self.name!r}: {self.size_field} must be <= {self.max_size} "
                f"(one letter per variable), got {size!r}"
            )

    # group hooks: a random root value, a random operation, apply, and text
    def random_value(self, rng: np.random.RandomState):
        raise NotImplementedError

    def random_op(self, rng: np.random.RandomState):
        raise NotImplementedError

    def apply(self, op, x):
        raise NotImplementedError

    def fmt_value(self, x) -> str:
        raise NotImplementedError

    def fmt_expr(self, op, x: str) -> str:
        """The right-hand side of a clause: the operation applied to the parent's name (`d + 2`)."""
        raise NotImplementedError

    def fmt_clause(self, y: str, expr: str) -> str:
        """A clause defining `y` as `expr` (an expression or the root's constant), `clause` says which side
        the name goes: `f = d + 2` (name_first) or `d + 2 = f` (name_last)."""
        return f"{expr} = {y}" if self.params.clause == "name_last" else f"{y} = {expr}"

    def fmt_op(self, op) -> str:
        """An operation as its clause writes it (`2` in `f = d + 2`), for `trace: delta_op`."""
        raise NotImplementedError

    def sample(self, rng: np.random.RandomState, size: int) -> Example:
        self.check_size(size)
        k = int(size)
        chain = [NAMES[i] for i in rng.choice(len(NAMES), k, replace=False)]  # dependency order
        values = [self.random_value(rng)]
        clauses = [self.fmt_clause(chain[0], self.fmt_value(values[0]))]
        ops = ["="]  # as a delta_op step writes them; the root's clause has no operation
        for j in range(1, k):
            op = self.random_op(rng)
            values.append(self.apply(op, values[-1]))
            clauses.append(self.fmt_clause(chain[j], self.fmt_expr(op, chain[j - 1])))
            ops.append(self.fmt_op(op))
        shown = [clauses[i] for i in rng.permutation(k)]
        names = sorted(chain)
        value_of = {v: self.fmt_value(x) for v, x in zip(chain, values)}
        known: set[str] = set()
        states = []
        for v in chain:
            known.add(v)
            states.append(self.fmt_state(names, [value_of[u] if u in known else UNKNOWN for u in names]))
        if self.params.trace == "delta":  # every resolution, in chain order; the final gathers them
            steps = tuple(f"{v} {value_of[v]}" for v in chain)
        elif self.params.trace == "delta_op":  # the same, each with its clause's operation
            steps = tuple(f"{v} {o} {value_of[v]}" for v, o in zip(chain, ops))
        else:  # every state but the last (the default final answer)
            steps = tuple(states[:-1])
        head = f"{self.name}:\nvars: [{' '.join(names)}], clauses: {'; '.join(shown)}\n"
        return Example(
            question=head + "trace | values:\n",
            steps=steps,
            final=self.fmt_answer(chain, [value_of[v] for v in chain]),
            question_nohint=head + "values:\n",
            meta={"n": k, "chain": chain, "values": [value_of[v] for v in chain]},
        )

    def fmt_state(self, names: list[str], values: list[str]) -> str:
        """A state vector in alphabetical order of the names: `[3 n 0]`, or `[f 3 i n s 0]` when named."""
        if self.params.named_states:
            return "[" + " ".join(f"{u} {x}" for u, x in zip(names, values)) + "]"
        return "[" + " ".join(values) + "]"

    def fmt_answer(self, chain: list[str], values: list[str]) -> str:
        """The final answer for a chain and its values (both in chain order), as `answer` says."""
        if self.params.answer == "last":
            return self.fmt_state(chain[-1:], values[-1:])
        if self.params.answer == "chain":
            return self.fmt_state(chain, values)
        order = sorted(range(len(chain)), key=chain.__getitem__)
        return self.fmt_state([chain[i] for i in order], [values[i] for i in order])

    def describe(self) -> dict:
        d = super().describe()
        if d.get("answer") == "state":
            d.pop("answer", None)
        if not d.get("named_states"):  # the default format keeps its dataset cache keys
            d.pop("named_states", None)
        if d.get("trace") == "state":
            d.pop("trace", None)
        if d.get("clause") == "name_first":
            d.pop("clause", None)
        return d

    def trivial_baselines(self) -> dict[str, Callable[[Example], str]]:
        def root_everywhere(ex: Example) -> str:
            # "every variable equals the constant given to the root"
            return self.fmt_answer(ex.meta["chain"], [ex.meta["values"][0]] * ex.meta["n"])

        return {"every value = the root's constant": root_everywhere}


@TASKS.register("lego_cyclic")
class LegoCyclic(LegoTask):
    """LEGO over Z6: values 0..5, operations are shifts mod 6.

    Example (n_vars=4; `draw(get_task('lego_cyclic'), "test", 1, seed=0, size=4)[0]`,
    question then answer; the answer ends with a blank line):

        lego_cyclic:
        vars: [f i s v], clauses: v = s + 2; i = f + 0; f = 3; s = i + 3
        trace | values:
        [3 n n n], [3 3 n n], [3 3 0 n] | [3 3 0 2]
    """

    modulus = 6

    def random_value(self, rng):
        return int(rng.randint(self.modulus))

    def random_op(self, rng):
        return int(rng.randint(self.modulus))

    def apply(self, op, x):
        return (x + op) % self.modulus

    def fmt_value(self, x) -> str:
        return str(x)

    def fmt_expr(self, op, x) -> str:
        return f"{x} + {op}"

    def fmt_op(self, op) -> str:
        return str(op)


@TASKS.register("lego_symmetry")
class LegoSymmetry(LegoTask):
    """LEGO over S5: values are permutations of 1..5 written as 5 digits, operations compose a
    permutation after the parent's value.

    Example (n_vars=3; `draw(get_task('lego_symmetry'), "test", 1, seed=0, size=3)[0]`,
    question then answer; the answer ends with a blank line):

        lego_symmetry:
        vars: [o q w], clauses: w = 51234; q = 32514 * w; o = 12534 * q
        trace | values:
        [n n 51234], [n 43251 51234] | [35241 43251 51234]
    """

    Params = LegoSymmetryParams

    def __init__(self, **params):
        super().__init__(**params)
        d = self.params.degree
        if isinstance(d, bool) or not isinstance(d, int) or d not in DEGREES:
            raise UserError(
                f"task {self.name!r}: degree must be an integer in {DEGREES[0]}..{DEGREES[-1]} "
                f"(permutations of 1..degree, one digit per entry), got {d!r}"
            )
        self.perms = [tuple(p) for p in itertools.permutations(range(1, d + 1))]  # S_d, lexicographic order

    def random_value(self, rng):
        return self.perms[rng.randint(len(self.perms))]

    def random_op(self, rng):
        return self.perms[rng.randint(len(self.perms))]

    def apply(self, op, x):
        return compose(op, x)

    def fmt_value(self, x) -> str:
        return fmt_perm(x)

    def fmt_expr(self, op, x) -> str:
        return f"{fmt_perm(op)} * {x}"

    def fmt_op(self, op) -> str:
        return fmt_perm(op)

    def describe(self) -> dict:
        d = super().describe()
        if d.get("degree") == 5:  # S5 keeps its dataset cache keys
            d.pop("degree", None)
        return d
