"""The paper's tables from a trial frame (and the per-T decomposition frame).

Each builder returns a `Table`: `display` holds the formatted cells (strings, "–" when missing)
that Markdown and LaTeX render; `data` holds the numbers at full precision, in tidy form, for CSV
(missing = empty). A table without any data is still a `Table`, with a `note` saying why.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from analysis.select import BEST, GROUP, Rule, mean_std, seeds_of, select_best
from stabray.record import one_per_seed

MISSING = "–"  # en dash; LaTeX gets "--"
NOT_RUN = "not run"  # no trial of this (task, method) in the source
NO_FINISHED = "no finished trial"  # trials ran, but none ran every epoch (ASHA stopped, failed or killed)

# Paper order first; anything else found in the data follows, sorted.
PAPER_METHODS = ["no_cot", "sft_cot", "implicit_cot", "coconut", "nso", "alg1"]
METHOD_LABELS = {
    "no_cot": "No CoT",
    "sft_cot": "SFT-CoT",
    "implicit_cot": "Implicit CoT",
    "coconut": "Coconut",
    "nso": "NSO",
    "alg1": "Algorithm 1",
    "mtp": "MTP",
}
TASK_ORDER = ["dijkstra", "bellman_ford", "mst_prim", "bfs", "dfs", "lego_cyclic", "lego_symmetry"]
TASK_LABELS = {
    "dijkstra": "Dijkstra",
    "bellman_ford": "Bellman-Ford",
    "mst_prim": "Prim",
    "bfs": "BFS",
    "dfs": "DFS",
    "lego_cyclic": "Cyclic",
    "lego_symmetry": "Symmetry",
}
REFERENCE_METHOD = "sft_cot"  # EAF reduction factors are relative to SFT-CoT
# Table 5 always shows these when present, then any other param that varied across trials.
HPARAMS = ["bits", "optimizer", "lr", "lora_rank", "lam", "latents_per_step", "sigma"]
HPARAM_LABELS = {
    "bits": "Bits",
    "optimizer": "Optimizer",
    "lr": "Learning rate",
    "lora_rank": "LoRA rank",
    "lam": "λ",
    "latents_per_step": "Latents per step c",
    "sigma": "σ",
}
NOT_HPARAMS = {"task", "method", "seed", "model", "task_version", "trial_id", "run_id", "status", "config_key"}


TABLE_EXTS = ("md", "tex", "csv")  # the files Table.write writes, <name>.<ext>
BITS_STUDY = "table3_study"  # bits_study's table name


@dataclass(frozen=True)
class Table:
    name: str  # file stem
    caption: str
    display: pl.DataFrame  # strings only
    data: pl.DataFrame  # numbers, for CSV
    note: str = ""  # set when data is missing

    def to_markdown(self) -> str:
        head = f"**{self.caption}**\n\n"
        note = f"\n_{self.note}_\n" if self.note else ""
        if self.display.width == 0:
            return head + note
        cols = self.display.columns
        cell = lambda s: str(s).replace("|", r"\|")  # noqa: E731
        lines = ["| " + " | ".join(cell(c) for c in cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in self.display.iter_rows()]
        return head + "\n".join(lines) + "\n" + note

    def to_latex(self) -> str:
        cols = self.display.columns
        out = [
            "% needs \\usepackage{booktabs}",
            "\\begin{table}[t]",
            "\\centering",
            f"\\caption{{{latex_escape(self.caption)}}}",
            f"\\label{{tab:{self.name}}}",
        ]
        if cols:
            out += [
                f"\\begin{{tabular}}{{l{'c' * (len(cols) - 1)}}}",
                "\\toprule",
                " & ".join(latex_escape(c) for c in cols) + " \\\\",
                "\\midrule",
            ]
            out += [" & ".join(latex_escape(v) for v in row) + " \\\\" for row in self.display.iter_rows()]
            out += ["\\bottomrule", "\\end{tabular}"]
        if self.note:
            out.append(f"\\par\\smallskip\\footnotesize {latex_escape(self.note)}")
        out.append("\\end{table}")
        return "\n".join(out) + "\n"

    def to_csv(self) -> str:
        return self.data.write_csv(null_value="") if self.data.width else ""

    def write(self, out_dir: str | Path) -> list[Path]:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        render = {"md": self.to_markdown, "tex": self.to_latex, "csv": self.to_csv}
        for ext in TABLE_EXTS:
            p = out / f"{self.name}.{ext}"
            p.write_text(render[ext]())
            paths.append(p)
        return paths


# LaTeX special characters, and the non-ASCII symbols the tables use.
_LATEX = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "–": "--",
    "±": r"\ensuremath{\pm}",
    "×": r"\ensuremath{\times}",
    "Σ": r"\ensuremath{\Sigma}",
    "ρ": r"\ensuremath{\rho}",
    "ε": r"\ensuremath{\varepsilon}",
    "λ": r"\ensuremath{\lambda}",
    "σ": r"\ensuremath{\sigma}",
}


def latex_escape(text: object) -> str:
    return "".join(_LATEX.get(ch, ch) for ch in str(text))


# ----------------------------------------------------------------------------------- formatting


def _missing(x) -> bool:
    return x is None or (isinstance(x, float) and (math.isnan(x) or math.isinf(x)))


def fmt_num(x) -> str:
    """3 significant digits; scientific beyond 1e4 or below 1e-2."""
    if _missing(x):
        return MISSING
    if isinstance(x, int):
        return str(x)
    ax = abs(x)
    if ax != 0 and (ax >= 1e4 or ax < 1e-2):
        return f"{x:.1e}"
    return f"{x:.3g}"


def fmt_pm(mean, std, scale: float = 1.0, n: int | None = None) -> str:
    """`mean ± std (n=k)`, one decimal; the mean alone with one seed (std null); `(n=k)` when n is
    given, so every cell says how many seeds it averages."""
    if _missing(mean):
        return MISSING
    tail = "" if n is None else f" (n={n})"
    if _missing(std):
        return f"{mean * scale:.1f}{tail}"
    return f"{mean * scale:.1f} ± {std * scale:.1f}{tail}"


def _absent(trials: pl.DataFrame, task: str, method: str) -> str:
    """What an empty (task, method) cell means: never run, run without a finished trial, or
    finished without the metric."""
    mine = trials.filter((pl.col("task") == task) & (pl.col("method") == method))
    if mine.is_empty():
        return NOT_RUN
    if mine.filter(pl.col("status").is_null() | (pl.col("status") == "FINISHED")).is_empty():
        return NO_FINISHED
    return MISSING


def _unselected(trials: pl.DataFrame, selected: pl.DataFrame, by: Sequence[str]) -> dict[tuple, str]:
    """The groups (values of `by`) that ran but have no selected configuration, each with why: "no
    finished trial" (every trial stopped early, failed or was killed) or "–" (finished without a
    validation score). A row-per-group table shows them as rows instead of leaving them out."""
    by = list(by)
    ran = trials.filter(pl.all_horizontal(pl.col(c).is_not_null() for c in by))
    have = {tuple(r[c] for c in by) for r in selected.iter_rows(named=True)}
    out = {}
    for r in ran.select(by).unique(maintain_order=True).iter_rows(named=True):
        key = tuple(r[c] for c in by)
        if key in have:
            continue
        mine = ran.filter(pl.all_horizontal(pl.col(c) == v for c, v in zip(by, key)))
        done = mine.filter(pl.col("status").is_null() | (pl.col("status") == "FINISHED"))
        out[key] = NO_FINISHED if done.is_empty() else MISSING
    return out


def _first_row(trials: pl.DataFrame, by: Sequence[str], key: tuple) -> dict:
    """The first trial of a group, as a dict (its task, method, model... for a row that says why it is empty)."""
    return trials.filter(pl.all_horizontal(pl.col(c) == v for c, v in zip(by, key))).row(0, named=True)


def _epochs(trials: pl.DataFrame, selected: pl.DataFrame, by: Sequence[str] = GROUP) -> str:
    """The epochs the seeds of the selected configurations ran ("12", or "6–12")."""
    e = seeds_of(trials, selected, by)["n_epochs"].drop_nulls() if not selected.is_empty() else pl.Series([])
    if not len(e):
        return ""
    return f"{e.min()}" + (f"–{e.max()}" if e.max() != e.min() else "")


def _pct_scale(values: pl.Series) -> float:
    """Accuracies are logged as fractions; values above 1 are taken as percent already."""
    v = values.drop_nulls()
    return 1.0 if len(v) and v.max() > 1.0 else 100.0


def ordered(values, order: Sequence[str]) -> list[str]:
    vals = {v for v in values if v is not None}
    return [v for v in order if v in vals] + sorted(vals - set(order))


def method_label(m: str) -> str:
    return METHOD_LABELS.get(m, m)


def task_label(t: str) -> str:
    return TASK_LABELS.get(t, t)


def _empty(name: str, caption: str, note: str, columns: Sequence[str] = ()) -> Table:
    display = pl.DataFrame({c: [] for c in columns}, schema={c: pl.Utf8 for c in columns})
    return Table(name, caption, display, pl.DataFrame(), note)


# ----------------------------------------------------------------------------------- Table 1


def table1(
    trials: pl.DataFrame,
    metric: str = "test_acc",
    name: str = "table1_accuracy",
    caption: str | None = None,
    methods: Sequence[str] = PAPER_METHODS,
    rule: Rule = BEST,
) -> Table:
    """Test accuracy (%) mean ± std (n = seeds) over the seeds of each (task, method)'s selected
    configuration; only FINISHED trials feed a cell. Rows: the paper's methods plus any other method
    logged, then (when the trials logged `trivial_<metric>`) the best trivial rule on the same
    examples; columns: the tasks logged. An empty cell says why: "not run", "no finished trial"
    (every trial stopped early, failed or was killed), or "–" (finished without the metric)."""
    caption = caption or f"Test accuracy (%) from {metric}, mean ± sample std (ddof=1) over seeds"
    tasks = ordered(trials["task"].to_list(), TASK_ORDER)
    meths = ordered(list(methods) + trials["method"].to_list(), list(methods))
    if metric not in trials.columns:
        return _empty(name, caption, f"No trial logged {metric}.", ["Method"])
    selected = select_best(trials, rule=rule)
    stats = mean_std(trials, selected, metric)
    if not tasks:
        return _empty(name, caption, "No trials logged.", ["Method"])
    scale = _pct_scale(stats["mean"]) if len(stats) else 100.0
    cell = {(r["task"], r["method"]): r for r in stats.iter_rows(named=True)}
    display = {"Method": [method_label(m) for m in meths]}
    for t in tasks:
        display[task_label(t)] = [
            fmt_pm(cell[(t, m)]["mean"], cell[(t, m)]["std"], scale, cell[(t, m)]["n"])
            if (t, m) in cell
            else _absent(trials, t, m)
            for m in meths
        ]
    scored = seeds_of(trials, selected) if not selected.is_empty() else trials.clear()
    floor, spread = _floors(scored, "trivial_" + metric, tasks)
    if floor:
        display["Method"].append(FLOOR_LABEL)
        for t in tasks:
            display[task_label(t)].append(fmt_num(floor[t] * scale) if t in floor else MISSING)
    data = pl.DataFrame(
        [
            {
                "task": t,
                "method": m,
                "mean_pct": cell[(t, m)]["mean"] * scale if (t, m) in cell else None,
                "std_pct": (
                    cell[(t, m)]["std"] * scale if (t, m) in cell and cell[(t, m)]["std"] is not None else None
                ),
                "n_seeds": cell[(t, m)]["n"] if (t, m) in cell else 0,
            }
            for t in tasks
            for m in meths
        ]
        + [
            {"task": t, "method": "best_trivial_rule", "mean_pct": v * scale, "std_pct": None, "n_seeds": 0}
            for t, v in floor.items()
        ],
        schema={"task": pl.Utf8, "method": pl.Utf8, "mean_pct": pl.Float64, "std_pct": pl.Float64, "n_seeds": pl.Int64},
    )
    ns = [r["n"] for r in cell.values()]
    note = "" if ns else f"No finished trial has {metric}."
    if spread:  # the selected configurations of a task were scored on different examples
        note = (note + " " if note else "") + (
            "The selected configurations of "
            + ", ".join(f"{task_label(t)} ({lo:.3f}-{hi:.3f})" for t, (lo, hi) in spread.items())
            + " logged different trivial-rule floors, so they were scored on different examples (the "
            "experiment holds trials of more than one task setting); the floor shown is their mean."
        )
    epochs = _epochs(trials, selected)
    if epochs:
        caption += f"; epochs run: {epochs}"
    return Table(name, caption, pl.DataFrame(display), data, note)


FLOOR_LABEL = "Best trivial rule"  # the last row of a Table 1 variant: accuracy without learning


def _floors(
    trials: pl.DataFrame, floor_metric: str, tasks: Sequence[str]
) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """Per task, the best trivial rule's accuracy as `trials` (the seeds of the selected
    configurations) logged it: the rule's accuracy on the evaluation split, the same for every trial
    scored on the same examples; the mean if they differ, and then (second dict) the task's lowest
    and highest floor, for a note."""
    if floor_metric not in trials.columns:
        return {}, {}
    rows = trials.filter(pl.col(floor_metric).is_not_null())
    floor, spread = {}, {}
    for t in tasks:
        vals = rows.filter(pl.col("task") == t)[floor_metric]
        if len(vals):
            floor[t] = float(vals.mean())
            if float(vals.max()) - float(vals.min()) > 1e-9:
                spread[t] = (float(vals.min()), float(vals.max()))
    return floor, spread


def table1_sized(trials: pl.DataFrame, rule: Rule = BEST) -> list[Table]:
    """Table 1 at every explicit evaluation size the trials logged (`test_acc_n<k>`, a task's
    long_sizes), one table per size, each with its trivial-rule floor."""
    sizes = sorted(int(c[len("test_acc_n") :]) for c in trials.columns if re.fullmatch(r"test_acc_n\d+", c))
    return [
        table1(
            trials,
            f"test_acc_n{k}",
            name=f"table1_n{k}",
            caption=f"Length generalization: test accuracy (%) on inputs of size {k}, mean ± sample std over seeds",
            rule=rule,
        )
        for k in sizes
    ]


def table1_length(trials: pl.DataFrame, longer: bool = False, rule: Rule = BEST) -> Table:
    """The length-generalization half of Table 1 (10% longer inputs; 20% with `longer`)."""
    metric, pct = ("test_longer_acc", 20) if longer else ("test_long_acc", 10)
    return table1(
        trials,
        metric,
        name=f"table1_length{'_20' if longer else ''}",
        caption=f"Length generalization: test accuracy (%) on {pct}% longer inputs, mean ± sample std over seeds",
        rule=rule,
    )


def welch(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float] | None:
    """Welch's two-sided t-test of mean(a) - mean(b): (t, degrees of freedom, p), or None when
    either side has fewer than 2 values. Two constant samples with different means give p = 0;
    with equal means, p = 1 (scipy would return nan)."""
    from scipy import stats

    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    diff = sum(a) / len(a) - sum(b) / len(b)
    if va + vb == 0:
        return (math.copysign(math.inf, diff), math.nan, 0.0) if diff else (0.0, math.nan, 1.0)
    res = stats.ttest_ind(a, b, equal_var=False)
    return float(res.statistic), float(res.df), float(res.pvalue)


def fmt_p(p: float) -> str:
    """A p-value to 3 decimals; below 0.001 as "<0.001" (not a misleading 0.000)."""
    return "<0.001" if p < 0.0005 else f"{p:.3f}"


def _seed_values(seeds: pl.DataFrame, task: str, method: str, metric: str) -> list[float]:
    rows = seeds.filter((pl.col("task") == task) & (pl.col("method") == method) & pl.col(metric).is_not_null())
    return rows[metric].to_list()


def method_tests(
    trials: pl.DataFrame, reference: str = "alg1", metrics: Sequence[str] | None = None, rule: Rule = BEST
) -> Table:
    """Each method against `reference` (Algorithm 1) on every accuracy it logged: the difference of
    the seed means in points (reference minus method) and Welch's two-sided p over the seeds of each
    (task, method)'s selected configuration. The metrics: test_acc, then the explicit sizes and the
    +10% / +20% splits the trials logged."""
    caption = f"{method_label(reference)} minus each method: test accuracy difference (points) and Welch's two-sided p"
    name = "method_tests"
    if metrics is None:
        sized = sorted((c for c in trials.columns if re.fullmatch(r"test_acc_n\d+", c)), key=lambda c: int(c[10:]))
        metrics = [
            m
            for m in ("test_acc", *sized, "test_long_acc", "test_longer_acc")
            if m in trials.columns and trials[m].is_not_null().any()
        ]
    if not trials.height or reference not in trials["method"].to_list():
        return _empty(name, caption, f"No trials of {reference}.", ["Task", "Method"])
    selected = select_best(trials, rule=rule)
    seeds = {m: seeds_of(trials, selected, metric=m) for m in metrics}  # a seed's repeat may hold what it lacks
    tasks = ordered(trials["task"].to_list(), TASK_ORDER)
    meths = [m for m in ordered(PAPER_METHODS + trials["method"].to_list(), PAPER_METHODS) if m != reference]
    display: dict[str, list[str]] = {"Task": [], "Method": []}
    for m in metrics:
        display[f"{m} Δ"], display[f"{m} p"] = [], []
    data = []
    for t in tasks:
        for meth in meths:
            vals = {}
            for metric in metrics:
                ref, other = (_seed_values(seeds[metric], t, x, metric) for x in (reference, meth))
                vals[metric] = (ref, other, welch(ref, other))
            if not any(o for _, o, _ in vals.values()):
                continue
            display["Task"].append(task_label(t))
            display["Method"].append(method_label(meth))
            for metric, (ref, other, w) in vals.items():
                diff = (sum(ref) / len(ref) - sum(other) / len(other)) * 100 if ref and other else None
                display[f"{metric} Δ"].append(MISSING if diff is None else f"{diff:+.1f}")
                display[f"{metric} p"].append(MISSING if w is None else fmt_p(w[2]))
                data.append(
                    {
                        "task": t,
                        "method": meth,
                        "metric": metric,
                        "diff_pts": diff,
                        "t": None if w is None else w[0],
                        "dof": None if w is None else w[1],
                        "p": None if w is None else w[2],
                        "n_ref": len(ref),
                        "n": len(other),
                    }
                )
    schema = {
        "task": pl.Utf8,
        "method": pl.Utf8,
        "metric": pl.Utf8,
        "diff_pts": pl.Float64,
        "t": pl.Float64,
        "dof": pl.Float64,
        "p": pl.Float64,
        "n_ref": pl.Int64,
        "n": pl.Int64,
    }
    note = (
        "" if data else f"No method shares a task with {method_label(reference)}."
    ) + " p is not corrected for the number of comparisons; with 3 seeds a side only large differences resolve."
    return Table(name, caption, pl.DataFrame(display), pl.DataFrame(data, schema=schema), note.strip())


# ----------------------------------------------------------------------------------- stability


PAPER_T = 5  # Tables 2-4 of the paper are at T = 5


def _at_T(decomp: pl.DataFrame, T: int = PAPER_T) -> pl.DataFrame:
    """Each trial's decomposition row at min(T, its T_max) (T = 0: T_max)."""
    if decomp.is_empty():
        return decomp
    rows = decomp if T <= 0 else decomp.filter(pl.col("T") <= T)
    return rows.sort(["trial_id", "T"]).group_by("trial_id", maintain_order=True).last()


