"""Typed, strict configuration: a trial's config (what the trainable takes) and a sweep spec (a
trial config + search space + resources + tracking). Unknown keys and out-of-range values are
errors that name the field; sweep specs are validated completely before Ray starts."""

from __future__ import annotations

import copy
import math
import operator
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, FiniteFloat, ValidationError, field_validator, model_validator

from stabray.errors import SpecError, UserError, did_you_mean

SWEEPS_DIR = Path(__file__).resolve().parent.parent / "sweeps"  # the shipped sweep specs


def _numeric(annotation: Any) -> bool:
    """A number field (int or float, optional or not), and not one that also takes a bool."""
    args = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else ()
    kinds = set(args) if args else {annotation}
    return bool(kinds & {int, float}) and bool not in kinds


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, v: Any, info) -> Any:
        """`epochs: true` is a slip, not 1: pydantic's lax mode would read a bool as the number 0 or 1; and
        `resample_train: "yes"` or `1` is not true: a flag takes true or false only (as task and method
        flags do)."""
        annotation = cls.model_fields[info.field_name].annotation
        if isinstance(v, bool) and _numeric(annotation):
            raise ValueError(f"must be a number, got {str(v).lower()}")
        if annotation is bool and not isinstance(v, bool):
            if getattr(v, "shape", None) == () and getattr(getattr(v, "dtype", None), "kind", "") == "b":  # numpy's
                return bool(v)
            raise ValueError(f"must be true or false, got {v!r}")
        return v


class TaskCfg(Strict):
    name: str  # a registered task or alias (python -m stabray tasks)
    params: dict[str, Any] = {}  # generator parameters, e.g. {n_nodes: 5, decimals: 1}
    train_size: int = Field(2000, gt=0)
    val_size: int = Field(200, gt=0)
    test_size: int = Field(200, gt=0)  # also the size of each length-generalization split
    data_seed: int = Field(0, ge=0, lt=2**32)  # seed of the dataset (independent of the trial's training seed)
    resample_train: bool = False  # draw a fresh training split of train_size every epoch (no memorizing)

    @model_validator(mode="after")
    def _size_schedule(self):
        """A size curriculum (params.train_size_schedule, {epoch: weights}) gets string keys, the
        form a JSON round trip gives (Ray Tune's search space and MLflow's params need string keys;
        the task reads "80" as 80). One that changes after epoch 0 draws a new training split at
        each change, which only a resampled training split does."""
        schedule = self.params.get("train_size_schedule")
        if isinstance(schedule, dict):
            keys = [str(k) for k in schedule]
            twice = sorted({k for k in keys if keys.count(k) > 1})
            if twice:  # YAML keeps 0 and "0" apart; as strings one would silently replace the other
                raise ValueError(
                    f"params.train_size_schedule names epoch {', '.join(twice)} twice "
                    "(once as a number, once as a string); keep one"
                )
            schedule = self.params["train_size_schedule"] = dict(zip(keys, schedule.values()))
        later = isinstance(schedule, dict) and any(k != "0" for k in schedule)
        if later and not self.resample_train:
            raise ValueError(
                "params.train_size_schedule changes the training sizes after epoch 0, which needs "
                "resample_train: true (a fresh training split every epoch)"
            )
        return self


