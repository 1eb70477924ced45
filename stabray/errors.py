"""Errors a user can fix. The CLI prints their message and exits with code 2."""


class UserError(ValueError):
    """Bad input: an unknown name, a misspelled key, an impossible value."""


class SpecError(UserError):
    """A sweep spec that does not validate; the message names the field and the file. `related`: other
    fields the problem is about (a conflict between two), for saying which `--set` caused it."""

    def __init__(self, path: str, field: str, problem: str, related: tuple[str, ...] = ()):
        self.path, self.field, self.problem, self.related = str(path), field, problem, tuple(related)
        super().__init__(f"{self.path}: {field}: {problem}")
