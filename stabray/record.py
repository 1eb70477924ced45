"""The trial record: what one trial logs and how it is read back.

Everything that names a trial's numbers lives here, once:
- `METRICS`: every metric a runner reports, with when it is logged (per epoch or once at the end),
  its group (science or system) and its meaning. The spec validator, the MLflow callback, the
  closing summary and `analysis/` all read this table, so a new metric is declared here only.
- `trial_params(config)`: the flat parameters logged per trial (task, method, lam, bits, lr, ...).
- `STATUSES` and `trial_status(...)`: one vocabulary for a trial's end (FINISHED, STOPPED, FAILED,
  RUNNING, KILLED).
- `DECOMP_KEYS`: the layout of the eq. (4) stability table (one row per T).
- `TrialRecord` and `trials_frame(records)`: one typed polars row per trial, whatever the source
  (an MLflow experiment through `stabray.tracking.Store.trial_records`, a Ray Tune experiment
  directory through `records_from_ray_dir`).

No Ray and no MLflow here: the training loop, the tracking layer and `analysis/` all import it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import polars as pl

# ----------------------------------------------------------------------------------- metrics


@dataclass(frozen=True)
class Metric:
    name: str
    when: Literal["epoch", "final"]  # logged every epoch (MLflow step = epoch) or once after the last epoch
    meaning: str
    group: Literal["science", "sys"] = "science"  # sys: timings and placement, kept apart from results
    runners: tuple[str, ...] = ("text", "icl")  # which trial runners report it
    icl_meaning: str = ""  # what it means for the in-context GD runner, where that differs
    # the direction in which a per-epoch objective is better: a sweep that optimises it the other way is
    # refused when the spec is read (None: not a search objective)
    better: Literal["max", "min"] | None = None

    def describe(self, runner: str = "text") -> str:
        return self.icl_meaning if runner == "icl" and self.icl_meaning else self.meaning


_ICL = ("icl",)
_TEXT = ("text",)

METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric(
            "train_loss",
            "epoch",
            "mean training loss over the epoch's steps: the method's training objective (text: next-token "
            "cross-entropy, nats; jacreg adds its beta-weighted Jacobian penalty, MTP its extra heads' losses, "
            "NSO its perturbed-latent losses)",
            better="min",
        ),
        Metric(
            "val_acc",
            "epoch",
            "exact match of the final answer on the validation split",
            icl_meaning="share of validation prompts whose self-generated theta_T is within 5% (relative L2) of "
            "the gradient-descent iterate theta_T",
            better="max",
        ),
        Metric(
            "steps_val_acc",
            "epoch",
            "fraction of the validation answers scored for val_acc whose written chain is the example's "
            "(steps_test_acc's measure), every epoch: the chain's learning curve beside the answer's",
            runners=_TEXT,
            better="max",
        ),
        Metric(
            "val_eaf",
            "epoch",
            "error amplification factor sum_{i<T} rho_i^(T) at T = T_max on the first eval.eaf_examples validation "
            "examples, measured on the method's evaluation chain (eval.eaf_chain): gold = the steps the method "
            "trains the model to write (Alg. 1 / MTP with lam < 1: the max(1, floor(lam T)) steps of its "
            "compressed chain; SFT-CoT: every step; Coconut: its latent slots, holding the model's own latents), "
            "generated = the model's own greedy chain. Measured every eval.eaf_every epochs and at the last epoch "
            "(absent from the epochs between). Not logged for No CoT and Implicit CoT, which answer without a "
            "chain, nor where the measured chains give the sum no term (no intermediate step before a final "
            "answer: e.g. Dijkstra at 3-4 nodes, where an answer can need no step, or a generated chain left "
            "empty): the sum over steps is empty, not a measured 0",
            icl_meaning="sum_i rho_i^(T) from exact Jacobians on validation prompts",
            better="min",
        ),
        Metric(
            "val_loss",
            "epoch",
            "teacher-forced squared error ||f_W(true prefix) - theta_bar_t||^2 against the training labels, mean "
            "over steps (theta_bar_T = theta* with task param last_target=star, the paper's L^CoT; theta_T with gd)",
            runners=_ICL,
            better="min",
        ),
        Metric(
            "val_infer_loss",
            "epoch",
            "||hat theta_T - theta_T||^2 with the model's own iterates, validation",
            runners=_ICL,
            better="min",
        ),
        Metric(
            "val_infer_star",
            "epoch",
            "||hat theta_T - theta*||^2 with the model's own iterates, validation",
            runners=_ICL,
            better="min",
        ),
        Metric("tokens", "epoch", "non-pad training tokens in the epoch", group="sys", runners=_TEXT),
        Metric("tokens_per_s", "epoch", "training tokens per second of the epoch", group="sys", runners=_TEXT),
        Metric("epoch_time_s", "epoch", "seconds spent training in the epoch", group="sys"),
        Metric("val_time_s", "epoch", "seconds spent on validation accuracy", group="sys"),
        Metric("eaf_time_s", "epoch", "seconds spent on the per-epoch EAF", group="sys"),
        Metric("gpus_assigned", "epoch", "GPUs Ray assigned to the trial", group="sys"),
        Metric("epoch", "epoch", "epochs completed (1-based)", group="sys"),
        Metric(
            "test_acc",
            "final",
            "exact match of the final answer on the test split (in distribution)",
            icl_meaning="the val_acc rule on the test split at T_max",
        ),
        Metric(
            "test_long_acc",
            "final",
            "test accuracy on the first length-generalization split (10% larger inputs than any training input)",
            icl_meaning="the val_acc rule with 10% more GD steps",
        ),
        Metric(
            "test_longer_acc",
            "final",
            "test accuracy on the second length-generalization split (20% larger inputs than any training input)",
            icl_meaning="the val_acc rule with 20% more GD steps",
        ),
        Metric(
            "trivial_val_acc",
            "final",
            "accuracy of the best of the task's trivial rules (no learning) on the whole validation split",
            runners=_TEXT,
        ),
        Metric(
            "trivial_test_acc",
            "final",
            "accuracy of the best of the task's trivial rules (no learning) on the same test examples",
            runners=_TEXT,
        ),
        Metric(
            "trivial_test_long_acc",
            "final",
            "accuracy of the best trivial rule on the test_long examples",
            runners=_TEXT,
        ),
        Metric(
            "trivial_test_longer_acc",
            "final",
            "accuracy of the best trivial rule on the test_longer examples",
            runners=_TEXT,
        ),
        Metric(
            "steps_test_acc",
            "final",
            "fraction of test answers whose written chain is the example's, token for token (methods that write "
            "the whole chain at evaluation: SFT-CoT, QAT, Alg. 1 at lam = 1, ...); beside test_acc it tells a "
            "wrong chain from a wrong final answer after a right chain",
            runners=_TEXT,
        ),
        Metric("steps_test_long_acc", "final", "steps_test_acc's measure on the test_long examples", runners=_TEXT),
        Metric("steps_test_longer_acc", "final", "steps_test_acc's measure on the test_longer examples", runners=_TEXT),
        Metric(
            "test_loss_gap",
            "final",
            "test split: final-answer loss (nats/token) given the model's own chain minus given the method's gold "
            "evaluation chain (Alg. 1 / MTP with lam < 1: the compressed chain; Implicit CoT: the empty chain); "
            "signed: negative when the answer is more likely after the model's own chain than after the gold one "
            "(a model whose chain errs but whose answer does not depend on it, or a gold chain it reads badly). "
            "Not logged for No CoT (both prefixes are the prompt); the eq. (4) table's loss gap is |.| of one "
            "step's loss",
            icl_meaning="inference minus teacher-forced loss at T_max against the last label (theta*: infer_star - "
            "tf_star with last_target=star; theta_T: infer_loss - tf_loss with gd)",
        ),
        Metric(
            "test_eaf",
            "final",
            "val_eaf's measure on the first eval.eaf_examples test examples, final model, same chain (eval.eaf_chain)",
            icl_meaning="sum_i rho_i^(T) from exact Jacobians on test prompts",
        ),
        Metric(
            "stability_T",
            "final",
            "the T of the *_at_T metrics: min(eval.stability_T, T_max of the method's gold evaluation chain)",
        ),
        Metric(
            "test_eaf_at_T",
            "final",
            "sum_{i<T} rho_i^(T) at T = stability_T from the eq. (4) table: eval.decomposition_examples test "
            "examples, the method's gold evaluation chain (Alg. 1 with lam < 1: its compressed chain; Coconut: its "
            "latent slots at their true values); Table 3's Sigma rho",
        ),
        Metric(
            "test_sum_eps_at_T",
            "final",
            "sum_{t<T} eps_t at T = stability_T from the eq. (4) table (per-step error given the gold prefix, same "
            "chain as test_eaf_at_T); Table 3's Sigma eps",
        ),
        Metric("test_bound_at_T", "final", "the eq. (4) bound at T = stability_T (same table and chain)"),
        Metric(
            "test_loss_gap_at_T",
            "final",
            "|loss given the self-generated prefix - given the gold prefix| of step T = stability_T (same table)",
        ),
        Metric("best_val_acc", "final", "highest val_acc over the epochs run"),
        Metric("best_epoch", "final", "1-based epoch of best_val_acc (the first one on ties)"),
        Metric(
            "weight_noise_loss_increase",
            "final",
            "mean increase of the inference loss under N(0, sigma^2) weight noise (Appendix B.2); on a QAT "
            "model the noise is added to the quantized weights the layers compute with",
        ),
        Metric("test_infer_loss", "final", "||hat theta_T - theta_T||^2, self-generated iterates, test", runners=_ICL),
        Metric("test_infer_star", "final", "||hat theta_T - theta*||^2, self-generated iterates, test", runners=_ICL),
        Metric(
            "jac_err_max", "final", "max over prompts and steps of ||J_{t-1}^(t) - J_theory|| (spectral)", runners=_ICL
        ),
        Metric("test_long_infer_star", "final", "||hat theta_T - theta*||^2 on the longer split", runners=_ICL),
        Metric("test_longer_infer_star", "final", "||hat theta_T - theta*||^2 on the longest split", runners=_ICL),
    )
}

# The in-context GD runner also logs one metric per curve and T: `<curve>_T<t>` (analysis/icl_figures.py).
ICL_CURVES = (
    "infer_loss",
    "tf_loss",
    "infer_star",
    "tf_star",
    "step_noise",
    "weight_noise",
    "jac_norm",
    "jac_norm_max",
    "theory_norm",
    "jac_err",
    "offdiag_max",
    "jac_prod",
    "theory_prod",
    "eaf",
    "acc",
)


_CURVE_METRIC = re.compile(rf"(?:{'|'.join(ICL_CURVES)})_T\d+")

# Metrics of evaluation splits at explicit sizes (a task's `long_sizes`: splits `test_n<k>`), one
# family each: `test_acc_n5` is the accuracy on inputs of size 5, `trivial_test_acc_n5` its floor.
# (MLflow metric names allow letters, digits and `_ - . / :` and space, so no `@n5`.)
SIZED_METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric(
            "test_acc_n<k>",
            "final",
            "exact match of the final answer on test inputs of size k (nodes, variables: a task's long_sizes)",
            runners=_TEXT,
        ),
        Metric(
            "trivial_test_acc_n<k>",
            "final",
            "accuracy of the best of the task's trivial rules on the same size-k test examples",
            runners=_TEXT,
        ),
        Metric(
            "steps_test_acc_n<k>",
            "final",
            "fraction of the size-k test answers whose written chain is the example's (steps_test_acc's measure)",
            runners=_TEXT,
        ),
    )
}
_SIZED_METRIC = re.compile(r"(trivial_|steps_)?test_acc_n(\d+)")
_SIZED_ORDER = {"": 0, "trivial_": 1, "steps_": 2}  # each accuracy, its floor, then its chain's

# Where the wrong written chains go off (a method that writes the whole chain): one metric per token
# index k of a step, every epoch on validation (`val_departure_tok0`, `val_departure_tok1`, ...) and at
# the end on each test split (`test_departure_tok0`, `test_long_departure_tok0`, and for a split at an
# explicit size `test_departure_tok0_n6`, the size last as in `test_acc_n6`).
DEPARTURE_METRIC = Metric(
    "val_departure_tok<k>",
    "epoch",
    "fraction of the validation answers scored for val_acc whose written chain first goes off the "
    "example's at token k of a step (stabray.evaluate.metrics.first_departure_token; a LEGO delta_op "
    "step `f 2 3`: 0 the variable, i.e. the clause lookup, 1 the operation, 2 the value, 3 a chain that "
    "stops, goes on or never ends); over k they add up to 1 - steps_val_acc",
    runners=_TEXT,
)
FINAL_DEPARTURE_METRIC = Metric(
    "test_departure_tok<k>",
    "final",
    "fraction of the test answers whose written chain first goes off the example's at token k of a "
    "step (val_departure_tok<k>'s measure on a test split; test_long_departure_tok<k> on test_long, "
    "test_departure_tok<k>_n<size> on the inputs of that size); over k they add up to 1 - its steps_ metric",
    runners=_TEXT,
)
_DEPARTURE_METRIC = re.compile(r"val_departure_tok(\d+)")
_FINAL_DEPARTURE_METRIC = re.compile(r"test(?:_long|_longer)?_departure_tok(\d+)|test_departure_tok(\d+)_n(\d+)")


def acc_metric(split: str) -> str:
    """The accuracy metric of an evaluation split: val -> val_acc, test_long -> test_long_acc,
    test_n5 (a split at an explicit size) -> test_acc_n5."""
    m = re.fullmatch(r"test_n(\d+)", split)
    return f"test_acc_n{m.group(1)}" if m else f"{split}_acc"


def trivial_metric(split: str) -> str:
    """The metric of the best trivial rule's accuracy on an evaluation split (trivial_test_acc_n5)."""
    return "trivial_" + acc_metric(split)