class LoraCfg(Strict):
    rank: int = Field(16, gt=0)
    alpha: int = Field(32, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj"]


PRESETS: dict[str, dict[str, int]] = {
    # name: embedded decoder shape. "tiny" is what tests use; the specs built on
    # sweeps/_base.yaml use "mini"; "small" is the field's default.
    "tiny": dict(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64),
    "mini": dict(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=256),
    "small": dict(hidden_size=128, num_layers=2, num_heads=4, intermediate_size=512),
    "base": dict(hidden_size=256, num_layers=4, num_heads=8, intermediate_size=1024),
    # the multi-head reasoning paper: one-layer transformers with one or two attention heads (tree path finding)
    "onelayer1h": dict(hidden_size=64, num_layers=1, num_heads=1, intermediate_size=256),
    "onelayer2h": dict(hidden_size=64, num_layers=1, num_heads=2, intermediate_size=256),
    # the MTP planning paper, NTP vs MTP: "mtp_small" is the laptop stand-in; "mtp8" has the paper's 8 layers
    # (the width is ours: the seeds give only the depth)
    "mtp_small": dict(hidden_size=128, num_layers=4, num_heads=4, intermediate_size=512),
    "mtp8": dict(hidden_size=256, num_layers=8, num_heads=8, intermediate_size=1024),
}


class ModelCfg(Strict):
    pretrained: str | None = None  # hub name or local directory; None = the embedded decoder
    lora: LoraCfg | None = None
    preset: Literal["tiny", "mini", "small", "base", "onelayer1h", "onelayer2h", "mtp_small", "mtp8"] = "small"
    hidden_size: int | None = Field(None, gt=0)
    num_layers: int | None = Field(None, gt=0)
    num_heads: int | None = Field(None, gt=0)
    intermediate_size: int | None = Field(None, gt=0)
    max_positions: int = Field(2048, gt=0)
    # embedded architecture: qwen2 (RoPE), gpt2 (learned absolute positions), bloom (ALiBi biases, no positions)
    family: Literal["qwen2", "gpt2", "bloom"] = "qwen2"
    # none: no positional encoding (NoPE; family gpt2 only); random: training positions are a sorted
    # random subset of 0..position_span-1, drawn per step (Ruoss et al. 2023; family qwen2 only;
    # stabray.models.positions)
    positions: Literal["default", "none", "random"] = "default"
    position_span: int | None = Field(None, gt=0)  # positions: random; None = max_positions
    # positions: random; evaluation at 0, k, 2k, ...; None = 1. A list [2, 3, 4]: per input, the largest
    # listed stride at which its expected sequence fits position_span (stabray.models.positions)
    position_eval_stride: int | list[int] | None = None
    # positions: random; each step's span drawn from max(length, position_span_min)..position_span; None = fixed
    position_span_min: int | None = Field(None, gt=0)
    # embedded: std of the normal initialisation of every weight matrix and embedding (transformers'
    # initializer_range); None = transformers' 0.02. Tiny from-scratch models learn LEGO only from 0.1.
    init_std: float | None = Field(None, gt=0, allow_inf_nan=False)
    # embedded tokenizer: "word" = one token per number; "digits" = one token per digit
    # ("52134" -> 5 ##2 ##1 ##3 ##4, "0.25" -> 0 ##. ##2 ##5; decoded back to whole numbers)
    numbers: Literal["word", "digits"] = "word"
    freeze_embeddings: bool = False  # embedded: the (tied) token embeddings stay at their random init
    # seed of the initial weights (the embedded model's, or a LoRA adapter's); None = the trial's seed.
    # Set, it parts the initialisation from what the trial's seed also draws (the order of the examples,
    # their views, the position draws, jacreg's probes): two trials with one init_seed start from the
    # same weights. The dataset has its own seed (task.data_seed).
    init_seed: int | None = Field(None, ge=0, lt=2**32)

    @field_validator("position_eval_stride", mode="before")
    @classmethod
    def _whole_numbers(cls, v: Any) -> Any:
        """A list of strides holds integers as written: [true, 3] or ["2", 3] is not [1, 3] or [2, 3]."""
        if isinstance(v, list) and any(isinstance(x, bool) or not isinstance(x, int) for x in v):
            raise ValueError(f"must be a positive integer or a list of distinct ones (got {v!r})")
        return v

    @field_validator("pretrained")
    @classmethod
    def _absolute(cls, v: str | None) -> str | None:
        """A relative local directory made absolute where the spec is read: Ray's trial workers run
        in their trial folders, where ./model would name nothing."""
        if v is not None and v.startswith(("./", "../", "~")):
            return os.path.abspath(os.path.expanduser(v))
        return v

    @model_validator(mode="after")
    def _positions(self):
        """The position options' combinations, checked when the spec is read."""
        problem = (
            pretrained_problem(self) or position_options_problem(self) or shape_problem(self) or lora_problem(self)
        )
        if problem:
            raise ValueError(problem)
        return self

    def shape(self) -> dict[str, int]:
        """The embedded decoder's shape (`embedded_shape`)."""
        return embedded_shape(self.preset, self.model_dump())


def embedded_shape(preset: str, overrides: dict[str, Any]) -> dict[str, int]:
    """An embedded decoder's shape: the preset's (PRESETS), overridden field by field by the
    `overrides` that are not None (a model config section, as a dict)."""
    return {k: v if overrides.get(k) is None else overrides[k] for k, v in PRESETS[preset].items()}


def shape_problem(m: ModelCfg) -> str | None:
    """What is wrong with an embedded decoder's shape, or None: every head gets hidden_size /
    num_heads dimensions, so the one must divide the other, and RoPE (qwen2) rotates pairs of them."""
    if m.pretrained is not None:
        return None
    s = m.shape()
    h, n = s["hidden_size"], s["num_heads"]
    if h % n:
        return f"hidden_size {h} is not a multiple of num_heads {n} (preset {m.preset!r} and overrides)"
    if m.family == "qwen2" and (h // n) % 2:
        return f"hidden_size / num_heads = {h // n} per head is odd; RoPE (family qwen2) needs an even head size"
    return None


LOCAL_MODEL = ("/", "./", "../", "~")  # how a local model directory starts; anything else is a hub name


def local_model_problem(pretrained: str | None) -> str | None:
    """What is wrong with a local `pretrained` directory on this machine, or None (a hub name, or no
    pretrained model). Checked where the trials run on this machine (not through ray://)."""
    if pretrained is None or not pretrained.startswith(LOCAL_MODEL):
        return None
    where = Path(pretrained).expanduser()
    if where.is_dir():
        return None
    what = "a file, not a model directory" if where.exists() else "no such directory"
    return f"model.pretrained {pretrained}: {what} (a local path; a hub name has no leading / . or ~)"


def lora_problem(m: ModelCfg) -> str | None:
    """What is wrong with `lora`, or None: LoRA adapts a pretrained model only (the embedded decoder
    always trains all its weights, so a `lora` section there would only add a LoRA-rank search with
    no effect)."""
    if m.lora is not None and m.pretrained is None:
        return "lora applies to a pretrained model (model.pretrained); the embedded decoder trains all its weights"
    return None


# fields of the embedded decoder that a pretrained model does not read: set beside model.pretrained, each
# would be silently ignored (the preset and max_positions are left out: every shipped spec's base sets the
# preset, and both have defaults that cannot be told from a written value)
EMBEDDED_ONLY = {
    "hidden_size": None,
    "num_layers": None,
    "num_heads": None,
    "intermediate_size": None,
    "init_std": None,
    "freeze_embeddings": False,
    "family": "qwen2",
    "positions": "default",
    "numbers": "word",
}


def pretrained_problem(m, prefix: str = "") -> str | None:
    """What is wrong with a pretrained model's options (a ModelCfg or a models.ModelSpec), or None: an
    empty name, or a field of the embedded decoder (EMBEDDED_ONLY) away from its default, which the
    pretrained model (its own config and tokenizer) would ignore. `prefix` ("model.") names the fields."""
    if m.pretrained is None:
        return None
    if not m.pretrained.strip():
        return f"{prefix}pretrained is empty: give a hub name or a local directory, or null for the embedded decoder"
    for name, default in EMBEDDED_ONLY.items():
        value = getattr(m, name, default)  # a ModelSpec has no `numbers`: its tokenizer is built beside it
        if value != default:
            back = "null" if default is None else str(default).lower()
            return (
                f"{prefix}{name} {value!r} applies to the embedded decoder only: {prefix}pretrained "
                f"{m.pretrained} brings its own config and tokenizer, so it would be ignored; set {name}: {back}"
            )
    return None


def position_options_problem(m, prefix: str = "") -> str | None:
    """What is wrong with an embedded model's position options (a ModelCfg or a models.ModelSpec),
    or None: `positions: none` needs family gpt2, `random` needs qwen2, the span options need
    `random`, the evaluation stride is a positive integer or a list of distinct ones, and
    position_span_min may not exceed the span. `prefix` ("model.") names the fields."""
    needs = {"none": "gpt2", "random": "qwen2"}.get(m.positions)
    if needs and m.family != needs:
        return f"{prefix}positions {m.positions!r} needs {prefix}family {needs} (got {m.family!r})"
    for name in ("position_span", "position_eval_stride", "position_span_min"):
        if getattr(m, name) is not None and m.positions != "random":
            return f"{prefix}{name} applies to {prefix}positions: random only (got positions {m.positions!r})"
    k = m.position_eval_stride
    if isinstance(k, int) and k < 1 or isinstance(k, list | tuple) and (not k or min(k) < 1 or len(set(k)) < len(k)):
        return f"{prefix}position_eval_stride must be a positive integer or a list of distinct ones (got {k!r})"
    span = m.position_span or m.max_positions
    if m.position_span_min is not None and m.position_span_min > span:
        return f"{prefix}position_span_min={m.position_span_min} exceeds the span {span}"
    return None


DEFAULT_METHOD = "sft_cot"  # a trial or sweep that names no method trains on the full chain


class MethodCfg(Strict):
    name: str  # a registered method (python -m stabray methods)
    params: dict[str, Any] = {}


class TrainCfg(Strict):
    """The training loop's settings (stabray.train.loop.Trainer takes this object)."""

    epochs: int = Field(8, ge=1)  # passes over the training split (ASHA's time unit)
    batch_size: int = Field(32, ge=1)  # examples per optimisation step
    lr: float = Field(1e-3, gt=0, allow_inf_nan=False)  # AdamW peak learning rate
    weight_decay: float = Field(0.01, ge=0, allow_inf_nan=False)  # AdamW decoupled weight decay
    warmup_steps: int = Field(20, ge=0)  # linear warm-up, then `schedule`
    schedule: Literal["cosine", "constant"] = "cosine"  # cosine: down to 10% of lr over all epochs
    grad_clip: float = Field(1.0, ge=0, allow_inf_nan=False)  # max global gradient norm; 0 = off
    max_steps_per_epoch: int = Field(0, ge=0)  # 0 = the whole split; > 0 caps an epoch (tests, smoke runs)
    threads: int = Field(0, ge=0)  # torch CPU threads; 0 = leave torch's default (Ray sets it from num_cpus)
    # batches of examples of similar length (stabray.train.loop.length_grouped_batches): less padding,
    # 0.73-0.81x the tokens computed on the 3-4-node Dijkstra mixes; off = uniformly shuffled batches
    group_by_length: bool = False


class EvalCfg(Strict):
    batch_size: int = Field(64, ge=1)  # generation batch
    val_examples: int = Field(0, ge=0)  # 0 = the whole validation split, every epoch
    eaf_examples: int = Field(16, ge=0)  # examples for the per-epoch EAF (0 = off)
    eaf_iters: int = Field(10, ge=1)  # power-iteration steps
    # per-epoch EAF every k epochs (and at the last epoch); epochs in between report no `val_eaf`. The
    # power iteration warm-starts from the last measured epoch. 1 = every epoch
    eaf_every: int = Field(1, ge=1)
    eaf_token_cap: int = Field(8, ge=1)  # output tokens per step block (the input side is the whole step)
    eaf_aggregation: Literal["block", "token_mean"] = "block"
    # chain of val_eaf / test_eaf: gold = the method's gold evaluation chain (Method.eval_steps: the chain it
    # trains on, e.g. Alg. 1's compressed one); generated = the model's own greedy chain and answer
    eaf_chain: Literal["gold", "generated"] = "gold"
    # T of the *_at_T final metrics (EAF, sum eps, bound, loss gap from the eq. (4) table): the row at
    # min(stability_T, T_max); Tables 2-4 of the paper are at T = 5. 0 = T_max
    stability_T: int = Field(5, ge=0)
    # length-generalization splits to evaluate at the end; None = all of the task's: test_long and
    # test_longer (10% / 20% larger inputs), or test_n<k> for each of the task's explicit long_sizes
    long_splits: list[str] | None = None
    loss_gap: bool = True  # final-answer loss gap on the test split at the end
    decomposition_examples: int = Field(0, ge=0)  # eq. (4) table at the end on this many test examples (0 = off)
    weight_noise_seeds: int = Field(0, ge=0)  # Appendix B.2 weight-noise stability at the end (0 = off)


class TrialConfig(Strict):
    """Everything one trial needs; `stabray.tune.trainable` takes this as a plain dict."""

    task: TaskCfg
    model: ModelCfg = ModelCfg()
    method: MethodCfg = MethodCfg(name=DEFAULT_METHOD)
    train: TrainCfg = TrainCfg()
    eval: EvalCfg = EvalCfg()
    seed: int = Field(0, ge=0, lt=2**32)  # training seed: initialisation, shuffling, step resampling
    device: Literal["auto", "cpu", "cuda"] = "auto"
    cache_dir: str | None = None  # dataset cache; None = $STABRAY_CACHE or ~/.cache/stabray/datasets

    @property
    def weights_seed(self) -> int:
        """The seed of the initial weights: model.init_seed, else the trial's seed."""
        return self.seed if self.model.init_seed is None else self.model.init_seed


def parse_trial_config(config: dict[str, Any]) -> TrialConfig:
    try:
        return TrialConfig.model_validate(config)
    except ValidationError as e:
        raise UserError(format_validation_error(e, "trial config")) from None


def _models(cls: type[BaseModel] = Strict) -> dict[str, type[BaseModel]]:
    """Every model class below `cls`, by name (a ValidationError names its root model only)."""
    out: dict[str, type[BaseModel]] = {}
    for sub in cls.__subclasses__():
        out[sub.__name__] = sub
        out.update(_models(sub))
    return out


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The config model an annotation holds, through Optional / unions / lists / dicts; None if none."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def known_keys(root: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys allowed at `loc` (a pydantic error location, without the bad key) below `root`;
    [] where the location is not a config model (a free-form dict such as task.params)."""
    model: type[BaseModel] | None = root
    for part in loc:
        if model is None:
            return []
        if isinstance(part, int) or part not in model.model_fields:
            continue  # a list index, or a union member's tag
        model = _model_in(model.model_fields[part].annotation)
    return sorted(model.model_fields) if model is not None else []


def validation_problem(e: ValidationError) -> tuple[str, str]:
    """(dotted path of the first error, e.g. "search.space.lr"; what is wrong there). An unknown key
    gets the closest allowed keys at its place ("unknown key; did you mean epochs?"), or all of them
    when none is close ("unknown key; the keys here are task, model, ...")."""
    errs = e.errors()
    first = errs[0]
    msg = "unknown key" if first["type"] == "extra_forbidden" else first["msg"]
    if first["type"] == "extra_forbidden" and first["loc"]:
        root = _models().get(e.title)
        allowed = known_keys(root, tuple(first["loc"][:-1])) if root is not None else []
        close = did_you_mean(first["loc"][-1], allowed, before="; ")
        if close:
            msg += close
        elif allowed:
            msg += f"; the keys here are {', '.join(allowed)}"
    msg = msg.removeprefix("Value error, ")  # pydantic's prefix for a validator's own message
    more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
    return ".".join(str(p) for p in first["loc"]), msg + more


def format_validation_error(e: ValidationError, where: str) -> str:
    loc, problem = validation_problem(e)
    return f"{where}: {loc}: {problem}"


# ----------------------------------------------------------------------------------------------
# Sweep specs


SHORT_NAMES = {  # search-space shorthands -> paths in the trial config
    "lam": "method.params.lam",
    "bits": "method.params.bits",
    "lr": "train.lr",
    "lora_rank": "model.lora.rank",
}


class Dist(Strict):
    """One searched value's distribution. Ranges are [low, high]: `randint` includes both ends;
    `uniform` and `loguniform` need low < high (and low > 0 for loguniform)."""

    choice: list[Any] | None = None
    loguniform: tuple[FiniteFloat, FiniteFloat] | None = None
    uniform: tuple[FiniteFloat, FiniteFloat] | None = None
    randint: tuple[int, int] | None = None

    @model_validator(mode="before")
    @classmethod
    def _a_mapping(cls, v: Any) -> Any:
        if isinstance(v, (dict, Dist)):
            return v
        raise ValueError(
            f"expected a distribution ({{choice: [...]}}, {{loguniform: [low, high]}}, {{uniform: [low, high]}} "
            f"or {{randint: [low, high]}}), got {v!r}; for one fixed value give {{choice: [{v!r}]}}"
        )

    def kind(self) -> str:
        set_ = [k for k in ("choice", "loguniform", "uniform", "randint") if getattr(self, k) is not None]
        if len(set_) != 1:
            raise ValueError("give exactly one of choice, loguniform, uniform, randint")
        return set_[0]

    @model_validator(mode="after")
    def _ranges(self) -> Dist:
        kind = self.kind()
        v = getattr(self, kind)
        if kind == "choice" and not v:
            raise ValueError("choice: an empty list (give at least one value)")
        if kind in ("uniform", "loguniform") and not v[0] < v[1]:
            raise ValueError(f"{kind}: [{v[0]:g}, {v[1]:g}] is empty or reversed (give [low, high] with low < high)")
        if kind == "loguniform" and v[0] <= 0:
            raise ValueError(f"loguniform: the low end must be > 0, got {v[0]:g}")
        if kind == "randint" and v[0] > v[1]:
            raise ValueError(f"randint: [{v[0]}, {v[1]}] is reversed (give [low, high], both included)")
        return self


class MethodEntry(Strict):
    """One method of a multi-method sweep, with its own search space (None: the method's default
    space from stabray/methods/spaces.yaml). Space keys are the method's hyperparameter names."""

    name: str
    params: dict[str, Any] = {}
    space: dict[str, Dist] | None = None


class EafStopCfg(Strict):
    """EAF-aware early stopping (stabray.tune.eaf_stop.EafStopper): after epoch e >= `grace`, a trial
    stops when its EAF exceeds `factor` x the median EAF that all trials reported at epoch e so far
    (itself included), unless its val_acc at epoch e is in the top `top_fraction` of the val_acc values
    reported at e so far. The median needs `min_trials` reports at e. It works with either scheduler
    (ASHA or FIFO) and with one or several objectives; a stopped trial ends as STOPPED, like ASHA's."""

    factor: float = Field(3.0, gt=1, allow_inf_nan=False)  # how many medians count as exploding
    top_fraction: float = Field(0.25, gt=0, le=1)  # val_acc in the top ceil(top_fraction * n) at e: never stopped
    grace: int = Field(2, ge=1)  # epochs every trial runs before the rule applies
    min_trials: int = Field(3, ge=2)  # reports at an epoch before its median is trusted


_COMPARE = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}
_STOP_WHEN = re.compile(r"\s*(>=|<=|>|<)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*")


class StopIfCfg(Strict):
    """A rule that ends a trial early (stabray.tune.stop_rules.RuleStopper): when its result of epoch
    `epoch` has `metric` satisfying `when` (a comparison and a number: ">= 0.5", "< 0.2"), the trial
    stops there and ends as STOPPED, like an ASHA stop. A missing or NaN value never stops it; a trial
    restored past `epoch` is not judged again. Example (LEGO's clause-lookup plateau):
    {metric: val_departure_tok0, epoch: 40, when: ">= 0.5"}."""

    metric: str  # a per-epoch metric (checked against the task's when the spec is read)
    epoch: int = Field(ge=1)  # the epoch whose result is judged (one epoch: a rule, not a running test)
    when: str  # ">= x", "> x", "<= x" or "< x"

    @field_validator("when", mode="before")
    @classmethod
    def _comparison(cls, v: Any) -> str:
        m = _STOP_WHEN.fullmatch(v) if isinstance(v, str) else None
        if m is None:
            raise ValueError(f'must be a comparison and a number, like ">= 0.5" or "< 0.2", quoted in YAML (got {v!r})')
        if not math.isfinite(float(m.group(2))):  # 1e999 reads as inf: a rule that always or never holds
            raise ValueError(f"{m.group(2)} is not a finite number (got {v!r})")
        return f"{m.group(1)} {float(m.group(2)):g}"

    @property
    def op(self) -> str:
        return self.when.split()[0]

    @property
    def bound(self) -> float:
        return float(self.when.split()[1])

    def holds(self, value: float) -> bool:
        """Whether `value` satisfies the comparison (NaN never does)."""
        return _COMPARE[self.op](value, self.bound)

    def describe(self) -> str:
        return f"{self.metric} {self.when} at epoch {self.epoch}"


class SearchCfg(Strict):
    num_samples: int = Field(8, ge=1)  # trials
    max_concurrent: int = Field(2, ge=1)  # trials running at once
    metric: str = "val_acc"
    mode: Literal["max", "min"] = "max"
    # Several objectives (a Pareto search): metrics [val_acc, val_eaf] with modes [max, min] replace
    # metric/mode. The searcher is told every objective; ASHA is single-objective, so a
    # multi-objective sweep needs scheduler: fifo (eaf_stop still applies).
    metrics: list[str] | None = None
    modes: list[Literal["max", "min"]] | None = None
    # Optuna's sampler: tpe, or nsga2 (NSGA-II, population max(2, min(50, num_samples // 4)) per
    # generation); None = tpe for one objective, nsga2 for several.
    sampler: Literal["tpe", "nsga2"] | None = None
    eaf_stop: EafStopCfg | None = None  # EAF-aware early stopping (off when absent)
    stop_if: list[StopIfCfg] = []  # rules that end a trial at a given epoch (any one stops it; null: none)
    searcher: Literal["optuna", "random", "grid"] = "optuna"  # grid: every combination of the choices
    scheduler: Literal["asha", "fifo"] = "asha"
    grace_period: int = Field(1, ge=1)  # ASHA: epochs before a trial can be stopped
    reduction_factor: int = Field(2, ge=2)  # ASHA: keep 1/reduction_factor at each rung
    space: dict[str, Dist] = {}  # path (or shorthand: lam, bits, lr, lora_rank) -> distribution
    max_failures: int = Field(0, ge=0)  # retries of a failing trial

    @property
    def n_trials(self) -> int:
        """Trials the search runs: num_samples, times every combination of the choices for a grid."""
        n = self.num_samples
        if self.searcher == "grid":
            for d in self.space.values():
                n *= len(d.choice or [None])
        return n

    @field_validator("stop_if", mode="before")
    @classmethod
    def _no_rules(cls, v: Any) -> Any:
        """`stop_if: null` (as `--set search.stop_if=null` drops an included spec's rules) is no rule."""
        return [] if v is None else v

    @model_validator(mode="after")
    def _objectives(self) -> SearchCfg:
        if self.modes is not None and self.metrics is None:
            raise ValueError("modes given without metrics (give both lists, or metric and mode for one objective)")
        if self.metrics is not None:
            if self.modes is None:
                raise ValueError("metrics given without modes (one max or min per metric)")
            if len(self.metrics) != len(self.modes):
                raise ValueError(f"{len(self.metrics)} metrics but {len(self.modes)} modes (one mode per metric)")
            if len(self.metrics) < 2:
                raise ValueError("metrics: give at least two (one objective: metric and mode)")
            dup = [m for m in self.metrics if self.metrics.count(m) > 1]
            if dup:
                raise ValueError(f"metrics: {dup[0]!r} is listed twice")
            # metric/mode beside the lists (a spec's own, or its include's: _base.yaml sets val_acc/max) must
            # agree with them, or they would be silently ignored: the metric one of the listed objectives,
            # with the mode the lists give it
            drop = "for one objective, drop the lists (metrics: null, modes: null)"
            if "metric" in self.model_fields_set and self.metric not in self.metrics:
                raise ValueError(
                    f"metric {self.metric!r} beside metrics {self.metrics}: the lists replace metric and mode, so "
                    f"it would be ignored; list it in metrics (with its mode in modes), or {drop}"
                )
            listed = self.modes[self.metrics.index(self.metric)] if self.metric in self.metrics else None
            if {"metric", "mode"} & self.model_fields_set and listed is not None and listed != self.mode:
                raise ValueError(
                    f"metric {self.metric!r} with mode {self.mode!r} beside metrics {self.metrics} and modes "
                    f"{self.modes}, which optimise it {listed!r}: the lists replace metric and mode, so these would "
                    f"be ignored; set mode: {listed} to keep the lists, or {drop}"
                )
        if self.sampler is not None and self.searcher != "optuna":
            raise ValueError(
                f"sampler {self.sampler!r} is Optuna's, but searcher is {self.searcher!r}, which would ignore it; "
                "drop the sampler (sampler: null) or use searcher: optuna"
            )
        return self

    @property
    def multi(self) -> bool:
        """Whether the sweep searches several objectives."""
        return self.metrics is not None

    def objectives(self) -> list[tuple[str, str]]:
        """[(metric, mode), ...]: the searched objectives, the primary one first."""
        if self.metrics is not None and self.modes is not None:
            return list(zip(self.metrics, self.modes))
        return [(self.metric, self.mode)]


class ResourcesCfg(Strict):
    cpu: float = Field(1.0, gt=0)
    gpu: float = Field(0.0, ge=0)


class MlflowCfg(Strict):
    tracking_uri: str | None = None  # None: $MLFLOW_TRACKING_URI, else sqlite at ./mlflow.db (absolute)
    experiment: str | None = None  # None: the sweep's name


NAME_MAX = 100  # a sweep name's length: it names the run folder and the MLflow experiment


class SweepSpec(Strict):
    name: str
    description: str = ""
    task: TaskCfg
    model: ModelCfg = ModelCfg()
    method: MethodCfg = MethodCfg(name=DEFAULT_METHOD)
    # Several methods in one sweep: each its own Optuna study and search space (the method keys of
    # search.space are dropped; its other keys, e.g. lr, are shared), num_samples trials each.
    methods: list[str | MethodEntry] | None = None
    train: TrainCfg = TrainCfg()
    eval: EvalCfg = EvalCfg()
    seed: int = Field(0, ge=0, lt=2**32)  # numpy's and Optuna's samplers take 0 .. 2**32 - 1
    device: Literal["auto", "cpu", "cuda"] = "auto"
    search: SearchCfg = SearchCfg()
    resources: ResourcesCfg = ResourcesCfg()
    mlflow: MlflowCfg = MlflowCfg()
    storage: str | None = None  # Ray Tune results: a folder or s3://bucket/prefix; None = ./stabray_runs

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not v or "/" in v or not v.isprintable():
            raise ValueError("must be a non-empty name without '/' or control characters (newline, tab)")
        if len(v) > NAME_MAX:  # the run folder is <name>-<yyyymmdd-hhmmss>; file names stop at 255 bytes
            raise ValueError(f"is {len(v)} characters long; at most {NAME_MAX}")
        return v

    def trial_base(self) -> dict[str, Any]:
        d = self.model_dump(include={"task", "model", "method", "train", "eval", "seed", "device"})
        return d


def deep_merge(base: dict, over: dict, path: tuple[str, ...] = ()) -> dict:
    """`over` on top of `base`, key by key; a search distribution (search.space.<key>) is replaced
    whole, so a spec can turn an included `loguniform` into a `choice`, and `null` removes an included
    one (`space: {lam: null}`)."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        atomic = path[:2] == ("search", "space") and len(path) == 2
        if atomic and v is None:
            out.pop(k, None)
            continue
        if isinstance(v, dict) and isinstance(out.get(k), dict) and not atomic:
            out[k] = deep_merge(out[k], v, (*path, k))
        else:
            out[k] = copy.deepcopy(v)
    return out


def yaml_problem(e: yaml.YAMLError) -> str:
    """A YAML error on one line: what is wrong and where (line, column)."""
    mark = getattr(e, "problem_mark", None)
    what = getattr(e, "problem", None) or str(e).splitlines()[0]
    if "chomping or indentation indicators" in what:  # `when: >= 0.5`: a bare > or | opens a block
        what += ' (a value that starts with > or |, like a comparison, needs quotes: when: ">= 0.5")'
    return f"{what} (line {mark.line + 1}, column {mark.column + 1})" if mark else what


def read_text(path: Path, what: str = "file") -> str:
    """A text file's contents, or a UserError naming the path and why it cannot be read."""
    if path.is_dir():
        raise UserError(f"{path}: is a directory, not a {what}")
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no such {what}") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not a text {what} (byte {e.start} is not UTF-8)") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read the {what} ({e.strerror or e})") from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (YAML 1.2 forbids it; PyYAML
    silently keeps the last, so `epochs: 80` above `epochs: 8` would be lost without a word)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: merged keys may be overridden
                continue
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, typing.Hashable) and key in seen:
                first = seen[key]
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping",
                    node.start_mark,
                    f"found the key {key!r} twice (first on line {first.line + 1})",
                    key_node.start_mark,
                )
            if isinstance(key, typing.Hashable):
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """YAML as yaml.safe_load reads it, except that a key given twice in one mapping is an error."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    """A spec file with its `include:` chain resolved (paths relative to the including file)."""
    path = path.resolve()
    if path in seen:
        raise SpecError(str(path), "include", "include cycle")
    text = read_text(path, "sweep spec")
    try:
        data = load_yaml(text) or {}
    except yaml.YAMLError as e:
        raise SpecError(str(path), "(file)", f"not valid YAML: {yaml_problem(e)}") from None
    if not isinstance(data, dict):
        raise SpecError(str(path), "(file)", "a sweep spec is a mapping of keys")
    includes = data.pop("include", [])
    includes = [includes] if isinstance(includes, str) else includes
    if not isinstance(includes, list) or not all(isinstance(i, str) and i for i in includes):
        raise SpecError(str(path), "include", f"a file name or a list of file names, got {includes!r}")
    merged: dict = {}
    for inc in includes:
        inc_path = path.parent / inc
        if not inc_path.exists():
            shipped = SWEEPS_DIR / f"{inc}.yaml"
            hint = (
                f" (an include is a path relative to this file; the shipped spec {inc!r} is "
                f"{os.path.relpath(shipped, path.parent)})"
                if shipped.is_file() and not inc.endswith((".yaml", ".yml"))
                else ""
            )
            raise SpecError(str(path), "include", f"file not found: {inc}{hint}")
        if not inc_path.is_file():
            raise SpecError(str(path), "include", f"not a file: {inc}")
        merged = deep_merge(merged, read_yaml(inc_path, (*seen, path)))
    return deep_merge(merged, data)


def set_path(d: dict, path: str, value: Any) -> None:
    """Set d[a][b][c] = value for path "a.b.c", creating missing mappings on the way; a UserError
    when a key on the way holds something other than a mapping (train.lr.x: lr is a number)."""
    keys = path.split(".")
    if not all(keys):
        raise UserError(f"{path!r}: not a dotted path of keys (like train.epochs)")
    for i, k in enumerate(keys[:-1]):
        if d.get(k) is None:
            d[k] = {}
        if not isinstance(d[k], dict):
            raise UserError(f"{'.'.join(keys[: i + 1])} is {d[k]!r}, not a mapping, so it has no key {keys[i + 1]!r}")
        d = d[k]
    d[keys[-1]] = value


def get_path(d: dict, path: str, default: Any = None) -> Any:
    """The value at a dotted path of nested dicts, or `default` where the path does not exist."""
    for k in path.split("."):
        if not isinstance(d, dict) or k not in d:
            return default
        d = d[k]
    return d