def _decomp_means(trials, decomp, selected, by, keys, T: int = PAPER_T) -> dict[tuple, dict]:
    """Per group: mean, sample std (`<key>_std`) and n over the selected configuration's seeds of the
    decomposition at T (T_max if the chains are shorter); "T" = the largest T used."""
    at = _at_T(decomp, T)
    if at.is_empty():
        return {}
    seeds = seeds_of(trials, selected, by).select([*by, "trial_id"])
    rows = at.drop([c for c in by if c in at.columns]).join(seeds, on="trial_id", how="inner")
    aggs = [pl.col(k).mean() for k in keys] + [pl.col(k).std(ddof=1).alias(f"{k}_std") for k in keys]
    agg = rows.group_by(list(by), maintain_order=True).agg(aggs + [pl.col("T").max(), pl.len().alias("n")])
    return {tuple(r[c] for c in by): r for r in agg.iter_rows(named=True)}


GAP_NOTE = (
    "Loss gap: |loss of step T given the model's own prefix − given the gold prefix| from the eq. (4) "
    "table (nats/token, never negative)."
)


def table3(trials: pl.DataFrame, decomp: pl.DataFrame, T: int = PAPER_T, rule: Rule = BEST) -> Table:
    """Per task, method and bit-width: test accuracy, loss gap, bound, Σρ and Σε at T (5, as the
    paper; T_max where the chains are shorter), on each method's evaluation chain; each a mean over
    the selected configuration's finished seeds, with n. Every stability column comes from the eq. (4)
    table only (a trial without one leaves them empty: no per-epoch or final EAF is put in its place).
    A (task, method, bits) that ran without a finished trial keeps its row, saying so."""
    name = "table3_bits"
    caption = (
        f"Decomposition of eq. (4) per QAT bit-width at T = {T} or T_max if smaller, test split, mean over "
        "seeds (* = selected on validation)"
    )
    by = ("task", "method", "bits")
    cols = ["Task", "Method", "Bits", "Test acc. (%)", "Loss gap", "Bound", "Σρ", "Σε", "T", "n", "sel."]
    with_bits = trials.filter(pl.col("bits").is_not_null())
    if with_bits.is_empty():
        return _empty(name, caption, "No trial logged a bits param.", cols)
    selected = select_best(with_bits, by, rule)
    acc = {tuple(r[c] for c in by): r for r in mean_std(with_bits, selected, "test_acc", by).iter_rows(named=True)}
    dec = _decomp_means(with_bits, decomp, selected, by, ["loss_gap", "bound", "eaf", "sum_eps"], T)
    winners = {
        tuple(r[c] for c in GROUP) + (r["bits"],) for r in select_best(with_bits, rule=rule).iter_rows(named=True)
    }
    scale = _pct_scale(with_bits["test_acc"])
    absent = _unselected(with_bits, selected, by)
    keys = [tuple(r[c] for c in by) for r in selected.iter_rows(named=True)] + list(absent)
    disp, data = [], []
    tasks = ordered([k[0] for k in keys], TASK_ORDER)
    meths = ordered([k[1] for k in keys], PAPER_METHODS)
    for key in sorted(keys, key=lambda k: (tasks.index(k[0]), meths.index(k[1]), k[2])):
        if key in absent:  # ran, but nothing to average: the row says why
            data.append({"task": key[0], "method": key[1], "bits": key[2], "n_acc": 0, "absent": absent[key]})
            blank = [MISSING] * (len(cols) - 5)  # loss gap .. n
            disp.append([task_label(key[0]), method_label(key[1]), str(key[2]), absent[key], *blank, ""])
            continue
        a, d = acc.get(key, {}), dec.get(key, {})
        rec = {
            "task": key[0],
            "method": key[1],
            "bits": key[2],
            "test_acc_pct": a["mean"] * scale if a.get("mean") is not None else None,
            "test_acc_std_pct": a["std"] * scale if a.get("std") is not None else None,
            "n_acc": a.get("n"),
            "loss_gap": d.get("loss_gap"),
            "loss_gap_std": d.get("loss_gap_std"),
            "bound": d.get("bound"),
            "bound_std": d.get("bound_std"),
            "sum_rho": d.get("eaf"),
            "sum_rho_std": d.get("eaf_std"),
            "sum_eps": d.get("sum_eps"),
            "sum_eps_std": d.get("sum_eps_std"),
            "T": d.get("T"),
            "n_decomposition": d.get("n"),
            "selected": key in winners,
            "absent": None,
        }
        data.append(rec)
        disp.append(
            [
                task_label(key[0]),
                method_label(key[1]),
                str(key[2]),
                fmt_pm(a.get("mean"), a.get("std"), scale, a.get("n")),
                _pm(rec["loss_gap"], rec["loss_gap_std"]),
                _pm(rec["bound"], rec["bound_std"]),
                _pm(rec["sum_rho"], rec["sum_rho_std"]),
                _pm(rec["sum_eps"], rec["sum_eps_std"]),
                fmt_num(rec["T"]),
                fmt_num(rec["n_decomposition"]),
                "*" if rec["selected"] else "",
            ]
        )
    note = GAP_NOTE + ("" if dec else " No stability decomposition logged: loss gap, bound, Σρ, Σε and T are missing.")
    return Table(
        name, caption, pl.DataFrame(disp, schema=cols, orient="row"), pl.DataFrame(data, infer_schema_length=None), note
    )


