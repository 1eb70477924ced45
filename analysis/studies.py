"""Studies: what `reproduce <study> --profile laptop|paper` runs and writes for each of the paper's
tables, figures and ablations.

A study names, per profile, the sweep specs it needs, whether it selects one configuration per group
on validation and reruns it to n seeds, and the tables and figures it writes. `reproduce` then, for
each spec, reuses the sweep when the MLflow store holds a finished one of it (parent run FINISHED, no
trial still running, at least the spec's number of trials) or runs it with the function `stabray
sweep` runs; selects and reruns where the study says so; writes the outputs (tables as md, tex and
csv; figures as png) into a folder and logs the folder to a parent run of the study in the MLflow
experiment `reproduce` (run name `<study>-<profile>`).

Seeds. A grid spec with a `seed` axis (the laptop studies, the paper's grid studies) gets that axis
set to seeds 0..n-1 (`--seeds n`, default 3): every configuration of the grid runs n seeds, no rerun.
A searched spec (the paper's method searches) is selected on validation and its selected
configurations are rerun to n seeds (`analysis.rerun`: the selected trial's seed, then seed+1, ...).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from analysis.select import BEST, GROUP, Rule

PROFILES = ("laptop", "paper")
DEFAULT_SEEDS = 3
EXPERIMENT = "reproduce"  # the MLflow experiment of the studies' parent runs
RERUN = "rerun"  # the sweep name `analysis.rerun` logs its parent runs under
PAPER_TASKS = ("dijkstra", "bellman_ford", "mst_prim", "bfs", "dfs", "lego_cyclic", "lego_symmetry")


# ----------------------------------------------------------------------------------- outputs


@dataclass
class Context:
    """What an output builder reads: every trial of the study's sweeps (and reruns), their eq. (4)
    rows, the folder to write figures into, the selection rule and the selection groups."""

    trials: pl.DataFrame
    decomp: pl.DataFrame
    out: Path
    rule: Rule = BEST
    group: tuple[str, ...] = GROUP


def _table1(c: Context):
    from analysis.tables import method_tests, table1

    return [table1(c.trials, rule=c.rule), method_tests(c.trials, rule=c.rule)]


def _table1_length(c: Context):
    """At a task's explicit sizes (test_acc_n<k>) when logged, else at +10% and +20% input sizes."""
    from analysis.tables import table1_length, table1_sized

    sized = table1_sized(c.trials, rule=c.rule)
    return sized or [table1_length(c.trials, rule=c.rule), table1_length(c.trials, longer=True, rule=c.rule)]


def _table2(c: Context):
    from analysis.tables import table2

    return [table2(c.trials, c.decomp, by=_with_model(c.group), rule=c.rule)]


def _bits_study(c: Context):
    from analysis.tables import bits_study

    return [bits_study(c.trials)]


def _table3(c: Context):
    from analysis.tables import table3

    return [table3(c.trials, c.decomp, rule=c.rule)]


def _table4(c: Context):
    from analysis.tables import table4

    return [table4(c.trials, c.decomp, rule=c.rule, by=c.group)]


def _table5(c: Context):
    from analysis.tables import table5

    return [table5(c.trials, rule=c.rule)]


def _figure1(c: Context):
    from analysis.figures import figure1

    return [figure1(c.trials, c.decomp, c.out / "figure1.png", c.rule)]


def _figure2(c: Context):
    from analysis.figures import gap_and_bound

    return [gap_and_bound(c.trials, c.decomp, c.out / "figure2_gap_bound_vs_T.png", c.rule)]


def _figure4(c: Context):
    from analysis.figures import eaf_against

    return [
        eaf_against(c.trials, "lam", c.out / "figure4_eaf_vs_lambda.png", "compression factor λ"),
        eaf_against(c.trials, "bits", c.out / "figure4_eaf_vs_bits.png", "QAT bit-width"),
    ]


