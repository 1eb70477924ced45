"""Every table `reproduce` and `report` write, checked cell by cell against the MLflow store they read.

One tiny real sweep (SFT-CoT, Algorithm 1 at 4 and 32 bits, and an NSO whose weight noise makes every
trial fail, x 2 seeds, FIFO, the eq. (4) table on) fills a temporary sqlite store; a tiny study then
writes its tables through `reproduce`, and `report` writes its own. The test reads the trials back
with `mlflow.tracking.MlflowClient` only (runs, params, tags, metric histories; the eq. (4) table
downloaded and parsed with `json`), re-implements the documented selection rule (per group, the best
validation accuracy among FINISHED trials, ties to the lower last-epoch `val_eaf`, then the lower
trial id; a configuration's seeds are the finished trials with every param but `seed` equal), and
recomputes every cell with numpy (mean, sample std with ddof=1, n). Displayed cells are compared
within their printed rounding, CSV cells at full precision; the words of empty cells (`not run`,
`no finished trial`, `–`) are checked where the store implies them."""

import csv
import json
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

SWEEPS = Path(__file__).resolve().parent.parent / "sweeps"
EXPERIMENT = "tables-check"
SEEDS = 2
PAPER_METHODS = ["no_cot", "sft_cot", "implicit_cot", "coconut", "nso", "alg1"]
LABELS = {
    "no_cot": "No CoT",
    "sft_cot": "SFT-CoT",
    "implicit_cot": "Implicit CoT",
    "coconut": "Coconut",
    "nso": "NSO",
    "alg1": "Algorithm 1",
}
PAPER_T = 5
# the study's outputs: every table builder `reproduce` drives (report adds eaf_reduction and the front)
OUTPUTS = ("table1", "table1_length", "table2", "table3", "bits_study", "table4", "table5", "appendix_b2")

SPEC = {
    "include": str(SWEEPS / "_base.yaml"),
    "name": EXPERIMENT,
    "task": {
        "name": "dijkstra",
        # 3 nodes and 256 training examples: enough for the tiny model to answer some questions after
        # 3 epochs, so the accuracies differ between trials (at 4 nodes every trial scored 0.0)
        "params": {"n_nodes": 3, "decimals": 1, "long_sizes": [4]},
        "train_size": 256,
        "val_size": 8,
        "test_size": 8,
    },
    "model": {"preset": "tiny"},
    "methods": [
        {"name": "sft_cot", "space": {}},
        {"name": "alg1", "params": {"lam": 0.5}, "space": {"bits": {"choice": [4, 32]}}},
        # weight noise of 1e30: the loss is not finite at the first step, so every NSO trial FAILS
        {"name": "nso", "params": {"sigma": 1.0e30, "samples": 1}, "space": {}},
    ],
    "train": {"epochs": 3, "batch_size": 16, "warmup_steps": 1, "threads": 1, "lr": 0.003},
    "eval": {
        "eaf_examples": 4,
        "eaf_iters": 2,
        "decomposition_examples": 8,  # the eq. (4) table on every test example (chains of 0-2 steps)
        "stability_T": PAPER_T,
        "weight_noise_seeds": 0,
    },
    "search": {
        "searcher": "grid",
        "scheduler": "fifo",
        "num_samples": 1,
        "max_concurrent": 1,
        "space": {"lam": None, "bits": None, "lr": None, "seed": {"choice": [0, 1]}},
    },
    "device": "cpu",
}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The sweep (once), the study's tables (`reproduce`) and the report's (`report`)."""
    from analysis.report import build_report
    from analysis.studies import Plan, Study, reproduce

    tmp = tmp_path_factory.mktemp("tables")
    mp = pytest.MonkeyPatch()
    mp.setenv("STABRAY_CACHE", str(tmp / "cache"))
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    mp.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    spec = tmp / "tables_check.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    uri = f"sqlite:///{tmp}/mlflow.db"
    plan = Plan((str(spec),), OUTPUTS)
    try:
        repro = reproduce(
            Study("check", "every table builder", plan, plan),
            "laptop",
            seeds=SEEDS,
            tracking_uri=uri,
            storage=str(tmp / "ray"),
            out=tmp / "repro",
            address="local",
        )
        report = build_report(EXPERIMENT, uri, out=tmp / "report")
    finally:
        mp.undo()
    return SimpleNamespace(uri=uri, repro=repro, report=report, tmp=tmp)


@pytest.fixture(scope="module")
def store(built):
    """The trials as the MLflow client sees them, nothing from stabray or analysis."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(built.uri)
    exp = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    trials = []
    for r in runs:
        tags = r.data.tags
        if tags.get("stabray.role") != "trial":
            continue
        rid = r.info.run_id
        hist = sorted((m.step, m.value) for m in client.get_metric_history(rid, "val_acc"))
        decomp = None
        if any(a.path == "stability/decomposition.json" for a in client.list_artifacts(rid, "stability")):
            path = client.download_artifacts(rid, "stability/decomposition.json", str(built.tmp / "dl" / rid))
            decomp = json.loads(Path(path).read_text())  # NaN parses as float nan
        metrics = dict(r.data.metrics)
        trials.append(
            SimpleNamespace(
                id=tags["stabray.trial_id"],
                name=r.info.run_name,
                status=tags.get("stabray.status") or r.info.status,
                params=dict(r.data.params),
                metrics=metrics,
                # the selection score: max val_acc over epochs, else the last val_acc
                score=max(v for _, v in hist) if hist else metrics.get("val_acc"),
                epochs=max((s for s, _ in hist), default=None),
                val_eaf=metrics.get("val_eaf"),
                decomp=decomp,
            )
        )
    return trials


