"""search.stop_if: the rule on a synthetic stream, beside the EAF rule, its spec checks, and a tiny sweep."""

from __future__ import annotations

import math
import random

import pytest
from pydantic import ValidationError

from stabray.config import SearchCfg, StopIfCfg
from stabray.tune.eaf_stop import EafStopper
from stabray.tune.stop_rules import RuleStopper, Stoppers, stop_detail, stopped_by, stoppers


def rule(metric="val_acc", epoch=2, when="< 0.3"):
    return StopIfCfg(metric=metric, epoch=epoch, when=when)


@pytest.mark.parametrize(
    "when,op,bound", [(">=0.5", ">=", 0.5), ("  <  .25 ", "<", 0.25), ("> 1e-3", ">", 0.001), ("<= -2", "<=", -2.0)]
)
def test_when_is_read_as_a_comparison(when, op, bound):
    r = rule(when=when)
    assert (r.op, r.bound) == (op, bound) and r.when == f"{op} {bound:g}"


@pytest.mark.parametrize("when", ["=> 0.5", "0.5", 0.5, None, ">= x", "== 0.5", ">= 0.5 or < 0.1", ""])
def test_a_when_that_is_not_a_comparison_is_refused(when):
    with pytest.raises(ValidationError, match="a comparison and a number"):
        rule(when=when)


def test_no_rules_is_an_empty_list_or_null():
    assert SearchCfg().stop_if == [] and SearchCfg(stop_if=None).stop_if == []


