"""Method registry. Importing this package registers every method."""

from stabray.methods import alg1, coconut, implicit_cot, jacreg, mtp, no_cot, nso, sft_cot  # noqa: F401  (registration)
from stabray.methods.base import METHODS, Method, get_method

__all__ = ["METHODS", "Method", "get_method"]
