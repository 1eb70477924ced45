"""Bad input to the researcher-facing scripts (scripts/, benchmarks/): refused with one line naming the
problem, before anything long runs, and nothing already there is lost. Each refusal beside a control
that goes through."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_benchmarks_smoke import load as load_bench
from test_sizes import load_calibrate

from stabray.errors import UserError, run_script

ROOT = Path(__file__).resolve().parent.parent
L89 = "l89_cyc_mix25w1113_deltaop_randpos192_h128_l3_e160_lr1e3_wd1e1"


def exit_code(main) -> int:
    """A script's exit code as its `__main__` block gives it (stabray.errors.run_script), argparse's
    own refusals (SystemExit 2) included."""
    try:
        return run_script(main)
    except SystemExit as e:
        return e.code


@pytest.mark.parametrize(
    "argv, words",
    [
        (["scripts/calibration_table.py", "{t}/none.jsonl"], "error: {t}/none.jsonl: cannot read it"),
        (["scripts/fake_cluster.py", "stop", "--temp-dir", "{t}"], "not a fake cluster's folder"),
        (["scripts/calibrate.py", "l89", "--set", "model.hiden=3", "--out", "{t}/r.jsonl"], "--set model.hiden=3:"),
        (["scripts/answer_probe.py", "{t}"], "error: {t}: not a stabray checkpoint (no state.pt)"),
        (["benchmarks/ab_revisions.py", "data", "--base", "no-such-rev"], "'no-such-rev' is not a git revision"),
        (["scripts/early_sign.py", "{t}/none.jsonl"], "error: {t}/none.jsonl: cannot read it"),
        (["benchmarks/readme_table.py", "README.md"], "README.md: not a readable run_all summary"),
        (["benchmarks/readme_table.py", "benchmarks/results/summary.json", "--check", "{t}/R.md"], "{t}/R.md: "),
    ],
)
def test_scripts_exit_2_with_one_line_on_bad_input(tmp_path, argv, words):
    """Run as a researcher runs them: bad input is `error: ...` on one line (after argparse's usage line
    where argparse reports it) and exit code 2, as for stabray's own commands; no traceback (a failure
    that is not the input's, such as `ray start` failing, exits 1)."""
    import subprocess
    import sys

    cmd = [sys.executable, *(a.format(t=tmp_path) for a in argv)]
    p = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": "."}
    )
    err = [line for line in p.stderr.strip().splitlines() if not line.startswith("usage: ")]
    assert p.returncode == 2 and len(err) == 1 and words.format(t=tmp_path) in err[0], (p.returncode, p.stderr)


def test_fake_cluster_stop_leaves_a_folder_without_a_cluster_alone(tmp_path):
    fc = load_calibrate("fake_cluster")
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(UserError, match="not a fake cluster's folder"):
        fc.stop(str(tmp_path))
    assert (tmp_path / "keep.txt").read_text() == "mine"
    with pytest.raises(UserError, match="no such folder"):
        fc.stop(str(tmp_path / "none"))
    (tmp_path / "pgid").write_text("999999999")  # a cluster's folder whose processes are gone: removed
    fc.stop(str(tmp_path), grace_s=0)
    assert not tmp_path.exists()


def test_fake_cluster_start_reads_its_config_before_creating_anything(tmp_path):
    fc = load_calibrate("fake_cluster")
    for text, why in (("a: [", "not valid YAML"), ("a: 1\n", "not a Ray autoscaler config")):
        (tmp_path / "c.yaml").write_text(text)
        with pytest.raises(UserError, match=why):
            fc.start(temp_dir=str(tmp_path / "t"), config=tmp_path / "c.yaml")
        assert not (tmp_path / "t").exists()
    assert set(fc.read_config(ROOT / "cluster.local.yaml")) >= {"provider", "head_node_type"}  # the shipped one