def table4(
    trials: pl.DataFrame, decomp: pl.DataFrame, T: int = PAPER_T, rule: Rule = BEST, by: Sequence[str] = GROUP
) -> Table:
    """Bound decomposition at T (5, as the paper; T_max if smaller) per (task, method) selected
    configuration (per (task, method, model) with `by` naming the model too: the paper's Table 4
    compares two base models), on each method's evaluation chain (Coconut: its latent slots). A group
    that ran without a finished trial keeps its row, saying so."""
    name, caption = (
        "table4_decomposition",
        f"Decomposition of eq. (4) at T = {T} or T_max if smaller, per method (selected configuration, seed mean)",
    )
    keys = ["loss_gap", "bound", "first_order", "second_order", "C1", "C2"]
    cols = ["Task", "Model", "Method", "Loss gap", "Bound", "First-order", "Second-order", "C1", "C2", "T", "n"]
    by = tuple(by)
    selected = select_best(trials, by, rule)
    if selected.is_empty():
        return _empty(name, caption, "No finished trials.", cols)
    dec = _decomp_means(trials, decomp, selected, by, keys, T)
    absent = _unselected(trials, selected, by)
    rows = [*selected.iter_rows(named=True), *(_first_row(trials, by, k) for k in absent)]
    tasks = ordered([r["task"] for r in rows], TASK_ORDER)
    meths = ordered([r["method"] for r in rows], PAPER_METHODS)
    disp, data = [], []
    order = lambda r: (tasks.index(r["task"]), str(r.get("model")), meths.index(r["method"]))  # noqa: E731
    for r in sorted(rows, key=order):
        group = tuple(r[c] for c in by)
        d = dec.get(group, {})
        model = r.get("model")
        vals = {k: d.get(k) for k in keys}
        why = absent.get(group)
        data.append(
            {
                "task": r["task"],
                "model": model,
                "method": r["method"],
                **vals,
                "T": d.get("T"),
                "n": d.get("n", 0 if why else None),
                "absent": why,
            }
        )
        cells = [why, *[MISSING] * (len(keys) - 1)] if why else [fmt_num(vals[k]) for k in keys]
        disp.append(
            [
                task_label(r["task"]),
                model or MISSING,
                method_label(r["method"]),
                *cells,
                fmt_num(d.get("T")),
                fmt_num(d.get("n", 0 if why else None)),
            ]
        )
    note = GAP_NOTE + ("" if dec else " No stability decomposition logged: every term is missing.")
    return Table(
        name, caption, pl.DataFrame(disp, schema=cols, orient="row"), pl.DataFrame(data, infer_schema_length=None), note
    )


