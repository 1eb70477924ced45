"""analysis/: loading, selection, tables and the report, on synthetic trials with known values.

Mean ± std is checked against numpy with ddof=1 (the sample std: the paper averages 3 seeds).
One test builds a real MLflow sqlite store (absolute path: MLflow 3 needs one) following the
logging schema in analysis/README.md, loads it back and writes the report.
"""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from analysis.load import load_ray
from analysis.rerun import expand_seeds, plan_reruns, seed_plan
from analysis.select import mean_std, select_best
from analysis.tables import (
    MISSING,
    NO_FINISHED,
    NOT_RUN,
    Table,
    eaf_reduction,
    latex_escape,
    table1,
    table1_length,
    table3,
    table4,
    table5,
)
from stabray.record import TrialRecord, decomposition_frame, trials_frame


def rec(
    tid,
    task="dijkstra",
    method="sft_cot",
    seed=0,
    lr=1e-3,
    bits=32,
    lam=1.0,
    val=(0.5, 0.6),
    eaf=None,
    test=None,
    long=None,
    status="FINISHED",
    decomp=None,
    **extra,
):
    params = {
        "task": task,
        "method": method,
        "seed": str(seed),
        "lr": str(lr),
        "bits": str(bits),
        "lam": str(lam),
        "model": "tiny",
        **{k: str(v) for k, v in extra.items()},
    }
    metrics = {"val_acc": val[-1]} if val else {}
    for k, v in (("test_eaf", eaf), ("test_acc", test), ("test_long_acc", long)):
        if v is not None:
            metrics[k] = v
    return TrialRecord(
        tid, params, metrics, [(i + 1, v) for i, v in enumerate(val)], status, run_id=f"run-{tid}", decomposition=decomp
    )


def decomp_rows(tmax=3, gap=0.5, bound=2.0, eaf=4.0):
    return [
        {
            "T": t,
            "loss_gap": gap * (t - 1),
            "bound": bound * (t - 1),
            "ratio": None if t == 1 else bound / gap,
            "first_order": 1.0 * (t - 1),
            "second_order": 0.5 * (t - 1),
            "C1": 0.02,
            "C2": 5.0,
            "eaf": eaf * t,
            "sum_eps": 0.1 * t,
        }
        for t in range(1, tmax + 1)
    ]


def test_frame_types_and_best_epoch():
    df = trials_frame([rec("a", val=(0.2, 0.7, 0.7, 0.4), lora_rank=16), rec("b", val=())])
    assert df.schema["lr"] == pl.Float64 and df.schema["bits"] == pl.Int64 and df.schema["lam"] == pl.Float64
    assert df.schema["seed"] == pl.Int64 and df.schema["lora_rank"] == pl.Int64
    a = df.filter(pl.col("trial_id") == "a").row(0, named=True)
    assert a["best_epoch"] == 2 and a["best_val_acc"] == 0.7 and a["n_epochs"] == 4  # first max wins
    b = df.filter(pl.col("trial_id") == "b").row(0, named=True)
    assert b["best_epoch"] is None and b["lora_rank"] is None and b["test_acc"] is None


def test_selection_ties_go_to_lower_validation_eaf():
    """Selection reads validation numbers only: ties go to the lower last-epoch validation EAF
    (`val_eaf`), never to the test EAF (`test_eaf`)."""
    trials = trials_frame(
        [
            rec("t1", lr=1e-3, val=(0.8,), eaf=1.0),  # lowest test EAF, but its validation EAF is higher
            rec("t2", lr=2e-3, val=(0.8,), eaf=9.0),  # same val, lower validation EAF: wins
            rec("t3", lr=3e-3, val=(0.7,), eaf=1.0),
            rec("t4", lr=4e-3, val=(0.9,), eaf=1.0, status="FAILED"),  # failed trials never win
            rec("t5", lr=5e-3, val=(0.95,), status="STOPPED"),  # nor trials the scheduler stopped
        ]
    )
    val_eaf = {"t1": 5.0, "t2": 3.0, "t3": 1.0, "t4": 1.0, "t5": 1.0}
    trials = trials.with_columns(val_eaf=pl.col("trial_id").replace_strict(val_eaf, return_dtype=pl.Float64))
    assert select_best(trials)["trial_id"].to_list() == ["t2"]