def test_an_unquoted_comparison_in_a_spec_file_is_told_to_quote(tmp_path, capsys):
    """`when: >= 0.5` opens a YAML block scalar: the parse error says to quote the comparison."""
    from stabray.cli import main

    path = tmp_path / "s.yaml"
    path.write_text("name: x\ntask: {name: dijkstra}\nsearch:\n  stop_if:\n    - metric: val_acc\n      when: >= 0.5\n")
    assert main(["sweep", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "not valid YAML" in err and 'needs quotes: when: ">= 0.5"' in err and "line 6" in err


def test_the_rule_on_a_synthetic_stream_matches_a_hand_computation():
    """Each trial is judged once, on its result of the rule's epoch, against the comparison written
    out here by hand; results of other epochs never stop it, whatever their value."""
    rng = random.Random(1)
    rules = [rule("val_departure_tok0", 3, ">= 0.5"), rule("val_acc", 5, "< 0.2")]
    s = RuleStopper(rules)
    expected = {}
    for t in (f"t{i}" for i in range(40)):
        for epoch in range(1, 8):
            dep, acc = rng.random(), rng.random()
            hand = (epoch == 3 and dep >= 0.5) or (epoch == 5 and acc < 0.2)
            got = s(t, {"epoch": epoch, "training_iteration": epoch, "val_departure_tok0": dep, "val_acc": acc})
            assert got == hand, (t, epoch, dep, acc)
            if got:
                expected[t] = epoch
                break
    assert s.stopped == expected
    assert {3, 5} == set(expected.values())  # both rules act in this stream
    assert 0 < len(expected) < 40
    t = next(t for t, e in expected.items() if e == 3)
    assert s.why[t].startswith("val_departure_tok0 = ") and s.why[t].endswith("at epoch 3, rule >= 0.5")


def test_missing_nan_and_boolean_values_never_stop_a_trial():
    s = RuleStopper([rule("val_acc", 1, ">= 0")])  # any number at epoch 1 stops
    assert not s("a", {"epoch": 1})
    assert not s("b", {"epoch": 1, "val_acc": float("nan")})
    assert not s("c", {"epoch": 1, "val_acc": True})
    assert not s("d", {"training_iteration": 2, "val_acc": 0.5})  # another epoch
    assert s("e", {"training_iteration": 1, "val_acc": 0.0})  # the iteration stands in for a missing epoch
    assert s.stopped == {"e": 1} and not s.stop_all()


def test_both_rules_see_every_result_and_the_tag_names_the_one_that_stopped():
    """Ray's CombinedStopper stops asking at the first yes; here the EAF rule still records the result of
    a trial the stop_if rule ends, so its median at that epoch counts it."""
    eaf = EafStopper(factor=2.0, top_fraction=0.25, grace=1, min_trials=3)
    rules = RuleStopper([rule("val_acc", 1, "< 0.1")])
    both = Stoppers(rules, eaf)
    assert both("a", {"epoch": 1, "val_acc": 0.05, "val_eaf": 1.0})  # the rule stops it
    assert eaf.eafs[1] == {"a": 1.0}  # and the EAF rule saw it anyway
    assert not both("b", {"epoch": 1, "val_acc": 0.5, "val_eaf": 1.0})
    assert both("c", {"epoch": 1, "val_acc": 0.2, "val_eaf": 50.0})  # median(1, 1, 50) = 1: the EAF rule
    assert (stopped_by(both, "a"), stopped_by(both, "c"), stopped_by(both, "b")) == ("stop_if", "eaf_stop", "asha")
    assert stop_detail(both, "a") == "val_acc = 0.05 at epoch 1, rule < 0.1" and stop_detail(both, "c") == ""
    assert stopped_by(None, "a") == "asha" and stopped_by(eaf, "c") == "eaf_stop"


def test_the_sweep_gets_one_stopper_for_what_it_configures():
    assert stoppers(SearchCfg()) is None
    assert isinstance(stoppers(SearchCfg(eaf_stop={})), EafStopper)
    one = stoppers(SearchCfg(stop_if=[{"metric": "val_acc", "epoch": 1, "when": "< 0.1"}]))
    assert isinstance(one, RuleStopper) and one.rules[0].describe() == "val_acc < 0.1 at epoch 1"
    both = stoppers(SearchCfg(eaf_stop={}, stop_if=[{"metric": "val_acc", "epoch": 1, "when": "< 0.1"}]))
    assert [type(m) for m in both.members] == [EafStopper, RuleStopper]


def test_a_nan_bound_is_not_a_number_here():
    with pytest.raises(ValidationError):
        rule(when=">= nan")
    assert not math.isnan(rule(when="> 0").bound)


# ----------------------------------------------------------------------------------- spec and sweep


def test_a_departure_rule_validates_for_a_method_that_writes_the_whole_chain():
    from stabray.spec import load_spec

    spec, _ = load_spec(
        "lego_cyclic",
        {
            "method.name": "sft_cot",
            "search.space.lam": None,
            "search.space.bits": None,
            "task.params.trace": "delta_op",
            "search.stop_if": [{"metric": "val_departure_tok3", "epoch": 2, "when": ">= 0.5"}],
        },
    )
    assert spec.search.stop_if[0].describe() == "val_departure_tok3 >= 0.5 at epoch 2"


def test_a_tiny_sweep_stops_the_trial_that_meets_the_rule_and_runs_the_other(tmp_path, monkeypatch, capsys):
    """Mini model, 3 epochs, two trials a grid apart in lr (1e-5: the loss barely moves; 1e-2: it falls),
    a rule on the epoch-2 training loss between them: the slow one ends STOPPED at epoch 2, tagged
    stop_if, with the rule and its value in the description; the other runs its 3 epochs and is tested.
    The rule is in the parent's description."""
    from mlflow import MlflowClient
    from test_pareto import write_spec

    from stabray.cli import main

    monkeypatch.setenv("STABRAY_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    search = {"num_samples": 1, "scheduler": "fifo", "searcher": "grid"}
    search["space"] = {"lam": None, "bits": None, "lr": {"choice": [1.0e-5, 1.0e-2]}}
    search["stop_if"] = [{"metric": "train_loss", "epoch": 2, "when": ">= 4.0"}]
    path = write_spec(
        tmp_path, search, model={"preset": "mini"}, train={"epochs": 3, "batch_size": 16, "warmup_steps": 1}
    )
    assert main(["sweep", str(path), "--tracking-uri", uri, "--storage", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "2 trials (0 failed), 1 finished, 1 stopped early" in out
    assert out.count("stopped by a search.stop_if rule at epoch 2") == 1

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("mini")
    runs = client.search_runs([exp.experiment_id])
    trials = {float(r.data.params["lr"]): r for r in runs if r.data.tags.get("stabray.role") == "trial"}
    assert sorted(trials) == [1.0e-5, 1.0e-2]
    loss = {lr: client.get_metric_history(r.info.run_id, "train_loss") for lr, r in trials.items()}
    slow, fast = trials[1.0e-5], trials[1.0e-2]
    at2 = {lr: next(m.value for m in h if m.step == 2) for lr, h in loss.items()}
    assert at2[1.0e-5] >= 4.0 > at2[1.0e-2], at2  # the rule, on the logged values (4.99, 2.61)
    t = slow.data.tags
    assert (t["stabray.status"], t["stabray.stopped_by"], t["stabray.stopped_at_epoch"]) == ("STOPPED", "stop_if", "2")
    assert sorted(m.step for m in loss[1.0e-5]) == [1, 2] and "test_acc" not in slow.data.metrics
    assert f"train_loss = {at2[1.0e-5]:.4g} at epoch 2, rule >= 4" in t["mlflow.note.content"]
    assert fast.info.status == "FINISHED" and "stabray.stopped_by" not in fast.data.tags
    assert sorted(m.step for m in loss[1.0e-2]) == [1, 2, 3] and "test_acc" in fast.data.metrics
    from analysis.load import load_mlflow
    from analysis.report import stopped_section

    frame = load_mlflow("mini", uri, stability=False).trials.sort("lr")  # what trials.csv is made of
    assert frame["stopped_by"].to_list() == ["stop_if", None] and frame["status"].to_list() == ["STOPPED", "FINISHED"]
    assert "\n".join(stopped_section(frame)).count("stopped by a search.stop_if rule after epoch 2") == 1
    parent = next(r for r in runs if r.data.tags.get("stabray.role") == "sweep")
    assert parent.data.params["stop_if"] == "train_loss >= 4 at epoch 2"
    assert "search.stop_if stops a trial when train_loss >= 4 at epoch 2" in parent.data.tags["mlflow.note.content"]
