"""Figures logged to MLflow during and after a sweep (matplotlib, Agg): a trial's curves per epoch,
and for the sweep's parent run val_acc per epoch of every trial and accuracy against the EAF."""

from __future__ import annotations

import math
from typing import Any

STATUS_STYLE = {  # trial status -> (colour, marker) in the sweep figures
    "FINISHED": ("tab:blue", "o"),
    "STOPPED": ("tab:orange", "x"),
    "FAILED": ("tab:red", "v"),
    "RUNNING": ("tab:gray", "."),
    "KILLED": ("tab:gray", "."),
}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def trial_curves(histories: dict[str, list[tuple[int, float]]], title: str = ""):
    """One panel per metric (e.g. train_loss, val_acc, val_eaf) against the epoch, and the
    val_departure_tok<k> together in one stacked panel (its top edge is 1 - steps_val_acc); None
    when empty."""
    from stabray.record import is_departure_metric

    series = {k: v for k, v in histories.items() if v and not is_departure_metric(k)}
    departures = {k: v for k, v in histories.items() if v and is_departure_metric(k)}
    panels = len(series) + bool(departures)
    if not panels:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, panels, figsize=(3.4 * panels, 2.9), squeeze=False)
    for ax, (name, points) in zip(axes[0], series.items()):
        ax.plot([s for s, _ in points], [v for _, v in points], "o-", markersize=3)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        if name.endswith("acc"):
            ax.set_ylim(-0.03, 1.03)
    if departures:
        _departure_panel(axes[0][-1], departures)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def _departure_panel(ax, departures: dict[str, list[tuple[int, float]]]) -> None:
    """Where the wrong validation chains first go off, by token of a step, stacked per epoch (an
    epoch a token has no point at counts 0 for it)."""
    keys = sorted(departures, key=lambda k: int(k.rsplit("tok", 1)[1]))
    epochs = sorted({s for k in keys for s, _ in departures[k]})
    by_epoch = [dict(departures[k]) for k in keys]
    shares = [[points.get(e, 0.0) for e in epochs] for points in by_epoch]
    ax.stackplot(epochs, shares, labels=[f"token {k.rsplit('tok', 1)[1]}" for k in keys], alpha=0.8)
    ax.set_title("val_departure_tok<k> (stacked)", fontsize=10)
    ax.set_xlabel("epoch")
    ax.set_ylim(-0.03, 1.03)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")


def sweep_val_acc(trials: list[dict[str, Any]], epochs: int | None = None):
    """val_acc per epoch of every trial (dict: name, status, history), one line each; a cross marks
    where the scheduler stopped a trial."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for t in trials:
        hist = t["history"]
        if not hist:
            continue
        colour, _ = STATUS_STYLE.get(t["status"], ("tab:gray", "."))
        ax.plot([e for e, _ in hist], [v for _, v in hist], "-", color=colour, alpha=0.7, linewidth=1.2)
        if t["status"] == "STOPPED":
            ax.plot(hist[-1][0], hist[-1][1], "x", color=colour, markersize=7)
    for status in ("FINISHED", "STOPPED", "FAILED"):
        if any(t["status"] == status for t in trials):
            colour, _ = STATUS_STYLE[status]
            ax.plot([], [], "-", color=colour, label={"STOPPED": "stopped early"}.get(status, status.lower()))
    ax.set_xlabel("epoch")
    ax.set_ylabel("val_acc")
    ax.set_ylim(-0.03, 1.03)
    if epochs:
        ax.set_xlim(0.5, epochs + 0.5)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    ax.set_title(f"val_acc per epoch, {len(trials)} trials", fontsize=10)
    fig.tight_layout()
    return fig


def accuracy_vs_eaf(points: list[dict[str, Any]]):
    """Accuracy against the EAF (dict: acc, eaf, status, label): test_acc and test_eaf for trials
    that finished, best_val_acc and the last per-epoch val_eaf for the others."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    shown = set()
    for p in points:
        if p["acc"] is None or p["eaf"] is None or not all(map(math.isfinite, (p["acc"], p["eaf"]))):
            continue
        colour, marker = STATUS_STYLE.get(p["status"], ("tab:gray", "."))
        label = {"FINISHED": "finished: test_acc, test_eaf", "STOPPED": "stopped: best_val_acc, last val_eaf"}.get(
            p["status"], p["status"].lower()
        )
        ax.scatter(p["eaf"], p["acc"], color=colour, marker=marker, label=None if label in shown else label)
        shown.add(label)
        ax.annotate(p["label"], (p["eaf"], p["acc"]), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("EAF (error amplification factor)")
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.03, 1.03)
    ax.grid(alpha=0.3)
    if shown:
        ax.legend(fontsize=8, loc="best")
    ax.set_title("accuracy vs EAF", fontsize=10)
    fig.tight_layout()
    return fig


def close(fig) -> None:
    if fig is not None:
        _plt().close(fig)
