"""Figure 2 style: loss gap and the eq. (4) bound against T, on two y axes (their scales differ)."""

from __future__ import annotations


def plot_bound_vs_T(rows: list[dict], title: str = ""):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    T = [r["T"] for r in rows]
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    ax.plot(T, [r["loss_gap"] for r in rows], "o-", color="tab:blue", label="loss gap")
    ax.set_xlabel("reasoning steps T")
    ax.set_ylabel("loss gap", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(T, [r["bound"] for r in rows], "s--", color="tab:red", label="bound (eq. 4)")
    ax2.set_ylabel("bound", color="tab:red")
    ax.set_xticks(T)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig
