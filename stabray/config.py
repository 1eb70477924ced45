"""Typed, strict configuration: a trial's config (what the trainable takes) and a sweep spec (a
trial config + search space + resources + tracking). Unknown keys and out-of-range values are
errors that name the field; sweep specs are validated completely before Ray starts."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from stabray.errors import SpecError, UserError


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TaskCfg(Strict):
    name: str  # a registered task or alias (python -m stabray tasks)
    params: dict[str, Any] = {}  # generator parameters, e.g. {n_nodes: 5, decimals: 1}
    train_size: int = Field(2000, gt=0)
    val_size: int = Field(200, gt=0)
    test_size: int = Field(200, gt=0)  # also the size of each length-generalization split
    data_seed: int = 0  # seed of the dataset (independent of the trial's training seed)
    resample_train: bool = False  # draw a fresh training split of train_size every epoch (no memorizing)


class LoraCfg(Strict):
    rank: int = Field(16, gt=0)
    alpha: int = Field(32, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj"]


class ModelCfg(Strict):
    pretrained: str | None = None  # hub name or local directory; None = the embedded decoder
    lora: LoraCfg | None = None
    preset: Literal["tiny", "mini", "small", "base", "onelayer1h", "onelayer2h", "mtp_small", "mtp8"] = "small"
    hidden_size: int | None = Field(None, gt=0)
    num_layers: int | None = Field(None, gt=0)
    num_heads: int | None = Field(None, gt=0)
    intermediate_size: int | None = Field(None, gt=0)
    max_positions: int = Field(2048, gt=0)
    family: Literal["qwen2", "gpt2"] = "qwen2"  # embedded architecture (RoPE vs learned absolute positions)


DEFAULT_METHOD = "sft_cot"  # a trial or sweep that names no method trains on the full chain


class MethodCfg(Strict):
    name: str  # a registered method (python -m stabray methods)
    params: dict[str, Any] = {}


class TrainCfg(Strict):
    """The training loop's settings (stabray.train.loop.Trainer takes this object)."""

    epochs: int = Field(8, ge=1)  # passes over the training split (ASHA's time unit)
    batch_size: int = Field(32, ge=1)  # examples per optimisation step
    lr: float = Field(1e-3, gt=0, allow_inf_nan=False)  # AdamW peak learning rate
    weight_decay: float = Field(0.01, ge=0)
    warmup_steps: int = Field(20, ge=0)  # linear warm-up, then `schedule`
    schedule: Literal["cosine", "constant"] = "cosine"  # cosine: down to 10% of lr over all epochs
    grad_clip: float = Field(1.0, ge=0)  # max global gradient norm; 0 = off
    max_steps_per_epoch: int = Field(0, ge=0)  # 0 = the whole split; > 0 caps an epoch (tests, smoke runs)
    threads: int = Field(0, ge=0)  # torch CPU threads; 0 = leave torch's default (Ray sets it from num_cpus)


class EvalCfg(Strict):
    batch_size: int = Field(64, ge=1)  # generation batch
    val_examples: int = Field(0, ge=0)  # 0 = the whole validation split, every epoch
    eaf_examples: int = Field(16, ge=0)  # examples for the per-epoch EAF (0 = off)
    eaf_iters: int = Field(10, ge=1)  # power-iteration steps
    eaf_token_cap: int = Field(8, ge=1)  # tokens per step block
    eaf_aggregation: Literal["block", "token_mean"] = "block"
    long_splits: list[Literal["test_long", "test_longer"]] = ["test_long", "test_longer"]
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
    seed: int = 0  # training seed: initialisation, shuffling, step resampling
    device: Literal["auto", "cpu", "cuda"] = "auto"
    cache_dir: str | None = None  # dataset cache; None = $STABRAY_CACHE or ~/.cache/stabray


def parse_trial_config(config: dict[str, Any]) -> TrialConfig:
    try:
        return TrialConfig.model_validate(config)
    except ValidationError as e:
        raise UserError(format_validation_error(e, "trial config")) from None