def test_a_repeated_seed_counts_once():
    """Two finished trials of one configuration and one seed (Optuna drawing a point of a small space
    again, a sweep repeated into the same store) are one sample of the seed's variation: mean, std, n
    and the Welch test see distinct seeds, the lowest trial id standing for a repeated one."""
    from analysis.select import repeated_seeds, seeds_of
    from analysis.tables import method_tests, welch

    accs = [0.70, 0.74, 0.79]
    rows = [rec(f"s{i}", seed=i, val=(0.8,), test=a) for i, a in enumerate(accs)]
    rows.append(rec("s9", seed=1, val=(0.8,), test=0.10))  # seed 1 again, with a later trial id
    alg1 = [rec(f"a{i}", method="alg1", seed=i, val=(0.8,), test=a + 0.1) for i, a in enumerate(accs)]
    trials = trials_frame(rows + alg1)
    assert repeated_seeds(trials) == 1
    assert sorted(seeds_of(trials, select_best(trials))["trial_id"].to_list()) == ["a0", "a1", "a2", "s0", "s1", "s2"]
    st = mean_std(trials, select_best(trials), "test_acc").filter(pl.col("method") == "sft_cot").row(0, named=True)
    assert st["n"] == 3
    assert st["mean"] == pytest.approx(np.mean(accs)) and st["std"] == pytest.approx(np.std(accs, ddof=1))
    row = method_tests(trials).data.filter((pl.col("method") == "sft_cot") & (pl.col("metric") == "test_acc"))
    row = row.row(0, named=True)
    assert (row["n_ref"], row["n"]) == (3, 3) and row["p"] == pytest.approx(welch([a + 0.1 for a in accs], accs)[2])
    from analysis.tables import study_table

    grid = study_table(trials, ("task", "method"), [("Acc", "test_acc", True)], "g", "grid").data  # no selection
    sft = grid.filter(pl.col("method") == "sft_cot").row(0, named=True)
    assert sft["n"] == 3 and sft["test_acc_mean"] == pytest.approx(np.mean(accs))


def test_one_per_seed_keeps_the_selected_trial_the_logged_metric_and_seedless_trials():
    from analysis.select import one_per_seed, seeds_of

    trials = trials_frame(
        [
            rec("t1", seed=0, val=(0.5,), test=None),  # seed 0, no test_acc logged
            rec("t2", seed=0, val=(0.9,), test=0.8),  # seed 0 again: the selected trial (best val)
            rec("t3", seed=1, val=(0.6,), test=0.7),
        ]
    )
    selected = select_best(trials)
    assert selected["trial_id"].to_list() == ["t2"]
    assert sorted(seeds_of(trials, selected)["trial_id"].to_list()) == ["t2", "t3"]  # the selected stands for 0
    st = mean_std(trials, selected, "test_acc").row(0, named=True)
    assert st["n"] == 2 and st["mean"] == pytest.approx(0.75)
    no_pref = seeds_of(trials, selected.with_columns(trial_id=pl.lit("zz")), metric="test_acc")
    assert sorted(no_pref["trial_id"].to_list()) == ["t2", "t3"]  # t1 lacks the metric: its repeat counts
    seedless = trials.with_columns(seed=pl.lit(None, dtype=pl.Int64))
    assert one_per_seed(seedless).height == 3  # no seed to compare: nothing set aside


def test_settings_no_other_param_names_are_different_configurations():
    """Trials whose configs differ only in a setting without a param of its own (model.family here)
    are two configurations (the logged `config_digest`), not four seeds of one: Table 1 shows the
    selected one's two seeds, n=2, and its floor from them; a note says when the selected
    configurations of a task logged different floors (scored on different examples)."""
    from stabray.record import trial_params

    def trial(tid, family, seed, val, test, floor=0.5):
        cfg = {"task": {"name": "dijkstra", "params": {"n_nodes": 4}}, "method": {"name": "sft_cot"},
               "model": {"family": family, "max_positions": 512}, "seed": seed}  # fmt: skip
        metrics = {"val_acc": val, "test_acc": test, "trivial_test_acc": floor}
        return TrialRecord(tid, {k: str(v) for k, v in trial_params(cfg).items()}, metrics, [(1, val)], "FINISHED")

    rows = [trial("q0", "qwen2", 0, 0.5, 0.40), trial("q1", "qwen2", 1, 0.5, 0.42)]
    rows += [trial("g0", "gpt2", 0, 0.9, 0.88), trial("g1", "gpt2", 1, 0.9, 0.86)]
    trials = trials_frame(rows)
    assert trials["config_key"].n_unique() == 2
    t = table1(trials)
    cell = t.display.filter(pl.col("Method") == "SFT-CoT")["Dijkstra"][0]
    assert cell == f"{np.mean([0.88, 0.86]) * 100:.1f} ± {np.std([0.88, 0.86], ddof=1) * 100:.1f} (n=2)"
    assert t.note == ""
    old = TrialRecord("g0", {k: v for k, v in rows[2].params.items() if k != "config_digest"}, rows[2].metrics,
                      rows[2].val_history, "FINISHED")  # fmt: skip
    mixed = trials_frame([old, rows[3]])  # logged before the digest existed: still meets the later trial
    assert mixed["config_key"].n_unique() == 1
    rows[3] = trial("g1", "gpt2", 1, 0.9, 0.86, floor=0.7)  # one seed scored on other examples
    t = table1(trials_frame(rows))
    assert t.display.filter(pl.col("Method") == "Best trivial rule")["Dijkstra"][0] == "60"
    assert "Dijkstra (0.500-0.700) logged different trivial-rule floors" in t.note