def steps_metric(split: str) -> str:
    """The metric of how often the written chain is the example's on an evaluation split (steps_test_acc_n5)."""
    return "steps_" + acc_metric(split)


def departure_metric(token: int, split: str = "val") -> str:
    """The metric of a split's written chains that first go off at token `token` of a step:
    val_departure_tok2 (every epoch), test_long_departure_tok2, test_departure_tok2_n6 (test_n6)."""
    return acc_metric(split).replace("_acc", f"_departure_tok{token}", 1)  # named as its accuracy is


def departure_token(name: str) -> int | None:
    """The token index k of a per-epoch departure metric (val_departure_tok<k>), else None."""
    m = _DEPARTURE_METRIC.fullmatch(name)
    return int(m.group(1)) if m else None


def is_departure_metric(name: str) -> bool:
    """Whether a name is one of the per-epoch departure metrics (val_departure_tok<k>)."""
    return departure_token(name) is not None


def declared(name: str) -> Metric | None:
    """The declaration of a metric name, a sized one included (test_acc_n5 -> its family)."""
    if name in METRICS:
        return METRICS[name]
    m = _SIZED_METRIC.fullmatch(name)
    if m:
        return SIZED_METRICS[f"{m.group(1) or ''}test_acc_n<k>"]
    if _DEPARTURE_METRIC.fullmatch(name):
        return DEPARTURE_METRIC
    if _FINAL_DEPARTURE_METRIC.fullmatch(name):
        return FINAL_DEPARTURE_METRIC
    return None


