"""One command: every table and figure into a folder, logged to the sweep's parent run."""

from __future__ import annotations

from pathlib import Path

from analysis.figures import all_figures
from analysis.load import load
from analysis.pareto import objectives_of, pareto_figure, pareto_table
from analysis.select import BEST, Rule, repeated_seeds
from analysis.tables import all_tables, table1


def build_report(
    experiment: str,
    tracking_uri: str | None = None,
    ray_dir: str | Path | None = None,
    out: str | Path | None = None,
    log_to_mlflow: bool = True,
    force: bool = False,
    rule: Rule = BEST,
    objectives: str | None = None,
) -> Path:
    """Write tables (md, tex, csv), figures (png) and an index README.md into `out`
    (default ./reports/<experiment>); from MLflow, also log the folder to the parent run. A folder
    that already holds files is replaced only with `force`; nothing is created when loading fails.
    `rule` selects each (task, method)'s configuration for the paper's tables; the Pareto front is
    over `objectives` ("val_acc:max,val_eaf:min"; default: the sweep's own when it searched several,
    else val_acc against val_eaf)."""
    from stabray.errors import UserError, unwritable

    out = Path(out or Path("reports") / experiment)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: a file, not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise UserError(f"--out {out}: the folder holds files already; pass --force to overwrite them")
    if why := unwritable(out):
        raise UserError(f"--out {out}: {why}")
    from stabray.progress import stage

    front_of = flag_objectives(objectives) if objectives else None  # a bad flag fails before anything is read
    loaded = load(experiment, tracking_uri, ray_dir)  # reading MLflow reports its own progress
    trials, decomp = loaded.trials, loaded.decomposition
    if trials.is_empty():  # tables of nothing would read as a result
        where = f"--ray-dir {ray_dir}" if ray_dir else f"experiment {experiment!r}"
        raise UserError(f"{where}: no trials to report (the sweep ran none, or is still starting)")
    if front_of is not None:
        numeric = sorted(c for c, t in trials.schema.items() if t.is_numeric() and c not in ("seed",))
        unknown = [m for m, _ in front_of if m not in numeric]
        if unknown:
            raise UserError(
                f"--objectives {objectives}: no trial logged {', '.join(unknown)} as a number; the trials have: "
                + ", ".join(numeric)
            )
    front_of = front_of or objectives_of(loaded.objectives)
    out.mkdir(parents=True, exist_ok=True)
    with stage(f"tables and figures of {trials.height} trials into {out}"):
        tables = all_tables(trials, decomp, rule)
        tables.append(pareto_table(trials, front_of))
        figures = all_figures(trials, decomp, out, rule)
        figures.append(pareto_figure(trials, out / "pareto_front.png", front_of))
        figures += icl_figures(experiment, trials, tracking_uri, ray_dir, out)
    for t in tables:
        t.write(out)
    source = f"Ray Tune dir `{ray_dir}`" if ray_dir else f"MLflow `{tracking_uri or 'default'}`"
    lines = [
        f"# Report: {experiment}",
        "",
        f"Source: {source}; {status_line(trials)}; "
        f"{decomp['trial_id'].n_unique() if decomp.height else 0} with a stability decomposition. Only "
        "finished trials (every epoch run) feed the tables' final-metric cells.",
        *_repeats_line(trials),
        "",
        f"Selection rule (`--select {rule.name}`): per task and method, the tables use the configuration with "
        f"{rule.describe()}.",
        "",
        table1(trials, rule=rule).to_markdown(),
        "",
        tables[-1].to_markdown(),
        "",
        *stopped_section(trials),
        "## Files",
        "",
    ]
    lines += [f"- `{t.name}.md|tex|csv`: {t.caption}" + (f" ({t.note})" if t.note else "") for t in tables]
    lines += [f"- `{p.relative_to(out)}`" for p in figures]
    (out / "README.md").write_text("\n".join(lines) + "\n")
    trials.write_csv(out / "trials.csv", null_value="")
    if log_to_mlflow and ray_dir is None:
        if loaded.parent_run_id is None:
            print(f"warning: experiment {experiment!r} has no parent run (tag stabray.role=sweep); report not logged")
        else:
            from stabray.tracking import Store

            Store.existing(tracking_uri, experiment).log_artifacts(loaded.parent_run_id, out, "report")
    print(f"report: wrote {len(tables)} tables and {len(figures)} figures to {out}")
    return out