# ----------------------------------------------------------------------------------- the reference


def finished(trials):
    return [t for t in trials if t.status == "FINISHED"]


def key(t, by):
    return tuple(t.params.get(c) for c in by)


def config(t):
    return {k: v for k, v in t.params.items() if k != "seed"}


def select(trials, by):
    """{group: selected trial}: best score among finished trials, ties to the lower val_eaf, then trial id."""
    out = {}
    for t in finished(trials):
        if t.score is None or any(v is None for v in key(t, by)):
            continue
        rank = (-t.score, t.val_eaf if t.val_eaf is not None else np.inf, t.id)
        g = key(t, by)
        if g not in out or rank < out[g][0]:
            out[g] = (rank, t)
    return {g: t for g, (_, t) in out.items()}


def seeds(trials, chosen, by):
    return [t for t in finished(trials) if key(t, by) == key(chosen, by) and config(t) == config(chosen)]


def stats(values):
    """(mean, sample std or None with one value, n) of the non-missing values."""
    v = np.array([x for x in values if x is not None and np.isfinite(x)], dtype=float)
    if not len(v):
        return None, None, 0
    return float(v.mean()), (float(v.std(ddof=1)) if len(v) > 1 else None), len(v)


def row_at(t, T=PAPER_T):
    """The trial's eq. (4) row at min(T, its T_max)."""
    rows = [r for r in t.decomp or [] if r["T"] <= T]
    return max(rows, key=lambda r: r["T"]) if rows else None


def ran(trials, by):
    """Every group (values of `by`) with at least one trial, whatever its status."""
    return {key(t, by) for t in trials if all(v is not None for v in key(t, by))}


def why_empty(trials, by, g):
    """What a row-per-group table shows for a group without a selected trial."""
    mine = [t for t in trials if key(t, by) == g]
    return "no finished trial" if not finished(mine) else "–"


def absent(trials, method, task="dijkstra"):
    mine = [t for t in trials if t.params.get("method") == method and t.params.get("task") == task]
    return "not run" if not mine else "no finished trial" if not finished(mine) else "–"


# ----------------------------------------------------------------------------------- reading tables