def test_a_per_epoch_eaf_counts_only_from_the_last_epoch():
    """A trial's val_eaf is its last epoch's: where the last epoch logged none (an empty sum), an
    earlier epoch's value does not stand in (the Ray Tune folder's reading; the MLflow one is checked
    in test_mlflow_store_load_and_report)."""
    from stabray.record import last_metrics

    results = [{"val_acc": 0.5, "val_eaf": 3.0, "epoch": 1}, {"val_acc": 0.6, "epoch": 2}, {"test_acc": 0.7}]
    got = last_metrics(results)
    assert "val_eaf" not in got and got["val_acc"] == 0.6 and got["test_acc"] == 0.7
    results[1]["val_eaf"] = 2.0
    assert last_metrics(results)["val_eaf"] == 2.0


def test_mean_std_over_seeds_matches_numpy():
    accs = [0.70, 0.74, 0.79]
    trials = trials_frame(
        [rec(f"s{i}", seed=i, val=(0.8 - i * 0.01,), test=a, long=a / 2) for i, a in enumerate(accs)]
        + [rec("other", lr=5e-3, val=(0.1,), test=0.0)]  # another config: not averaged in
    )
    st = mean_std(trials, select_best(trials), "test_acc").row(0, named=True)
    assert st["n"] == 3
    assert st["mean"] == pytest.approx(np.mean(accs)) and st["std"] == pytest.approx(np.std(accs, ddof=1))
    t = table1(trials)
    cell = t.display.filter(pl.col("Method") == "SFT-CoT")["Dijkstra"][0]
    assert cell == f"{np.mean(accs) * 100:.1f} ± {np.std(accs, ddof=1) * 100:.1f} (n=3)"
    csv = t.data.filter(pl.col("method") == "sft_cot").row(0, named=True)
    assert csv["mean_pct"] == pytest.approx(np.mean(accs) * 100) and csv["n_seeds"] == 3
    half = table1_length(trials).display.filter(pl.col("Method") == "SFT-CoT")["Dijkstra"][0]
    assert half == f"{np.mean(accs) * 50:.1f} ± {np.std(accs, ddof=1) * 50:.1f} (n=3)"


def test_missing_cells_are_marked():
    trials = trials_frame([rec("a", test=0.5, val=(0.5,)), rec("b", task="bfs", method="alg1", val=(0.5,))])
    t = table1(trials)
    row = t.display.filter(pl.col("Method") == "SFT-CoT").row(0, named=True)
    assert row["Dijkstra"] == "50.0 (n=1)" and row["BFS"] == NOT_RUN  # one seed: the mean alone
    assert t.display.filter(pl.col("Method") == "Coconut")["Dijkstra"][0] == NOT_RUN
    assert t.display.filter(pl.col("Method") == "Algorithm 1")["BFS"][0] == MISSING  # finished, no test_acc
    csv_lines = t.to_csv().splitlines()
    assert "bfs,sft_cot,,,0" in csv_lines  # empty in CSV
    assert "--" in t.to_latex() and MISSING in t.to_markdown()
    # no decomposition logged: tables 3 and 4 still come out, with notes
    t3, t4 = table3(trials, decomposition_frame([])), table4(trials, decomposition_frame([]))
    assert t3.note and t4.note and t3.display["Bound"].to_list() == [MISSING, MISSING]
    # no EAF at all, then no SFT-CoT EAF: reduction factors missing, with a note
    assert "EAF" in eaf_reduction(trials).note
    only_alg1 = trials.with_columns(test_eaf=pl.when(pl.col("method") == "alg1").then(2.0))
    red = eaf_reduction(only_alg1)
    assert "sft_cot" in red.note and set(red.display.drop("Method").to_numpy().ravel()) == {MISSING, NOT_RUN}
    # an empty cell says why, as in Table 1: alg1 has an EAF but no reference; coconut never ran
    assert red.display.filter(pl.col("Method") == "Algorithm 1")["BFS"][0] == MISSING
    assert red.display.filter(pl.col("Method") == "Coconut")["Dijkstra"][0] == NOT_RUN


def test_latex_escaping():
    assert latex_escape("a_b & 50% #1 $x {y} ~^\\") == (
        r"a\_b \& 50\% \#1 \$x \{y\} \textasciitilde{}\textasciicircum{}\textbackslash{}"
    )
    assert latex_escape("73.1 ± 1.4") == r"73.1 \ensuremath{\pm} 1.4"
    tex = table5(trials_frame([rec("a", task="my_task", method="my_method", val=(0.5,))])).to_latex()
    assert r"my\_task" in tex and r"my\_method" in tex and "my_task" not in tex