def _figure5(c: Context):
    from analysis.figures import figure5

    return [figure5(c.trials, c.decomp, c.out / "figure5_gap_eaf_vs_T.png", c.rule)]


def _study_metrics(*extra: tuple[str, str, bool]):
    from analysis.tables import STUDY_METRICS

    return [*STUDY_METRICS, *extra]


def _ablation_compression(c: Context):
    from analysis.tables import study_table

    return [
        study_table(
            c.trials,
            ("task", "method", "lam", "bits", "strategy"),
            _study_metrics(),
            "ablation_compression",
            "Compression strategies of Algorithm 1 (random, drop_first, drop_last, equal): test accuracy and eq. (4) "
            "terms at T = stability_T, mean ± std over seeds",
            {"strategy": "Strategy"},
        )
    ]


def _ablation_noise(c: Context):
    from analysis.tables import study_table

    return [
        study_table(
            c.trials,
            ("task", "method", "lam", "bits", "noise"),
            _study_metrics(),
            "ablation_noise",
            "Quantization (QAT) against Gaussian weight noise of matched per-row scale at the same bit-width: test "
            "accuracy and eq. (4) terms at T = stability_T, mean ± std over seeds",
            {"noise": "Noise"},
        )
    ]


def _appendix_b2(c: Context):
    from analysis.tables import study_table

    return [
        study_table(
            c.trials,
            ("task", "method", "lam", "train_size"),
            [
                ("Test acc. (%)", "test_acc", True),
                ("Weight-noise loss increase", "weight_noise_loss_increase", False),
                ("Loss gap", "test_loss_gap_at_T", False),
                ("Σρ", "test_eaf_at_T", False),
            ],
            "appendix_b2_noise_stability",
            "Noise stability (inference-loss increase under N(0, 0.005²) weight noise, mean over noise seeds) and "
            "accuracy against training-set size and the steps trained on (SFT-CoT: all; Algorithm 1 at λ < 1, 32 "
            "bits: a random share; No CoT: none), mean ± std over seeds",
            {"train_size": "Train size"},
        )
    ]


@dataclass(frozen=True)
class Output:
    files: tuple[str, ...]  # what it writes, for the plan (tables: stem of the md/tex/csv files)
    build: Callable[[Context], list]  # -> Tables and figure paths


OUTPUTS: dict[str, Output] = {
    "table1": Output(("table1_accuracy", "method_tests"), _table1),
    "table1_length": Output(("table1_n<k> per long size, or table1_length and table1_length_20",), _table1_length),
    "table2": Output(("table2_decomposition_by_T",), _table2),
    "table3": Output(("table3_bits",), _table3),
    "bits_study": Output(("table3_study",), _bits_study),
    "table4": Output(("table4_decomposition",), _table4),
    "table5": Output(("table5_hparams",), _table5),
    "figure1": Output(("figure1.png",), _figure1),
    "figure2": Output(("figure2_gap_bound_vs_T.png",), _figure2),
    "figure4": Output(("figure4_eaf_vs_lambda.png", "figure4_eaf_vs_bits.png"), _figure4),
    "figure5": Output(("figure5_gap_eaf_vs_T.png",), _figure5),
    "ablation_compression": Output(("ablation_compression",), _ablation_compression),
    "ablation_noise": Output(("ablation_noise",), _ablation_noise),
    "appendix_b2": Output(("appendix_b2_noise_stability",), _appendix_b2),
}


def _with_model(group: Sequence[str]) -> tuple[str, ...]:
    return tuple(group) + (() if "model" in group else ("model",))


# ----------------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class Plan:
    """One profile of a study."""

    specs: tuple[str, ...]  # shipped spec names (sweeps/<name>.yaml) or paths
    outputs: tuple[str, ...]  # keys of OUTPUTS
    rerun: bool = False  # select one configuration per group on validation, rerun it to n seeds
    group: tuple[str, ...] = GROUP  # the selection groups (trial columns)
    note: str = ""  # what the profile does not cover, or how it differs from the paper


@dataclass(frozen=True)
class Study:
    name: str
    what: str  # the part of the paper it reproduces
    laptop: Plan
    paper: Plan
    profiles: dict[str, Plan] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "profiles", {"laptop": self.laptop, "paper": self.paper})

    def plan(self, profile: str) -> Plan:
        return self.profiles[profile]


_PAPER_METHODS = tuple(f"studies/paper/{t}_methods" for t in PAPER_TASKS)
_BF_MODELS = ("studies/paper/bellman_ford_llama_methods", "studies/paper/bellman_ford_gemma_methods")
_LAPTOP_METHODS = ("dijkstra_methods",)

STUDIES: dict[str, Study] = {
    s.name: s
    for s in (
        Study(
            "table1",
            "Table 1: test accuracy per method and task, in distribution and on longer inputs",
            Plan(_LAPTOP_METHODS, ("table1", "table1_length"), note="Dijkstra only; lengths 5 and 6 nodes"),
            Plan(_PAPER_METHODS, ("table1", "table1_length"), rerun=True),
        ),
        Study(
            "table2",
            "Table 2: the eq. (4) decomposition at every T across model sizes (SFT-CoT)",
            Plan(
                ("studies/table2_dijkstra",),
                ("table2",),
                group=("task", "method", "model"),
                note="Dijkstra, two sizes of the embedded decoder (presets mini and small) instead of three "
                "pretrained models on Bellman-Ford",
            ),
            Plan(
                ("studies/paper/bellman_ford_methods", *_BF_MODELS),
                ("table2",),
                rerun=True,
                group=("task", "method", "model"),
            ),
        ),
        Study(
            "table3",
            "Table 3: the eq. (4) terms per QAT bit-width",
            Plan(("table3_dijkstra",), ("bits_study",), note="Dijkstra, every λ x bits configuration (no selection)"),
            Plan(
                ("paper/bellman_ford", "paper/dijkstra", "paper/mst_prim"),
                ("table3",),
                rerun=True,
                group=("task", "method", "bits"),
            ),
        ),
        Study(
            "table4",
            "Table 4: the eq. (4) decomposition per method",
            Plan(_LAPTOP_METHODS, ("table4",), note="Dijkstra, the embedded decoder, every method"),
            Plan(_BF_MODELS, ("table4",), rerun=True, group=("task", "method", "model")),
        ),
        Study(
            "table5",
            "Table 5: the selected hyperparameters",
            Plan(("dijkstra",), ("table5",), note="Algorithm 1 on Dijkstra, selected from the default search"),
            Plan(_PAPER_METHODS, ("table5",)),
        ),
        Study(
            "figure1",
            "Figure 1: bound and loss gap against T, accuracy and EAF per method",
            Plan(_LAPTOP_METHODS, ("figure1",), note="Dijkstra instead of Bellman-Ford"),
            Plan(("studies/paper/bellman_ford_methods",), ("figure1",), rerun=True),
        ),
        Study(
            "figure2",
            "Figure 2: loss gap and bound against T",
            Plan(_LAPTOP_METHODS, ("figure2",), note="Dijkstra only, every method"),
            Plan(
                ("studies/paper/bfs_methods", "studies/paper/dijkstra_methods", "studies/paper/mst_prim_methods"),
                ("figure2",),
                rerun=True,
            ),
        ),
        Study(
            "figure4",
            "Figure 4: EAF and loss gap against λ and against the bit-width",
            Plan(("table3_dijkstra",), ("figure4",), note="Dijkstra, λ in {0.1, 1} (the same steps below 2/3 here)"),
            Plan(("studies/paper/figure4_dijkstra", "studies/paper/figure4_mst_prim"), ("figure4",)),
        ),
        Study(
            "figure5",
            "Figure 5: loss gap and EAF against T per base model",
            Plan(
                ("studies/table2_dijkstra",),
                ("figure5",),
                group=("task", "method", "model"),
                note="Dijkstra, two sizes of the embedded decoder",
            ),
            Plan(
                (*_BF_MODELS, "studies/paper/mst_prim_llama_sft", "studies/paper/mst_prim_gemma_sft"),
                ("figure5",),
                rerun=True,
                group=("task", "method", "model"),
                note="Bellman-Ford and Prim, Llama-3.2-1B and Gemma-2-2B",
            ),
        ),
        Study(
            "ablation-compression",
            "Section 5.2: compression strategies (random, drop first, drop last, equally spaced)",
            Plan(("studies/ablation_compression",), ("ablation_compression",)),
            Plan(("studies/paper/ablation_compression",), ("ablation_compression",)),
        ),
        Study(
            "ablation-noise",
            "Section 5.2: quantization against Gaussian weight noise of matched scale",
            Plan(("studies/ablation_noise",), ("ablation_noise",)),
            Plan(("studies/paper/ablation_noise",), ("ablation_noise",)),
        ),
        Study(
            "appendix-b2",
            "Appendix B.2: noise stability against training-set size and the steps trained on",
            Plan(("studies/appendix_b2",), ("appendix_b2",), note="Dijkstra; 500 and 2000 examples"),
            Plan(("studies/paper/appendix_b2",), ("appendix_b2",), note="Dijkstra only"),
        ),
    )
}


