"""What a method is: a frozen parameter dataclass plus the hooks the training loop calls.

A method decides (1) what the model is trained on for each example in each epoch (which steps,
which prompt), (2) how the model is prepared (QAT parametrizations, new tokens), (3) the loss of a
batch, (4) which parameters train, and (5) the prompt used at evaluation. One module per method,
one `METHODS.register(...)` per method.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from stabray.errors import UserError
from stabray.registry import Registry
from stabray.tasks.base import Example


@dataclasses.dataclass(frozen=True)
class NoParams:
    pass


SPACES_FILE = Path(__file__).with_name("spaces.yaml")
SPACE_KINDS = ("choice", "loguniform", "uniform", "randint")


@lru_cache(maxsize=1)
def load_spaces() -> dict[str, dict[str, dict[str, Any]]]:
    """{method: {param: spec}} from spaces.yaml, each spec exactly one of SPACE_KINDS."""
    import yaml

    data = yaml.safe_load(SPACES_FILE.read_text()) or {}
    for method, space in data.items():
        for param, spec in (space or {}).items():
            if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in SPACE_KINDS:
                raise UserError(
                    f"{SPACES_FILE}: {method}.{param}: a space is one of "
                    f"{{{' | '.join(SPACE_KINDS)}: ...}}, got {spec!r}"
                )
    return {m: dict(s or {}) for m, s in data.items()}


def typed_param(method: str, key: str, value: Any, default: Any) -> Any:
    """`value` as the type of the hyperparameter's default (bool, int, float or str), else a UserError:
    a YAML `maybe` for a flag or a string for a count must not reach the training loop. Values from a
    search may be numpy scalars; a float may be written `1e-3`, which YAML reads as a string."""
    where = f"method {method!r}: {key}"
    if isinstance(default, bool):
        if isinstance(value, bool | np.bool_):
            return bool(value)
        raise UserError(f"{where} must be true or false, got {value!r}")
    if isinstance(default, int):
        if isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_):
            return int(value)
        if isinstance(value, float) and value.is_integer():  # 4.0, as pydantic takes it for an int
            return int(value)
        raise UserError(f"{where} must be an integer, got {value!r}")
    if isinstance(default, float):
        number = None
        if isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                pass
        if number is not None and math.isfinite(number):
            return number
        raise UserError(f"{where} must be a finite number, got {value!r}")
    if isinstance(default, str) and not isinstance(value, str):
        raise UserError(f"{where} must be a string, got {value!r}")
    return value


class Method:
    name: ClassVar[str]  # set by METHODS.register
    Params: ClassVar[type] = NoParams
    # Default Optuna/Ray search space of this method's hyperparameters: {param: spec}, where spec is
    # {"choice": [...]}, {"loguniform": [lo, hi]}, {"uniform": [lo, hi]} or {"randint": [lo, hi]}.
    # Filled from spaces.yaml (the entry under the method's name) when the method is registered.
    default_space: ClassVar[dict[str, dict[str, Any]]] = {}
    # What the method means for the logged lam / bits when it has no such hyperparameter (the trial
    # record logs these next to its own hyperparameters; SFT-CoT: every step, full precision).
    implied_params: ClassVar[dict[str, Any]] = {}

    def __init__(self, **params: Any):
        names = {f.name for f in dataclasses.fields(self.Params)}
        for key in params:
            if key not in names:
                raise UserError(
                    f"method {self.name!r}: unknown hyperparameter {key!r}; "
                    f"known: {', '.join(sorted(names)) or '(none)'}"
                )
        defaults = {f.name: f.default for f in dataclasses.fields(self.Params)}
        params = {k: typed_param(self.name, k, v, defaults[k]) for k, v in params.items()}
        self.params = self.Params(**params)
        self.validate()

    def validate(self) -> None:
        """Raise UserError for impossible values."""

    def view_epochs(self, epochs: int) -> tuple[int, ...]:
        """The epochs (of `epochs`) whose training views hold each example's longest: the sequence-length
        check reads the training views at them. The first epoch, for a method whose curriculum only takes
        tokens away as the epochs pass (Implicit CoT) or has none."""
        return (0,)

    def model_problem(self, model) -> str | None:
        """What is wrong with these hyperparameters on this model (a config.ModelCfg), or None: a
        combination the method's own values cannot rule out, checked when a spec or a trial is read."""
        return None

    # -- hooks the training loop calls ---------------------------------------------------------
    def bind_tokenizer(self, tokenizer) -> None:
        """Called with the tokenizer before the model is built. A method that needs token ids or
        new tokens (Coconut: <bot>, <eot>, <latent>) takes them here; tokens added here make
        `build_model` resize the embeddings."""

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def trainable_parameters(self, model: torch.nn.Module) -> list[torch.nn.Parameter]:
        return [p for p in model.parameters() if p.requires_grad]

    def train_view(self, ex: Example, epoch: int, rng: np.random.Generator) -> tuple[str, tuple[str, ...] | None]:
        """(prompt, steps) the model is trained on for this example in this epoch; steps None =
        answer only (no separator), a tuple (even empty) = the chain form "s1, s2 | final"."""
        return ex.question, ex.steps

    # Whether the model answers with a chain ("s1, s2 | final") at evaluation; False = answer only.
    chain_at_eval: ClassVar[bool] = True

    def eval_prompt(self, ex: Example) -> str:
        return ex.question if self.chain_at_eval else ex.question_nohint

    def eval_steps(self, ex: Example) -> tuple[str, ...] | None:
        """The gold chain of evaluation: the ground-truth steps the method trains the model to write
        for this example. Every stability quantity (EAF, loss gap, eq. (4), weight noise) is measured
        on this chain after `eval_prompt`; None = answer only, () = "| final"."""
        return ex.steps if self.chain_at_eval else None

    # Whether the evaluation chain has intermediate steps (text or latent) for the EAF to sum over.
    # False (No CoT, Implicit CoT): eq. (4)'s sums over steps are empty, so the EAF and the bound are
    # 0 by definition, not measured; the runners then log no EAF and no eq. (4) table.
    steps_at_eval: ClassVar[bool] = True

    def on_train_step(self, step: int, steps_per_epoch: int) -> str | None:
        """Called by the training loop before it builds the batch of optimizer step `step` (0-based,
        counted over the whole run). A method with a schedule finer than epochs reads it here.
        Returns None, "optimizer" (a fresh optimizer, the learning-rate schedule carries on) or
        "schedule" (a fresh optimizer and a fresh schedule over the remaining steps)."""
        return None

    # Whether the evaluation prompt holds latent thoughts (inputs that are fed-back hidden states,
    # not tokens). The stability measure then treats each latent slot as a step; the eq. (4)
    # decomposition, which needs a ground-truth value for every step, is not defined.
    latent_thoughts: ClassVar[bool] = False

    def model_inputs(self, model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """The keyword arguments of `model(...)` that feed these token ids as the method does at
        evaluation (Coconut: latent slots hold the fed-back hidden states)."""
        return {"input_ids": input_ids, "attention_mask": attention_mask}

    def latent_slots(self, input_ids: list[int] | tuple[int, ...]) -> list[int]:
        """Positions of latent-thought slots in a token sequence (none for language methods)."""
        return []

    def generate(
        self, model, encoder, prompts: list[str], max_new_tokens: int, batch_size: int = 64, device="cpu"
    ) -> list[list[int]]:
        """Greedy decoding to EOS (Coconut overrides: latent thoughts first)."""
        from stabray.evaluate.generate import greedy

        return greedy(model, encoder, prompts, max_new_tokens, batch_size=batch_size, device=device)

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean next-token cross-entropy over the answer tokens."""
        return model(**batch).loss

    def step(self, model, batch) -> float:
        """One optimisation step's forward and backward; returns the loss. NSO overrides this."""
        loss = self.loss(model, batch)
        loss.backward()
        return float(loss.detach())


def _attach_space(name: str, cls: type[Method]) -> None:
    """Registration hook: the method's default space from spaces.yaml, its keys checked against Params."""
    space = load_spaces().get(name, {})
    known = {f.name for f in dataclasses.fields(cls.Params)}
    for key in space:
        if key not in known:
            raise UserError(
                f"{SPACES_FILE}: method {name!r} has no hyperparameter {key!r}; "
                f"known: {', '.join(sorted(known)) or '(none)'}"
            )
    cls.default_space = space


METHODS: Registry[type[Method]] = Registry("method", on_register=_attach_space)


def get_method(name: str, **params: Any) -> Method:
    return METHODS.get(name)(**params)