def test_empty_frame_tables_are_written(tmp_path):
    empty = trials_frame([])
    tables = [
        table1(empty),
        table1_length(empty),
        table3(empty, decomposition_frame([])),
        table4(empty, decomposition_frame([])),
        table5(empty),
        eaf_reduction(empty),
    ]
    for t in tables:
        assert isinstance(t, Table) and t.note
        for p in t.write(tmp_path):
            assert p.exists()
        assert t.note in t.to_markdown()


def test_decomposition_tables():
    trials = trials_frame(
        [
            rec("q1", method="alg1", bits=1, val=(0.7,), test=0.70, eaf=10.0, decomp=decomp_rows(4, eaf=1.0)),
            rec("q1b", method="alg1", bits=1, seed=1, val=(0.6,), test=0.72, eaf=12.0, decomp=decomp_rows(4, eaf=2.0)),
            rec("q4", method="alg1", bits=4, val=(0.8,), test=0.80, eaf=20.0, decomp=decomp_rows(4, eaf=3.0)),
            rec("s", method="sft_cot", bits=32, val=(0.6,), test=0.6, eaf=40.0),
        ]
    )
    decomp = decomposition_frame([r for r in [rec("q1", method="alg1", bits=1, decomp=decomp_rows(4, eaf=1.0))]])
    assert decomp.height == 4 and decomp.schema["T"] == pl.Int64
    full = decomposition_frame(
        [
            rec("q1", method="alg1", bits=1, val=(0.7,), decomp=decomp_rows(4, eaf=1.0)),
            rec("q1b", method="alg1", bits=1, seed=1, val=(0.6,), decomp=decomp_rows(4, eaf=2.0)),
            rec("q4", method="alg1", bits=4, val=(0.8,), decomp=decomp_rows(4, eaf=3.0)),
        ]
    )
    t3 = table3(trials, full)
    one_bit = t3.data.filter((pl.col("method") == "alg1") & (pl.col("bits") == 1)).row(0, named=True)
    assert one_bit["sum_rho"] == pytest.approx(6.0)  # mean of eaf*T at T=4 over the two seeds: (4 + 8) / 2
    assert one_bit["test_acc_pct"] == pytest.approx(71.0) and one_bit["T"] == 4  # T = 5 asked, T_max = 4
    assert one_bit["sum_rho_std"] == pytest.approx(np.std([4.0, 8.0], ddof=1)) and one_bit["n_decomposition"] == 2
    shown = t3.display.filter((pl.col("Method") == "Algorithm 1") & (pl.col("Bits") == "1")).row(0, named=True)
    assert shown["Σρ"] == f"6 ± {np.std([4.0, 8.0], ddof=1):.3g}" and shown["n"] == "2"
    assert shown["Test acc. (%)"] == f"71.0 ± {np.std([70.0, 72.0], ddof=1):.1f} (n=2)"
    # a trial without an eq. (4) table: its stability cells stay empty; its per-epoch or final EAF
    # (40) and its own final-answer loss gap are other quantities and never fill them
    sft = t3.data.filter(pl.col("method") == "sft_cot").row(0, named=True)
    assert sft["sum_rho"] is None and sft["loss_gap"] is None and sft["bound"] is None
    assert t4_row(trials, full, "sft_cot")["loss_gap"] is None
    assert t3.data.filter(pl.col("bits") == 4)["selected"].to_list() == [True]
    t4 = table4(trials, full).data.filter(pl.col("method") == "alg1").row(0, named=True)
    assert t4["bound"] == pytest.approx(6.0) and t4["C2"] == 5.0
    red = eaf_reduction(trials).data.filter((pl.col("method") == "alg1")).row(0, named=True)
    assert red["reduction"] == pytest.approx(40.0 / 20.0)


def t4_row(trials, decomp, method):
    return table4(trials, decomp).data.filter(pl.col("method") == method).row(0, named=True)


def test_cells_say_why_they_are_empty_and_tables_show_epochs():
    """'not run' (no trial), 'no finished trial' (all stopped / failed / killed), '–' (finished
    without the metric); stopped trials never feed a cell; the caption gives the epochs run."""
    trials = trials_frame(
        [
            rec("a", val=(0.5, 0.6, 0.7), test=0.7),
            rec("b", method="alg1", val=(0.9, 0.95), test=0.99, status="STOPPED"),  # its test_acc is never used
            rec("c", method="nso", val=(0.4,), status="FAILED"),
        ]
    )
    t = table1(trials)
    col = dict(zip(t.display["Method"].to_list(), t.display["Dijkstra"].to_list()))
    assert col["SFT-CoT"] == "70.0 (n=1)"
    assert col["Algorithm 1"] == NO_FINISHED and col["NSO"] == NO_FINISHED and col["Coconut"] == NOT_RUN
    assert "epochs run: 3" in t.caption