def get_study(name: str, profile: str, seeds: int) -> tuple[Study, Plan]:
    """The study and its profile's plan; a UserError naming the problem for bad input."""
    from stabray.errors import UserError

    if name not in STUDIES:
        import difflib

        close = difflib.get_close_matches(name, list(STUDIES), n=2)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        raise UserError(f"unknown study {name!r}{hint}; studies: {', '.join(STUDIES)}")
    if profile not in PROFILES:
        raise UserError(f"--profile {profile}: unknown profile; use one of {', '.join(PROFILES)}")
    if not isinstance(seeds, int) or seeds < 1:
        raise UserError(f"--seeds {seeds}: must be at least 1")
    study = STUDIES[name]
    return study, study.plan(profile)


# ----------------------------------------------------------------------------------- planning


@dataclass
class SpecPlan:
    """One spec of a study, resolved: what running it costs and whether the store holds it."""

    name: str  # as the study names it
    path: Path
    spec: Any  # the validated SweepSpec (with the seed override)
    sets: list[str]  # the `sweep --set` items that apply the seed override
    experiment: str
    tracking_uri: str
    methods: list[tuple[str, int]]  # (method, trials) per method
    trials: int
    epochs: int
    grid_seeds: bool  # a grid with a seed axis: --seeds sets it
    reuse: dict | None = None  # the finished sweep found in the store (Store.sweeps() entry)
    store_note: str = ""

    @property
    def trial_epochs(self) -> int:
        return self.trials * self.epochs

    @property
    def asha(self) -> bool:
        return self.spec.search.scheduler == "asha"


def _seed_key(spec) -> str | None:
    """The search-space key of the grid's seed axis, or None."""
    return next((k for k in spec.search.space if k == "seed"), None)


def resolve_spec(name: str, seeds: int, tracking_uri: str | None) -> SpecPlan:
    """Load and validate a spec (every error before any work), with its grid seed axis set to
    0..seeds-1, and count its trials."""
    import yaml

    from stabray.spec import load_spec, method_specs
    from stabray.tracking import resolve_tracking_uri

    spec, path = load_spec(name)
    grid_seeds = spec.search.searcher == "grid" and _seed_key(spec) is not None
    sets = []
    if grid_seeds:
        value = {"choice": list(range(seeds))}
        sets = [f"search.space.seed={yaml.safe_dump(value, default_flow_style=True).strip()}"]
        spec, path = load_spec(name, {"search.space.seed": value}, {"search.space.seed": f"--seeds {seeds}"})
    subs = method_specs(spec, path)
    methods = [(sub.method.name, sub.search.n_trials) for _, sub in subs]
    return SpecPlan(
        name=name,
        path=path,
        spec=spec,
        sets=sets,
        experiment=spec.mlflow.experiment or spec.name,
        tracking_uri=resolve_tracking_uri(tracking_uri, spec.mlflow.tracking_uri),
        methods=methods,
        trials=sum(n for _, n in methods),
        epochs=spec.train.epochs,
        grid_seeds=grid_seeds,
    )