def describe_metric(name: str, runner: str = "text") -> str:
    """The meaning of a metric name (a sized one with its size filled in)."""
    m = declared(name)
    if m is None:
        return ""
    size = _SIZED_METRIC.fullmatch(name)
    text = m.describe(runner)
    if token := _DEPARTURE_METRIC.fullmatch(name):
        return text.replace("token k", f"token {token.group(1)}")
    if token := _FINAL_DEPARTURE_METRIC.fullmatch(name):
        k, n = token.group(1) or token.group(2), token.group(3)
        where = f"answers on test inputs of size {n}" if n else f"{name.split('_departure')[0]} answers"
        return text.replace("token k", f"token {k}").replace("the test answers", f"the {where}", 1)
    return text.replace("size k", f"size {size.group(2)}") if size else text


def sized_metric_names(names) -> list[str]:
    """The sized metrics among `names` (e.g. a trial's logged keys), by size, each accuracy before its
    floor and its chain's (steps_)."""
    found = filter(None, (_SIZED_METRIC.fullmatch(n) for n in set(names)))
    return [m.group(0) for m in sorted(found, key=lambda m: (int(m.group(2)), _SIZED_ORDER[m.group(1) or ""]))]


def final_departure_metric_names(names) -> list[str]:
    """The final departure metrics among `names` (test_departure_tok<k>, test_long_..., test_departure_tok<k>_n<size>),
    split by split as the accuracies are ordered (test, test_long, test_longer, then by size), token by token."""
    found = filter(None, (_FINAL_DEPARTURE_METRIC.fullmatch(n) for n in set(names)))
    splits = {"test": 0, "test_long": 1, "test_longer": 2}

    def key(m: re.Match) -> tuple[int, int, int]:
        if m.group(3) is not None:  # a split at an explicit size, after the named ones
            return (3, int(m.group(3)), int(m.group(2)))
        return (splits[m.group(0).split("_departure")[0]], 0, int(m.group(1)))

    return [m.group(0) for m in sorted(found, key=key)]