def test_row_tables_keep_a_row_for_groups_without_a_finished_trial():
    """Tables 3-5 (a row per group) show a (task, method) that ran but has nothing to average as a row
    that says why, in the methods' order, instead of leaving it out; the CSV says it in `absent`."""
    records = [
        rec("a", val=(0.5, 0.6), test=0.7, decomp=decomp_rows()),
        rec("b", method="alg1", bits=4, val=(0.9,), status="STOPPED"),
        rec("c", method="nso", val=(0.4,), status="FAILED"),
        rec("d", method="coconut", val=()),  # finished, but no validation score
    ]
    trials, decomp = trials_frame(records), decomposition_frame(records)
    t3, t4, t5 = table3(trials, decomp), table4(trials, decomp), table5(trials)
    assert t3.display["Method"].to_list() == ["SFT-CoT", "Coconut", "NSO", "Algorithm 1"]
    assert t3.display["Test acc. (%)"].to_list() == ["70.0 (n=1)", MISSING, NO_FINISHED, NO_FINISHED]
    assert t3.display["Bits"].to_list() == ["32", "32", "32", "4"]
    assert t3.data["absent"].to_list() == [None, MISSING, NO_FINISHED, NO_FINISHED]
    assert t3.data["n_acc"].to_list() == [1, 0, 0, 0]
    assert t4.display["Method"].to_list() == ["SFT-CoT", "Coconut", "NSO", "Algorithm 1"]
    assert t4.display["Loss gap"].to_list()[1:] == [MISSING, NO_FINISHED, NO_FINISHED]
    assert t4.display["Model"].to_list() == ["tiny"] * 4 and t4.display["n"].to_list()[1:] == ["0"] * 3
    assert t4.data["absent"].to_list() == [None, MISSING, NO_FINISHED, NO_FINISHED]
    assert t5.display["Method"].to_list() == ["SFT-CoT", "Coconut", "NSO", "Algorithm 1"]
    assert t5.display["Best val. acc. (%)"].to_list() == ["60.0", MISSING, NO_FINISHED, NO_FINISHED]
    assert t5.display["Trial"].to_list() == ["a", MISSING, MISSING, MISSING]
    assert t5.data["absent"].to_list() == [None, MISSING, NO_FINISHED, NO_FINISHED]
    assert t5.data["trial_id"].to_list() == ["a", None, None, None]


def test_report_counts_statuses_and_lists_stopped_trials():
    from analysis.report import status_line, stopped_section

    records = [
        rec("a", val=(0.5, 0.6, 0.7), test=0.7),
        rec("b", method="alg1", val=(0.4, 0.45), status="STOPPED", lr=2e-3),
        rec("c", method="alg1", val=(0.3,), status="STOPPED", lr=3e-3),
        rec("d", method="nso", val=(0.4,), status="FAILED"),
    ]
    records[2].stopped_by = "stop_if"  # what MLflow's tag says; a Ray dir does not know
    trials = trials_frame(records)
    assert trials["stopped_by"].to_list() == [None, None, "stop_if", None]
    assert status_line(trials) == "4 trials: 1 finished, 2 stopped early, 1 failed"
    text = "\n".join(stopped_section(trials))
    assert "`c`: stopped by a search.stop_if rule after epoch 1, best val_acc 0.300" in text
    assert "`b`: stopped after epoch 2, best val_acc 0.450" in text
    assert text.index("`c`") < text.index("`b`")  # by epochs run
    assert stopped_section(trials.filter(pl.col("status") != "STOPPED")) == []


def test_seed_expansion():
    assert seed_plan(7, [], 3) == [7, 8, 9]
    assert seed_plan(7, [7, 9], 3) == [8]
    assert seed_plan(0, [0, 5, 6], 3) == []
    cfg = {"task": "dijkstra", "method": "alg1", "seed": 4, "lr": 1e-3}
    assert [c["seed"] for c in expand_seeds(cfg, [4], 3)] == [5, 6]
    trials = trials_frame([rec("a", seed=4, val=(0.9,)), rec("b", seed=5, val=(0.1,)), rec("c", lr=9.0, val=(0.2,))])
    plan = plan_reruns(trials, {"a": cfg}, 3)
    assert [c["seed"] for c in plan] == [6] and all(c["lr"] == 1e-3 for c in plan)


