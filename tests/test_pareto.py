"""Multi-objective sweeps and stability-aware selection: the Pareto front against a brute-force
dominance check, the knee, the EAF stopping rule on a synthetic result stream, the selection rules on
a hand-built frame, spec validation of metrics/modes, and a tiny two-objective sweep through the CLI."""

import math
import random
import statistics
from pathlib import Path

import polars as pl
import pytest
import yaml

from stabray.cli import main
from stabray.pareto import FRONT, front_mask, knee_index, parse_objectives

# ----------------------------------------------------------------------------------- the front


def brute_front(points, modes):
    """O(n^2): i is on the front unless some j is >= in every objective and > in one (None: not on it)."""
    sign = [1 if m == "max" else -1 for m in modes]
    pts = [None if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in p) else p for p in points]
    out = []
    for i, p in enumerate(pts):
        if p is None:
            out.append(False)
            continue
        dominated = False
        for j, q in enumerate(pts):
            if j == i or q is None:
                continue
            ge = all(s * q[k] >= s * p[k] for k, s in enumerate(sign))
            gt = any(s * q[k] > s * p[k] for k, s in enumerate(sign))
            if ge and gt:
                dominated = True
                break
        out.append(not dominated)
    return out


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("seed", range(12))
def test_front_matches_brute_force_with_ties_duplicates_and_missing(k, seed):
    rng = random.Random(seed)
    n = rng.randint(1, 40)
    # few distinct values so ties and exact duplicates are common; some missing values
    points = [
        [rng.choice([0.0, 0.25, 0.5, 0.75, 1.0]) if rng.random() > 0.05 else None for _ in range(k)] for _ in range(n)
    ]
    if n > 3:
        points[1] = list(points[0])  # an exact duplicate
        if points[2][0] is not None:
            points[2][0] = float("nan")  # NaN counts as missing
    modes = [rng.choice(["max", "min"]) for _ in range(k)]
    names = [f"m{i}" for i in range(k)]
    df = pl.DataFrame({names[i]: [p[i] for p in points] for i in range(k)}, schema={m: pl.Float64 for m in names})
    got = front_mask(df, list(zip(names, modes))).to_list()
    assert got == brute_front(points, modes)


def test_front_by_hand():
    # (acc max, eaf min): a=(0.9, 5) b=(0.8, 2) c=(0.8, 3) d=(0.9, 5) duplicate of a, e=(0.5, 2) dominated by b
    df = pl.DataFrame({"val_acc": [0.9, 0.8, 0.8, 0.9, 0.5], "eaf": [5.0, 2.0, 3.0, 5.0, 2.0]})
    assert front_mask(df, [("val_acc", "max"), ("eaf", "min")]).to_list() == [True, True, False, True, False]


def test_knee_is_farthest_from_the_extremes_line():
    # front (acc max, eaf min): (1.0, 10), (0.9, 2), (0.5, 1), (0.95, 8); normalised over the front:
    # acc -> (x - 0.5) / 0.5, eaf -> (10 - e) / 9 (the better end at 1); extremes (1, 0) and (0, 1):
    # distance to the line x + y = 1 is |x + y - 1| / sqrt 2: (0.9, 2) -> 0.8 + 0.889 - 1 = 0.689 is largest
    df = pl.DataFrame({"val_acc": [1.0, 0.9, 0.5, 0.95, 0.4], "eaf": [10.0, 2.0, 1.0, 8.0, 9.0]})
    obj = [("val_acc", "max"), ("eaf", "min")]
    x = [(a - 0.5) / 0.5 for a in df["val_acc"][:4]]
    y = [(10 - e) / 9 for e in df["eaf"][:4]]
    expected = max(range(4), key=lambda i: abs(x[i] + y[i] - 1))
    assert knee_index(df, obj) == expected == 1
    assert knee_index(df.head(1), obj) == 0  # one member: itself
    assert (
        knee_index(
            pl.DataFrame({"val_acc": [None], "eaf": [1.0]}, schema={"val_acc": pl.Float64, "eaf": pl.Float64}), obj
        )
        is None
    )


def test_parse_objectives():
    assert parse_objectives("val_acc:max, eaf:min") == [("val_acc", "max"), ("eaf", "min")]
    with pytest.raises(ValueError, match="METRIC:max"):
        parse_objectives("val_acc:up,eaf:min")


# ----------------------------------------------------------------------------------- EAF stopper


