"""Figures 3 and 6 of the paper for the in-context GD tasks (icl_linear, icl_quadratic), as PNG.

Figure 3: inference loss (self-generated iterates) vs teacher-forced loss against the step T, both
against theta* (the chain converges to it), with the loss under noise on the fed-back iterates and
on the weights; a second panel shows the error against the GD iterate theta_T that training targets.
Figure 6: measured step-Jacobian norms ||J_{T-1}^(T)|| next to the theory's ||I - (eta/n) X X^T||
(linear) or ||I - (2 eta/n) X D(theta) X^T|| (quadratic), the product norm sum_i ||P_i||^2 both ways,
and the EAF per T.

Source: a checkpoint directory (its icl_curves.json, or the trial is re-evaluated when the file is
missing) or an MLflow run id (the trial's `<curve>_T<t>` metrics).

    python -m analysis.icl_figures <checkpoint dir | mlflow run id> [--tracking-uri URI] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from analysis.figures import _save, plt

CURVES = ("infer_loss", "tf_loss", "infer_star", "tf_star", "step_noise", "weight_noise", "jac_norm",
          "jac_norm_max", "theory_norm", "jac_err", "offdiag_max", "jac_prod", "theory_prod", "eaf")


def curves_from_checkpoint(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    f = path / "icl_curves.json"
    if f.exists():
        return json.loads(f.read_text())
    from stabray.train.run import load_run

    run = load_run(path)
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
    import mlflow

    run = mlflow.MlflowClient(tracking_uri=tracking_uri).get_run(run_id)
    return curves_from_metrics(run.data.metrics, run.data.params.get("task.name", ""))


def figure3(curves: dict[str, Any], path: Path) -> Path:
    T = curves["T"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    ax = axes[0]
    for key, label, style in (("infer_star", "inference (self-generated steps)", "-o"),
                              ("tf_star", "teacher-forced (true steps)", "--s"),
                              ("step_noise", "inference, noise on fed-back iterates", ":^"),
                              ("weight_noise", "inference, noise on weights", ":v")):
        if key in curves:
            ax.plot(T, curves[key], style, ms=3, label=label)
    ax.set_yscale("log"); ax.set_xlabel("steps T"); ax.set_ylabel(r"$\|\hat\theta_T - \theta^\star\|^2$")
    ax.set_title(f"Figure 3: {curves.get('task', '')} loss vs theta*"); ax.legend(fontsize=7)
    ax = axes[1]
    for key, label, style in (("infer_loss", "inference", "-o"), ("tf_loss", "teacher-forced", "--s")):
        if key in curves:
            ax.plot(T, curves[key], style, ms=3, label=label)
    ax.set_yscale("log"); ax.set_xlabel("steps T"); ax.set_ylabel(r"$\|\hat\theta_T - \theta_T\|^2$")
    ax.set_title("error vs the GD iterate (training target)"); ax.legend(fontsize=7)
    return _save(fig, path)


def figure6(curves: dict[str, Any], path: Path) -> Path:
    T = curves["T"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.6))
    ax = axes[0]
    ax.plot(T, curves["jac_norm"], "-o", ms=3, label=r"measured $\|J_{T-1}^{(T)}\|$ (mean)")
    if "jac_norm_max" in curves:
        ax.plot(T, curves["jac_norm_max"], "-", lw=0.8, label="measured (max over prompts)")
    ax.plot(T, curves["theory_norm"], "--s", ms=3, label="theory (mean)")
    ax.set_xlabel("steps T"); ax.set_ylabel("spectral norm"); ax.set_title("step Jacobian")
    ax.legend(fontsize=7)
    ax = axes[1]
    ax.plot(T, curves["jac_prod"], "-o", ms=3, label=r"measured $\sum_{i\leq T}\|P_i\|^2$")
    ax.plot(T, curves["theory_prod"], "--s", ms=3, label="theory")
    ax.set_xlabel("steps T"); ax.set_title("Figure 6: Jacobian product norm"); ax.legend(fontsize=7)
    ax = axes[2]
    ax.plot(T, curves["eaf"], "-o", ms=3, label=r"EAF $\sum_{i<T}\rho_i^{(T)}$")
    if "jac_err" in curves:
        ax.plot(T, curves["jac_err"], "--", label=r"max $\|J - J_{theory}\|$")
    ax.set_xlabel("steps T"); ax.set_yscale("symlog", linthresh=1e-3); ax.set_title("EAF and Jacobian error")
    ax.legend(fontsize=7)
    fig.suptitle(str(curves.get("task", "")))
    return _save(fig, path)


def write_figures(curves: dict[str, Any], out: str | Path) -> list[Path]:
    out = Path(out)
    return [figure3(curves, out / "figure3_icl_losses.png"), figure6(curves, out / "figure6_icl_jacobians.png")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", help="checkpoint directory, or an MLflow run id")
    ap.add_argument("--tracking-uri", default=None)
    ap.add_argument("--out", default=None, help="folder for the PNGs (default: ./reports/<task>)")
    a = ap.parse_args(argv)
    curves = curves_from_checkpoint(a.source) if Path(a.source).is_dir() else curves_from_mlflow(a.source, a.tracking_uri)
    if not curves.get("T"):
        raise SystemExit(f"{a.source}: no per-T ICL curves found")
    for p in write_figures(curves, a.out or Path("reports") / (curves.get("task") or "icl")):
        print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