def test_ray_dir(tmp_path):
    for i, (val, test) in enumerate([((0.3, 0.6), 0.55), ((0.5, 0.4), 0.45)]):
        d = tmp_path / "dijkstra" / f"trainable_{i:05d}"
        d.mkdir(parents=True)
        (d / "params.json").write_text(
            json.dumps(
                {
                    "task": "dijkstra",
                    "method": "sft_cot",
                    "seed": i,
                    "lr": 1e-3,
                    "bits": 32,
                    "lam": 1.0,
                    "model": {"hidden": 64},
                }
            )
        )
        lines = [
            {"epoch": e + 1, "val_acc": v, "val_eaf": 2.0, "training_iteration": e + 1, "trial_id": f"t{i}"}
            for e, v in enumerate(val)
        ]
        lines[-1].update(test_acc=test, test_eaf=3.0, done=True)
        (d / "result.json").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    loaded = load_ray(tmp_path, "dijkstra")
    df = loaded.trials
    assert df["trial_id"].to_list() == ["t0", "t1"] and df["best_epoch"].to_list() == [2, 1]
    assert df["status"].to_list() == ["FINISHED"] * 2 and df["model.hidden"].to_list() == [64, 64]
    assert loaded.configs["t0"]["model"] == {"hidden": 64}
    st = mean_std(df, select_best(df), "test_acc").row(0, named=True)
    assert st["n"] == 2 and st["mean"] == pytest.approx(0.5)


def test_ray_dir_finds_the_newest_run_and_every_method(tmp_path):
    """Given the storage root and the sweep's name, the trials of its newest run folder
    (`<sweep>-<yyyymmdd-hhmmss>`, not a sweep whose name only starts the same); a multi-method run
    folder reads every method's trials (`<run>/<method>/<trial>`)."""
    from analysis.load import load_ray
    from stabray.errors import UserError

    def trial(d, trial_id, method, acc):
        d.mkdir(parents=True)
        (d / "params.json").write_text(json.dumps({"task": "dijkstra", "method": method, "seed": 0}))
        line = {
            "epoch": 1,
            "val_acc": acc,
            "test_acc": acc,
            "training_iteration": 1,
            "trial_id": trial_id,
            "done": True,
        }
        (d / "result.json").write_text(json.dumps(line) + "\n")

    trial(tmp_path / "dijkstra-20260101-000000" / "t_a", "old", "sft_cot", 0.1)
    trial(tmp_path / "dijkstra-20260102-000000" / "t_b", "new", "sft_cot", 0.2)
    trial(tmp_path / "dijkstra-lengthgen-20260103-000000" / "t_c", "other sweep", "sft_cot", 0.3)
    (tmp_path / "dijkstra-20260104-000000").mkdir()  # a newer run that wrote no trial yet
    assert load_ray(tmp_path, "dijkstra").trials["trial_id"].to_list() == ["new"]
    assert load_ray(tmp_path, "dijkstra-lengthgen").trials["trial_id"].to_list() == ["other sweep"]
    multi = tmp_path / "multi-20260105-000000"
    trial(multi / "alg1" / "t_d", "a1", "alg1", 0.4)
    trial(multi / "sft_cot" / "t_e", "s1", "sft_cot", 0.5)
    for where in (multi, tmp_path):
        loaded = load_ray(where, "multi")
        assert sorted(zip(loaded.trials["trial_id"], loaded.trials["method"])) == [("a1", "alg1"), ("s1", "sft_cot")]
    with pytest.raises(UserError, match="no Ray Tune trials in it .*nope-<yyyymmdd-hhmmss>"):
        load_ray(tmp_path, "nope")


