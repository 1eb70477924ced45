"""Task generator parameters of the wrong type (a string, a list, a bool where a number goes) are a
UserError naming the task and the parameter, for every task and every int, float, bool or str field,
rather than a TypeError from the first range check that compares them (`data --param p=abc` gave one)."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from stabray.errors import UserError
from stabray.tasks import TASKS, get_task

FIELDS = [
    (name, f.name, typing.get_type_hints(TASKS.get(name).Params)[f.name], f.default)
    for name in sorted(TASKS)
    for f in dataclasses.fields(TASKS.get(name).Params)
]
WRONG = {int: ["abc", [1], True, 2.5], float: ["abc", [1], True, None], bool: ["yes", 1, None], str: [True, [1], 3]}


def test_every_task_has_typed_parameters():
    kinds = {kind for _, _, kind, _ in FIELDS}
    assert {int, float, bool, str} <= kinds and len({name for name, *_ in FIELDS}) >= 10


@pytest.mark.parametrize("task, key, kind, default", [c for c in FIELDS if c[2] in WRONG], ids=lambda v: str(v))
def test_a_value_of_the_wrong_type_names_the_parameter(task, key, kind, default):
    for value in WRONG[kind]:
        with pytest.raises(UserError, match=rf"task '{task}': {key} must be .*, got {value!r}".replace("[", r"\[")):
            get_task(task, **{key: value})
    get_task(task, **{key: default})  # its own default, given explicitly, is fine


def test_an_integer_is_a_number():
    assert get_task("dijkstra", p=1).params.p == 1
    with pytest.raises(UserError, match=r"p must be in \(0, 1\], got 2"):  # the range check still runs
        get_task("dijkstra", p=2)