def _pm(mean, std) -> str:
    """`mean ± std` at 3 significant digits; the mean alone with one seed."""
    if _missing(mean):
        return MISSING
    return fmt_num(mean) if _missing(std) else f"{fmt_num(mean)} ± {fmt_num(std)}"


TABLE2_KEYS = [  # (column label, key of the eq. (4) table)
    ("Loss gap", "loss_gap"),
    ("Bound", "bound"),
    ("First-order", "first_order"),
    ("Second-order", "second_order"),
    ("C1", "C1"),
    ("C2", "C2"),
]


def table2(
    trials: pl.DataFrame,
    decomp: pl.DataFrame,
    by: Sequence[str] = ("task", "method", "model"),
    rule: Rule = BEST,
    methods: Sequence[str] | None = ("sft_cot",),
) -> Table:
    """Table 2 of the paper: the eq. (4) table at every T (loss gap, bound, bound/gap ratio, first- and
    second-order terms, C1, C2) per model, mean over the finished seeds of each group's selected
    configuration (groups `by`: task, method and model; a grid of seeds has one configuration per
    group, so every seed counts). `methods` keeps those methods only (the paper's Table 2 is SFT-CoT;
    None: all). Ratio = the Bound column / the Loss gap column, as shown; missing where the gap is 0."""
    name = "table2_decomposition_by_T"
    caption = (
        "Decomposition of eq. (4) at every T per model: loss gap |inference loss − loss given the gold prefix| "
        "(nats/token), bound, ratio bound/gap, first- and second-order terms, C1, C2; mean over seeds"
    )
    by = list(by)
    labels = {"task": "Task", "method": "Method", "model": "Model"}
    cols = [labels.get(c, c) for c in by] + ["T", "Loss gap", "Bound", "Ratio", *(c for c, _ in TABLE2_KEYS[2:]), "n"]
    mine = trials if methods is None else trials.filter(pl.col("method").is_in(list(methods)))
    selected = select_best(mine, by, rule) if mine.height else mine
    if decomp.is_empty() or selected.is_empty():
        return _empty(name, caption, "No finished trial with an eq. (4) table.", cols)
    seeds = seeds_of(mine, selected, by).select([*by, "trial_id"])
    rows = decomp.drop([c for c in by if c in decomp.columns]).join(seeds, on="trial_id", how="inner")
    if rows.is_empty():
        return _empty(name, caption, "No eq. (4) table for the selected configurations.", cols)
    keys = [k for _, k in TABLE2_KEYS]
    data = (
        rows.group_by([*by, "T"])
        .agg(
            [pl.col(k).mean() for k in keys]
            + [pl.col(k).std(ddof=1).alias(f"{k}_std") for k in keys]
            + [pl.len().alias("n")]
        )
        .sort([*by, "T"])
    )
    data = data.with_columns(
        ratio=pl.when(pl.col("loss_gap").abs() > 0).then(pl.col("bound") / pl.col("loss_gap")).otherwise(None)
    )
    disp = []
    for r in data.iter_rows(named=True):
        ident = [task_label(r[c]) if c == "task" else method_label(r[c]) if c == "method" else str(r[c]) for c in by]
        disp.append(
            [
                *ident,
                str(r["T"]),
                fmt_num(r["loss_gap"]),
                fmt_num(r["bound"]),
                fmt_num(r["ratio"]),
                *(fmt_num(r[k]) for _, k in TABLE2_KEYS[2:]),
                str(r["n"]),
            ]
        )
    return Table(name, caption, pl.DataFrame(disp, schema=cols, orient="row"), data, GAP_NOTE)