def hand_rule(history, trial, epoch, eaf, acc, factor, top, grace, min_trials):
    """The documented rule, computed independently from the full list of earlier results."""
    if epoch < grace or eaf is None:
        return False
    eafs = [e for (t, ep, e, a) in history if ep == epoch and e is not None]
    accs = [a for (t, ep, e, a) in history if ep == epoch and a is not None]
    if len(eafs) < min_trials or not eaf > factor * statistics.median(eafs):
        return False
    better = sum(1 for a in accs if a > acc)
    return not better < math.ceil(top * len(accs))


def test_eaf_stopper_on_a_synthetic_stream_matches_a_hand_computation():
    from stabray.tune.eaf_stop import EafStopper

    rng = random.Random(0)
    factor, top, grace, min_trials = 3.0, 0.25, 2, 3
    stopper = EafStopper(factor, top, grace, min_trials)
    # 8 trials, 6 epochs, interleaved: eaf mostly ~1, some exploding (x10), accuracies spread
    alive = {f"t{i}": True for i in range(8)}
    history, stopped = [], {}
    for epoch in range(1, 7):
        order = list(alive)
        rng.shuffle(order)
        for t in order:
            if not alive[t]:
                continue
            blow = int(t[1:]) % 3 == 0 and epoch >= 2
            eaf = rng.uniform(0.8, 1.2) * (10.0 if blow else 1.0)
            acc = round(rng.uniform(0.1, 0.9), 2)
            history.append((t, epoch, eaf, acc))
            expect = hand_rule(history, t, epoch, eaf, acc, factor, top, grace, min_trials)
            got = stopper(t, {"epoch": epoch, "training_iteration": epoch, "val_eaf": eaf, "val_acc": acc})
            assert got == expect, (t, epoch, eaf, acc)
            if got:
                alive[t] = False
                stopped[t] = epoch
    assert stopped and stopper.stopped == stopped  # the stream does stop some trials
    assert all(int(t[1:]) % 3 == 0 for t in stopped)  # only exploding ones here


def test_eaf_stopper_spares_the_top_fraction_and_missing_eaf():
    from stabray.tune.eaf_stop import EafStopper

    s = EafStopper(factor=2.0, top_fraction=0.5, grace=1, min_trials=3)
    assert not s("a", {"epoch": 1, "val_eaf": 1.0, "val_acc": 0.1})
    assert not s("b", {"epoch": 1, "val_eaf": 1.0, "val_acc": 0.2})
    # median(1, 1, 10) = 1, 10 > 2: but acc 0.9 is the best of 3 -> protected
    assert not s("c", {"epoch": 1, "val_eaf": 10.0, "val_acc": 0.9})
    # median(1, 1, 10, 10) = 5.5, 12 > 11; acc 0.05: 3 better of 4, ceil(0.5 * 4) = 2 -> stopped
    assert s("d", {"epoch": 1, "val_eaf": 12.0, "val_acc": 0.05})
    assert not s("e", {"epoch": 1, "val_acc": 0.0})  # no EAF (a method without a chain): never stopped
    assert not s("f", {"epoch": 1, "val_eaf": float("nan"), "val_acc": 0.0})
    assert s("g", {"epoch": 1, "val_eaf": float("inf"), "val_acc": 0.0})  # overflow counts as exceeding
    assert s.stopped == {"d": 1, "g": 1}


# ----------------------------------------------------------------------------------- selection rules


def selection_frame():
    # one (task, method) group; score = best_val_acc; eaf = the last validation EAF; the knee worked out below
    rows = [
        ("t1", 0.90, 10.0, "FINISHED"),  # best accuracy
        ("t2", 0.895, 4.0, "FINISHED"),  # within 0.01 of the best, lower EAF
        ("t3", 0.89, 6.0, "FINISHED"),  # within 0.01 but higher EAF than t2 (dominated by t2)
        ("t4", 0.80, 1.5, "FINISHED"),  # on the front
        ("t5", 0.50, 1.0, "FINISHED"),  # the front's low-EAF extreme
        ("t6", 0.99, 0.5, "STOPPED"),  # stopped early: never selected
        ("t7", 0.895, None, "FINISHED"),  # no EAF
    ]
    return pl.DataFrame(
        {
            "trial_id": [r[0] for r in rows],
            "task": ["dijkstra"] * len(rows),
            "method": ["alg1"] * len(rows),
            "best_val_acc": [r[1] for r in rows],
            "val_acc": [r[1] for r in rows],
            "val_eaf": [r[2] for r in rows],
            "status": [r[3] for r in rows],
        },
        schema_overrides={"val_eaf": pl.Float64},
    )