def test_mlflow_store_load_and_report(tmp_path, monkeypatch):
    import mlflow  # a hard dependency: never skipped

    from analysis.load import load_mlflow
    from analysis.report import build_report

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{(tmp_path / 'mlflow.db').resolve()}"
    client = mlflow.MlflowClient(tracking_uri=uri)
    exp_id = client.create_experiment("dijkstra", artifact_location=(tmp_path / "artifacts").as_uri())
    parent = client.create_run(exp_id, tags={"stabray.role": "sweep", "stabray.sweep": "dijkstra"}, run_name="sweep")
    pid = parent.info.run_id
    cfgs = [("sft_cot", 0, (0.4, 0.6), 0.55), ("sft_cot", 1, (0.5, 0.5), 0.50), ("alg1", 0, (0.7, 0.65), 0.71)]
    for i, (method, seed, vals, test) in enumerate(cfgs):
        tags = {
            "mlflow.parentRunId": pid,
            "stabray.role": "trial",
            "stabray.trial_id": f"trial_{i}",
            "stabray.task": "dijkstra",
            "stabray.method": method,
        }
        run = client.create_run(exp_id, tags=tags, run_name=f"trial_{i}")
        rid = run.info.run_id
        params = {
            "task": "dijkstra",
            "task_version": "1",
            "method": method,
            "model": "tiny",
            "lr": "0.001",
            "seed": str(seed),
            "lam": "0.2" if method == "alg1" else "1.0",
            "bits": "1" if method == "alg1" else "32",
            "n_nodes": "5",
        }
        metrics = [
            mlflow.entities.Metric(k, v, 0, e + 1)
            for e, v in enumerate(vals)
            for k, v in (("val_acc", v), ("val_eaf", 5.0 - e), ("train_loss", 1.0 / (e + 1)), ("epoch_time_s", 1.0))
            if not (i == 1 and k == "val_eaf" and e == 1)  # trial_1's last epoch measured no EAF (an empty sum)
        ]
        last = len(vals)
        metrics += [
            mlflow.entities.Metric(k, v, 0, last)
            for k, v in (("test_acc", test), ("test_long_acc", test / 2), ("test_loss_gap", 0.3), ("test_eaf", 4.0 - i))
        ]
        client.log_batch(rid, metrics=metrics, params=[mlflow.entities.Param(k, v) for k, v in params.items()])
        client.log_dict(rid, {**params, "seed": seed, "lr": 1e-3}, "trial_config.json")
        if method == "alg1":
            client.log_dict(rid, decomp_rows(3), "stability/decomposition.json")
        client.set_terminated(rid, "FINISHED")
    client.set_terminated(pid, "FINISHED")

    loaded = load_mlflow("dijkstra", uri)
    df = loaded.trials
    assert loaded.parent_run_id == pid and df.height == 3
    assert df["trial_id"].to_list() == ["trial_0", "trial_1", "trial_2"]
    assert df["best_epoch"].to_list() == [2, 1, 1] and df["bits"].to_list() == [32, 32, 1]
    assert df.schema["lr"] == pl.Float64 and df["test_acc"].to_list() == [0.55, 0.50, 0.71]
    assert df["val_eaf"].to_list() == [4.0, None, 4.0]  # epoch 1's 5.0 is not trial_1's last epoch's EAF
    assert loaded.decomposition.height == 3 and set(loaded.decomposition["trial_id"]) == {"trial_2"}

    out = build_report("dijkstra", uri, out=tmp_path / "report")
    names = {p.name for p in out.iterdir()}
    for stem in (
        "table1_accuracy",
        "table1_length",
        "table3_bits",
        "table4_decomposition",
        "table5_hparams",
        "eaf_reduction",
    ):
        assert {f"{stem}.md", f"{stem}.tex", f"{stem}.csv"} <= names
    assert {
        "fig2_gap_bound_vs_T.png",
        "fig4_eaf_vs_lambda.png",
        "fig4_eaf_vs_bits.png",
        "acc_vs_eaf.png",
        "README.md",
    } <= names
    # the two sft_cot trials differ only in the seed: one configuration, two seeds
    t1 = pl.read_csv(out / "table1_accuracy.csv").filter(pl.col("method") == "sft_cot").row(0, named=True)
    assert t1["mean_pct"] == pytest.approx(52.5) and t1["n_seeds"] == 2
    assert t1["std_pct"] == pytest.approx(np.std([55.0, 50.0], ddof=1))
    assert "52.5 ± 3.5" in (out / "table1_accuracy.md").read_text()
    logged = {a.path for a in client.list_artifacts(pid, "report")}
    assert "report/table1_accuracy.md" in logged

    # a front over a metric no trial logged: an error naming it and what the trials have, no folder
    from stabray.errors import UserError

    with pytest.raises(UserError, match=r"no trial logged val_acc_typo as a number; the trials have: .*best_val_acc"):
        build_report("dijkstra", uri, out=tmp_path / "r2", objectives="val_acc_typo:max,val_eaf:min")
    assert not (tmp_path / "r2").exists()
    with pytest.raises(UserError, match=r"no trial logged name as a number"):  # a column, but not a number
        build_report("dijkstra", uri, out=tmp_path / "r2", objectives="name:max,val_eaf:min")
    front = build_report("dijkstra", uri, out=tmp_path / "r3", objectives="test_acc:max,test_eaf:min")
    assert "Pareto front of test_acc (max), test_eaf (min)" in (front / "pareto_front.md").read_text()


def test_report_from_ray_dir_through_cli_register(tmp_path):
    import argparse

    from analysis.cli import register

    d = tmp_path / "ray" / "dijkstra" / "trainable_0"
    d.mkdir(parents=True)
    (d / "params.json").write_text(json.dumps({"task": "dijkstra", "method": "alg1", "seed": 0, "bits": 2, "lam": 0.5}))
    result = {"val_acc": 0.5, "val_eaf": 2.0, "test_acc": 0.4, "trial_id": "x"}
    (d / "result.json").write_text(json.dumps(result) + "\n")
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))  # how `python -m stabray report` mounts it
    args = parser.parse_args(
        ["report", "--experiment", "dijkstra", "--ray-dir", str(tmp_path / "ray"), "--out", str(tmp_path / "out")]
    )
    assert args.func(args) == 0
    assert "| Algorithm 1 | 40.0 (n=1) |" in (tmp_path / "out" / "table1_accuracy.md").read_text()
    assert (tmp_path / "out" / "fig2_gap_bound_vs_T.png").stat().st_size > 0  # a "no data" figure