def study_table(
    trials: pl.DataFrame,
    by: Sequence[str],
    metrics: Sequence[tuple[str, str, bool]],
    name: str,
    caption: str,
    labels: dict[str, str] | None = None,
) -> Table:
    """A grid study's table (every configuration run with several seeds, no selection): one row per
    combination of the `by` columns, with n and mean ± sample std (ddof=1) over its finished trials of
    each metric (`metrics`: (column label, metric, shown in percent)). A metric no trial logged is
    left out of the table, with a note naming it."""
    by = list(by)
    labels = {"task": "Task", "method": "Method", "model": "Model", "lam": "λ", "bits": "Bits", **(labels or {})}
    done = (
        one_per_seed(trials.filter(pl.col("status").is_null() | (pl.col("status") == "FINISHED")))
        if trials.height
        else trials
    )
    missing_by = [c for c in by if c not in done.columns]
    present = [(lab, m, pct) for lab, m, pct in metrics if m in done.columns and done[m].drop_nulls().len() > 0]
    cols = [labels.get(c, c) for c in by] + ["n", *(lab for lab, _, _ in present)]
    if done.is_empty() or missing_by:
        why = f"no trial logged {', '.join(missing_by)}" if missing_by and not done.is_empty() else "no finished trial"
        return _empty(name, caption, f"{why.capitalize()}.", cols)
    aggs = [pl.len().alias("n")]
    for _, m, _ in present:
        aggs += [pl.col(m).mean().alias(f"{m}_mean"), pl.col(m).std(ddof=1).alias(f"{m}_std")]
    data = done.group_by(by).agg(aggs).sort(by, nulls_last=True)
    scale = _pct_scale(done["test_acc"]) if "test_acc" in done.columns else 100.0

    def ident(c, v):
        if c == "task":
            return task_label(v)
        if c == "method":
            return method_label(v)
        return fmt_num(v) if isinstance(v, float) else MISSING if v is None else str(v)

    disp = []
    for r in data.iter_rows(named=True):
        cells = [
            fmt_pm(r[f"{m}_mean"], r[f"{m}_std"], scale) if pct else _pm(r[f"{m}_mean"], r[f"{m}_std"])
            for _, m, pct in present
        ]
        disp.append([*(ident(c, r[c]) for c in by), str(r["n"]), *cells])
    absent = [m for _, m, _ in metrics if (m, True) not in {(x, True) for _, x, _ in present}]
    note = f"Not logged by any finished trial: {', '.join(absent)}." if absent else ""
    return Table(name, caption, pl.DataFrame(disp, schema=cols, orient="row"), data, note)