_NUM = r"-?\d+(?:\.\d+)?(?:e[+-]\d+)?"


def tol(shown: str) -> float:
    """Half a unit of the last printed digit (what the printed rounding can hide)."""
    m = re.fullmatch(r"-?\d+(?:\.(\d+))?(?:e([+-]\d+))?", shown)
    assert m, f"not a number: {shown!r}"
    return 0.5 * 10.0 ** (-len(m.group(1) or "") + int(m.group(2) or 0)) * (1 + 1e-9)


def shows(shown: str, value, what=""):
    if value is None:
        assert shown == "–", (what, shown)
        return
    assert shown != "–", (what, "missing cell for", value)
    assert abs(float(shown) - value) <= tol(shown), (what, shown, value)


def shows_pm(cell: str, mean, std, n=None, scale=1.0, what=""):
    """`mean ± std (n=k)` (the std left out with one value, `(n=k)` only where the table shows it)."""
    m = re.fullmatch(rf"({_NUM})(?: ± ({_NUM}))?(?: \(n=(\d+)\))?", cell)
    assert m, (what, cell)
    shows(m.group(1), mean * scale, what)
    if std is None:
        assert m.group(2) is None, (what, cell)
    else:
        shows(m.group(2), std * scale, what)
    if n is not None:
        assert m.group(3) == str(n), (what, cell, n)


def md(path: Path):
    """(caption, header, rows as dicts, note) of a table's Markdown."""
    lines = path.read_text().splitlines()
    caption = lines[0].strip("*")
    table = [ln for ln in lines if ln.startswith("|")]
    split = lambda ln: [c.strip().replace(r"\|", "|") for c in ln.strip().strip("|").split(" | ")]  # noqa: E731
    header = split(table[0]) if table else []
    rows = [dict(zip(header, split(ln), strict=True)) for ln in table[2:]]
    notes = [ln.strip("_") for ln in lines if ln.startswith("_")]
    return caption, header, rows, " ".join(notes)


def csv_rows(path: Path):
    with path.open() as f:
        return list(csv.DictReader(f))


def close(text: str, value, what=""):
    if value is None:
        assert text == "", (what, text)
    else:
        assert text != "" and float(text) == pytest.approx(value, rel=1e-9, abs=1e-12), (what, text, value)


# ----------------------------------------------------------------------------------- the checks


def methods_in(trials):
    extra = sorted({t.params["method"] for t in trials} - set(PAPER_METHODS))
    return PAPER_METHODS + extra


def check_table1(store, folder: Path, stem: str, metric: str):
    by = ("task", "method")
    chosen = select(store, by)
    caption, header, rows, note = md(folder / f"{stem}.md")
    assert header == ["Method", "Dijkstra"]
    data = {(r["task"], r["method"]): r for r in csv_rows(folder / f"{stem}.csv")}
    meths = methods_in(store)
    assert [r["Method"] for r in rows[: len(meths)]] == [LABELS[m] for m in meths]
    any_cell = False
    for m, row in zip(meths, rows, strict=False):
        sel = chosen.get(("dijkstra", m))
        mean, std, n = stats([t.metrics.get(metric) for t in seeds(store, sel, by)]) if sel else (None, None, 0)
        what = (stem, m)
        if n:
            any_cell = True
            shows_pm(row["Dijkstra"], mean, std, n, 100, what)
        else:
            assert row["Dijkstra"] == absent(store, m), what
        c = data[("dijkstra", m)]
        close(c["mean_pct"], None if mean is None else mean * 100, what)
        close(c["std_pct"], None if std is None else std * 100, what)
        assert int(c["n_seeds"]) == n, what
    floor = [t.metrics[f"trivial_{metric}"] for t in store if f"trivial_{metric}" in t.metrics]
    if floor:
        assert rows[-1]["Method"] == "Best trivial rule"
        shows(rows[-1]["Dijkstra"], float(np.mean(floor)) * 100, (stem, "floor"))
        close(data[("dijkstra", "best_trivial_rule")]["mean_pct"], float(np.mean(floor)) * 100)
    else:
        assert len(rows) == len(meths) and ("dijkstra", "best_trivial_rule") not in data
    epochs = sorted({t.epochs for sel in chosen.values() for t in seeds(store, sel, by)})
    assert caption.endswith(f"epochs run: {epochs[0]}" + (f"–{epochs[-1]}" if len(epochs) > 1 else ""))
    assert (note == "") == any_cell, (stem, note)
    return any_cell


def test_table1_every_cell(store, built):
    for folder in (built.repro, built.report):
        assert check_table1(store, folder, "table1_accuracy", "test_acc")
        assert check_table1(store, folder, "table1_n4", "test_acc_n4")
    # +10% / +20% inputs were never evaluated (the task has explicit long sizes): the report leaves
    # their tables out rather than write tables of empty cells
    for stem, metric in (("table1_length", "test_long_acc"), ("table1_length_20", "test_longer_acc")):
        assert not any(metric in t.metrics for t in store)
        assert not (built.report / f"{stem}.md").exists()


def test_method_tests_every_cell(store, built):
    """Algorithm 1 minus each method on test_acc and test_acc_n4: the difference of the selected
    configurations' seed means (points) and scipy's Welch p on the same seeds, read from MLflow."""
    from scipy.stats import ttest_ind

    by = ("task", "method")
    chosen = select(store, by)
    ref = chosen.get(("dijkstra", "alg1"))
    assert ref is not None
    for folder in (built.repro, built.report):
        caption, header, rows, _ = md(folder / "method_tests.md")
        assert header == ["Task", "Method", "test_acc Δ", "test_acc p", "test_acc_n4 Δ", "test_acc_n4 p"]
        shown = {r["Method"]: r for r in rows}
        expected = [m for m in methods_in(store) if m != "alg1" and chosen.get(("dijkstra", m))]
        assert list(shown) == [LABELS[m] for m in expected], (folder, list(shown))
        for m in expected:
            for metric in ("test_acc", "test_acc_n4"):
                a = [t.metrics[metric] for t in seeds(store, ref, by) if metric in t.metrics]
                b = [t.metrics[metric] for t in seeds(store, chosen[("dijkstra", m)], by) if metric in t.metrics]
                cell = shown[LABELS[m]]
                shows(cell[f"{metric} Δ"].lstrip("+"), (np.mean(a) - np.mean(b)) * 100, (m, metric))
                if len(a) > 1 and len(b) > 1 and np.var(a) + np.var(b) > 0:
                    p = float(ttest_ind(a, b, equal_var=False).pvalue)
                    if cell[f"{metric} p"] == "<0.001":
                        assert p < 0.0005, (m, metric, p)
                    else:
                        shows(cell[f"{metric} p"], p, (m, metric))
                else:
                    assert cell[f"{metric} p"] in ("–", "0.000", "1.000"), (m, metric, cell)


def test_store_holds_what_the_tables_need(store):
    """The sweep is the one the checks assume: a failed method, two configurations of alg1, eq. (4) tables."""
    by_method = {}
    for t in store:
        by_method.setdefault(t.params["method"], []).append(t)
    assert {m: len(ts) for m, ts in by_method.items()} == {"sft_cot": SEEDS, "alg1": 2 * SEEDS, "nso": SEEDS}
    assert all(t.status == "FAILED" for t in by_method["nso"])
    assert all(t.status == "FINISHED" and t.decomp for t in by_method["sft_cot"] + by_method["alg1"])
    # the at-T metrics are the eq. (4) table's row at T = stability_T (T_max if shorter)
    for t in finished(store):
        r = row_at(t, int(t.metrics["stability_T"]))
        assert r["T"] == t.metrics["stability_T"] == min(PAPER_T, max(x["T"] for x in t.decomp))
        for metric, k in (("eaf", "eaf"), ("sum_eps", "sum_eps"), ("bound", "bound"), ("loss_gap", "loss_gap")):
            assert t.metrics[f"test_{metric}_at_T"] == pytest.approx(r[k], rel=1e-6, abs=1e-9)
    # something for ddof=1 to differ from ddof=0 on
    assert np.std([row_at(t)["bound"] for t in by_method["sft_cot"]]) > 0
    # and accuracies that differ, so that reading another column or another statistic shows
    accs = [t.metrics["test_acc"] for t in finished(store)]
    assert len(set(accs)) >= 3 and np.std([t.metrics["test_acc"] for t in by_method["sft_cot"]]) > 0, accs


def test_table2_every_cell(store, built):
    by = ("task", "method", "model")
    sft = [t for t in store if t.params["method"] == "sft_cot"]
    chosen = select(sft, by)
    _, header, rows, _ = md(built.repro / "table2_decomposition_by_T.md")
    keys = ["loss_gap", "bound", "first_order", "second_order", "C1", "C2"]
    labels = ["Loss gap", "Bound", "First-order", "Second-order", "C1", "C2"]
    assert header == ["Task", "Method", "Model", "T", *labels[:2], "Ratio", *labels[2:], "n"]
    expected = []
    for g, sel in sorted(chosen.items()):
        trials = seeds(sft, sel, by)
        for T in sorted({r["T"] for t in trials for r in t.decomp}):
            at = [next(r for r in t.decomp if r["T"] == T) for t in trials if any(r["T"] == T for r in t.decomp)]
            expected.append((g, T, {k: stats([r[k] for r in at]) for k in keys}))
    data = csv_rows(built.repro / "table2_decomposition_by_T.csv")
    assert len(rows) == len(data) == len(expected) > 1
    for row, c, (g, T, s) in zip(rows, data, expected, strict=True):
        what = ("table2", g, T)
        assert (row["Task"], row["Method"], row["Model"], row["T"]) == ("Dijkstra", "SFT-CoT", g[2], str(T))
        assert (c["task"], c["method"], c["model"], int(c["T"])) == (*g, T)
        for k, lab in zip(keys, labels, strict=True):
            mean, std, n = s[k]
            shows(row[lab], mean, what + (k,))
            close(c[k], mean, what + (k,))
            close(c[f"{k}_std"], std, what + (k, "std"))
        n = s["bound"][2]
        assert row["n"] == str(n) and int(c["n"]) == n
        gap, bound = s["loss_gap"][0], s["bound"][0]
        ratio = bound / gap if gap != 0 else None
        shows(row["Ratio"], ratio, what + ("ratio",))
        close(c["ratio"], ratio, what + ("ratio",))


def test_table3_every_cell(store, built):
    by = ("task", "method", "bits")
    chosen = select(store, by)
    winners = {key(t, ("task", "method", "bits")) for t in select(store, ("task", "method")).values()}
    order = lambda g: (PAPER_METHODS.index(g[1]), int(g[2]))  # noqa: E731
    groups = sorted(ran(store, by), key=order)  # a group without a finished trial too: its row says so
    cols = ["Task", "Method", "Bits", "Test acc. (%)", "Loss gap", "Bound", "Σρ", "Σε", "T", "n", "sel."]
    for folder in (built.repro, built.report):
        _, header, rows, _ = md(folder / "table3_bits.md")
        data = csv_rows(folder / "table3_bits.csv")
        # NSO logged no bits param: not a row of the per-bit-width table (tests/test_analysis.py has one that is)
        assert header == cols and len(rows) == len(data) == len(groups) == len(chosen) == 3
        for row, c, g in zip(rows, data, groups, strict=True):
            what = ("table3", g)
            if g not in chosen:
                why = why_empty(store, by, g)
                assert why == "no finished trial" and (row["Method"], row["Bits"]) == (LABELS[g[1]], g[2])
                assert row["Test acc. (%)"] == c["absent"] == why and int(c["n_acc"]) == 0, (what, row)
                assert all(row[k] == "–" for k in cols[4:-1]) and row["sel."] == "", (what, row)
                continue
            trials = seeds(store, chosen[g], by)
            assert (row["Method"], row["Bits"]) == (LABELS[g[1]], g[2]) and (c["method"], c["bits"]) == g[1:]
            mean, std, n = stats([t.metrics.get("test_acc") for t in trials])
            shows_pm(row["Test acc. (%)"], mean, std, n, 100, what)
            close(c["test_acc_pct"], mean * 100)
            close(c["test_acc_std_pct"], None if std is None else std * 100)
            at = [row_at(t) for t in trials if row_at(t)]
            for lab, k, col in (
                ("Loss gap", "loss_gap", "loss_gap"),
                ("Bound", "bound", "bound"),
                ("Σρ", "eaf", "sum_rho"),
                ("Σε", "sum_eps", "sum_eps"),
            ):
                m, s, _ = stats([r[k] for r in at])
                shows_pm(row[lab], m, s, what=what + (k,))
                close(c[col], m, what + (k,))
                close(c[f"{col}_std"], s, what + (k, "std"))
            T = max(r["T"] for r in at)
            assert row["T"] == str(T) and int(c["T"]) == T
            assert row["n"] == str(len(at)) and int(c["n_decomposition"]) == len(at) and int(c["n_acc"]) == n
            assert (row["sel."] == "*") == (g in winners) and (c["selected"] == "true") == (g in winners)


def test_table4_every_cell(store, built):
    by = ("task", "method")
    chosen = select(store, by)
    keys = ["loss_gap", "bound", "first_order", "second_order", "C1", "C2"]
    labels = ["Loss gap", "Bound", "First-order", "Second-order", "C1", "C2"]
    groups = sorted(ran(store, by), key=lambda g: PAPER_METHODS.index(g[1]))
    for folder in (built.repro, built.report):
        _, header, rows, _ = md(folder / "table4_decomposition.md")
        data = csv_rows(folder / "table4_decomposition.csv")
        assert header == ["Task", "Model", "Method", *labels, "T", "n"]
        assert len(rows) == len(data) == len(groups) == 3 and len(chosen) == 2  # NSO: a row saying why
        for row, c, g in zip(rows, data, groups, strict=True):
            what = ("table4", g)
            if g not in chosen:
                why = why_empty(store, by, g)
                model = next(t.params["model"] for t in store if key(t, by) == g)
                assert why == "no finished trial" and (row["Method"], row["Model"]) == (LABELS[g[1]], model)
                assert row["Loss gap"] == c["absent"] == why and row["n"] == c["n"] == "0", (what, row)
                assert all(row[k] == "–" for k in [*labels[1:], "T"]), (what, row)
                continue
            sel = chosen[g]
            at = [row_at(t) for t in seeds(store, sel, by) if row_at(t)]
            assert (row["Method"], row["Model"]) == (LABELS[g[1]], sel.params["model"])
            for k, lab in zip(keys, labels, strict=True):
                mean = stats([r[k] for r in at])[0]
                shows(row[lab], mean, what + (k,))
                close(c[k], mean, what + (k,))
            T = max(r["T"] for r in at)
            assert row["T"] == str(T) and int(c["T"]) == T and row["n"] == str(len(at)) and int(c["n"]) == len(at)


def grid_rows(store, by):
    groups = {}
    for t in finished(store):
        groups.setdefault(key(t, by), []).append(t)
    return groups


def check_grid(store, path: Path, by, labels, metrics):
    """A grid-study table: per combination of `by` (params), n and mean ± std of each (label, metric, pct)."""
    _, header, rows, note = md(path.with_suffix(".md"))
    data = csv_rows(path.with_suffix(".csv"))
    present = [(lab, m, pct) for lab, m, pct in metrics if any(m in t.metrics for t in finished(store))]
    assert header[: len(labels)] == labels and header[len(labels) :][: 1 + len(present)] == [
        "n",
        *(lab for lab, _, _ in present),
    ]
    expected = grid_rows(store, by)
    assert len(rows) == len(data) == len(expected)
    for row, c in zip(rows, data, strict=True):
        g = tuple(c[b] for b in by)  # the CSV writes each param as the store holds it
        ts = expected[g]
        what = (path.name, g)
        assert row["Method"] == LABELS[g[1]] and row["n"] == str(len(ts)) and int(c["n"]) == len(ts)
        for lab, m, pct in present:
            mean, std, _ = stats([t.metrics.get(m) for t in ts])
            shows_pm(row[lab], mean, std, scale=100 if pct else 1, what=what + (m,))
            close(c[f"{m}_mean"], mean, what + (m,))
            close(c[f"{m}_std"], std, what + (m, "std"))
    return header, rows, data, note, expected


def test_bits_study_every_cell(store, built):
    from analysis.tables import STUDY_METRICS

    by = ("task", "method", "lam", "bits")
    header, rows, data, _, expected = check_grid(
        store, built.repro / "table3_study", by, ["Task", "Method", "λ", "Bits"], STUDY_METRICS
    )
    assert len(rows) == 3
    for row, c in zip(rows, data, strict=True):
        ts = next(ts for g, ts in expected.items() if (g[1], g[3]) == (c["method"], c["bits"]))
        T = sorted({t.metrics["stability_T"] for t in ts})
        assert row["T"] == f"{T[0]:g}" + (f"–{T[-1]:g}" if len(T) > 1 else "")
        close(c["T_min"], T[0])
        close(c["T_max"], T[-1])


def test_appendix_b2_every_cell(store, built):
    metrics = [
        ("Test acc. (%)", "test_acc", True),
        ("Weight-noise loss increase", "weight_noise_loss_increase", False),
        ("Loss gap", "test_loss_gap_at_T", False),
        ("Σρ", "test_eaf_at_T", False),
    ]
    by = ("task", "method", "lam", "train_size")
    header, rows, _, note, _ = check_grid(
        store, built.repro / "appendix_b2_noise_stability", by, ["Task", "Method", "λ", "Train size"], metrics
    )
    assert not any("weight_noise_loss_increase" in t.metrics for t in store)  # weight_noise_seeds: 0
    assert "Weight-noise loss increase" not in header
    assert note == "Not logged by any finished trial: weight_noise_loss_increase."
    assert len(rows) == 2  # alg1's two bit-widths are one row here: bits is not a column of this study


def test_table5_every_cell(store, built):
    chosen = select(store, ("task", "method"))
    by = ("task", "method")
    groups = sorted(ran(store, by), key=lambda g: PAPER_METHODS.index(g[1]))
    logged = {m for t in store for m in t.metrics}
    for folder in (built.repro, built.report):
        _, header, rows, _ = md(folder / "table5_hparams.md")
        data = csv_rows(folder / "table5_hparams.csv")
        assert header[:5] == ["Task", "Method", "Bits", "Learning rate", "λ"]
        assert header[-2:] == ["Best val. acc. (%)", "Trial"]
        # a hyperparameter column is a param of the trials, never one of their metrics
        assert not set(header) & logged and not set(data[0]) & (logged - {"best_val_acc"}), header
        assert len(rows) == len(data) == len(groups) == 3 and len(chosen) == 2
        for row, c, g in zip(rows, data, groups, strict=True):
            if g not in chosen:
                why = why_empty(store, by, g)
                assert why == "no finished trial" and row["Method"] == LABELS[g[1]], row
                assert row["Best val. acc. (%)"] == c["absent"] == why and row["Trial"] == "–" and c["trial_id"] == ""
                assert all(row[k] == "–" for k in header[2:-2]), row
                continue
            sel = chosen[g]
            assert row["Method"] == LABELS[g[1]] and row["Trial"] == sel.id == c["trial_id"]
            shows(row["Best val. acc. (%)"], sel.score * 100)
            close(c["best_val_acc"], sel.score)
            bits = int(sel.params["bits"])
            assert row["Bits"] == ("32 (full)" if bits == 32 else f"{bits}-bit")
            shows(row["Learning rate"], float(sel.params["lr"]))
            shows(row["λ"], float(sel.params["lam"]))
            for col in header[5:-2]:  # the other params that vary across trials
                v = sel.params.get(col)
                assert row[col] == ("–" if v is None else v) or float(row[col]) == pytest.approx(float(v), rel=5e-3)
            assert json.loads(c["config_key"]) == {k: v for k, v in sorted(config(sel).items())}


