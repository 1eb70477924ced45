"""Errors a user can fix. The CLI prints their message and exits with code 2."""


class UserError(ValueError):
    """Bad input: an unknown name, a misspelled key, an impossible value."""


class SpecError(UserError):
    """A sweep spec that does not validate; the message names the field and the file."""

    def __init__(self, path: str, field: str, problem: str):
        self.path, self.field, self.problem = str(path), field, problem
        super().__init__(f"{self.path}: {field}: {problem}")