def is_metric(key: str) -> bool:
    """Whether a reported key is a declared metric (what the MLflow callback logs)."""
    return key in METRICS or any(
        p.fullmatch(key) for p in (_CURVE_METRIC, _SIZED_METRIC, _DEPARTURE_METRIC, _FINAL_DEPARTURE_METRIC)
    )


def metric_names(when: str | None = None, group: str | None = "science", runner: str | None = None) -> list[str]:
    """Declared metric names, filtered by when they are logged, their group and the runner."""
    return [
        m.name
        for m in METRICS.values()
        if (when is None or m.when == when)
        and (group is None or m.group == group)
        and (runner is None or runner in m.runners)
    ]


# MLflow groups a run's charts by the prefix before "/": timings and placement go under `sys/`, apart
# from the results. This is the one place that maps a declared name to its logged name and back;
# the tracking store applies it when it writes and reads, so everything else uses the plain names.
SYS_PREFIX = "sys/"


def logged_name(name: str) -> str:
    """The name a metric is logged under in MLflow (`sys/epoch_time_s` for a system metric)."""
    m = METRICS.get(name)
    return SYS_PREFIX + name if m is not None and m.group == "sys" else name


def record_name(logged: str) -> str:
    """The declared name of a metric read back from MLflow (inverse of `logged_name`)."""
    return logged[len(SYS_PREFIX) :] if logged.startswith(SYS_PREFIX) else logged


def searchable_metrics(runner: str | None = None) -> list[str]:
    """Metrics a sweep may optimise and ASHA may stop on: science metrics reported every epoch (by
    trials of that runner, "text" or "icl", when given)."""
    return metric_names(when="epoch", runner=runner)


# Key of a final result that holds the eq. (4) table (a list of rows, not a metric), and its row layout.
STABILITY_TABLE = "stability_table"
DECOMP_KEYS = ["T", "loss_gap", "bound", "ratio", "first_order", "second_order", "C1", "C2", "eaf", "sum_eps"]

# Keys of the first result after each start or restore that say what computed the trial's numbers
# (`stabray.train.loop.kernels`: torch version, kernel path); kept as the run's tags stabray.torch and
# stabray.kernels. Another kernel path reproduces a trial only to about the 4th decimal of its loss.
KERNEL_KEYS = ("torch", "kernels")

# ----------------------------------------------------------------------------------- status

# How a trial ended. FINISHED: ran every epoch (it has the final metrics). STOPPED: ended early by
# the scheduler (ASHA), the EAF rule (search.eaf_stop) or a search.stop_if rule. FAILED: it raised.
# RUNNING: still going, or its driver died. KILLED: the sweep was interrupted while it ran (`--resume` continues it).
STATUSES = ("FINISHED", "STOPPED", "FAILED", "RUNNING", "KILLED")
# what stopped a STOPPED trial (its MLflow tag stabray.stopped_by) -> words for descriptions and reports
STOPPER_WORDS = {"asha": "ASHA", "eaf_stop": "the EAF rule", "stop_if": "a search.stop_if rule"}