STUDY_METRICS = [  # (column label, metric, scale to percent)
    ("Test acc. (%)", "test_acc", True),
    ("Loss gap", "test_loss_gap_at_T", False),
    ("Bound", "test_bound_at_T", False),
    ("Σρ", "test_eaf_at_T", False),
    ("Σε", "test_sum_eps_at_T", False),
]


def bits_study(trials: pl.DataFrame, by: Sequence[str] = ("task", "method", "lam", "bits")) -> Table:
    """Table 3 of a grid study (every configuration run with several seeds, no selection): per
    (task, method, λ, bits), mean ± sample std (ddof=1) over the finished trials of test accuracy and
    the eq. (4) table read at stability_T (the `test_*_at_T` metrics: Σρ = test_eaf_at_T, Σε =
    test_sum_eps_at_T, each on the method's evaluation chain), with n and the T used."""
    name = BITS_STUDY
    caption = "Table 3 at laptop scale: eq. (4) terms per λ and bit-width at T = stability_T, mean ± std over seeds"
    by = list(by)
    cols = ["Task", "Method", "λ", "Bits", "n", *(c for c, _, _ in STUDY_METRICS), "T"]
    done = one_per_seed(trials.filter(pl.col("status").is_null() | (pl.col("status") == "FINISHED")))
    need = [m for _, m, _ in STUDY_METRICS] + ["stability_T"]
    if done.is_empty() or any(c not in done.columns for c in need + by):
        return _empty(name, caption, "No finished trial with the test_*_at_T metrics.", cols)
    aggs = [pl.len().alias("n")]
    for _, m, _ in STUDY_METRICS:
        aggs += [pl.col(m).mean().alias(f"{m}_mean"), pl.col(m).std(ddof=1).alias(f"{m}_std")]
    aggs += [pl.col("stability_T").min().alias("T_min"), pl.col("stability_T").max().alias("T_max")]
    data = done.group_by(by).agg(aggs).sort(by)
    scale = _pct_scale(done["test_acc"])
    disp = []
    for r in data.iter_rows(named=True):
        T = (
            MISSING
            if r["T_min"] is None
            else f"{r['T_min']:g}" + (f"–{r['T_max']:g}" if r["T_max"] != r["T_min"] else "")
        )
        cells = []
        for _, m, pct in STUDY_METRICS:
            mean, std = r[f"{m}_mean"], r[f"{m}_std"]
            cells.append(fmt_pm(mean, std, scale) if pct else _pm(mean, std))  # accuracy: %, one decimal
        disp.append(
            [
                task_label(r["task"]),
                method_label(r["method"]),
                fmt_num(r["lam"]),
                str(r["bits"]),
                str(r["n"]),
                *cells,
                T,
            ]
        )
    return Table(name, caption, pl.DataFrame(disp, schema=cols, orient="row"), data)