def test_run_all_update_needs_an_out_folder_and_a_summary(tmp_path, capsys):
    run_all = load_bench("run_all")
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"smoke": True, "benchmarks": [], "figures": []}))
    cases = [
        (["--only"], "--only: name at least one benchmark"),
        (["--smoke", "--only", "qat", "--update", str(summary)], "--update writes the merged summary into --out"),
        (["--smoke", "--only", "qat", "--update", str(ROOT / "README.md"), "--out", str(tmp_path)], "not a JSON"),
        (["--only", "qat", "--update", str(summary), "--out", str(tmp_path / "o")], "cannot mix a smoke run"),
    ]
    for argv, why in cases:
        with pytest.raises(SystemExit) as stop:
            run_all.main(argv)
        assert stop.value.code == 2 and why in capsys.readouterr().err, argv
    assert not (tmp_path / "o").exists() and not (tmp_path / "qat.json").exists()  # nothing ran


def test_run_all_update_in_place_merges_and_a_cut_short_rerun_leaves_the_summary(tmp_path, monkeypatch):
    """The control: --update with --out = the summary's own folder replaces the re-run benchmark's rows
    there; while it runs, its rows go to rerun_summary.json, so the summary is whole if it is cut short."""
    import subprocess

    run_all = load_bench("run_all")
    old = {"benchmark": "qat", "rc": 0, "headline": "old"}
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"smoke": True, "benchmarks": [old, {"benchmark": "train"}], "figures": []}))
    seen = []

    real = subprocess.run

    def fake(cmd, **kw):  # the benchmark "runs": the summary is still the old one meanwhile
        if "--json" not in cmd:
            return real(cmd, **kw)
        seen.append(json.loads(summary.read_text())["benchmarks"][0]["headline"])
        Path(cmd[cmd.index("--json") + 1]).write_text(json.dumps({"figures": []}))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(run_all.subprocess, "run", fake)
    run_all.main(["--smoke", "--only", "qat", "--update", str(summary), "--out", str(tmp_path), "--quiet"])
    merged = json.loads(summary.read_text())
    assert seen == ["old"] and [r["benchmark"] for r in merged["benchmarks"]] == ["qat", "train"]
    assert merged["benchmarks"][0]["headline"] != "old" and merged["updates"][-1]["benchmarks"] == ["qat"]
    assert (tmp_path / "rerun_summary.json").exists()


@pytest.mark.parametrize("name", load_bench("run_all").available())
def test_every_benchmark_checks_its_json_path_first(name, capsys):
    bench = load_bench(name)
    with pytest.raises(SystemExit) as stop:
        bench.main(["--json", "/nonexistent-folder/x.json"])
    assert stop.value.code == 2 and "does not exist" in capsys.readouterr().err


