"""`python -m stabray methods`: every registered method, its hyperparameters, defaults and default space."""

from __future__ import annotations

import dataclasses
import re


def register(sub) -> None:
    p = sub.add_parser("methods", help="list methods with their hyperparameters and default search spaces")
    p.set_defaults(func=run)


def run(args) -> int:
    from stabray.methods import METHODS

    for name in METHODS.names():
        cls = METHODS.get(name)
        doc = (cls.__doc__ or __import__(cls.__module__, fromlist=["x"]).__doc__ or "").strip()
        first = " ".join(doc.split("\n\n")[0].split())  # the first paragraph, then its first sentence
        summary = re.split(r"(?<!\bal)\.\s", first)[0].rstrip(".")  # "et al. 2024" does not end it
        print(f"{name}: {summary}")
        fields = dataclasses.fields(cls.Params)
        if not fields:
            print("    (no hyperparameters)")
        for f in fields:
            space = cls.default_space.get(f.name)
            print(f"    {f.name} = {f.default!r}" + (f"    search: {space}" if space else ""))
    return 0