def check_places(specs: list[SpecPlan], storage: str | None) -> None:
    """The tracking stores and the storage the study would use, checked as a sweep checks them before
    Ray starts (a URI MLflow cannot open, a damaged database, a server that does not answer, a storage
    path under a file, a missing bucket): in the plan, a dry run included, not after the first sweep."""
    from stabray.tracking import check_store
    from stabray.tune.storage import open_storage

    for uri in dict.fromkeys(sp.tracking_uri for sp in specs):
        check_store(uri, create=True)
    for location in dict.fromkeys([storage] if storage else [sp.spec.storage for sp in specs]):
        open_storage(location, "--storage" if storage else "storage")


def finished_sweep(uri: str, experiment: str, sweep: str, min_trials: int) -> tuple[dict | None, str]:
    """The newest finished sweep of `sweep` in the store (parent FINISHED, no trial running, at least
    `min_trials` trials), or None, and a note saying what the store holds. Creates nothing."""
    from stabray.errors import UserError
    from stabray.tracking import Store
    from stabray.tracking.store import sqlite_path

    db = sqlite_path(uri)
    if db is not None and not db.exists():
        return None, "no store yet"
    try:
        store = Store.existing(uri, experiment)
    except UserError:
        return None, f"no experiment {experiment!r} in the store"
    mine = [s for s in store.sweeps() if s["sweep"] == sweep]
    done = [s for s in mine if s["status"] == "FINISHED" and s["running"] == 0 and s["trials"] >= min_trials]
    if done:
        s = done[-1]
        return s, f"finished sweep {s['run_id']} ({s['trials']} trials)"
    if mine:
        last = mine[-1]
        return None, f"no finished sweep (latest {last['run_id']}: {last['status']}, {last['trials']} trials)"
    return None, f"no sweep {sweep!r} in experiment {experiment!r}"


def rerun_parents(uri: str, experiment: str, sweep: dict) -> set[str]:
    """The runs whose trials belong to a reused or new sweep: its parent, its method groups and the
    experiment's reruns."""
    from stabray.tracking import Store

    runs = Store.existing(uri, experiment).sweeps()
    return {sweep["run_id"], *sweep["groups"], *(s["run_id"] for s in runs if s["sweep"] == RERUN)}


def estimated_groups(sp: SpecPlan, group: Sequence[str]) -> int:
    """How many configurations selection keeps: per method, the product over the group's columns
    (other than task and method) of the values the spec's space gives that column (1 when fixed)."""
    from stabray.spec import method_specs, space_path

    model_paths = ("model.pretrained", "model.preset")  # the `model` param is one of these
    total = 0
    for _, sub in method_specs(sp.spec, sp.path):
        n = 1
        for col in group:
            if col in ("task", "method"):
                continue
            for key, dist in sub.search.space.items():
                path = space_path(key)
                if path.rsplit(".", 1)[-1] == col or (col == "model" and path in model_paths):
                    n *= len(dist.choice) if dist.choice else 1
        total += n
    return total


def _shown(path: Path) -> str:
    """A shipped spec relative to the repository (sweeps/...), any other as given."""
    from stabray.spec import SWEEPS_DIR

    try:
        return str(path.resolve().relative_to(SWEEPS_DIR.parent))
    except ValueError:
        return str(path)