def trial_status(*, failed: bool, done: bool, has_final: bool, killed: bool = False) -> str:
    """The status of a trial from what is known about it: `done` = it ended (any way), `has_final`
    = it reported the end-of-training metrics."""
    if failed:
        return "FAILED"
    if has_final:
        return "FINISHED"
    if killed:
        return "KILLED"
    return "STOPPED" if done else "RUNNING"


# ----------------------------------------------------------------------------------- params


def trial_params(config: dict[str, Any]) -> dict[str, Any]:
    """The flat parameters logged for a trial (analysis/ and the closing summary read these names):
    task identity and size, method and every one of its hyperparameters with its default filled in
    (e.g. alg1's lam = 0.2 when the config leaves it out), what a method implies without a
    hyperparameter (SFT-CoT: lam = 1.0, bits = 32), model, lr, seed and the training sizes. An
    embedded model also logs its shape, `hidden_size` and `num_layers` (its preset's values unless the
    config overrides them), so that runs of one preset at different depths or widths differ in MLflow,
    and its position options when not the default (`model_positions`)."""
    from stabray.methods import METHODS
    from stabray.tasks import TASKS

    task, method = config["task"], config["method"]
    model, train = config.get("model") or {}, config.get("train") or {}
    task_cls, method_cls = TASKS.get(task["name"]), METHODS.get(method["name"])
    p: dict[str, Any] = {
        "task": task_cls.name,
        "task_version": task_cls.version,
        "method": method_cls.name,
        "model": model.get("pretrained") or f"embedded-{model.get('preset', 'small')}",
        "lr": train.get("lr"),
        "seed": config.get("seed", 0),
        "epochs": train.get("epochs"),
        "batch_size": train.get("batch_size"),
        "train_size": task.get("train_size"),
    }
    p.update(method_cls.implied_params)
    mparams = method.get("params") or {}
    try:
        p.update(dataclasses.asdict(method_cls.Params(**mparams)))
    except TypeError:  # not a valid config (an unknown key): log what was given
        p.update(mparams)
    p.update(task.get("params") or {})
    if model.get("lora"):
        p["lora_rank"] = model["lora"].get("rank")
    p.update(model_shape(model))
    p.update(model_positions(model))
    digest = config_digest(config)
    if digest is not None:
        p["config_digest"] = digest
    return p


# Trial config fields that say where a trial runs, not what it is: left out of `config_digest`
PLACEMENT_FIELDS = {"seed": True, "device": True, "cache_dir": True, "train": {"threads": True}}


def config_digest(config: dict[str, Any]) -> str | None:
    """12 hex digits of the whole trial config but its seed and where it runs (`PLACEMENT_FIELDS`),
    defaults left out (a value written at its default is the same configuration): logged as a param,
    so `config_key` tells apart trials that differ in a setting no other param names (model.family,
    init_std, numbers, weight_decay, schedule, the eval settings, ...) instead of pooling them as seeds
    of one configuration. None for a config that does not validate."""
    import hashlib

    from stabray.config import parse_trial_config
    from stabray.errors import UserError

    try:
        cfg = parse_trial_config(config)
    except UserError:
        return None
    from stabray.methods import METHODS

    d = cfg.model_dump(mode="json", exclude_defaults=True, exclude=PLACEMENT_FIELDS)
    d = {k: v for k, v in d.items() if v != {}}  # a section left with placement fields only
    method_cls = METHODS.get(cfg.method.name)
    try:  # the method's hyperparameters with their defaults filled in: lam 0.2 written or not is one config
        full = dataclasses.asdict(method_cls.Params(**cfg.method.params))
        d["method"] = {"name": method_cls.name, "params": json.loads(json.dumps(full, default=str))}
    except TypeError:
        pass
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:12]


def model_positions(model: dict[str, Any]) -> dict[str, Any]:
    """An embedded model's position options when they are not the default: `positions`, and with
    randomized positions its `position_span` and `position_eval_stride` ("3", or "2,3,4" for a
    stride per input), so that runs evaluated at different strides are different configurations."""
    if model.get("pretrained") or model.get("positions", "default") == "default":
        return {}
    p: dict[str, Any] = {"positions": model["positions"]}
    if model["positions"] == "random":
        k = model.get("position_eval_stride") or 1
        p["position_span"] = model.get("position_span") or model.get("max_positions", 2048)
        p["position_eval_stride"] = ",".join(map(str, k)) if isinstance(k, list | tuple) else str(k)
    return p


def model_shape(model: dict[str, Any]) -> dict[str, Any]:
    """An embedded model's `hidden_size` and `num_layers` from a model config section (its preset's
    values unless the section overrides them); {} for a pretrained model."""
    if model.get("pretrained"):
        return {}
    from stabray.config import PRESETS, embedded_shape

    preset = model.get("preset", "small")
    if preset not in PRESETS:  # a config that did not validate: nothing to say
        return {}
    shape = embedded_shape(preset, model)
    return {k: shape[k] for k in ("hidden_size", "num_layers")}


# Short labels of searched values in run names (alg1-lam0.2-b4-lr0.0031-s0); any other key keeps its name.
NAME_LABELS = {"bits": "b", "lora_rank": "r", "batch_size": "bs", "seed": "s", "position_eval_stride": "stride"}