def flag_objectives(text: str) -> list:
    """The `--objectives` flag, strictly: two or more METRIC:max|min (a sweep's own single recorded
    objective falls back to the default front; a flag the user typed does not)."""
    from stabray.errors import UserError
    from stabray.pareto import parse_objectives

    try:
        return parse_objectives(text)
    except ValueError as e:
        raise UserError(f"--objectives {text}: {e}") from None


STATUS_WORDS = {  # status -> how the report counts it
    "FINISHED": "finished",
    "STOPPED": "stopped early",
    "FAILED": "failed",
    "KILLED": "killed",
    "RUNNING": "running",
}


def status_line(trials) -> str:
    """'8 trials: 1 finished, 7 stopped early by the scheduler' (statuses in a fixed order)."""
    if not trials.height:
        return "0 trials"
    counts = trials.group_by("status").len()
    n = {r["status"]: r["len"] for r in counts.iter_rows(named=True)}
    parts = [f"{n[s]} {w}" for s, w in STATUS_WORDS.items() if n.get(s)]
    parts += [f"{c} {s or 'without a status'}" for s, c in n.items() if s not in STATUS_WORDS]
    return f"{trials.height} trials: " + ", ".join(parts)


def stopped_section(trials) -> list[str]:
    """A Markdown list of the trials stopped early, with the epochs each ran, what stopped it (where
    the source says) and its best validation accuracy (none: an empty list)."""
    import polars as pl

    from stabray.record import STOPPER_WORDS

    if not trials.height:
        return []
    stopped = trials.filter(pl.col("status") == "STOPPED").sort("n_epochs", "name", nulls_last=True)
    if stopped.is_empty():
        return []
    out = [
        "## Trials stopped early",
        "",
        "Stopped early (by ASHA, the EAF rule or a search.stop_if rule) after the epochs shown; "
        "their final metrics (test accuracy, EAF, loss gap) were never computed and no table uses them.",
        "",
    ]
    for r in stopped.iter_rows(named=True):
        acc = "" if r.get("best_val_acc") is None else f", best val_acc {r['best_val_acc']:.3f}"
        who = f" by {STOPPER_WORDS.get(r['stopped_by'], r['stopped_by'])}" if r.get("stopped_by") else ""
        out.append(f"- `{r['name']}`: stopped{who} after epoch {r['n_epochs']}{acc}")
    return [*out, ""]


def icl_figures(experiment: str, trials, tracking_uri=None, ray_dir=None, out: Path = Path(".")) -> list[Path]:
    """Figures 3 and 6 of each in-context GD task's best trial, into <out>/<task>/ (none for other tasks)."""
    from analysis.icl_figures import run
    from stabray.errors import UserError

    tasks = (
        sorted(t for t in trials["task"].drop_nulls().unique().to_list() if t.startswith("icl_"))
        if trials.height
        else []
    )
    paths: list[Path] = []
    for task in tasks:
        try:
            # the report's own --out check (--force for a folder that holds files) covers these files
            paths += run(None, experiment, tracking_uri, ray_dir, task, out / task, force=True)
        except UserError as e:  # e.g. no finished trial yet: the rest of the report still gets written
            print(f"warning: no ICL figures for {task}: {e}")
    return paths


def _repeats_line(trials) -> list[str]:
    """A sentence when some finished trials repeat another's configuration and seed."""
    n = repeated_seeds(trials) if trials.height else 0
    if not n:
        return []
    one = n == 1
    return [
        f"{n} finished trial{'' if one else 's'} repeat{'s' if one else ''} another's configuration and seed and "
        f"{'is' if one else 'are'} not counted again: a mean ± std is over distinct seeds, one trial standing for "
        "each (the selected one where it is among them, else the lowest trial id)."
    ]