# ----------------------------------------------------------------------------------- Table 5, EAF


def table5(trials: pl.DataFrame, rule: Rule = BEST) -> Table:
    """The selected hyperparameters per (task, method); one that ran without a finished trial keeps its
    row, saying so."""
    name, caption = "table5_hparams", f"Selected hyperparameters per task and method ({rule.describe()})"
    selected = select_best(trials, rule=rule)
    if selected.is_empty():
        return _empty(name, caption, "No finished trials.", ["Task", "Method"])
    from stabray.record import EPOCH_METRICS, FINAL_METRICS, META_COLUMNS, is_metric

    # every metric column is left out, the sized ones too (test_acc_n5, trivial_test_acc_n5: a trial frame
    # gets one column per size a task evaluated at, and a failed trial's null makes them look "varied")
    params = [
        c
        for c in trials.columns
        if c not in META_COLUMNS
        and c not in NOT_HPARAMS
        and c not in FINAL_METRICS + EPOCH_METRICS
        and not is_metric(c)
    ]
    varied = [c for c in params if c not in HPARAMS and trials[c].n_unique() > 1]
    hp = [c for c in HPARAMS if c in trials.columns and trials[c].drop_nulls().len() > 0] + sorted(varied)
    absent = _unselected(trials, selected, GROUP)
    tasks = ordered(selected["task"].to_list() + [k[0] for k in absent], TASK_ORDER)
    meths = ordered(selected["method"].to_list() + [k[1] for k in absent], PAPER_METHODS)
    blank = {c: None for c in selected.columns}
    rows = sorted(
        [*selected.iter_rows(named=True), *({**blank, "task": t, "method": m} for t, m in absent)],
        key=lambda r: (tasks.index(r["task"]), meths.index(r["method"])),
    )
    cols = ["Task", "Method", *(HPARAM_LABELS.get(c, c) for c in hp), "Best val. acc. (%)", "Trial"]
    scale = _pct_scale(selected["score"])

    def show(c, v):
        if _missing(v):
            return MISSING
        if c == "bits":
            return "32 (full)" if v == 32 else f"{v}-bit"
        return fmt_num(v) if isinstance(v, float) else str(v)

    disp = [
        [
            task_label(r["task"]),
            method_label(r["method"]),
            *(show(c, r[c]) for c in hp),
            f"{r['score'] * scale:.1f}" if r["trial_id"] is not None else absent[(r["task"], r["method"])],
            r["trial_id"] or MISSING,
        ]
        for r in rows
    ]
    data = pl.DataFrame(rows, schema=selected.schema)  # the CSV in the order of the displayed rows
    data = data.select(["task", "method", *hp, "score", "trial_id", "config_key"]).rename({"score": "best_val_acc"})
    why = [None if r["trial_id"] is not None else absent[(r["task"], r["method"])] for r in rows]
    data = data.with_columns(absent=pl.Series(why, dtype=pl.Utf8))
    return Table(name, caption, pl.DataFrame(disp, schema=cols, orient="row"), data)