def _short(v: Any) -> str:
    if isinstance(v, list | tuple):  # a list value (a stride per input): 2,3,4, as its param
        return ",".join(_short(x) for x in v)
    if isinstance(v, float):
        return f"{v:.2g}" if abs(v) < 0.01 or abs(v) >= 1000 else f"{v:.3g}"  # 0.0031, 0.2, 12.5
    return str(v)


def run_name(config: dict[str, Any], searched: list[str] | tuple[str, ...] = ()) -> str:
    """A readable name for a trial: its method, each searched value (config paths, labelled by their
    last key) and its seed, e.g. `alg1-lam0.2-b4-lr0.0031-s0`."""
    from stabray.config import get_path

    parts = [str(trial_params(config)["method"])]
    for path in searched:
        key = path.rsplit(".", 1)[-1]
        if key == "seed":
            continue
        parts.append(NAME_LABELS.get(key, key) + _short(get_path(config, path)))
    parts.append("s" + str(config.get("seed", 0)))
    return "-".join(parts)


# Params with a known type; any other param is inferred (int, else float, else string).
PARAM_TYPES: dict[str, pl.DataType] = {
    "task": pl.Utf8,
    "task_version": pl.Utf8,
    "method": pl.Utf8,
    "model": pl.Utf8,
    "lr": pl.Float64,
    "seed": pl.Int64,
    "lam": pl.Float64,  # compression factor; 1.0 = keep all steps
    "bits": pl.Int64,  # QAT bit-width; 32 = full precision
    "lora_rank": pl.Int64,
    "hidden_size": pl.Int64,  # embedded models only
    "num_layers": pl.Int64,  # embedded models only
    "positions": pl.Utf8,  # embedded models with positions other than the default
    "position_span": pl.Int64,  # randomized positions
    "position_eval_stride": pl.Utf8,  # randomized positions: "3", or "2,3,4" (a stride per input)
    "n_nodes": pl.Int64,
    "latents_per_step": pl.Int64,  # Coconut
    "sigma": pl.Float64,
    "config_digest": pl.Utf8,  # 12 hex digits (could read as a number)
}
# Params left out of `config_key`: trials that differ only in these are seeds of one configuration.
SEED_PARAMS = ("seed",)

# ----------------------------------------------------------------------------------- the frame


@dataclass
class TrialRecord:
    """One trial as read from a source, before typing."""

    trial_id: str
    params: dict[str, Any]
    metrics: dict[str, float]  # final value of every metric the trial logged
    val_history: list[tuple[int, float]] = field(default_factory=list)  # (epoch, val_acc)
    status: str | None = "FINISHED"  # one of STATUSES (None: unknown, counted as finished)
    run_id: str | None = None  # MLflow run id
    decomposition: list[dict] | None = None  # rows of the eq. (4) table (keys DECOMP_KEYS)
    config: dict | None = None  # the trainable's config, when the source holds it
    name: str | None = None  # the run's readable name (MLflow run name, e.g. alg1-lam0.2-b4-lr0.0031-s0)
    stopped_by: str | None = None  # a STOPPED trial's stopper (MLflow tag stabray.stopped_by: asha, eaf_stop, stop_if)


FINAL_METRICS = metric_names(when="final")
EPOCH_METRICS = metric_names(when="epoch")

META_COLUMNS: dict[str, pl.DataType] = {
    "trial_id": pl.Utf8,
    "name": pl.Utf8,  # readable run name (MLflow run name; the trial directory for a Ray dir)
    "run_id": pl.Utf8,  # MLflow child run id; null for a Ray dir
    "status": pl.Utf8,  # one of STATUSES
    "stopped_by": pl.Utf8,  # STOPPED: asha, eaf_stop or stop_if (MLflow records; null from a Ray dir)
    "config_key": pl.Utf8,  # all params but the seed, as JSON
    "task": pl.Utf8,
    "method": pl.Utf8,
    "seed": pl.Int64,
    "lam": pl.Float64,
    "bits": pl.Int64,
    **{m: pl.Float64 for m in FINAL_METRICS + EPOCH_METRICS if m not in ("best_val_acc", "best_epoch")},
    "best_val_acc": pl.Float64,  # max val_acc over epochs
    "best_epoch": pl.Int64,  # 1-based epoch of that max (first one on ties)
    "n_epochs": pl.Int64,  # epochs run
}

DECOMP_SCHEMA: dict[str, pl.DataType] = {
    "trial_id": pl.Utf8,
    "run_id": pl.Utf8,
    "config_key": pl.Utf8,
    "task": pl.Utf8,
    "method": pl.Utf8,
    "model": pl.Utf8,
    "seed": pl.Int64,
    "bits": pl.Int64,
    "lam": pl.Float64,
    "T": pl.Int64,
    **{k: pl.Float64 for k in DECOMP_KEYS[1:]},
}


def _is_missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or (isinstance(v, str) and v in ("", "None", "null"))


def _parse(v: Any, dtype: pl.DataType) -> Any:
    if _is_missing(v):
        return None
    try:
        if dtype == pl.Int64:
            f = float(v)
            return int(f) if f.is_integer() else None
        if dtype == pl.Float64:
            return float(v)
    except (TypeError, ValueError):
        return None
    return str(v)