def test_eaf_reduction_every_cell(store, built):
    by = ("task", "method")
    chosen = select(store, by)
    eaf = {g[1]: stats([t.metrics.get("test_eaf") for t in seeds(store, sel, by)])[0] for g, sel in chosen.items()}
    _, header, rows, _ = md(built.report / "eaf_reduction.md")
    data = {r["method"]: r for r in csv_rows(built.report / "eaf_reduction.csv")}
    assert header == ["Method", "Dijkstra"]
    ref = eaf["sft_cot"]
    for m, row in zip(methods_in(store), rows, strict=True):
        e = eaf.get(m)
        factor = ref / e if e else None
        assert row["Method"] == LABELS[m]
        if factor is None:
            assert row["Dijkstra"] == absent(store, m), m
        else:
            shows(row["Dijkstra"].removesuffix("×"), factor, m)
        close(data[m]["eaf"], e, m)
        close(data[m]["eaf_reference"], ref, m)
        close(data[m]["reduction"], factor, m)


def test_pareto_front_every_cell(store, built):
    """The front of (last val_acc, max) and (last val_eaf, min) over every trial with both."""
    pts = [t for t in store if t.metrics.get("val_acc") is not None and t.val_eaf is not None]
    gain = lambda t: (t.metrics["val_acc"], -t.val_eaf)  # noqa: E731
    front = [
        t for t in pts if not any(all(a >= b for a, b in zip(gain(o), gain(t))) and gain(o) != gain(t) for o in pts)
    ]
    front.sort(key=lambda t: (-t.metrics["val_acc"], t.val_eaf))
    caption, header, rows, _ = md(built.report / "pareto_front.md")
    data = csv_rows(built.report / "pareto_front.csv")
    assert [r["name"] for r in rows] == [c["name"] for c in data] == [t.name for t in front]
    for row, c, t in zip(rows, data, front, strict=True):
        shows(row["val_acc"], t.metrics["val_acc"])
        shows(row["val_eaf"], t.val_eaf)
        close(c["val_acc"], t.metrics["val_acc"])
        close(c["val_eaf"], t.val_eaf)
        assert row["status"] == c["status"] == t.status and row["seed"] == t.params["seed"]
    # the knee: farthest from the line joining the front's extremes (min-max normalised); <= 2 distinct: the best
    g = np.array([gain(t) for t in front])
    span = np.where(g.max(0) > g.min(0), g.max(0) - g.min(0), 1.0)
    z = (g - g.min(0)) / span
    if len({tuple(x) for x in g}) <= 2:
        knee = 0
    else:
        a, b = z[0], z[-1]
        d = np.abs((b[0] - a[0]) * (z[:, 1] - a[1]) - (b[1] - a[1]) * (z[:, 0] - a[0]))
        knee = int(np.argmax(d))
    assert [r["knee"] for r in rows] == ["*" if i == knee else "" for i in range(len(front))]
    # the caption counts what the front was drawn from and says what was left out
    left = [t for t in store if t not in pts]
    assert f": {len(front)} of {len(pts)} trials with every objective; left out: " in caption, caption
    assert left and all(t.status == "FAILED" for t in left)
    assert f"left out: {len(left)} failed without val_acc; " in caption, caption