def eaf_reduction(trials: pl.DataFrame, methods: Sequence[str] = PAPER_METHODS, rule: Rule = BEST) -> Table:
    """EAF(SFT-CoT) / EAF(method) per task: how many times smaller the method's EAF is."""
    name = "eaf_reduction"
    caption = (
        f"EAF reduction factor relative to {method_label(REFERENCE_METHOD)} (EAF(SFT-CoT) / EAF(method), "
        "test EAF of the final model at T_max (test_eaf), selected configurations, mean over seeds)"
    )
    tasks = ordered(trials["task"].to_list(), TASK_ORDER)
    meths = ordered(list(methods) + trials["method"].to_list(), list(methods))
    if not tasks:
        return _empty(name, caption, "No trials logged.", ["Method"])
    stats = mean_std(trials, select_best(trials, rule=rule), "test_eaf")
    eaf = {(r["task"], r["method"]): r["mean"] for r in stats.iter_rows(named=True)}
    data, display = [], {"Method": [method_label(m) for m in meths]}
    for t in tasks:
        ref = eaf.get((t, REFERENCE_METHOD))
        col = []
        for m in meths:
            e = eaf.get((t, m))
            factor = ref / e if ref is not None and e not in (None, 0.0) else None
            data.append({"task": t, "method": m, "eaf": e, "eaf_reference": ref, "reduction": factor})
            # a method without an EAF says why, as Table 1 does: not run, no finished trial, or finished without one
            col.append((_absent(trials, t, m) if e is None else MISSING) if factor is None else f"{factor:.2f}×")
        display[task_label(t)] = col
    notes = []
    if not eaf:
        notes.append("No trial logged an EAF.")
    elif not any(m == REFERENCE_METHOD for _, m in eaf):
        notes.append(f"No {REFERENCE_METHOD} trial with an EAF: factors cannot be computed.")
    schema = {
        "task": pl.Utf8,
        "method": pl.Utf8,
        "eaf": pl.Float64,
        "eaf_reference": pl.Float64,
        "reduction": pl.Float64,
    }
    return Table(name, caption, pl.DataFrame(display), pl.DataFrame(data, schema=schema), " ".join(notes))


def all_tables(trials: pl.DataFrame, decomp: pl.DataFrame, rule: Rule = BEST) -> list[Table]:
    """The paper's tables, each (task, method)'s configuration chosen by `rule`."""
    sized = table1_sized(trials, rule=rule)
    # the +10% / +20% tables only where some trial logged them (a spec with explicit sizes has none)
    length = [
        table1_length(trials, longer=longer, rule=rule)
        for longer, metric in ((False, "test_long_acc"), (True, "test_longer_acc"))
        if not sized or (metric in trials.columns and trials[metric].is_not_null().any())
    ]
    return [
        table1(trials, rule=rule),
        *length,
        *sized,
        method_tests(trials, rule=rule),
        table3(trials, decomp, rule=rule),
        table4(trials, decomp, rule=rule),
        table5(trials, rule=rule),
        eaf_reduction(trials, rule=rule),
    ]
