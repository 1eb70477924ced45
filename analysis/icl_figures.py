"""Figures 3 and 6 of the paper for the in-context GD tasks (icl_linear, icl_quadratic), as PNG.

Figure 3: inference loss (self-generated iterates) vs teacher-forced loss against the step T, both
against theta* (the chain converges to it), with the loss under noise on the fed-back iterates and
on the weights; a second panel shows the error against the GD iterate theta_T that training targets.
Figure 6: measured step-Jacobian norms ||J_{T-1}^(T)|| next to the theory's ||I - (eta/n) X X^T||
(linear) or ||I - (2 eta/n) X D(theta) X^T|| (quadratic), the product norm sum_i ||P_i||^2 both ways,
and the EAF per T.

Source, one of
- a checkpoint directory (its icl_curves.json; the trial is re-evaluated when the file is missing),
  or a Ray Tune trial directory (its latest checkpoint_*),
- an MLflow run id (the checkpoint the run recorded, else the run's `<curve>_T<t>` metrics),
- `--experiment <sweep>` (MLflow, or `--ray-dir <sweep results dir>`): the sweep's best ICL trial,
  selected as in analysis/select.py (best validation accuracy, ties to the lower EAF).

Next to the PNGs, `icl_figures.json` holds every plotted series exactly as drawn (read back from
the figures' lines) and where the numbers came from.

    python -m analysis icl-figures <checkpoint dir | trial dir | run id> [--out DIR]
    python -m analysis icl-figures --experiment icl_linear [--tracking-uri URI | --ray-dir DIR] [--out DIR]
    python -m stabray icl-figures ...      (the same command)
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from analysis.figures import plt, save_figure
from stabray.record import ICL_CURVES as CURVES  # the logged `<curve>_T<t>` names


def checkpoint_dir(path: str | Path) -> Path:
    """A checkpoint directory itself, or the latest `checkpoint_*` of a Ray Tune trial directory."""
    from stabray.errors import UserError

    path = Path(path)
    if (path / "icl_curves.json").exists() or (path / "state.pt").exists():
        return path
    cks = sorted(path.glob("checkpoint_*"))
    if cks:
        return cks[-1]
    raise UserError(f"{path}: neither a checkpoint (icl_curves.json / state.pt) nor a trial dir with checkpoint_*")


def curves_from_checkpoint(path: str | Path) -> dict[str, Any]:
    path = checkpoint_dir(path)
    f = path / "icl_curves.json"
    if f.exists():
        return json.loads(f.read_text())
    from stabray.errors import UserError
    from stabray.train import load_run

    run = load_run(path)
    if not hasattr(run, "curves"):
        raise UserError(
            f"{path}: a checkpoint of task {run.cfg.task.name!r}; Figures 3 and 6 need icl_linear or icl_quadratic"
        )
    run.final()
    return run.curves


def curves_from_metrics(metrics: dict[str, float], task: str = "") -> dict[str, Any]:
    """{"infer_loss_T3": v, ...} -> {"infer_loss": [v1, v2, ...], "T": [...]}."""
    per: dict[str, dict[int, float]] = {}
    for k, v in metrics.items():
        m = re.fullmatch(r"(.+)_T(\d+)", k)
        if m and m.group(1) in CURVES:
            per.setdefault(m.group(1), {})[int(m.group(2))] = v
    Ts = sorted({t for d in per.values() for t in d})
    out: dict[str, Any] = {"task": task, "T": Ts}
    for k, d in per.items():
        out[k] = [d.get(t, float("nan")) for t in Ts]
    return out


def curves_from_mlflow(run_id: str, tracking_uri: str | None = None) -> dict[str, Any]:
    from stabray.tracking import run_data

    metrics, params, tags = run_data(run_id, tracking_uri)
    task = params.get("task") or tags.get("stabray.task", "")  # logged by stabray.tune.callbacks
    return curves_from_metrics(metrics, task)


def curves_from_run_id(run_id: str, tracking_uri: str | None = None) -> tuple[dict[str, Any], str]:
    """The checkpoint the run recorded when it is on this machine, else the run's logged metrics."""
    from stabray.errors import UserError
    from stabray.tracking import checkpoint_dir_of

    try:
        ck = checkpoint_dir_of(run_id, tracking_uri)
    except UserError as e:
        curves = curves_from_mlflow(run_id, tracking_uri)  # no store or no run: that error alone
        print(f"note: {e}; using the run's logged <curve>_T<t> metrics")
        return curves, f"MLflow run {run_id} metrics"
    return curves_from_checkpoint(ck), f"checkpoint {ck} (MLflow run {run_id})"


