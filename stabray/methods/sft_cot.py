"""SFT-CoT: supervised fine-tuning on the full chain of thought (every intermediate step)."""

from stabray.methods.base import METHODS, Method


@METHODS.register("sft_cot")
class SFTCoT(Method):
    implied_params = {"lam": 1.0, "bits": 32}  # every step, full precision
