"""One generic registry for tasks, methods and trial runners: a name is written once (at
registration, which also sets the class's `name`), aliases point at it, and an unknown name fails
with "did you mean ..." and the list of what exists."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from stabray.errors import UserError, did_you_mean

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str, on_register: Callable[[str, T], None] | None = None):
        self.kind = kind  # "task", "method", "runner": used in error messages
        self.on_register = on_register  # called with (name, obj) once registered, e.g. to check obj
        self._items: dict[str, T] = {}
        self._aliases: dict[str, str] = {}

    def register(self, name: str, *, aliases: tuple[str, ...] = ()) -> Callable[[T], T]:
        """Class decorator: registers the class under `name` and sets `cls.name = name`."""

        def deco(obj: T) -> T:
            for key in (name, *aliases):
                if key in self._items or key in self._aliases:
                    raise ValueError(f"{self.kind} {key!r} is registered twice")
            if "name" in vars(obj):
                raise ValueError(f"{self.kind} {name!r}: the registration names the class; drop its `name` attribute")
            obj.name = name
            self._items[name] = obj
            for a in aliases:
                self._aliases[a] = name
            if self.on_register is not None:
                self.on_register(name, obj)
            return obj

        return deco

    def canonical(self, name: str) -> str:
        if name in self._items:
            return name
        if name in self._aliases:
            return self._aliases[name]
        known = sorted([*self._items, *self._aliases])
        hint = did_you_mean(name, known, n=3, cutoff=0.5, quote=True, before=" ")
        raise UserError(f"unknown {self.kind} {name!r};{hint} available: {', '.join(sorted(self._items))}")

    def get(self, name: str) -> T:
        return self._items[self.canonical(name)]

    def names(self) -> list[str]:
        return sorted(self._items)

    def aliases_of(self, name: str) -> list[str]:
        return sorted(a for a, n in self._aliases.items() if n == name)

    def __contains__(self, name: str) -> bool:
        return name in self._items or name in self._aliases

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