def _ray_trial_dir(root: Path, trial_id: str) -> Path | None:
    for res in sorted(root.glob("**/result.json")):
        with res.open() as f:
            first = f.readline()
        try:
            if str(json.loads(first).get("trial_id")) == trial_id:
                return res.parent
        except (json.JSONDecodeError, AttributeError):
            continue
    return None


def best_trial(
    experiment: str, tracking_uri: str | None = None, ray_dir: str | Path | None = None, task: str | None = None
) -> dict[str, Any]:
    """The sweep's selected ICL trial (a row of analysis.load's trials frame, with `score`)."""
    import polars as pl

    from analysis.load import load
    from analysis.select import select_best
    from stabray.errors import UserError

    trials = load(experiment, tracking_uri, ray_dir).trials
    icl = trials.filter(pl.col("task").str.starts_with("icl_") & ((pl.col("task") == task) if task else True))
    best = select_best(icl, by=("task",)).sort("score", descending=True)
    if best.is_empty():
        raise UserError(
            f"experiment {experiment!r}: no finished ICL trial with a validation score ({trials.height} trials in all)"
        )
    if best.height > 1 and task is None:
        raise UserError(f"experiment {experiment!r} holds several ICL tasks {best['task'].to_list()}; pass --task")
    return best.row(0, named=True)


def resolve(
    source: str | None = None,
    experiment: str | None = None,
    tracking_uri: str | None = None,
    ray_dir: str | Path | None = None,
    task: str | None = None,
) -> tuple[dict[str, Any], str]:
    """(curves, where they came from) for a checkpoint / trial dir, an MLflow run id, or a sweep's best trial."""
    from stabray.errors import UserError

    if source:
        if Path(source).is_dir():
            ck = checkpoint_dir(source)
            return curves_from_checkpoint(ck), f"checkpoint {ck}"
        return curves_from_run_id(source, tracking_uri)
    if not experiment:
        raise UserError("give a checkpoint dir, a trial dir or an MLflow run id, or --experiment")
    row = best_trial(experiment, tracking_uri, ray_dir, task)
    what = f"best trial {row['trial_id']} of {experiment!r} (val score {row['score']:.3f})"
    if ray_dir is not None:
        tdir = _ray_trial_dir(Path(ray_dir), str(row["trial_id"]))
        if tdir is None:
            raise UserError(f"{ray_dir}: no trial directory for trial {row['trial_id']}")
        ck = checkpoint_dir(tdir)
        return curves_from_checkpoint(ck), f"{what}: checkpoint {ck}"
    curves, where = curves_from_run_id(row["run_id"], tracking_uri)
    return curves, f"{what}: {where}"


def plotted_series(fig) -> dict[str, dict[str, list[float]]]:
    """Every line of a figure as drawn: {axes title: {label: y values}} (x is T)."""
    out: dict[str, dict[str, list[float]]] = {}
    for ax in fig.axes:
        out[ax.get_title()] = {ln.get_label(): [float(v) for v in ln.get_ydata()] for ln in ax.get_lines()}
    return out


def _plot(ax, curves: dict[str, Any], key: str, style: str, label: str, **kw) -> None:
    if curves.get(key):
        ax.plot(curves["T"], curves[key], style, label=label, **kw)


def figure3(curves: dict[str, Any]):
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    ax = axes[0]
    for key, label, style in (
        ("infer_star", "inference (self-generated steps)", "-o"),
        ("tf_star", "teacher-forced (true steps)", "--s"),
        ("step_noise", "inference, noise on fed-back iterates", ":^"),
        ("weight_noise", "inference, noise on weights", ":v"),
    ):
        _plot(ax, curves, key, style, label, ms=3)
    ax.set_yscale("log")
    ax.set_xlabel("steps T")
    ax.set_ylabel(r"$\|\hat\theta_T - \theta^\star\|^2$")
    ax.set_title(f"Figure 3: {curves.get('task', '')} loss vs theta*")
    ax.legend(fontsize=7)
    ax = axes[1]
    for key, label, style in (("infer_loss", "inference", "-o"), ("tf_loss", "teacher-forced", "--s")):
        _plot(ax, curves, key, style, label, ms=3)
    ax.set_yscale("log")
    ax.set_xlabel("steps T")
    ax.set_ylabel(r"$\|\hat\theta_T - \theta_T\|^2$")
    ax.set_title("error vs the GD iterate (training target)")
    ax.legend(fontsize=7)
    return fig