def format_plan(study: Study, profile: str, plan: Plan, specs: list[SpecPlan], seeds: int, out: Path) -> str:
    lines = [f"reproduce {study.name} --profile {profile}: {study.what}"]
    if plan.note:
        lines.append(f"  note: {plan.note}")
    lines.append(f"  seeds: {seeds}   out: {out}")
    total_trials = total_epochs = 0
    upper = False
    for sp in specs:
        s = sp.spec.search
        lines.append(f"  spec {sp.name} ({_shown(sp.path)}): experiment {sp.experiment!r} in {sp.tracking_uri}")
        if len(sp.methods) > 1:
            per = ", ".join(f"{m} {n}" for m, n in sp.methods)
            lines.append(f"    {len(sp.methods)} methods, trials per method: {per}")
        if s.searcher != "grid":
            how = f"{s.searcher}, num_samples {s.num_samples}" + (" per method" if len(sp.methods) > 1 else "")
        elif len(sp.methods) > 1:
            how = f"a grid per method x num_samples {s.num_samples}"
        else:
            how = f"grid of {sp.trials // s.num_samples} x num_samples {s.num_samples}"
        te = (
            f"at most {sp.trial_epochs} trial-epochs (upper bound: ASHA stops weak trials early)"
            if sp.asha
            else f"{sp.trial_epochs} trial-epochs"
        )
        upper |= sp.asha
        lines.append(
            f"    {sp.trials} trials ({how}), {sp.epochs} epochs, {s.scheduler.upper()}: {te}; "
            f"{s.max_concurrent} at a time, {sp.spec.resources.cpu:g} CPU / {sp.spec.resources.gpu:g} GPU each"
        )
        if sp.grid_seeds:
            lines.append(f"    seeds: the grid's seed axis is set to 0..{seeds - 1}")
        state = f"reused: {sp.store_note}" if sp.reuse else f"would run ({sp.store_note})"
        lines.append(f"    store: {state}")
        if sp.reuse is None:
            total_trials += sp.trials
            total_epochs += sp.trial_epochs
    if plan.rerun:
        lines.append(
            f"  reruns: one configuration per ({', '.join(plan.group)}) selected on validation, rerun to {seeds} seeds"
        )
        for sp in specs:
            if sp.reuse is not None:  # the sweep is there: the exact plan
                from analysis.rerun import planned_reruns

                parents = rerun_parents(sp.tracking_uri, sp.experiment, sp.reuse)
                todo = planned_reruns(sp.experiment, sp.tracking_uri, seeds, by=plan.group, parents=parents)
                epochs = sum(int(c.get("train", {}).get("epochs") or sp.epochs) for c in todo)
                lines.append(f"    {sp.name}: {len(todo)} reruns, {epochs} trial-epochs (from the stored sweep)")
                total_trials += len(todo)
                total_epochs += epochs
                continue
            groups = estimated_groups(sp, plan.group)
            n = groups * max(0, seeds - 1)
            lines.append(
                f"    {sp.name}: about {groups} configuration{'s' if groups != 1 else ''} -> at most {n} reruns x "
                f"{sp.epochs} epochs = "
                f"{n * sp.epochs} trial-epochs (estimated: the selected trial's own seed counts, seeds already run "
                "are skipped)"
            )
            total_trials += n
            total_epochs += n * sp.epochs
            upper = True
    else:
        why = "grid over seeds" if all(sp.grid_seeds for sp in specs) else "the study reads the sweeps' own trials"
        lines.append(f"  reruns: none ({why})")
    files = [f for key in plan.outputs for f in OUTPUTS[key].files]
    lines.append(f"  outputs: {', '.join(files)} (tables as .md, .tex, .csv), README.md, trials.csv")
    lines.append(
        f"  logged to: MLflow experiment {EXPERIMENT!r}, run {study.name}-{profile} (params: specs, seeds; tag "
        "stabray.reused)"
    )
    bound = " (upper bound)" if upper else ""
    lines.append(f"  to run: {total_trials} trials, {total_epochs} trial-epochs{bound}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------- running


def run_sweep_spec(sp: SpecPlan, storage: str | None, address: str | None) -> int:
    """Run a spec with the function `python -m stabray sweep` runs (its closing table and the parent
    run's summary included). Returns its exit code."""
    from stabray.commands.sweep import run

    args = argparse.Namespace(
        spec=str(sp.path),
        method=None,
        num_samples=None,
        tracking_uri=sp.tracking_uri,
        storage=storage,
        address=address,
        resume=False,
        set=list(sp.sets),
        dry_run=False,
        verbose=False,
    )
    return run(args)


def load_study_trials(specs: list[SpecPlan], parents: dict[str, set[str]]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Every trial (and eq. (4) row) of the study's sweeps and their reruns, as one frame each."""
    from analysis.load import load_mlflow

    trials, decomp = [], []
    for sp in specs:
        loaded = load_mlflow(sp.experiment, sp.tracking_uri, parents=parents[sp.name])
        trials.append(loaded.trials)
        decomp.append(loaded.decomposition)
    nonempty = [t for t in trials if t.height] or trials[:1]
    return (
        pl.concat(nonempty, how="diagonal_relaxed"),
        pl.concat([d for d in decomp if d.height] or decomp[:1], how="diagonal_relaxed"),
    )


def reproduce(
    study: str | Study,
    profile: str = "laptop",
    *,
    seeds: int = DEFAULT_SEEDS,
    tracking_uri: str | None = None,
    storage: str | None = None,
    out: str | Path | None = None,
    address: str | None = None,
    dry_run: bool = False,
    rule: Rule = BEST,
) -> Path | None:
    """Plan, then (unless `dry_run`) run the study: reuse or run each spec, select and rerun where the
    study says so, write its outputs into `out` (default ./reports/reproduce-<study>-<profile>) and log
    them to the study's parent run. Returns the folder (None for a dry run)."""
    from stabray.errors import UserError, unwritable

    t0 = time.perf_counter()
    if isinstance(study, Study):
        if profile not in PROFILES:
            raise UserError(f"--profile {profile}: unknown profile; use one of {', '.join(PROFILES)}")
        if not isinstance(seeds, int) or seeds < 1:
            raise UserError(f"--seeds {seeds}: must be at least 1")
        st, plan = study, study.plan(profile)
    else:
        st, plan = get_study(study, profile, seeds)
    out = Path(out or Path("reports") / f"reproduce-{st.name}-{profile}")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: a file, not a directory")
    if why := unwritable(out):
        raise UserError(f"--out {out}: {why}")
    specs = [resolve_spec(name, seeds, tracking_uri) for name in plan.specs]  # every spec error first
    check_places(specs, storage)
    for sp in specs:
        sp.reuse, sp.store_note = finished_sweep(sp.tracking_uri, sp.experiment, sp.spec.name, sp.trials)
    print(format_plan(st, profile, plan, specs, seeds, out), flush=True)
    if dry_run:
        return None

    reused, ran, parents = [], [], {}
    for sp in specs:
        if sp.reuse is None:
            print(f"reproduce: running {sp.name} ({sp.trials} trials)", flush=True)
            rc = run_sweep_spec(sp, storage, address)
            if rc != 0:  # the sweep printed how to continue it (--resume); reproduce then reuses it
                raise UserError(
                    f"the sweep {sp.name} did not finish (exit code {rc}); continue it with the --resume command "
                    "above, then run reproduce again"
                )
            sp.reuse, sp.store_note = finished_sweep(sp.tracking_uri, sp.experiment, sp.spec.name, sp.trials)
            if sp.reuse is None:
                raise UserError(
                    f"the sweep {sp.name} ran, but the store holds no finished sweep of it: {sp.store_note}"
                )
            ran.append(sp.name)
        else:
            print(f"reproduce: reusing {sp.name}: {sp.store_note}", flush=True)
            reused.append(sp.name)
        parents[sp.name] = rerun_parents(sp.tracking_uri, sp.experiment, sp.reuse)
    if plan.rerun:
        from analysis.rerun import rerun

        for sp in specs:
            rerun(
                sp.experiment,
                sp.tracking_uri,
                seeds,
                storage,
                by=plan.group,
                address=address,
                parents=parents[sp.name],
            )
            parents[sp.name] = rerun_parents(sp.tracking_uri, sp.experiment, sp.reuse)  # the new reruns too

    trials, decomp = load_study_trials(specs, parents)
    out.mkdir(parents=True, exist_ok=True)
    ctx = Context(trials, decomp, out, rule, plan.group)
    tables, figures = [], []
    for key in plan.outputs:
        for item in OUTPUTS[key].build(ctx):
            (figures if isinstance(item, Path) else tables).append(item)
    for t in tables:
        t.write(out)
    trials.write_csv(out / "trials.csv", null_value="")
    (out / "README.md").write_text(_readme(st, profile, plan, specs, seeds, reused, ran, tables, figures, out))
    for t in tables:
        print(t.to_markdown())
    parent = _log_study(st, profile, plan, specs, seeds, reused, ran, out)
    print(
        f"reproduce {st.name} --profile {profile}: {len(tables)} tables and {len(figures)} figures in {out}; "
        f"reused {len(reused)} sweep(s), ran {len(ran)}; MLflow run {parent} (experiment {EXPERIMENT!r}); "
        f"wall time {time.perf_counter() - t0:.1f} s",
        flush=True,
    )
    return out


def _readme(st, profile, plan, specs, seeds, reused, ran, tables, figures, out: Path) -> str:
    lines = [
        f"# reproduce {st.name} --profile {profile}",
        "",
        f"{st.what}." + (f" {plan.note}." if plan.note else ""),
        "",
        f"Seeds: {seeds}. Sweeps: "
        + "; ".join(
            f"`{sp.name}` (experiment `{sp.experiment}`, {'reused' if sp.name in reused else 'run'})" for sp in specs
        )
        + ".",
        "",
        "Selection: the tables that select take one configuration per ("
        + ", ".join(plan.group)
        + ") on validation"
        + (f", rerun to {seeds} seeds." if plan.rerun else "; no reruns: the sweeps' own seeds.")
        + " Grid-study tables (one row per configuration) average every configuration's finished seeds.",
        "",
        "## Files",
        "",
    ]
    lines += [f"- `{t.name}.md|tex|csv`: {t.caption}" + (f" ({t.note})" if t.note else "") for t in tables]
    lines += [f"- `{p.relative_to(out) if p.is_relative_to(out) else p}`" for p in figures]
    lines += ["- `trials.csv`: every trial the tables read, one row each"]
    return "\n".join(lines) + "\n"


def _log_study(st, profile, plan, specs, seeds, reused, ran, out: Path) -> str:
    """The study's parent run in the experiment `reproduce` (in the first spec's store), with the folder."""
    from stabray.tracking import Store

    store = Store(specs[0].tracking_uri, EXPERIMENT)
    run_id = store.start_run(
        f"{st.name}-{profile}",
        tags={
            "stabray.role": "study",
            "stabray.study": st.name,
            "stabray.profile": profile,
            "stabray.reused": ",".join(reused),
            "stabray.ran": ",".join(ran),
            "mlflow.note.content": f"reproduce {st.name} --profile {profile}: {st.what}",
        },
        params={
            "study": st.name,
            "profile": profile,
            "specs": ",".join(sp.name for sp in specs),
            "experiments": ",".join(sp.experiment for sp in specs),
            "seeds": seeds,
            "rerun": plan.rerun,
            "group": ",".join(plan.group),
        },
    )
    store.log_artifacts(run_id, out)
    store.end(run_id, "FINISHED")
    return run_id