def test_benchmark_arguments_are_checked_before_measuring(tmp_path):
    import argparse

    common = load_bench("common")
    assert common.positive_int("3") == 3
    for bad in ("0", "-1", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            common.positive_int(bad)
    assert common.json_out(str(tmp_path / "q.json")) == str(tmp_path / "q.json")
    for bad in (str(tmp_path), str(tmp_path / "none" / "q.json")):
        with pytest.raises(argparse.ArgumentTypeError):
            common.json_out(bad)


@pytest.mark.parametrize(
    "argv, why",
    [
        (["l89_cyc_mix25w1113_deltaop_randpos", "--out", "{t}/r.jsonl"], "did you mean"),
        ([L89, "--out", "{t}/none/r.jsonl"], "--out {t}/none/r.jsonl: the folder"),
        ([L89, "--out", "{t}"], "a folder; give a JSON-lines file"),
        ([L89, "--out", "{t}/r.jsonl", "--eval-strides", "2,0"], "expected strides >= 1"),
        ([L89, "--out", "{t}/r.jsonl", "--eval-strides", ","], "no stride given"),
        ([L89, "--out", "{t}/r.jsonl", "--set", "train.epochs"], "expected KEY=VALUE"),
        ([L89, "--out", "{t}/r.jsonl", "--set", "train.epochs=[1"], "not a YAML value"),
        (
            ["l89", "--out", "{t}/r.jsonl", "--set", "train.epoch=3"],
            "error: --set train.epoch=3: train.epoch: unknown key",
        ),
    ],
)
def test_calibrate_refuses_before_training(tmp_path, monkeypatch, capsys, argv, why):
    """One line, exit 2, no model built (an hour of training would end in the error otherwise)."""
    calibrate = load_calibrate("calibrate")
    monkeypatch.setattr("stabray.train.run.TrialRun.epoch", lambda *a, **k: pytest.fail("trained"))
    monkeypatch.setattr("sys.argv", ["calibrate.py", *(a.format(t=tmp_path) for a in argv)])
    code = exit_code(calibrate.main)
    err = capsys.readouterr().err
    assert code == 2 and why.format(t=tmp_path) in err and "Traceback" not in err, err


def test_calibrate_control_an_existing_out_file_passes_the_checks(tmp_path, monkeypatch):
    """The control for the refusals above: a valid command line, --out an existing file (rows are
    appended), gets past every check to building the run."""
    calibrate = load_calibrate("calibrate")
    (tmp_path / "r.jsonl").write_text('{"profile": "x"}\n')

    def reached(*a, **k):
        raise RuntimeError("reached the run")

    monkeypatch.setattr("stabray.train.run.TrialRun.__init__", reached)
    argv = ["calibrate.py", "L28", "--out", str(tmp_path / "r.jsonl"), "--eval-strides", "2,3", "--set", "seed=1"]
    monkeypatch.setattr("sys.argv", argv)
    with pytest.raises(RuntimeError, match="reached the run"):
        calibrate.main()


def test_calibrate_names_the_set_that_wrote_a_bad_field():
    """A config problem the --set overrides caused (the profile alone passes) is named by the --set
    that wrote the field (the last one, when two wrote it; one above it; one below a section whose
    check spans two fields), else by every --set; a problem of the profile's own, by the profile."""
    import copy

    import yaml

    from stabray.config import set_path

    calibrate = load_calibrate("calibrate")
    profiles = yaml.safe_load((ROOT / "scripts" / "calibration_profiles.yaml").read_text())
    clean = calibrate.profile_config(L89, profiles)
    cases = [
        ("model.hiden", 1, [], "profile p: model.hiden: unknown key"),
        ("model.hiden", 1, [("model", "{hiden: 1}")], "--set model={hiden: 1}: model.hiden: unknown key"),
        ("train.epochs", 0, [("train.epochs", "5"), ("train.epochs", "0")], "--set train.epochs=0: train.epochs"),
        ("model.hidden_size", 130, [("model.hidden_size", "130")], "--set model.hidden_size=130: model: hidden_size"),
        ("train.epochs", 0, [("seed", "1"), ("train.lr", "1")], "--set seed=1, --set train.lr=1: train.epochs"),
        ("train.epochs", 2, [("train.epochs", "2")], None),  # the control: valid
    ]
    for key, value, sets, words in cases:
        cfg = copy.deepcopy(clean)
        set_path(cfg, key, value)
        if words is None:
            calibrate.check_config(cfg, "p", sets, clean)
            continue
        with pytest.raises(UserError) as e:
            calibrate.check_config(cfg, "p", sets, clean)
        assert str(e.value).startswith(words), (str(e.value), words)
    broken = copy.deepcopy(clean)
    set_path(broken, "model.hiden", 1)  # the profile's own problem, whatever the --set
    with pytest.raises(UserError, match=r"^profile p: model.hiden: unknown key"):
        calibrate.check_config(broken, "p", [("model.hiden", "1")], broken)


def test_calibrate_takes_a_short_profile_name_and_records_the_full_one():
    import yaml

    calibrate = load_calibrate("calibrate")
    profiles = yaml.safe_load((ROOT / "scripts" / "calibration_profiles.yaml").read_text())
    assert calibrate.full_name("l89", profiles) == L89 and calibrate.full_name(L89, profiles) == L89
    assert calibrate.full_name("l8", profiles) == "l8"  # no profile l8_...: left to the unknown-name error


def test_calibration_rows_are_read_with_the_file_and_line_named(tmp_path):
    table = load_calibrate("calibration_table")
    f = tmp_path / "rows.jsonl"
    f.write_text('{"profile": "a", "seed": 0, "splits": {}}\n\n{"profile": "a"\n')
    with pytest.raises(UserError, match=r"rows.jsonl, line 3: not valid JSON"):
        table.read_rows([str(f)])
    f.write_text('{"profile": "a", "seed": 0}\n')
    with pytest.raises(UserError, match=r"line 1: not a calibration row \(no splits\)"):
        table.read_rows([str(f)])
    with pytest.raises(UserError, match="cannot read it"):
        table.read_rows([str(tmp_path / "none.jsonl")])
    assert len(table.read_rows([str(ROOT / "scripts" / "calibration_results.jsonl")])) >= 192


def test_calibration_compare_refuses_unlike_sides():
    table = load_calibrate("calibration_table")
    results = [str(ROOT / "scripts" / "calibration_results.jsonl")]
    with pytest.raises(UserError, match=r"\(lego_cyclic\) and L28.* \(dijkstra\) are different tasks"):
        table.compare(results, "l89", "L28")
    with pytest.raises(UserError, match="name the same profile"):
        table.compare(results, "L28", "L28")
    assert "A - B" in table.compare(results, "l89", "l99")


def test_early_sign_names_the_tracked_epochs(monkeypatch, capsys):
    sign = load_calibrate("early_sign")
    for argv, why in (
        (["--epoch", "7"], "tracked epochs: 40, 80, 120, 160"),
        (["--threshold", "nan"], "between 0 and 1"),
        (["--chosen-on", "180-165"], "1 <= A <= B"),
    ):
        monkeypatch.setattr("sys.argv", ["early_sign.py", *argv])
        with pytest.raises(SystemExit) as stop:
            sign.main()
        assert stop.value.code == 2 and why in capsys.readouterr().err, argv
    monkeypatch.setattr("sys.argv", ["early_sign.py"])
    sign.main()
    assert "rows 165-180 (the threshold was read on these): 16 runs" in capsys.readouterr().out


def test_calibration_table_settings_show_a_label_rows_profile_and_its_own_overrides():
    """The settings column: a --label row is read under the profile it ran, a --set that changes a
    field is listed, one that repeats the profile's value is not (older rows record the profile's
    own fields as overrides), and a name that is no profile says so."""
    import yaml

    table = load_calibrate("calibration_table")
    doc = yaml.safe_load((ROOT / "scripts" / "calibration_profiles.yaml").read_text())
    own = table.settings({"profile": L89}, doc)
    assert own.startswith("l87_") and "trace: delta_op" in own and "--set" not in own
    cases = [
        ({"profile": L89, "overrides": ["train.lr=1.0e-3", "train.lr=0.002"]}, own + "; --set train.lr=0.002"),
        ({"profile": L89, "overrides": ["train.lr=0.002", "train.lr=1.0e-3"]}, own),  # the last one wins
        ({"profile": L89, "overrides": ["model.init_std=0.1", "train.lr=1e-3"]}, own),  # l89's own values
        ({"profile": L89, "overrides": ["train.lr=3e-3", "broken"]}, own + "; --set train.lr=3e-3, broken"),
        ({"profile": L89, "overrides": ["task.name=a|b"]}, own + "; --set task.name=a\\|b"),  # a Markdown cell
        ({"profile": "mine", "from_profile": L89, "overrides": []}, f"profile {L89}: {own}"),
        ({"profile": "mine"}, "not a profile of calibration_profiles.yaml"),
    ]
    for row, want in cases:
        assert table.settings(row, doc) == want, row