def figure6(curves: dict[str, Any]):
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.6))
    ax = axes[0]
    _plot(ax, curves, "jac_norm", "-o", r"measured $\|J_{T-1}^{(T)}\|$ (mean)", ms=3)
    _plot(ax, curves, "jac_norm_max", "-", "measured (max over prompts)", lw=0.8)
    _plot(ax, curves, "theory_norm", "--s", "theory (mean)", ms=3)
    ax.set_xlabel("steps T")
    ax.set_ylabel("spectral norm")
    ax.set_title("step Jacobian")
    ax.legend(fontsize=7)
    ax = axes[1]
    _plot(ax, curves, "jac_prod", "-o", r"measured $\sum_{i\leq T}\|P_i\|^2$", ms=3)
    _plot(ax, curves, "theory_prod", "--s", "theory", ms=3)
    ax.set_xlabel("steps T")
    ax.set_title("Figure 6: Jacobian product norm")
    ax.legend(fontsize=7)
    ax = axes[2]
    _plot(ax, curves, "eaf", "-o", r"EAF $\sum_{i<T}\rho_i^{(T)}$", ms=3)
    _plot(ax, curves, "jac_err", "--", r"max $\|J - J_{theory}\|$")
    ax.set_xlabel("steps T")
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_title("EAF and Jacobian error")
    ax.legend(fontsize=7)
    fig.suptitle(str(curves.get("task", "")), y=1.04)
    return fig


FIGURES = {"figure3_icl_losses": figure3, "figure6_icl_jacobians": figure6}


def write_figures(curves: dict[str, Any], out: str | Path, source: str = "") -> list[Path]:
    """Figure 3 and Figure 6 as PNG into `out`, plus icl_figures.json with the plotted series."""
    out = Path(out)
    paths, data = [], {"source": source, "task": curves.get("task", ""), "T": list(curves["T"]), "figures": {}}
    for name, make in FIGURES.items():
        fig = make(curves)
        data["figures"][name] = plotted_series(fig)
        paths.append(save_figure(fig, out / f"{name}.png"))
    (out / "icl_figures.json").write_text(json.dumps(data, indent=1))
    return paths


def summary(curves: dict[str, Any]) -> str:
    """The numbers a note on Figures 3 / 6 needs, as text (first, middle and last T)."""
    T = curves["T"]
    idx = sorted({0, len(T) // 2, len(T) - 1})
    lines = [f"{curves.get('task', '')}: T = " + ", ".join(str(T[i]) for i in idx)]
    for key in ("tf_loss", "infer_loss", "infer_star", "eaf", "jac_norm", "theory_norm", "jac_err", "acc"):
        if curves.get(key):
            lines.append(f"  {key:12s} " + "  ".join(f"{curves[key][i]:.3g}" for i in idx))
    return "\n".join(lines)


def run(
    source: str | None = None,
    experiment: str | None = None,
    tracking_uri: str | None = None,
    ray_dir: str | None = None,
    task: str | None = None,
    out: str | None = None,
    force: bool = False,
) -> list[Path]:
    """Figures 3 and 6 of one ICL trial into `out` (default ./reports/<task>). Files of the same names
    there are replaced only with `force`; a given `out` is checked before anything is read."""
    from stabray.errors import check_output_folder

    names = [f"{n}.png" for n in FIGURES] + ["icl_figures.json"]
    if out:
        check_output_folder(out, names, force)
    curves, where = resolve(source, experiment, tracking_uri, ray_dir, task)
    if not curves.get("T"):
        from stabray.errors import UserError

        raise UserError(f"{where}: no per-T ICL curves found")
    out_dir = Path(out) if out else Path("reports") / (curves.get("task") or "icl")
    if not out:  # the default folder is known once the task is
        check_output_folder(out_dir, names, force)
    paths = write_figures(curves, out_dir, where)
    print(f"from {where}")
    print(summary(curves))
    for p in paths:
        print(p)
    print(out_dir / "icl_figures.json")
    return paths


def main(argv: list[str] | None = None) -> int:
    from analysis.cli import main as cli_main

    return cli_main(["icl-figures", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