def format_validation_error(e: ValidationError, where: str) -> str:
    errs = e.errors()
    first = errs[0]
    loc = ".".join(str(p) for p in first["loc"])
    msg = "unknown key" if first["type"] == "extra_forbidden" else first["msg"]
    more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
    return f"{where}: {loc}: {msg}{more}"


# ----------------------------------------------------------------------------------------------
# Sweep specs


SHORT_NAMES = {  # search-space shorthands -> paths in the trial config
    "lam": "method.params.lam",
    "bits": "method.params.bits",
    "lr": "train.lr",
    "lora_rank": "model.lora.rank",
}


class Dist(Strict):
    choice: list[Any] | None = None
    loguniform: tuple[float, float] | None = None
    uniform: tuple[float, float] | None = None
    randint: tuple[int, int] | None = None

    def kind(self) -> str:
        set_ = [k for k in ("choice", "loguniform", "uniform", "randint") if getattr(self, k) is not None]
        if len(set_) != 1:
            raise ValueError("give exactly one of choice, loguniform, uniform, randint")
        return set_[0]


class MethodEntry(Strict):
    """One method of a multi-method sweep, with its own search space (None: the method's default
    space from stabray/methods/spaces.yaml). Space keys are the method's hyperparameter names."""

    name: str
    params: dict[str, Any] = {}
    space: dict[str, Dist] | None = None


class SearchCfg(Strict):
    num_samples: int = Field(8, ge=1)  # trials
    max_concurrent: int = Field(2, ge=1)  # trials running at once
    metric: str = "val_acc"
    mode: Literal["max", "min"] = "max"
    searcher: Literal["optuna", "random", "grid"] = "optuna"  # grid: every combination of the choices
    scheduler: Literal["asha", "fifo"] = "asha"
    grace_period: int = Field(1, ge=1)  # ASHA: epochs before a trial can be stopped
    reduction_factor: int = Field(2, ge=2)  # ASHA: keep 1/reduction_factor at each rung
    space: dict[str, Dist] = {}  # path (or shorthand: lam, bits, lr, lora_rank) -> distribution
    max_failures: int = Field(0, ge=0)  # retries of a failing trial


class ResourcesCfg(Strict):
    cpu: float = Field(1.0, gt=0)
    gpu: float = Field(0.0, ge=0)


class MlflowCfg(Strict):
    tracking_uri: str | None = None  # None: $MLFLOW_TRACKING_URI, else sqlite at ./mlflow.db (absolute)
    experiment: str | None = None  # None: the sweep's name


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
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    search: SearchCfg = SearchCfg()
    resources: ResourcesCfg = ResourcesCfg()
    mlflow: MlflowCfg = MlflowCfg()
    storage: str | None = None  # Ray Tune results; None = ./stabray_runs (absolute)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not v or "/" in v:
            raise ValueError("must be a non-empty name without '/'")
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


def read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    """A spec file with its `include:` chain resolved (paths relative to the including file)."""
    path = path.resolve()
    if path in seen:
        raise SpecError(str(path), "include", "include cycle")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise SpecError(str(path), "(file)", f"not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise SpecError(str(path), "(file)", "a sweep spec is a mapping of keys")
    includes = data.pop("include", [])
    includes = [includes] if isinstance(includes, str) else includes
    merged: dict = {}
    for inc in includes:
        inc_path = path.parent / inc
        if not inc_path.exists():
            raise SpecError(str(path), "include", f"file not found: {inc}")
        merged = deep_merge(merged, read_yaml(inc_path, (*seen, path)))
    return deep_merge(merged, data)


def set_path(d: dict, path: str, value: Any) -> None:
    keys = path.split(".")
    for k in keys[:-1]:
        if d.get(k) is None:
            d[k] = {}
        d = d[k]
    d[keys[-1]] = value


def get_path(d: dict, path: str, default: Any = None) -> Any:
    """The value at a dotted path of nested dicts, or `default` where the path does not exist."""
    for k in path.split("."):
        if not isinstance(d, dict) or k not in d:
            return default
        d = d[k]
    return d
