"""`python -m stabray methods`: every registered method, what it does, its hyperparameters with their
defaults, and the space a sweep searches by default (stabray/methods/spaces.yaml)."""

from __future__ import annotations

import dataclasses
import textwrap

WIDTH = 100  # wrap descriptions here


def register(sub) -> None:
    p = sub.add_parser(
        "methods",
        help="list methods with their hyperparameters and default search spaces",
        description=__doc__.split(":", 1)[1].strip(),
    )
    p.set_defaults(func=run)


def space_text(dist: dict) -> str:
    """{'choice': [1, 2]} -> 'choice of 1, 2'; {'loguniform': [0.001, 0.03]} -> 'loguniform 0.001 .. 0.03'."""
    if not isinstance(dist, dict) or len(dist) != 1:
        return str(dist)
    ((kind, v),) = dist.items()
    if kind == "choice":
        return "choice of " + ", ".join(map(str, v))
    return f"{kind} {v[0]} .. {v[1]}"


def describe(name: str) -> str:
    from stabray.methods import METHODS

    cls = METHODS.get(name)
    doc = (cls.__doc__ or __import__(cls.__module__, fromlist=["x"]).__doc__ or "").strip()
    first = " ".join(doc.split("\n\n")[0].split())  # the whole first paragraph, unwrapped
    lines = [name]
    lines += textwrap.wrap(first, WIDTH, initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False)
    fields = dataclasses.fields(cls.Params)
    if not fields:
        lines.append("  hyperparameters: none")
        return "\n".join(lines)
    rows = [(f.name, repr(f.default), space_text(cls.default_space[f.name]) if f.name in cls.default_space else "")
            for f in fields]  # fmt: skip
    w0 = max(len("hyperparameter"), *(len(r[0]) for r in rows))
    w1 = max(len("default"), *(len(r[1]) for r in rows))
    lines.append(f"  {'hyperparameter':<{w0}}  {'default':<{w1}}  searched by default")
    lines += [f"  {a:<{w0}}  {b:<{w1}}  {c or '-'}".rstrip() for a, b, c in rows]
    return "\n".join(lines)


def run(args) -> int:
    from stabray.methods import METHODS

    print("\n\n".join(describe(name) for name in METHODS.names()))
    return 0