def test_selection_rules_on_a_hand_built_frame():
    from analysis.select import Rule, select_best

    df = selection_frame()
    pick = lambda rule: select_best(df, rule=rule)["trial_id"].to_list()  # noqa: E731
    assert pick(Rule("best_acc")) == ["t1"]
    assert pick(Rule("eaf_within", 0.01)) == ["t2"]
    assert pick(Rule("eaf_within", 0.0)) == ["t1"]
    assert pick(Rule("eaf_within", 0.2)) == ["t4"]
    # knee: front of finished trials with an EAF = t1 (0.9, 10), t2 (0.895, 4), t4 (0.8, 1.5), t5 (0.5, 1);
    # normalised: x = (s - 0.5) / 0.4, y = (10 - e) / 9; line from t1 (1, 0) to t5 (0, 1): x + y = 1
    xs = {"t1": 1.0, "t2": 0.395 / 0.4, "t4": 0.3 / 0.4, "t5": 0.0}
    ys = {"t1": 0.0, "t2": 6 / 9, "t4": 8.5 / 9, "t5": 1.0}
    expected = max(xs, key=lambda t: abs(xs[t] + ys[t] - 1))
    assert pick(Rule("knee")) == [expected] == ["t4"]


def test_an_unknown_rule_is_a_user_error():
    from analysis.select import Rule
    from stabray.errors import UserError

    with pytest.raises(UserError, match="unknown rule"):
        Rule("best")


# ----------------------------------------------------------------------------------- spec validation


SWEEPS = Path(__file__).resolve().parent.parent / "sweeps"


def write_spec(tmp_path, search, **over):
    """A tiny dijkstra spec (as tests/test_sweep.py's) with `search` and the `over` sections merged in."""
    spec = {
        "include": str(SWEEPS / "_base.yaml"),
        "name": "mini",
        "task": {"name": "dijkstra", "params": {"n_nodes": 4, "decimals": 1}, "train_size": 48, "val_size": 8,
                 "test_size": 8},
        "model": {"preset": "tiny"},
        "train": {"epochs": 2, "batch_size": 16, "warmup_steps": 1},
        "eval": {"eaf_examples": 4, "eaf_iters": 2, "decomposition_examples": 0, "weight_noise_seeds": 0,
                 "long_splits": ["test_long"]},
        "search": {"num_samples": 3, "max_concurrent": 2, **search},
        "device": "cpu",
    }  # fmt: skip
    for k, v in over.items():
        spec[k] = {**spec.get(k, {}), **v}
    p = tmp_path / "mini.yaml"
    p.write_text(yaml.safe_dump(spec))
    return p


def test_multi_objective_spec_validates(tmp_path):
    from stabray.spec import load_spec

    spec, _ = load_spec(
        str(write_spec(tmp_path, {"metrics": ["val_acc", "val_eaf"], "modes": ["max", "min"], "scheduler": "fifo"}))
    )
    assert spec.search.objectives() == [("val_acc", "max"), ("val_eaf", "min")] and spec.search.multi
    single, _ = load_spec(str(write_spec(tmp_path, {"metric": "val_eaf", "mode": "min"})))
    assert single.search.objectives() == [("val_eaf", "min")] and not single.search.multi