def _infer(values: list[Any]) -> pl.DataType:
    present = [str(v) for v in values if not _is_missing(v)]
    if not present:
        return pl.Utf8
    for dtype, parse in ((pl.Int64, int), (pl.Float64, float)):
        try:
            [parse(v) for v in present]
            return dtype
        except ValueError:
            pass
    return pl.Utf8


def config_key(params: dict[str, Any], ignore: tuple[str, ...] = ()) -> str:
    """All params except the seed (and `ignore`), as canonical JSON: equal keys = seeds of one
    configuration."""
    return json.dumps({k: str(v) for k, v in sorted(params.items()) if k not in SEED_PARAMS and k not in ignore})


def key_ignores(records: list[TrialRecord]) -> tuple[str, ...]:
    """What `config_key` leaves out over `records`: `config_digest` where some trials lack it (logged
    before it existed), so that their configurations and the later trials' still meet as before."""
    has = {"config_digest" in r.params for r in records}
    return ("config_digest",) if len(has) > 1 else ()


def _best_epoch(history: list[tuple[int, float]]) -> tuple[int | None, float | None]:
    hist = [(e, v) for e, v in history if not _is_missing(v)]
    if not hist:
        return None, None
    epoch, val = max(hist, key=lambda ev: (ev[1], -ev[0]))  # first epoch on ties
    return int(epoch), float(val)


def one_per_seed(trials: pl.DataFrame, prefer: set[str] | None = None) -> pl.DataFrame:
    """One trial per (configuration, seed). A seed run twice for one configuration (Optuna drawing a
    point of a small space again, a sweep repeated into the same store) is one sample of the seed's
    variation, not two: the trial in `prefer` (a selected one) stands for it, else the lowest trial
    id (an order of ids, not of time: Ray's ids of two sweeps do not say which ran first). Trials
    without a seed are kept as they are, as is a frame without those columns."""
    if not trials.height or any(c not in trials.columns for c in ("config_key", "seed", "trial_id")):
        return trials
    seeded = trials.filter(pl.col("seed").is_not_null())
    ranked = seeded.with_columns(_other=~pl.col("trial_id").is_in(list(prefer or ()))).sort(["_other", "trial_id"])
    kept = set(ranked.unique(subset=["config_key", "seed"], keep="first")["trial_id"].to_list())
    return trials.filter(pl.col("seed").is_null() | pl.col("trial_id").is_in(list(kept)))


def trials_frame(records: list[TrialRecord]) -> pl.DataFrame:
    """One typed row per trial: meta columns, every param, final metrics (the sized ones, e.g.
    test_acc_n5, and where the wrong written chains go off, e.g. test_departure_tok0, as they occur),
    best epoch."""
    param_names = sorted({k for r in records for k in r.params})
    ignore = key_ignores(records)
    logged = {k for r in records for k in r.metrics}
    sized = sized_metric_names(logged) + final_departure_metric_names(logged)
    rows: list[dict[str, Any]] = []
    for r in records:
        best_epoch, best_val = _best_epoch(r.val_history)
        m = r.metrics
        row: dict[str, Any] = {
            "trial_id": str(r.trial_id),
            "name": r.name or str(r.trial_id),
            "run_id": r.run_id,
            "status": r.status,
            "stopped_by": r.stopped_by,
            "config_key": config_key(r.params, ignore),
            **{k: m.get(k) for k in FINAL_METRICS + EPOCH_METRICS + sized},
            # the history wins over the logged summary; the summary covers a trial without history
            "best_val_acc": best_val if best_val is not None else m.get("best_val_acc"),
            "best_epoch": best_epoch if best_epoch is not None else m.get("best_epoch"),
            "n_epochs": max((e for e, _ in r.val_history), default=None),
        }
        for k in param_names:
            col = k if k not in META_COLUMNS or k in PARAM_TYPES else f"param_{k}"
            row[col] = r.params.get(k)
        rows.append(row)
    schema = dict(META_COLUMNS)
    schema.update({k: pl.Float64 for k in sized})
    for k in param_names:
        col = k if k not in META_COLUMNS or k in PARAM_TYPES else f"param_{k}"
        if col not in schema or k in PARAM_TYPES:
            schema[col] = PARAM_TYPES.get(k) or _infer([r.params.get(k) for r in records])
    data = {c: [_parse(row.get(c), t) for row in rows] for c, t in schema.items()}
    return pl.DataFrame(data, schema=schema).sort("trial_id")


def decomposition_frame(records: list[TrialRecord]) -> pl.DataFrame:
    """The per-T rows of every trial that has them, joined with the trial's identity."""
    rows = []
    ignore = key_ignores(records)
    for r in records:
        rows_in = r.decomposition if isinstance(r.decomposition, list) else []  # anything else: malformed
        for d in (d for d in rows_in if isinstance(d, dict)):
            row = {
                "trial_id": str(r.trial_id),
                "run_id": r.run_id,
                "config_key": config_key(r.params, ignore),
                **{k: r.params.get(k) for k in ("task", "method", "model", "seed", "bits", "lam")},
                **{k: d.get(k) for k in DECOMP_KEYS},
            }
            rows.append({c: _parse(row.get(c), t) for c, t in DECOMP_SCHEMA.items()})
    return pl.DataFrame(rows, schema=DECOMP_SCHEMA).sort(["trial_id", "T"])


# ----------------------------------------------------------------------------------- Ray Tune dirs

# A sweep's run folder under the storage root: `<sweep>-<yyyymmdd-hhmmss>` (the sweep writes it, `--resume`
# and `analysis --ray-dir` find it again). One definition, so the writer and the readers cannot drift apart.
_RUN_STAMP = "%Y%m%d-%H%M%S"
_RUN_SUFFIX = r"-\d{8}-\d{6}"


def run_folder(sweep: str, when: float | None = None) -> str:
    """The run folder name of sweep `sweep` started at `when` (seconds since the epoch; default now)."""
    import time

    return f"{sweep}-{time.strftime(_RUN_STAMP, time.localtime(when))}"


def is_run_folder(name: str, sweep: str | None = None) -> bool:
    """Whether `name` is a run folder (`<sweep>-<yyyymmdd-hhmmss>`), of sweep `sweep` when given: a sweep
    named `dijkstra` does not claim the runs of a sweep named `dijkstra-2x`."""
    if sweep is None:
        return re.search(_RUN_SUFFIX + "$", name) is not None
    return re.fullmatch(re.escape(sweep) + _RUN_SUFFIX, name) is not None


BUNDLE = "trial_config"  # a Ray param space may hold whole trial configs under this key (a grid over configs)


def unwrap(config: dict[str, Any]) -> dict[str, Any]:
    """The trial config inside a Ray trial config (which may bundle it under BUNDLE)."""
    return config[BUNDLE] if BUNDLE in config else config


def is_trial_config(config: dict[str, Any]) -> bool:
    """Whether a dict is a stabray trial config (the trainable's layout), not flat params."""
    return isinstance(config.get("task"), dict) and isinstance(config.get("method"), dict)


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        elif not isinstance(v, list):
            out[f"{prefix}{k}"] = v
    return out


def params_of(config: dict[str, Any]) -> dict[str, Any]:
    """The params of a Ray trial config: every flattened key, and for a stabray trial config the
    same flat params the MLflow callback logs (task, method, lam, bits, ...)."""
    params = _flatten(config)
    trial_cfg = unwrap(config)
    if is_trial_config(trial_cfg):
        params.update(trial_params(trial_cfg))
    return params


def history_of(results: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(epoch, val_acc) of a trial's reported results, in order."""
    out = []
    for i, res in enumerate(results, start=1):
        if not _is_missing(res.get("val_acc")):
            out.append((int(res.get("epoch") or res.get("training_iteration") or i), float(res["val_acc"])))
    return out


# Per-epoch metrics read as the trial's last epoch's: absent there (the EAF's empty sum at the last
# epoch, say), an earlier epoch's value is not the trial's, so the trial has none (`last_metrics`)
LAST_EPOCH_ONLY = ("val_eaf",)


def last_metrics(results: list[dict[str, Any]]) -> dict[str, float]:
    """The last value of every numeric key over a trial's reported results, except that a
    `LAST_EPOCH_ONLY` metric counts only when the last epoch's result (the last with `val_acc`) has it."""
    metrics: dict[str, float] = {}
    for res in results:
        for k, v in res.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and not _is_missing(v):
                metrics[k] = float(v)
    last_epoch = next((r for r in reversed(results) if "val_acc" in r), None)
    for k in LAST_EPOCH_ONLY:
        if last_epoch is not None and _is_missing(last_epoch.get(k)):
            metrics.pop(k, None)
    return metrics


def _read_results(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a trial killed mid-write leaves a torn last line
                pass
    return out


def _read_json(path: Path, kind: type) -> Any:
    """A JSON file of the expected kind (dict, list), or a one-line UserError naming the file."""
    from stabray.errors import UserError

    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: not a readable JSON file ({e})") from None
    if not isinstance(data, kind):
        raise UserError(f"{path}: expected a JSON {kind.__name__}, got {type(data).__name__}")
    return data


def records_from_ray_dir(root: Path) -> list[TrialRecord]:
    """Read `<root>/<trial dir>/{params.json,result.json}` of a Ray Tune experiment directory."""
    records = []
    for params_file in sorted(root.glob("*/params.json")):
        tdir = params_file.parent
        config = _read_json(params_file, dict)
        results = _read_results(tdir / "result.json")
        metrics = last_metrics(results)
        trial_id = next((str(r["trial_id"]) for r in results if r.get("trial_id")), tdir.name)
        failed = (tdir / "error.txt").exists() or (tdir / "error.pkl").exists()
        has_final = "test_acc" in metrics
        done = any(r.get("done") for r in results)
        decomp_file = tdir / "stability" / "decomposition.json"
        records.append(
            TrialRecord(
                trial_id=trial_id,
                params=params_of(config),
                metrics=metrics,
                val_history=history_of(results),
                status=trial_status(failed=failed, done=done, has_final=has_final or done),
                decomposition=_read_json(decomp_file, list) if decomp_file.exists() else None,
                config=config,
                name=tdir.name,
            )
        )
    return records
