"""Loading and validating sweep specs (sweeps/*.yaml) completely, before Ray starts."""

from __future__ import annotations

import copy
import functools
import itertools
import math
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from stabray.config import (
    SHORT_NAMES,
    SWEEPS_DIR,
    Dist,
    MethodCfg,
    MethodEntry,
    SweepSpec,
    TrialConfig,
    read_yaml,
    set_path,
    validation_problem,
)
from stabray.errors import SpecError, UserError, did_you_mean
from stabray.record import METRICS, departure_token, is_departure_metric, searchable_metrics

DEFAULT_LORA_RANKS = (16, 32, 64)  # searched whenever the model uses LoRA and the spec names no rank space


def find_spec(name_or_path: str) -> Path:
    """A path to a YAML file, or the name of a shipped spec in sweeps/ (e.g. "dijkstra")."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml"):
        if not p.exists():
            raise UserError(f"sweep spec not found: {p}")
        return p
    for d in (Path.cwd() / "sweeps", SWEEPS_DIR):
        cand = d / f"{name_or_path}.yaml"  # "paper/dijkstra" finds sweeps/paper/dijkstra.yaml
        if cand.exists():
            return cand
    shipped = sorted(
        str(q.relative_to(SWEEPS_DIR).with_suffix("")) for q in SWEEPS_DIR.rglob("*.yaml") if not q.stem.startswith("_")
    )
    hint = did_you_mean(name_or_path, shipped, n=3, before=" ")
    raise UserError(
        f"no sweep spec {name_or_path!r} (looked for sweeps/{name_or_path}.yaml);{hint} shipped: {', '.join(shipped)}"
    )


def load_spec(
    name_or_path: str, overrides: dict[str, Any] | None = None, sources: dict[str, str] | None = None
) -> tuple[SweepSpec, Path]:
    """Read, merge includes and overrides, and validate every field, name and search-space value.
    `sources` says how the user wrote an override ({"train.epochs": "--set train.epochs=0"}): an
    error in a field an override set names that override instead of the spec file."""
    if overrides is not None and not isinstance(overrides, dict):
        raise UserError(f"load_spec: overrides must be a dict of dotted keys to values, got {type(overrides).__name__}")
    path = find_spec(name_or_path)
    raw = read_yaml(path)
    sources = sources or {}
    for k, v in (overrides or {}).items():
        try:
            set_override(raw, k, v)
        except UserError as e:
            raise UserError(f"{sources.get(k, k)}: {e}") from None
    try:
        spec = _validated(raw, path)
    except SpecError as e:
        fields = (e.field, *e.related)
        hits = {k: lab for k, lab in sources.items() if any(_sets_field(k, f) for f in fields)}
        if not hits:
            raise
        # an error about a whole section (model: "hidden_size 64 is not a multiple of num_heads 5") that
        # several overrides set: the ones whose field the problem names, else all of them
        named = {k: lab for k, lab in hits.items() if re.search(rf"\b{re.escape(k.rsplit('.', 1)[-1])}\b", e.problem)}
        label = ", ".join((named or hits).values()) if len(hits) > 1 else next(iter(hits.values()))
        raise SpecError(f"{label} (spec {path})", e.field, e.problem, e.related) from None
    for k, v in (overrides or {}).items():  # an override the search would silently replace
        key = next(
            (s for s in spec.search.space or {} if k == space_path(s) or k.startswith(space_path(s) + ".")), None
        )
        if key is not None and not k.startswith("search."):
            raise SpecError(
                f"{sources.get(k, k)} (spec {path})",
                k,
                f"the spec searches this field (search.space.{key}), so every trial would replace this value; "
                f"drop the search with --set search.space.{key}=null, or search one value: "
                f"--set 'search.space.{key}={{choice: [{v}]}}'",
            )
    return spec, path


DIST_KINDS = tuple(Dist.model_fields)  # choice, loguniform, uniform, randint


def set_override(raw: dict[str, Any], key: str, value: Any) -> None:
    """Apply one override (`--set key=value`) to a raw spec. Below `search.space.` the rest of the
    key is one search-space key, itself a dotted field path (`search.space.model.position_eval_stride`
    searches model.position_eval_stride), unless it ends in a distribution's kind, which gives that
    key this distribution (`search.space.lr.choice=[0.003]` replaces lr's loguniform range; a field
    whose own name is a kind is reached through its distribution: `search.space.<path>.choice.choice`).
    The override replaces every key searching the same field (`search.space.train.lr` replaces the
    spec's `lr`), and null drops the search of that field."""
    prefix = "search.space."
    if not key.startswith(prefix):
        set_path(raw, key, value)
        return
    rest = key[len(prefix) :]
    if not rest or not all(rest.split(".")):
        raise UserError(f"{key!r}: not a dotted path of keys (like search.space.model.position_eval_stride)")
    if raw.get("search") is None:
        raw["search"] = {}
    search = raw["search"]
    if not isinstance(search, dict):
        raise UserError(f"search is {search!r}, not a mapping, so it has no key 'space'")
    if search.get("space") is None:
        search["space"] = {}
    space = search["space"]
    if not isinstance(space, dict):
        raise UserError(f"search.space is {space!r}, not a mapping of searched fields")
    name, _, last = rest.rpartition(".")
    if name and last in DIST_KINDS:
        rest, value = name, (None if value is None else {last: value})
    for k in [k for k in space if space_path(k) == space_path(rest)]:
        del space[k]
    if value is not None:
        space[rest] = value


def _sets_field(key: str, field: str) -> bool:
    """Whether an override of `key` set the field an error names (or a part of it)."""
    field = field.rsplit(": ", 1)[-1]  # "methods.alg1: search.space.bits" -> "search.space.bits"
    return key == field or field.startswith(key + ".") or key.startswith(field + ".")


def _validated(raw: dict[str, Any], path: Path) -> SweepSpec:
    space = (raw.get("search") or {}).get("space") or {}
    if (raw.get("model") or {}).get("lora") and not any(space_path(k) == "model.lora.rank" for k in space):
        set_path(raw, "search.space.lora_rank", {"choice": list(DEFAULT_LORA_RANKS)})  # LoRA on: rank searched too
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as e:
        raise SpecError(str(path), *validation_problem(e)) from None
    check_spec(spec, path)
    return spec


def check_spec(spec: SweepSpec, path: Path | str) -> None:
    """Every check `load_spec` makes beyond the fields' own types and ranges (names, searched values,
    objectives, rules, the device); `run_sweep` asks it again of the spec it is given (cheap: the
    expensive parts are cached), so a SweepSpec built in Python is held to the same rules."""
    if not isinstance(spec, SweepSpec):
        raise UserError(f"a sweep needs a SweepSpec (stabray.spec.load_spec(name)[0]), got {type(spec).__name__}")
    path = Path(path)
    if spec.device == "cuda" and spec.resources.gpu == 0:
        raise SpecError(
            str(path),
            "device",
            "cuda, but each trial asks for 0 GPUs (resources.gpu) and a Ray trial sees only the GPUs it asks "
            "for; set resources.gpu (e.g. 1), or device: auto",
            related=("resources.gpu",),
        )
    if spec.methods:
        names = [e if isinstance(e, str) else e.name for e in spec.methods]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise SpecError(str(path), "methods", f"method {sorted(dup)[0]!r} is listed twice")
        for label, sub in method_specs(spec, path):
            try:
                validate_semantics(sub, path)
            except SpecError as e:
                raise SpecError(str(path), f"methods.{label}: {e.field}", e.problem) from None
    else:
        validate_semantics(spec, path)


def method_space(name: str, space: dict | None = None) -> dict[str, Dist]:
    """A method's search space with full paths (method.params.<key>); None = its default space."""
    from stabray.methods import METHODS

    raw = space if space is not None else METHODS.get(name).default_space
    out = {}
    for k, d in raw.items():
        out[k if k.startswith("method.") else f"method.params.{k}"] = d if isinstance(d, Dist) else Dist(**d)
    return out


def method_specs(spec: SweepSpec, path: Path | str = "spec") -> list[tuple[str | None, SweepSpec]]:
    """(label, single-method spec) per method of the sweep; [(None, spec)] for a one-method spec."""
    from stabray.methods import METHODS

    if not spec.methods:
        return [(None, spec)]
    common = {k: d for k, d in spec.search.space.items() if not space_path(k).startswith("method.")}
    out = []
    for entry in spec.methods:
        e = MethodEntry(name=entry) if isinstance(entry, str) else entry
        try:
            name = METHODS.canonical(e.name)
        except UserError as err:
            raise SpecError(str(path), "methods", str(err)) from None
        space = {**common, **method_space(name, e.space)}
        sub = spec.model_copy(
            update={
                "method": MethodCfg(name=name, params=e.params),
                "methods": None,
                "search": spec.search.model_copy(update={"space": space}),
            }
        )
        out.append((name, sub))
    return out


def space_path(key: str) -> str:
    return SHORT_NAMES.get(key, key)


GOLDEN = (math.sqrt(5) - 1) / 2  # an irrational fraction: the point it picks inside a range is never whole

MAX_ENUMERATED = 1024  # a randint range up to this many values is checked value by value


MAX_COMBINATIONS = 512  # combinations of checked points an objective not every trial reports is judged on


def sample_points(spec: SweepSpec) -> dict[str, list[Any]]:
    """Values to check per searched path, so that every value a distribution can produce builds a
    valid trial: every choice; every integer of a randint range (above MAX_ENUMERATED values,
    that many evenly spaced ones, both ends included); the ends and the middle of a continuous
    range and a point at the golden fraction of it (its validators are intervals: ends plus an interior
    value cover them, and the golden point, never a whole number, catches a continuous range on an
    integer field, whose middle can be whole: uniform [8, 16])."""
    out = {}
    for key, dist in spec.search.space.items():
        kind = dist.kind()
        v = getattr(dist, kind)
        if kind == "choice":
            out[key] = list(v)
        elif kind == "randint":
            lo, hi = v
            if hi - lo + 1 <= MAX_ENUMERATED:
                out[key] = list(range(lo, hi + 1))
            else:
                out[key] = sorted({lo + round(i * (hi - lo) / (MAX_ENUMERATED - 1)) for i in range(MAX_ENUMERATED)})
        elif kind == "uniform":  # and a point no whole number can be (a range on an integer field)
            out[key] = [v[0], (v[0] + v[1]) / 2, v[0] + (v[1] - v[0]) * GOLDEN, v[1]]
        else:  # loguniform: the geometric middle, and a point at the golden fraction of the log range
            out[key] = [v[0], math.sqrt(v[0] * v[1]), v[0] * (v[1] / v[0]) ** GOLDEN, v[1]]
    return out


def _trial_problem(trial: dict[str, Any]) -> tuple[str, str] | None:
    """(field, what is wrong) for a trial config that does not build, or None."""
    from stabray.methods import get_method
    from stabray.tasks import get_task

    try:
        cfg = TrialConfig.model_validate(trial)
    except ValidationError as e:
        return validation_problem(e)
    built = {}
    builds = (
        ("method.params", lambda: get_method(cfg.method.name, **cfg.method.params)),
        ("task.params", lambda: get_task(cfg.task.name, **cfg.task.params)),
    )
    for field, build in builds:
        try:
            built[field] = build()
        except (UserError, TypeError) as e:
            return field, str(e)
    problem = built["method.params"].model_problem(cfg.model)
    if problem:
        return "method.params", problem
    return _icl_problem(cfg)


def _icl_problem(cfg: TrialConfig) -> tuple[str, str] | None:
    """(field, what is wrong) when a task of the in-context GD runner is given what that runner does not
    read, or None (and for every other task): a model field away from its default (the runner builds its
    own model from task.params; left out: the preset and max_positions, which every shipped spec's base
    sets, and init_seed, which seeds its weights), or device cuda (it trains on the CPU)."""
    from stabray.config import ModelCfg
    from stabray.tasks import TASKS

    if TASKS.get(cfg.task.name).runner != "icl":
        return None
    default = ModelCfg()
    for name in ModelCfg.model_fields:
        if name not in ("preset", "max_positions", "init_seed") and getattr(cfg.model, name) != getattr(default, name):
            return (
                f"model.{name}",
                f"{getattr(cfg.model, name)!r}, but task {cfg.task.name!r} trains the in-context GD model, built from "
                "task.params (heads, layers), which reads no model section; drop it",
            )
    if cfg.device == "cuda":
        return "device", f"cuda, but task {cfg.task.name!r}'s in-context GD runner trains on the CPU; use auto or cpu"
    return None


def run_problem(cfg: TrialConfig, local_paths: bool = True) -> tuple[str, str] | None:
    """(field, what is wrong) with one trial config that `load_spec` would refuse in a sweep, or None:
    what `TrialConfig` alone cannot see (`_trial_problem`: the task's and the method's own values, a
    method's values on this model; a local model directory that is not there; sequences past the
    embedded model's positions). `make_run` asks it, so the Python API and a trainable in a Ray
    pipeline of one's own refuse what the sweep command refuses, before any data or model is built.
    `local_paths`: whether a local model directory must be on this machine (not when the trials run
    elsewhere, through Ray Client)."""
    from stabray.config import local_model_problem

    trial = cfg.model_dump()
    if problem := _trial_problem(trial):
        return problem
    if local_paths and (problem := local_model_problem(cfg.model.pretrained)):
        return "model.pretrained", problem
    return _sequence_problem(trial)


def problem_text(problem: tuple[str, str]) -> str:
    """One line for a (field, what is wrong) pair: the field, unless the text already starts with it."""
    field, text = problem
    return text if text.startswith(field) else f"{field}: {text}"


# Per-epoch objectives that not every text trial reports: a trial that does not would fail the sweep at
# its first result (Ray's strict metric check), so the spec validator asks `_objective_problem` first.
PARTIAL_OBJECTIVES = ("val_eaf", "steps_val_acc")


def _objective_problem(trial: dict[str, Any], metric: str, epoch: int | None = None) -> str | None:
    """Why a text trial would not report the per-epoch metric `metric` at every epoch (at `epoch` alone,
    when given: a search.stop_if rule), or None.
    val_eaf: off (eval.eaf_examples 0), measured only every eval.eaf_every > 1 epochs, a method that
    answers without a chain (No CoT, Implicit CoT: the sum over steps is empty), or measured on the
    model's own chain (eval.eaf_chain: generated), which can have no step at an epoch (an empty sum: not
    logged). On the gold chain a validation split whose first eval.eaf_examples examples all answer
    without a step would report none either; the sweep's driver checks that on the validation split
    (drawn alone when the trials run on a cluster; `stabray.tune.sweep.empty_eaf_draw`), not here. steps_val_acc and
    val_departure_tok<k>: a method whose evaluation chain is not each example's whole chain (No CoT,
    Implicit CoT, Coconut, Algorithm 1 or MTP at lam < 1), judged on a few examples of the task at each
    in-distribution size, as `stabray.evaluate.metrics.writes_whole_chain` judges the validation
    split; val_departure_tok<k> also needs k at most the longest step's token count on those examples
    (k = that count is the chain's end)."""
    import numpy as np

    from stabray.evaluate.metrics import longest_step, writes_whole_chain
    from stabray.methods import get_method
    from stabray.tasks import get_task

    cfg = TrialConfig.model_validate(trial)
    method = get_method(cfg.method.name, **cfg.method.params)
    if metric == "val_eaf":
        if cfg.eval.eaf_examples == 0:
            return "val_eaf is not measured: eval.eaf_examples is 0"
        measured = epoch is not None and (epoch % cfg.eval.eaf_every == 0 or epoch == cfg.train.epochs)
        if cfg.eval.eaf_every != 1 and not measured:
            return (
                f"val_eaf is measured every eval.eaf_every = {cfg.eval.eaf_every} epochs, so the epochs between "
                + (f"(epoch {epoch} among them) " if epoch is not None else "")
                + "would report no value; set eval.eaf_every: 1"
            )
        if not method.steps_at_eval:
            return (
                f"method {cfg.method.name!r} answers without a chain at evaluation, so its trials log no val_eaf "
                "(the sum over steps is empty); optimise val_acc"
            )
        if cfg.eval.eaf_chain == "generated":
            return (
                "val_eaf on the model's own chain (eval.eaf_chain: generated) is not logged at an epoch where none "
                "of the measured chains has a step (an untrained model's often have none: an empty sum, not a "
                "measured 0), so a trial could report no value; set eval.eaf_chain: gold"
            )
        return None
    task = get_task(cfg.task.name, **cfg.task.params)
    rng = np.random.RandomState(0)
    examples = [task.sample(rng, n) for n in task.in_dist_sizes for _ in range(4)]
    if writes_whole_chain(method, examples):
        token, longest = departure_token(metric), longest_step(examples)
        if token is not None and token > longest:
            return (
                f"{cfg.task.name}'s steps have at most {longest} tokens here, so its trials report "
                f"val_departure_tok0 to val_departure_tok{longest} (the last: a chain that stops, goes on or "
                f"never ends), not {metric}"
            )
        return None
    return (
        f"{metric} scores the written chain against each example's whole chain, which method "
        f"{cfg.method.name!r} does not write at evaluation here, so its trials would never report it; "
        "optimise val_acc, or use a method that writes every step (sft_cot, nso, jacreg, alg1 or mtp at lam 1)"
    )


def _sequence_problem(trial: dict[str, Any]) -> tuple[str, str] | None:
    """`_sequence_length_problem` of what a sequence's length and the model's positions depend on (the task,
    the method, the model's family and position options): the points of a search that leave those alone
    (a learning rate, a LoRA rank) are judged once."""
    import json

    cfg = TrialConfig.model_validate(trial)
    m = cfg.model
    if m.pretrained is not None or not (m.family == "gpt2" and m.positions == "default" or m.positions == "random"):
        return None
    keep = ("family", "positions", "max_positions", "position_span", "numbers")
    key = json.dumps(
        [cfg.task.model_dump(), cfg.method.model_dump(), {k: getattr(m, k) for k in keep}, cfg.train.epochs],
        sort_keys=True,
        default=str,
    )
    return _sequence_length_problem(key)


@functools.lru_cache(maxsize=256)
def _sequence_length_problem(key: str) -> tuple[str, str] | None:
    """(field, what is wrong) when the embedded model cannot read the task's sequences, or None: family
    gpt2 with its learned positions (`positions: default`) has max_positions of them, and a longer
    sequence fails inside torch (an index error) in every trial; `positions: random` draws a training
    step's positions from the span, so no training sequence may be longer (evaluation inputs may: the
    stride fits them, stabray.models.positions). Judged on 4 examples per size (in distribution, and for
    gpt2 the longer splits too: a lower bound of the longest), each as the method's evaluation encodes
    it (BOS, prompt, chain, final answer, EOS) and, in distribution, as training reads it at the epochs
    that hold its longest views (`Method.view_epochs`: the first for most methods; each of Coconut's
    stages, which write the remaining steps beside their latents, where its evaluation writes none),
    with a word-level tokenizer built from them, as the trial's."""
    import json

    import numpy as np

    from stabray.data.encode import Encoder
    from stabray.data.tokenizer import build_tokenizer
    from stabray.methods import get_method
    from stabray.tasks import TASKS, get_task

    task_cfg, method_cfg, m, epochs = json.loads(key)
    cfg = TrialConfig.model_validate({"task": task_cfg, "method": method_cfg, "model": m})
    m = cfg.model
    learned = m.family == "gpt2" and m.positions == "default"
    if TASKS.get(cfg.task.name).runner != "text":
        return None
    task, method = get_task(cfg.task.name, **cfg.task.params), get_method(cfg.method.name, **cfg.method.params)
    sizes = [*task.in_dist_sizes, *(task.long_sizes().values() if learned else ())]
    rng = np.random.RandomState(0)
    examples = [(n, task.sample(rng, n)) for n in sizes for _ in range(4)]
    tok = build_tokenizer([t for _, e in examples for t in (e.question, e.question_nohint, e.answer)], m.numbers)
    method.bind_tokenizer(tok)
    enc = Encoder(tok)
    view_rng = np.random.default_rng(0)
    in_dist = set(task.in_dist_sizes)

    def lengths(n, e):
        yield len(enc.encode(method.eval_prompt(e), method.eval_steps(e), e.final).input_ids)
        if n in in_dist:  # and as training reads it at the epochs of its longest views (Method.view_epochs)
            for epoch in method.view_epochs(epochs):
                yield len(enc.encode(*method.train_view(e, epoch, view_rng), e.final).input_ids)

    longest, size = max((k, n) for n, e in examples for k in lengths(n, e))
    limit = m.max_positions if learned else (m.position_span or m.max_positions)
    if longest <= limit:
        return None
    if learned:
        return (
            "model.max_positions",
            f"{limit}, but a {cfg.task.name} sequence at size {size} has {longest} tokens (or more), past the "
            f"learned positions of family gpt2; raise model.max_positions to at least {longest}, or use family "
            "qwen2 (rotary positions)",
        )
    return (
        "model.position_span" if m.position_span else "model.max_positions",
        f"{limit} (the span randomized positions are drawn from), but a {cfg.task.name} training sequence at "
        f"size {size} has {longest} tokens (or more); raise model.position_span to at least {longest}",
    )


def _check_objective(
    spec: SweepSpec,
    base: dict[str, Any],
    points: dict[str, list[Any]],
    where: str,
    field: str,
    metric: str,
    epoch: int | None = None,
) -> None:
    """A SpecError unless every trial the search can make reports `metric` every epoch
    (`_objective_problem`): over the combinations of the checked points (`sample_points`), the field
    to blame is the objective itself when no combination reports it (the method, say No CoT), else
    the searched key whose value takes it away (Algorithm 1's lam below 1 for steps_val_acc)."""
    keys = list(points)
    combos = [dict(zip(keys, vs)) for vs in itertools.islice(itertools.product(*points.values()), MAX_COMBINATIONS)]

    def trial(combo: dict[str, Any]) -> dict[str, Any]:
        t = copy.deepcopy(base)
        for k, v in combo.items():
            set_path(t, space_path(k), v)
        return t

    problems = [(c, _objective_problem(trial(c), metric, epoch)) for c in combos]
    failing = next(((c, why) for c, why in problems if why is not None), None)
    if failing is None:
        return
    passing = next((c for c, why in problems if why is None), None)
    combo, why = failing
    if passing is None:
        raise SpecError(where, field, why)
    for k in keys:  # move the failing trial toward the passing one, one key at a time
        bad = combo[k]
        combo = {**combo, k: passing[k]}
        if _objective_problem(trial(combo), metric, epoch) is None:
            raise SpecError(
                where, f"search.space.{k}", f"{_describe(spec.search.space[k], bad)}: {why}", related=(field,)
            )
    raise SpecError(where, field, why)  # unreachable: the last step reaches the passing trial


def _describe(dist: Dist, value: Any) -> str:
    kind = dist.kind()
    if kind == "choice":
        return f"value {value!r}"
    return f"{kind} {list(getattr(dist, kind))} can produce {value!r}"


def validate_semantics(spec: SweepSpec, path: Path) -> None:
    """Names exist, every searched value builds a valid trial; errors name the field and the file."""
    from stabray.methods import METHODS
    from stabray.tasks import TASKS, get_task

    where = str(path)
    try:
        TASKS.canonical(spec.task.name)
    except UserError as e:
        raise SpecError(where, "task.name", str(e)) from None
    try:
        task = get_task(spec.task.name, **spec.task.params)
    except UserError as e:
        raise SpecError(where, "task.params", str(e)) from None
    except TypeError as e:
        raise SpecError(where, "task.params", str(e)) from None
    try:
        task.long_splits(spec.eval.long_splits)
    except UserError as e:
        raise SpecError(where, "eval.long_splits", str(e)) from None
    try:
        METHODS.canonical(spec.method.name)
    except UserError as e:
        raise SpecError(where, "method.name", str(e)) from None
    base = spec.trial_base()
    for key, dist in spec.search.space.items():
        try:
            dist.kind()
        except ValueError as e:
            raise SpecError(where, f"search.space.{key}", str(e)) from None
        p = space_path(key)
        head = p.split(".")[0]
        if head not in ("task", "model", "method", "train", "eval", "seed"):
            raise SpecError(
                where,
                f"search.space.{key}",
                f"not a trial field; use one of {', '.join(SHORT_NAMES)} or a path like train.lr",
            )
        if p == "method.name":
            raise SpecError(
                where,
                f"search.space.{key}",
                "the method is not a search-space field (each method has its own hyperparameters and space); "
                "list them under `methods:` instead, one Optuna study each (sweeps/dijkstra_methods.yaml)",
            )
        if p.startswith("model.lora.") and spec.model.lora is None:
            raise SpecError(where, f"search.space.{key}", "searches a LoRA field but model.lora is not set")
        other = next((k for k in spec.search.space if k != key and space_path(k) == p), None)
        if other is not None:
            raise SpecError(
                where,
                f"search.space.{key}",
                f"searches {p}, which search.space.{other} already searches; keep one of the two",
                related=(f"search.space.{other}",),
            )
    points = sample_points(spec)
    problem = _trial_problem(base)
    if problem is not None:  # a spec value that no trial uses (the search always replaces it) is fine
        filled = copy.deepcopy(base)
        for key, values in points.items():
            set_path(filled, space_path(key), values[0])
        if not points or _trial_problem(filled) is not None:
            raise SpecError(where, *problem)
        base = filled  # below, each key's points are checked with the others at their first point
    for key, values in points.items():
        p = space_path(key)
        dist = spec.search.space[key]
        for v in values:
            trial = copy.deepcopy(base)
            set_path(trial, p, v)
            problem = _trial_problem(trial)
            if problem is not None:
                raise SpecError(where, f"search.space.{key}", f"{_describe(dist, v)}: {': '.join(problem)}")
    long_fields = {"task", "model", "method"}  # what a sequence's length and the positions depend on
    if problem := _sequence_problem(base):  # at the spec's values: the field is to blame, not a search key
        raise SpecError(where, *problem)
    if any(space_path(k).split(".", 1)[0] in long_fields for k in points):  # each key's points, as above
        for key, values in points.items():
            if space_path(key).split(".", 1)[0] not in long_fields:
                continue
            for v in values:
                trial = copy.deepcopy(base)
                set_path(trial, space_path(key), v)
                if problem := _sequence_problem(trial):
                    field, text = problem
                    dist = spec.search.space[key]
                    raise SpecError(where, f"search.space.{key}", f"{_describe(dist, v)}: {field} {text}")
    if spec.search.searcher == "grid":
        ranged = [k for k, d in spec.search.space.items() if d.kind() != "choice"]
        if ranged:
            raise SpecError(where, f"search.space.{ranged[0]}", "a grid search takes only `choice` distributions")
    runner = TASKS.get(spec.task.name).runner  # the metrics its trials report
    per_epoch = searchable_metrics(runner)
    allowed = f"must be a per-epoch metric that {spec.task.name} trials report ({', '.join(per_epoch)})"
    s = spec.search
    if s.multi:
        for i, m in enumerate(s.metrics or []):
            if m not in per_epoch:
                raise SpecError(where, f"search.metrics.{i}", f"{allowed}, got {m!r}")
        if s.scheduler == "asha":
            raise SpecError(
                where,
                "search.scheduler",
                "asha stops trials on one metric, so a multi-objective sweep (search.metrics) cannot use it; "
                "set search.scheduler: fifo (search.eaf_stop can still stop trials whose EAF explodes)",
            )
    elif s.metric not in per_epoch:
        raise SpecError(where, "search.metric", f"{allowed}, got {s.metric!r}")
    for i, (metric, mode) in enumerate(s.objectives()):  # optimising a loss upward selects the worst trials
        better = METRICS[metric].better
        if better is not None and mode != better:
            mode_field, metric_field = (
                (f"search.modes.{i}", f"search.metrics.{i}") if s.multi else ("search.mode", "search.metric")
            )
            fix = f"search.mode: {better}"
            if s.multi:
                fix = f"search.modes: [{', '.join(better if k == i else m for k, m in enumerate(s.modes or []))}]"
            raise SpecError(
                where,
                mode_field,
                f"{mode}, but {metric} is better {'higher' if better == 'max' else 'lower'}, so the search would "
                f"favour the worst trials (and ASHA stop the best); set {fix}",
                related=(metric_field,),
            )
    objectives = list(s.metrics or []) if s.multi else [s.metric]
    for i, metric in enumerate(objectives):
        field = f"search.metrics.{i}" if s.multi else "search.metric"
        if runner == "text" and metric in PARTIAL_OBJECTIVES:
            _check_objective(spec, base, points, where, field, metric)
        if runner == "icl" and metric == "val_eaf":
            _check_icl_eaf(spec, points, where, field)
    if s.eaf_stop is not None and spec.eval.eaf_examples == 0:
        raise SpecError(where, "search.eaf_stop", "needs the per-epoch EAF, but eval.eaf_examples is 0")
    if s.eaf_stop is not None and s.eaf_stop.min_trials > s.n_trials:
        raise SpecError(
            where,
            "search.eaf_stop.min_trials",
            f"{s.eaf_stop.min_trials}, but the search runs {s.n_trials} trial(s), so no epoch would ever have "
            "that many EAFs to take a median of and the rule would never act; lower it or raise search.num_samples",
        )
    for i, rule in enumerate(s.stop_if):
        _check_stop_rule(spec, base, points, where, f"search.stop_if.{i}", rule, runner, per_epoch)


def _check_stop_rule(spec, base, points, where: str, field: str, rule, runner: str, per_epoch: list[str]) -> None:
    """A SpecError unless the rule can act: its metric is one the task's trials report every epoch (a
    departure share val_departure_tok<k> for a text task too), its epoch is one some trial reaches, and
    every trial the search can make reports the metric at that epoch (`_check_objective`)."""
    departure = runner == "text" and is_departure_metric(rule.metric)
    if rule.metric not in per_epoch and not departure:
        shares = ", or val_departure_tok<k> for a method that writes the whole chain" if runner == "text" else ""
        raise SpecError(
            where,
            f"{field}.metric",
            f"must be a per-epoch metric that {spec.task.name} trials report ({', '.join(per_epoch)}{shares}), "
            f"got {rule.metric!r}" + did_you_mean(rule.metric, per_epoch, before="; "),
        )
    epochs = [spec.train.epochs] + [v for k, vs in points.items() if space_path(k) == "train.epochs" for v in vs]
    if rule.epoch >= max(epochs):
        raise SpecError(
            where,
            f"{field}.epoch",
            f"{rule.epoch} is not before the last epoch a trial runs (train.epochs {max(epochs)}): a trial "
            "that reaches it has finished, so the rule would never act",
        )
    if runner == "text" and (rule.metric in PARTIAL_OBJECTIVES or departure):
        _check_objective(spec, base, points, where, f"{field}.metric", rule.metric, rule.epoch)
    if runner == "icl" and rule.metric == "val_eaf":
        _check_icl_eaf(spec, points, where, f"{field}.metric")


def _check_icl_eaf(spec, points: dict[str, list[Any]], where: str, field: str) -> None:
    """A SpecError when an in-context GD trial of the search runs chains of one step (T_max 1): its EAF
    is an empty sum, which it does not log, so it could not report `val_eaf`."""
    from stabray.tasks import get_task

    task = spec.task
    values = [get_task(task.name, **task.params).params.T_max]
    values += [v for k, vs in points.items() if space_path(k) == "task.params.T_max" for v in vs]
    if min(values) < 2:
        raise SpecError(
            where,
            field,
            "val_eaf sums over the intermediate steps, and a trial at task.params.T_max 1 has none (an empty "
            "sum, not logged), so it would report no value; train at T_max 2 or more, or optimise val_acc",
        )