def test_ray_dir_of_a_real_sweep_names_task_and_method(tmp_path):
    """A stabray sweep's params.json is the nested trainable config (or a grid's {"trial_config": ...}):
    load_ray gives it the same flat params as MLflow (task, method, lam, bits, lr, seed), so selection
    by (task, method) sees it."""
    cfgs = [
        {
            "task": {"name": "icl_quadratic", "params": {"init_gain": g}},
            "method": {"name": "sft_cot", "params": {}},
            "train": {"lr": 1.0, "epochs": 8},
            "seed": s,
        }
        for g, s in ((0.5, 0), (0.75, 1))
    ]
    for i, (cfg, val) in enumerate(zip(cfgs, (0.5, 0.9))):
        d = tmp_path / f"trial_{i}"
        d.mkdir()
        (d / "params.json").write_text(json.dumps(cfg if i == 0 else {"trial_config": cfg}))
        (d / "result.json").write_text(
            json.dumps({"val_acc": val, "test_acc": val, "training_iteration": 1, "trial_id": f"t{i}", "done": True})
            + "\n"
        )
    df = load_ray(tmp_path).trials
    assert df["task"].to_list() == ["icl_quadratic"] * 2 and df["method"].to_list() == ["sft_cot"] * 2
    assert df["seed"].to_list() == [0, 1] and df["lam"].to_list() == [1.0, 1.0] and df["lr"].to_list() == [1.0, 1.0]
    assert df["init_gain"].to_list() == [0.5, 0.75]
    assert select_best(df)["trial_id"].to_list() == ["t1"]


def test_table3_reads_the_decomposition_at_T5():
    """Tables 3-4 are at T = 5 (the paper's), T_max only where a chain is shorter."""
    trials = trials_frame([rec("a", method="alg1", bits=2, val=(0.7,), test=0.7)])
    decomp = decomposition_frame([rec("a", method="alg1", bits=2, decomp=decomp_rows(7, eaf=1.0))])
    row = table3(trials, decomp).data.row(0, named=True)
    assert row["T"] == 5 and row["sum_rho"] == pytest.approx(5.0)  # eaf * T at T = 5, not at T_max = 7
    assert table3(trials, decomp, T=0).data.row(0, named=True)["T"] == 7
    assert table4(trials, decomp).data.row(0, named=True)["T"] == 5


def test_bits_study_mean_std_n_against_numpy():
    """The grid study's table: per (lam, bits) the mean ± sample std and n over seeds of each
    test_*_at_T metric, no selection; stopped trials do not count."""
    from analysis.tables import STUDY_METRICS, bits_study

    rng = np.random.default_rng(0)
    records, values = [], {}
    for lam in (1.0, 0.1):
        for bits in (1, 32):
            for seed in range(3):
                m = {metric: float(rng.uniform(0.1, 50)) for _, metric, _ in STUDY_METRICS}
                m["test_acc"] = float(rng.uniform(0.3, 0.9))
                m["stability_T"] = 4.0 if lam == 1.0 else 2.0
                r = rec(f"{lam}-{bits}-{seed}", method="alg1", bits=bits, lam=lam, seed=seed, val=(0.5,))
                r.metrics.update(m)
                records.append(r)
                values.setdefault((lam, bits), []).append(m)
    stopped = rec("x", method="alg1", bits=1, lam=1.0, seed=9, status="STOPPED")
    stopped.metrics.update({metric: 1e6 for _, metric, _ in STUDY_METRICS} | {"stability_T": 4.0})
    t = bits_study(trials_frame([*records, stopped]))
    assert t.data.height == 4 and t.data["n"].to_list() == [3, 3, 3, 3]
    for r in t.data.iter_rows(named=True):
        vs = values[(r["lam"], r["bits"])]
        for _, metric, _ in STUDY_METRICS:
            x = np.array([v[metric] for v in vs])
            assert r[f"{metric}_mean"] == pytest.approx(x.mean()) and r[f"{metric}_std"] == pytest.approx(x.std(ddof=1))
        assert r["T_min"] == r["T_max"] == (4.0 if r["lam"] == 1.0 else 2.0)
    first = t.display.row(0, named=True)
    assert first["n"] == "3" and " ± " in first["Σρ"] and first["T"] in ("2", "4")