@pytest.mark.parametrize(
    "search,field,words",
    [
        ({"metrics": ["val_acc", "val_eaf"], "modes": ["max"], "scheduler": "fifo"}, "search", "2 metrics but 1 modes"),
        (
            {"metrics": ["val_acc", "test_eaf"], "modes": ["max", "min"], "scheduler": "fifo"},
            "search.metrics.1",
            "test_eaf",
        ),
        ({"metrics": ["val_acc", "val_eaf"], "modes": ["max", "min"]}, "search.scheduler", "scheduler: fifo"),
        ({"modes": ["max", "min"]}, "search", "without metrics"),
        ({"metrics": ["val_acc"], "modes": ["max"], "scheduler": "fifo"}, "search", "at least two"),
        ({"metrics": ["val_acc", "val_eaf"], "modes": ["max", "up"], "scheduler": "fifo"}, "search.modes.1", ""),
        ({"eaf_stop": {"factor": 0.5}}, "search.eaf_stop.factor", ""),
        ({"eaf_stop": {"min_trials": 4}}, "search.eaf_stop.min_trials", "runs 3 trial(s)"),
    ],
)
def test_bad_objectives_are_one_line_errors(tmp_path, capsys, search, field, words):
    path = write_spec(tmp_path, search)
    assert main(["sweep", str(path), "--storage", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f": {field}:" in err and words in err and str(path) in err
    assert not (tmp_path / "runs").exists()


def test_eaf_stop_needs_the_per_epoch_eaf(tmp_path, capsys):
    path = write_spec(tmp_path, {"eaf_stop": {"factor": 3.0}}, eval={"eaf_examples": 0})
    assert main(["sweep", str(path), "--dry-run"]) == 2
    assert "search.eaf_stop: needs the per-epoch EAF" in capsys.readouterr().err


# ----------------------------------------------------------------------------------- end to end


def test_two_objective_sweep_through_the_cli_writes_the_front(tmp_path, monkeypatch, capsys):
    """mini model, 1 epoch, 3 trials: the closing table marks the front, the parent run holds it,
    and the report writes the front's table, which agrees with the brute-force check."""
    from mlflow import MlflowClient

    monkeypatch.setenv("STABRAY_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    path = write_spec(
        tmp_path,
        {"metrics": ["val_acc", "val_eaf"], "modes": ["max", "min"], "scheduler": "fifo", "eaf_stop": {"grace": 1}},
        model={"preset": "mini"},
        train={"epochs": 1, "batch_size": 16, "warmup_steps": 1},
    )
    assert yaml.safe_load(path.read_text())["search"]["num_samples"] == 3
    rc = main(["sweep", str(path), "--tracking-uri", uri, "--storage", str(tmp_path / "runs")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "== sweep mini: 3 trials (0 failed)" in out
    assert "front: * = on the Pareto front of val_acc (max), val_eaf (min)" in out

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("mini")
    parent = next(r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("stabray.role") == "sweep")
    assert parent.data.params["objectives"] == "val_acc:max,val_eaf:min" and parent.data.params["sampler"] == "nsga2"
    logged = {a.path for a in client.list_artifacts(parent.info.run_id, "pareto")}
    assert {"pareto/front.md", "pareto/front.csv"} <= logged
    assert "plots/pareto_front.png" in {a.path for a in client.list_artifacts(parent.info.run_id, "plots")}
    summary = Path(client.download_artifacts(parent.info.run_id, "summary.md", str(tmp_path))).read_text()
    header = next(line for line in summary.splitlines() if line.startswith("| trial"))
    assert [c.strip() for c in header.strip("|").split("|")][:2] == ["trial", "front"]
    assert "`front`: * = on the Pareto front of val_acc (max), val_eaf (min)." in summary

    assert (
        main(
            [
                "report",
                "--experiment",
                "mini",
                "--tracking-uri",
                uri,
                "--out",
                str(tmp_path / "rep"),
                "--no-log",
                "--select",
                "knee",
            ]
        )
        == 0
    )
    front = pl.read_csv(tmp_path / "rep" / "pareto_front.csv")
    trials = pl.read_csv(tmp_path / "rep" / "trials.csv")
    points = [[r["val_acc"], r["val_eaf"]] for r in trials.iter_rows(named=True)]
    on = [n for n, f in zip(trials["name"], brute_front(points, ["max", "min"])) if f]
    assert sorted(front["name"].to_list()) == sorted(on) and len(on) >= 1
    readme = (tmp_path / "rep" / "README.md").read_text()
    assert "Selection rule (`--select knee`)" in readme and "Pareto front of val_acc (max), val_eaf (min)" in readme
    assert (tmp_path / "rep" / "pareto_front.png").stat().st_size > 0
    assert FRONT not in front.columns  # the table shows members, not the mask


def test_front_caption_says_what_was_left_out_and_why():
    """Stopped trials are on the front's footing (their last reported values); trials missing an
    objective are left out, counted by status and the objective they miss."""
    from analysis.pareto import pareto_table

    df = pl.DataFrame(
        {
            "name": ["a", "b", "c", "d", "e"],
            "status": ["FINISHED", "STOPPED", "FAILED", "FINISHED", "FAILED"],
            "val_acc": [0.9, 0.8, None, 0.7, None],
            "val_eaf": [5.0, 2.0, None, None, None],
        },
        schema_overrides={"val_acc": pl.Float64, "val_eaf": pl.Float64},
    )
    t = pareto_table(df, [("val_acc", "max"), ("val_eaf", "min")])
    assert t.data["name"].to_list() == ["a", "b"]
    assert t.caption.startswith(
        "Pareto front of val_acc (max), val_eaf (min): 2 of 2 trials with every objective (1 stopped early, "
        "compared at the epoch they stopped); left out: 2 failed without val_acc, 1 finished without val_eaf; "
    ), t.caption
    assert "left out" not in pareto_table(df.head(2), [("val_acc", "max"), ("val_eaf", "min")]).caption
