"""Evaluation at explicit sizes and training on a mix of sizes: splits, metric names, the spec
validator, and the trivial-rule floors every trial logs beside its accuracies."""

from __future__ import annotations

import math
import os
import re
from collections import Counter

import numpy as np
import polars as pl
import pytest

from stabray.data.splits import draw, make_splits, split_seed
from stabray.errors import SpecError, UserError
from stabray.record import (
    TrialRecord,
    acc_metric,
    describe_metric,
    is_metric,
    logged_name,
    steps_metric,
    trials_frame,
    trivial_metric,
)
from stabray.spec import load_spec
from stabray.tasks import get_task
from stabray.tasks.base import normalize_answer


def test_train_sizes_mix_draws_each_size_uniformly():
    task = get_task("dijkstra", decimals=1, train_sizes=[5, 3, 4])
    assert task.size == 5 and task.in_dist_sizes == (3, 4, 5)
    splits = make_splits(task, {"train": 600, "val": 150, "test": 150}, seed=0)
    for name in ("train", "val", "test"):
        counts = Counter(e.meta["n"] for e in splits[name])
        assert set(counts) == {3, 4, 5}
        n = len(splits[name])
        # binomial(n, 1/3): each count within 4 standard deviations of n/3
        assert all(abs(c - n / 3) < 4 * np.sqrt(n * (1 / 3) * (2 / 3)) for c in counts.values()), counts
    # the length-generalization splits lie beyond the largest training size
    assert task.long_sizes() == {"test_long": 6, "test_longer": 7}
    assert {e.meta["n"] for e in splits["test_long"]} == {6} and {e.meta["n"] for e in splits["test_longer"]} == {7}
    # no question of an evaluation split is in the training split
    evals = {e.question for s in ("val", "test") for e in splits[s]}
    assert not evals & {e.question for e in splits["train"]}


def test_mixed_split_against_an_independent_draw():
    """A mixed split is: one RandomState seeded by (seed, split, sizes); per example a uniform size,
    then the task's own sample at that size (here redrawn by hand, duplicates skipped)."""
    task = get_task("lego_cyclic", n_vars=3, train_sizes=[2, 3])
    got = draw(task, "val", 40, 7, (2, 3))
    rng = np.random.RandomState(split_seed(7, "val", (2, 3)))
    want, seen = [], set()
    while len(want) < 40:
        size = (2, 3)[rng.randint(2)]
        ex = task.sample(rng, size)
        if ex.question not in seen:
            seen.add(ex.question)
            want.append(ex)
    assert [e.question + e.answer for e in got] == [e.question + e.answer for e in want]


def test_single_size_splits_and_cache_keys_unchanged():
    """Without the new options a task draws exactly what it drew before they existed."""
    task = get_task("dijkstra", n_nodes=4, decimals=1)
    assert task.in_dist_sizes == (4,)
    assert [e.question for e in draw(task, "test", 5, 0, 4)] == [e.question for e in draw(task, "test", 5, 0, (4,))]
    rng = np.random.RandomState(split_seed(0, "test", 4))  # the seed of a single size is the old one
    assert draw(task, "test", 1, 0, 4)[0].question == task.sample(rng, 4).question
    assert set(task.describe()) == {"task", "version", "n_nodes", "p", "decimals"}
    assert set(get_task("lego_cyclic").describe()) == {"task", "version", "n_vars"}
    assert set(get_task("lego_symmetry").describe()) == {"task", "version", "n_vars"}  # S5 keeps its keys
    assert get_task("lego_symmetry", degree=3).describe()["degree"] == 3


def test_explicit_long_sizes_name_the_splits():
    task = get_task("dijkstra", n_nodes=4, decimals=1, train_sizes=[3, 4], long_sizes=[6, 5])
    assert task.long_sizes() == {"test_n5": 5, "test_n6": 6}
    assert task.long_splits() == ("test_n5", "test_n6") and task.long_splits(["test_n6"]) == ("test_n6",)
    splits = make_splits(task, {"train": 20, "val": 10, "test": 10}, seed=0)
    assert set(splits) == {"train", "val", "test", "test_n5", "test_n6"}
    assert {e.meta["n"] for e in splits["test_n6"]} == {6}
    with pytest.raises(UserError, match="no split 'test_long'"):
        task.long_splits(["test_long"])


def test_train_size_weights_skew_the_training_split_only():
    """[1, 3] over sizes [3, 4]: three in four training graphs at 4 nodes (binomial check), while the
    evaluation splits are the very examples the unweighted task draws; the training split against an
    independent redraw with numpy's weighted choice; the weights enter the cache key."""
    plain = get_task("dijkstra", decimals=1, train_sizes=[3, 4], long_sizes=[5])
    task = get_task("dijkstra", decimals=1, train_sizes=[3, 4], train_size_weights=[1, 3], long_sizes=[5])
    assert task.train_size_probs == (0.25, 0.75) and plain.train_size_probs is None
    sizes = {"train": 800, "val": 60, "test": 60}
    got, base = make_splits(task, sizes, seed=3), make_splits(plain, sizes, seed=3)
    n4 = sum(e.meta["n"] == 4 for e in got["train"])
    assert abs(n4 - 600) < 4 * np.sqrt(800 * 0.75 * 0.25), n4
    for split in ("val", "test", "test_n5"):
        assert [e.question for e in got[split]] == [e.question for e in base[split]]
    exclude = {e.question for s in ("val", "test", "test_n5") for e in got[s]}
    rng = np.random.RandomState(split_seed(3, "train", (3, 4)))
    want, seen = [], set()
    while len(want) < 800:
        ex = task.sample(rng, (3, 4)[rng.choice(2, p=[0.25, 0.75])])
        if ex.question not in seen and ex.question not in exclude:
            seen.add(ex.question)
            want.append(ex)
    assert [e.question for e in got["train"]] == [e.question for e in want]
    assert task.describe()["train_size_weights"] == [1.0, 3.0] and "train_size_weights" not in plain.describe()


def test_fresh_training_splits_follow_the_weights(tmp_path, cache_dir):
    """task.resample_train draws every epoch's new split with the same weights."""
    from stabray.train import make_run

    text = SPEC.replace("train_sizes: [3, 4],", "train_sizes: [3, 4], train_size_weights: [1, 9],")
    text = text.replace("train_size: 32", "train_size: 200\n  resample_train: true")
    spec, _ = load_spec(str(write_spec(tmp_path, text)))
    base = spec.trial_base()  # digits: a fresh split can hold a distance the small cached splits never held
    run = make_run({**base, "cache_dir": cache_dir, "model": {**base["model"], "numbers": "digits"}})
    fresh = run.fresh_train(1)
    assert fresh != run.data["train"] and len(fresh) == 200
    n4 = sum(e.meta["n"] == 4 for e in fresh)
    assert abs(n4 - 180) < 4 * np.sqrt(200 * 0.9 * 0.1), n4


def test_train_size_schedule_moves_the_training_sizes_between_epochs(tmp_path, cache_dir):
    """{0: [9, 1], 2: [1, 9]}: the first training split and epoch 1's fresh one are nine in ten at 3
    nodes, from epoch 2 on nine in ten at 4 (binomial checks on what the trainer is handed); the
    evaluation splits are those of the unscheduled task; string keys (a JSON round trip) read the same."""
    from stabray.train import make_run

    text = SPEC.replace("train_sizes: [3, 4],", "train_sizes: [3, 4], train_size_schedule: {{0: [9, 1], 2: [1, 9]}},")
    text = text.replace("train_size: 32", "train_size: 200\n  resample_train: true")
    spec, _ = load_spec(str(write_spec(tmp_path, text)))
    base = spec.trial_base()  # digits: a fresh split can hold a distance the small cached splits never held
    run = make_run({**base, "cache_dir": cache_dir, "model": {**base["model"], "numbers": "digits"}})
    band = 4 * np.sqrt(200 * 0.9 * 0.1)
    for epoch, want3 in ((0, 180), (1, 180), (2, 20), (5, 20)):
        n3 = sum(e.meta["n"] == 3 for e in run.trainer._examples(epoch))
        assert abs(n3 - want3) < band, (epoch, n3)
    plain = make_run({**load_spec(str(write_spec(tmp_path)))[0].trial_base(), "cache_dir": cache_dir})
    for split in ("val", "test", "test_n5"):
        assert [e.question for e in run.data[split]] == [e.question for e in plain.data[split]]
    task = get_task("dijkstra", decimals=1, train_sizes=[3, 4], train_size_weights=[1, 3],
                    train_size_schedule={"4": [1, 1]})  # fmt: skip
    assert [task.train_size_probs_at(e) for e in (0, 3, 4, 9)] == [(0.25, 0.75), (0.25, 0.75), (0.5, 0.5), (0.5, 0.5)]
    assert task.describe()["train_size_schedule"] == {"4": [1.0, 1.0]}


def test_train_size_schedule_after_epoch_0_needs_resampling(tmp_path):
    text = SPEC.replace("train_sizes: [3, 4],", "train_sizes: [3, 4], train_size_schedule: {{0: [9, 1], 2: [1, 9]}},")
    assert load_spec(str(write_spec(tmp_path, text)))[0].task.resample_train  # the base spec resamples
    text = text.replace("train_size: 32", "train_size: 32\n  resample_train: false")
    with pytest.raises(SpecError, match="needs resample_train: true"):
        load_spec(str(write_spec(tmp_path, text)))
    only0 = SPEC.replace("train_sizes: [3, 4],", "train_sizes: [3, 4], train_size_schedule: {{0: [9, 1]}},")
    only0 = only0.replace("train_size: 32", "train_size: 32\n  resample_train: false")
    # the keys become strings (Ray Tune's search space cannot flatten int keys), which the task reads as epochs
    spec = load_spec(str(write_spec(tmp_path, only0)))[0]
    assert spec.task.params["train_size_schedule"] == {"0": [9, 1]}
    assert get_task("dijkstra", **spec.task.params).train_size_schedule == ((0, (9.0, 1.0)),)


def test_train_size_schedule_with_an_epoch_twice_is_refused(tmp_path):
    """YAML keeps `0` and `"0"` apart; as strings one would silently replace the other."""
    text = SPEC.replace("train_sizes: [3, 4],", "train_sizes: [3, 4], train_size_schedule: {{0: [9, 1], '0': [1, 9]}},")
    with pytest.raises(SpecError, match="names epoch 0 twice"):
        load_spec(str(write_spec(tmp_path, text)))


def test_train_size_schedule_passes_through_the_optuna_search_space(tmp_path):
    """Ray's OptunaSearch flattens the whole trial config (path keys must be strings): a schedule
    written with integer epochs, as YAML reads `{0: [3, 1], 2: [1, 3]}`, converts, and the trial
    config keeps it."""
    from ray.tune.search.optuna import OptunaSearch

    from stabray.tune.sweep import ray_space

    text = SPEC.replace("train_sizes: [3, 4],", "train_sizes: [3, 4], train_size_schedule: {{0: [3, 1], 2: [1, 3]}},")
    lr = "lr: {{loguniform: [1.0e-4, 1.0e-3]}}"
    text = text.replace("{{lam: null, bits: null}}", "{{lam: null, bits: null, " + lr + "}}")
    spec, _ = load_spec(str(write_spec(tmp_path, text)))
    space = OptunaSearch.convert_search_space(ray_space(spec))
    assert list(space) == ["train/lr"]
    assert ray_space(spec)["task"]["params"]["train_size_schedule"] == {"0": [3, 1], "2": [1, 3]}


@pytest.mark.parametrize(
    "schedule, problem",
    [
        ([1, 2], "must be a mapping"),
        ({}, "must be a mapping"),
        ({-1: [1, 1]}, "integers >= 0"),
        ({"x": [1, 1]}, "integers >= 0"),
        ({3: [1]}, r"train_size_schedule\[3\] must be 2 positive numbers"),
        ({3: [1, 0]}, r"train_size_schedule\[3\] must be 2 positive numbers"),
    ],
)
def test_bad_train_size_schedule(schedule, problem):
    with pytest.raises(UserError, match=problem):
        get_task("dijkstra", decimals=1, train_sizes=[3, 4], train_size_schedule=schedule)
    with pytest.raises(UserError, match="needs train_sizes"):
        get_task("dijkstra", decimals=1, train_size_schedule={0: [1, 1]})


@pytest.mark.parametrize(
    "params, problem",
    [
        ({"train_size_weights": [1, 2]}, "needs train_sizes"),
        ({"train_sizes": [3, 4], "train_size_weights": [1]}, "2 positive numbers"),
        ({"train_sizes": [3, 4], "train_size_weights": [1, 0]}, "2 positive numbers"),
        ({"train_sizes": [3, 4], "train_size_weights": [1, "x"]}, "2 positive numbers"),
        ({"train_sizes": [3, 4], "train_size_weights": [1, float("nan")]}, "2 positive numbers"),
        ({"train_sizes": [4, 3], "train_size_weights": [1, 2]}, "ascending order"),
    ],
)
def test_bad_train_size_weights(params, problem):
    with pytest.raises(UserError, match=problem):
        get_task("dijkstra", decimals=1, **params)


def test_spec_validator_names_bad_train_size_weights(tmp_path):
    bad = SPEC.replace("train_sizes: [3, 4],", "train_sizes: [3, 4], train_size_weights: [1, -1],")
    with pytest.raises(SpecError, match="train_size_weights"):
        load_spec(str(write_spec(tmp_path, bad)))


@pytest.mark.parametrize(
    "params, problem",
    [
        ({"train_sizes": []}, "non-empty list"),
        ({"train_sizes": 3}, "non-empty list"),
        ({"train_sizes": [3, 3]}, "distinct"),
        ({"train_sizes": [1, 4]}, "in 2..1000"),
        ({"n_nodes": 4, "long_sizes": [4, 5]}, "larger than the largest training size 4"),
        ({"train_sizes": [3, 5], "long_sizes": [5]}, "larger than the largest training size 5"),
        ({"n_nodes": 4, "labels": 5, "long_sizes": [6]}, "needs at least 6 labels"),
        ({"train_size": [3]}, "unknown parameter 'train_size'; did you mean train_sizes"),
        ({"qqq": 1}, "unknown parameter 'qqq'; known: decimals, distances, labels"),
    ],
)
def test_bad_size_options(params, problem):
    with pytest.raises(UserError, match=problem):
        get_task("dijkstra", **params)


def test_metric_names_by_size():
    assert acc_metric("test") == "test_acc" and acc_metric("test_long") == "test_long_acc"
    assert acc_metric("test_n12") == "test_acc_n12" and trivial_metric("test_n5") == "trivial_test_acc_n5"
    assert trivial_metric("test_longer") == "trivial_test_longer_acc"
    assert steps_metric("test") == "steps_test_acc" and steps_metric("test_n5") == "steps_test_acc_n5"
    for name in ("test_acc_n5", "trivial_test_acc_n12", "trivial_test_acc", "trivial_test_long_acc", "trivial_val_acc",
                 "steps_test_acc", "steps_test_acc_n5", "steps_test_long_acc"):  # fmt: skip
        assert is_metric(name) and logged_name(name) == name  # science metrics: no sys/ prefix
        assert describe_metric(name)
    assert "size 7" in describe_metric("test_acc_n7")
    for name in ("test_acc_n", "test_acc_nX", "test_n5_acc", "test_acc@n5"):
        assert not is_metric(name)
    # MLflow's allowed metric-name characters: letters, digits, _ - . / : and space
    import re

    assert re.fullmatch(r"[\w\-./: ]+", acc_metric("test_n5"))


def test_trials_frame_reads_sized_metrics():
    recs = [
        TrialRecord("a", {"task": "dijkstra", "method": "sft_cot", "seed": 0}, {"test_acc": 0.9, "test_acc_n5": 0.4,
                                                                                 "trivial_test_acc_n5": 0.6}),
        TrialRecord("b", {"task": "dijkstra", "method": "sft_cot", "seed": 1}, {"test_acc": 0.8, "test_acc_n10": 0.1}),
    ]  # fmt: skip
    df = trials_frame(recs)
    assert df.schema["test_acc_n5"] == pl.Float64 and df.schema["test_acc_n10"] == pl.Float64
    assert df.filter(pl.col("trial_id") == "a")["test_acc_n5"].item() == 0.4
    assert df.filter(pl.col("trial_id") == "b")["test_acc_n5"].item() is None
    assert df["trivial_test_acc_n5"].to_list() == [0.6, None]


def test_trials_frame_reads_final_departures():
    """Where the wrong written chains go off at the end is a column of the trial frame (so of trials.csv),
    split by split in the accuracies' order and token by token; a trial without one has null there."""
    dep = {"test_departure_tok1": 0.2, "test_departure_tok0": 0.1, "test_departure_tok0_n7": 0.5,
           "test_departure_tok10_n6": 0.05, "test_departure_tok0_n6": 0.4, "test_long_departure_tok0": 0.3,
           "val_departure_tok0": 0.9}  # fmt: skip
    recs = [
        TrialRecord("a", {"task": "lego_cyclic", "method": "sft_cot", "seed": 0}, {"test_acc": 0.7, **dep}),
        TrialRecord("b", {"task": "lego_cyclic", "method": "no_cot", "seed": 0}, {"test_acc": 0.5}),
    ]
    df = trials_frame(recs)
    cols = [c for c in df.columns if "_departure_" in c]
    assert cols == ["test_departure_tok0", "test_departure_tok1", "test_long_departure_tok0", "test_departure_tok0_n6",
                    "test_departure_tok10_n6", "test_departure_tok0_n7"]  # fmt: skip
    assert "val_departure_tok0" not in df.columns  # a per-epoch curve, not a final number
    a, b = (df.filter(pl.col("trial_id") == t).row(0, named=True) for t in "ab")
    assert {c: a[c] for c in cols} == {c: dep[c] for c in cols} and all(b[c] is None for c in cols)
    assert all(df.schema[c] == pl.Float64 for c in cols)


SPEC = """
include: {base}
name: sized
task:
  name: dijkstra
  params: {{n_nodes: 4, decimals: 1, train_sizes: [3, 4], long_sizes: [5, 6], labels: 8}}
  train_size: 32
  val_size: 8
  test_size: 12
model: {{preset: tiny, init_std: 0.1}}
method: {{name: sft_cot}}
train: {{epochs: 1, batch_size: 16, max_steps_per_epoch: 2, threads: 1}}
eval: {{eaf_examples: 0, decomposition_examples: 0, weight_noise_seeds: 0}}
search: {{space: {{lam: null, bits: null}}}}
"""


def write_spec(tmp_path, text=SPEC):
    from stabray.spec import SWEEPS_DIR

    path = tmp_path / "sized.yaml"
    path.write_text(text.format(base=SWEEPS_DIR / "_base.yaml"))
    return path


def test_the_validation_floor_is_read_on_the_examples_val_acc_scores(tmp_path, cache_dir):
    """eval.val_examples: val_acc scores the first N validation examples, so trivial_val_acc is the
    best rule on those N (on this draw the whole split's floor differs, so reading the whole split
    fails this)."""
    from stabray.train import make_run

    spec, _ = load_spec(str(write_spec(tmp_path)))
    cfg = {**spec.trial_base(), "cache_dir": cache_dir}
    first = make_run(cfg)
    val = first.data["val"]

    def floor(exs):
        return max(first.task.baseline_accuracy(exs).values())

    n = next(k for k in range(1, len(val)) if floor(val[:k]) != floor(val))  # a count where the two differ
    cfg["eval"] = {**cfg["eval"], "val_examples": n}
    run = make_run(cfg)
    assert run.trivial_accuracy()["trivial_val_acc"] == floor(val[:n])
    assert len(run.evaluate("val", run.cfg.eval.val_examples).predictions) == n


def test_spec_with_explicit_sizes_logs_named_metrics_and_floors(tmp_path, cache_dir):
    from stabray.train import make_run

    spec, _ = load_spec(str(write_spec(tmp_path)))
    cfg = {**spec.trial_base(), "cache_dir": cache_dir}
    run = make_run(cfg)
    epoch = run.epoch()
    final = run.final()
    want = {"test_acc", "test_acc_n5", "test_acc_n6", "trivial_val_acc", "trivial_test_acc", "trivial_test_acc_n5",
            "trivial_test_acc_n6", "steps_test_acc", "steps_test_acc_n5", "steps_test_acc_n6"}  # fmt: skip
    assert set(final) >= want and "test_long_acc" not in final
    assert all(is_metric(k) for k in final)

    # the chain's score against the written chains read back here (the text before the last '|', spacing aside)
    def written_right(exs, preds):
        return np.mean([p.rsplit("|", 1)[0].split() == e.answer.rsplit("|", 1)[0].split() if "|" in p else False
                        for e, p in zip(exs, preds)])  # fmt: skip

    for split in ("test", "test_n5", "test_n6"):
        exs, preds = run.data[split], run.evaluate(split).predictions
        assert final[steps_metric(split)] == pytest.approx(written_right(exs, preds))
    # and every epoch on the validation examples scored for val_acc (the chain's learning curve)
    n_val = run.cfg.eval.val_examples
    exs, preds = run.data["val"][: n_val or None], run.evaluate("val", n_val).predictions
    assert len(preds) == len(exs) and is_metric("steps_val_acc")
    assert epoch["steps_val_acc"] == pytest.approx(written_right(exs, preds))
    # and where the wrong ones go off: one metric per token of the longest step and its end, every epoch
    from stabray.evaluate.metrics import first_departure_token

    longest = max(len(normalize_answer(s).split()) for e in exs for s in e.steps)
    dep = {k: v for k, v in epoch.items() if k.startswith("val_departure_tok")}
    assert set(dep) == {f"val_departure_tok{k}" for k in range(longest + 1)} and all(is_metric(k) for k in dep)
    where = [first_departure_token(e.steps, p) for e, p in zip(exs, preds)]
    assert dep == {f"val_departure_tok{k}": pytest.approx(where.count(k) / len(exs)) for k in range(longest + 1)}
    assert sum(dep.values()) == pytest.approx(1 - epoch["steps_val_acc"])
    assert "token 2 of a step" in describe_metric("val_departure_tok2")
    # the same count at the end on each test split, the sized ones named with the size last (as test_acc_n6)
    for split, name in (("test", "test_departure_tok{}"), ("test_n5", "test_departure_tok{}_n5"),
                        ("test_n6", "test_departure_tok{}_n6")):  # fmt: skip
        exs, preds = run.data[split], run.evaluate(split).predictions
        where = [first_departure_token(e.steps, p) for e, p in zip(exs, preds)]
        longest = max(len(normalize_answer(s).split()) for e in exs for s in e.steps)
        got = {k: v for k, v in final.items() if re.fullmatch(name.format(r"\d+"), k)}
        assert got == {name.format(k): pytest.approx(where.count(k) / len(exs)) for k in range(longest + 1)}
        assert sum(got.values()) == pytest.approx(1 - final[steps_metric(split)])
    assert "token 1 of a step" in describe_metric("test_departure_tok1_n6")
    assert "test inputs of size 6" in describe_metric("test_departure_tok1_n6")
    assert "test_long answers" in describe_metric("test_long_departure_tok0")
    assert {e.meta["n"] for e in run.data["test_n6"]} == {6} and {e.meta["n"] for e in run.data["test"]} <= {3, 4}
    # each floor against the two Dijkstra rules computed here from the graph alone, on the very examples evaluated
    by_rule = {
        "adjacent": lambda ex: rule_text(ex, adjacent=True),
        "identity": lambda ex: rule_text(ex, adjacent=False),
    }
    for split in ("val", "test", "test_n5", "test_n6"):
        exs = run.data[split]
        best = max(
            np.mean([normalize_answer(f(e)) == normalize_answer(e.final) for e in exs]) for f in by_rule.values()
        )
        assert final[trivial_metric(split)] == pytest.approx(best)


def test_each_split_logs_its_own_scores(tmp_path, cache_dir, monkeypatch):
    """final() names each split's scores after that split, and epoch() the validation's: with the
    generations chosen here, a different count per split of whole right answers, of right chains with
    a wrong final answer (a 6-node final: the wrong length for every other split) and of answers
    with neither, every logged accuracy and chain score is the count made here."""
    import stabray.evaluate.metrics as metrics
    from stabray.train import make_run

    spec, _ = load_spec(str(write_spec(tmp_path)))
    run = make_run({**spec.trial_base(), "cache_dir": cache_dir})
    plan = {"val": (1, 2), "test": (2, 1), "test_n5": (4, 3), "test_n6": (7, 0)}  # (right, right chain only)
    wrong6 = run.data["test_n6"][0].final  # 6 entries
    wrong5 = run.data["test_n5"][0].final  # for the 6-node split: 5 entries
    said: dict[str, str] = {}
    for split, (k, j) in plan.items():
        exs = run.data[split][: run.cfg.eval.val_examples or None] if split == "val" else run.data[split]
        assert len(exs) > k + j
        wrong = wrong5 if split == "test_n6" else wrong6
        for i, e in enumerate(exs):
            prompt = run.method.eval_prompt(e)
            assert prompt not in said  # no question in two splits
            chain = e.answer.rsplit("|", 1)[0]
            said[prompt] = e.answer if i < k else chain + "| " + wrong if i < k + j else "[0 0] | " + wrong
    monkeypatch.setattr(
        metrics,
        "generate_per_input",
        lambda method, model, enc, prompts, *a, **kw: [list(enc.ids(said[p])) for p in prompts],
    )
    epoch, final = run.epoch(), run.final()
    for split, (k, j) in plan.items():
        n = len([p for p in said if p in {run.method.eval_prompt(e) for e in run.data[split]}])
        got = epoch if split == "val" else final
        name = "val_acc" if split == "val" else acc_metric(split)
        assert got[name] == pytest.approx(k / n), (split, got[name])
        assert got[steps_metric(split)] == pytest.approx((k + j) / n), split


def test_evaluate_split_scores_the_written_chain_apart_from_the_answer(tmp_path, cache_dir, monkeypatch):
    """evaluate_split on chosen generations: a right answer, the right chain with a wrong final answer, a
    chain with a step left out and the right final answer, the final answer alone. acc counts the
    final answers, steps_acc the chains; a compressed method (Algorithm 1, lam 0.5) logs no steps_acc."""
    import stabray.evaluate.metrics as metrics
    from stabray.methods import get_method
    from stabray.train import make_run

    spec, _ = load_spec(str(write_spec(tmp_path)))
    run = make_run({**spec.trial_base(), "cache_dir": cache_dir})
    exs = [e for s in ("test", "test_n5", "test_n6") for e in run.data[s] if len(e.steps) >= 2][:4]
    assert len(exs) == 4
    texts = [
        exs[0].answer,
        exs[1].answer.rsplit("|", 1)[0] + "| " + exs[0].final,
        exs[2].render_answer(exs[2].steps[1:]),
        exs[3].final,
    ]
    assert exs[1].final != exs[0].final  # the second text has the wrong final answer
    monkeypatch.setattr(metrics, "generate_per_input", lambda *a, **k: [list(run.encoder.ids(t)) for t in texts])
    res = metrics.evaluate_split(run.model, run.encoder, run.task, exs, run.method)
    assert res.acc == pytest.approx(3 / 4) and res.steps_acc == pytest.approx(2 / 4)
    compressed = get_method("alg1", lam=0.5, strategy="equal")
    res = metrics.evaluate_split(run.model, run.encoder, run.task, exs, compressed)
    assert res.steps_acc is None


def rule_text(ex, adjacent: bool) -> str:
    A, s, labels = np.asarray(ex.meta["A"]), ex.meta["source"], ex.meta["labels"]
    pred = [labels[s] if adjacent and A[s, v] != 0 and v != s else labels[v] for v in range(len(A))]
    return "[" + " ".join(f"{labels[v]}:{p}" for v, p in enumerate(pred)) + "]"


def test_spec_validator_names_bad_long_splits(tmp_path):
    bad = SPEC.replace("eaf_examples: 0,", "eaf_examples: 0, long_splits: [test_long],")
    with pytest.raises(SpecError, match="eval.long_splits"):
        load_spec(str(write_spec(tmp_path, bad)))
    with pytest.raises(SpecError, match="long_sizes"):
        load_spec(str(write_spec(tmp_path, SPEC.replace("long_sizes: [5, 6]", "long_sizes: [4, 6]"))))


def test_closing_table_puts_floors_under_the_accuracies(tmp_path):
    from stabray.tune.summary import FLOOR_ROW, closing_table, metric_columns

    spec, _ = load_spec(str(write_spec(tmp_path)))
    assert metric_columns(spec)[:5] == ["val_acc", "best_val_acc", "test_acc", "test_acc_n5", "test_acc_n6"]
    metrics = {"val_acc": 0.9, "test_acc": 0.95, "test_acc_n5": 0.7, "test_acc_n6": 0.5, "trivial_val_acc": 0.8,
               "trivial_test_acc": 0.84, "trivial_test_acc_n5": 0.6, "trivial_test_acc_n6": 0.4}  # fmt: skip
    recs = [TrialRecord(str(i), {"task": "dijkstra", "method": "sft_cot", "seed": i}, metrics, [(1, 0.9)])
            for i in range(2)]  # fmt: skip
    show, _ = closing_table(spec, trials_frame(recs).rename({"n_epochs": "epochs_run"}))
    floor = show.filter(pl.col("trial") == FLOOR_ROW).row(0, named=True)
    assert show.height == 3 and show["trial"][-1] == FLOOR_ROW
    assert (floor["test_acc"], floor["test_acc_n5"], floor["test_acc_n6"]) == (0.84, 0.6, 0.4)
    assert floor["val_acc"] == floor["best_val_acc"] == 0.8 and floor["val_eaf"] is None


def test_sized_metrics_round_trip_through_mlflow(tmp_path):
    """MLflow accepts the sized names and the trials read back with them as columns."""
    from stabray.tracking import Store

    store = Store(f"sqlite:///{tmp_path}/mlflow.db", "sized")
    parent = store.start_parent("sized", "sized-1", {})
    child = store.start_child(parent, "t0", "sft_cot-s0", {"task": "dijkstra", "method": "sft_cot", "seed": 0}, {}, {})
    final = {"test_acc": 0.9, "test_acc_n5": 0.55, "trivial_test_acc_n5": 0.6, "test_acc_n12": 0.1}
    assert store.log_metrics(child, final, step=1) == 4
    records, _ = store.trial_records(stability=False)
    df = trials_frame(records)
    assert df["test_acc_n5"].to_list() == [0.55] and df["test_acc_n12"].to_list() == [0.1]
    assert df["trivial_test_acc_n5"].to_list() == [0.6]


def test_size_parameter_is_the_largest_training_size():
    assert get_task("dijkstra", train_sizes=[3, 5]).params.n_nodes == 5
    assert get_task("dijkstra", n_nodes=5, train_sizes=[3, 5]).size == 5
    with pytest.raises(UserError, match="disagrees with train_sizes"):
        get_task("dijkstra", n_nodes=4, train_sizes=[3, 5])


def test_method_table_means_over_seeds_against_numpy():
    from stabray.tune.summary import FLOOR_ROW, method_table

    spec, _ = load_spec("dijkstra_methods")
    rng = np.random.default_rng(0)
    recs, acc = [], {}
    for m in ("alg1", "sft_cot"):
        for seed in range(3):
            vals = {"test_acc": rng.uniform(), "test_acc_n5": rng.uniform(), "test_acc_n6": rng.uniform()}
            acc.setdefault(m, []).append(vals)
            metrics = {**vals, "best_val_acc": 0.5, "trivial_test_acc": 0.84, "trivial_test_acc_n5": 0.6,
                       "trivial_test_acc_n6": 0.4}  # fmt: skip
            recs.append(TrialRecord(f"{m}{seed}", {"task": "dijkstra", "method": m, "seed": seed}, metrics))
    table = method_table(spec, trials_frame(recs))
    assert table["method"].to_list() == ["sft_cot", "alg1", FLOOR_ROW]  # the spec's order, then the floor
    for m in ("sft_cot", "alg1"):
        row = table.filter(pl.col("method") == m).row(0, named=True)
        assert row["n"] == "3"
        for col in ("test_acc", "test_acc_n5", "test_acc_n6"):
            xs = [v[col] for v in acc[m]]
            assert row[col] == f"{np.mean(xs):.3f} ± {np.std(xs, ddof=1):.3f}"
    floor = table.row(2, named=True)
    assert (floor["test_acc"], floor["test_acc_n5"], floor["test_acc_n6"]) == ("0.840", "0.600", "0.400")


def test_report_tables_at_explicit_sizes_with_floors():
    from analysis.tables import FLOOR_LABEL, all_tables, table1_sized

    rng = np.random.default_rng(1)
    recs, xs = [], []
    for seed in range(3):
        x = float(rng.uniform())
        xs.append(x)
        metrics = {"test_acc": 0.9, "test_acc_n5": x, "trivial_test_acc_n5": 0.6, "best_val_acc": 0.9}
        recs.append(TrialRecord(str(seed), {"task": "dijkstra", "method": "sft_cot", "seed": seed}, metrics))
    df = trials_frame(recs)
    (table,) = table1_sized(df)
    assert table.name == "table1_n5"
    shown = dict(zip(table.display["Method"], table.display["Dijkstra"]))
    assert shown["SFT-CoT"] == f"{100 * np.mean(xs):.1f} ± {100 * np.std(xs, ddof=1):.1f} (n=3)"
    assert shown[FLOOR_LABEL] == "60"
    assert "table1_n5" in [t.name for t in all_tables(df, pl.DataFrame())]


def load_calibrate(name: str = "calibrate"):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / f"{name}.py"
    mod = importlib.util.spec_from_file_location(name, path)
    calibrate = importlib.util.module_from_spec(mod)
    mod.loader.exec_module(calibrate)
    return calibrate


def test_early_sign_counts_calls_against_outcomes():
    """scripts/early_sign.py on synthetic rows: the share is the test count off at token 0 over the
    split's size at the asked epoch; a run fits at its first val_acc >= 0.95; only delta_op runs at init
    0.1 tracked at that epoch count; the 2x2 and Fisher's p are those of scipy on the hand-made table."""
    from scipy.stats import fisher_exact

    sign = load_calibrate("early_sign")

    def row(off_at_var, accs, trace="delta_op", init=0.1, tracked=True):
        epochs = [{"epoch": e, "val_acc": a} for e, a in enumerate(accs, 1)]
        if tracked:
            epochs[1]["track_departure"] = {"test": {"0": off_at_var, "1": 3}}
            epochs[1]["val_departure_tok0"] = off_at_var / 20
        cfg = {"task": {"params": {"trace": trace}}, "model": {"init_std": init}}
        return {"profile": "lx_a", "seed": 0, "config": cfg, "final": {"test": {"n": 20}}, "epochs": epochs}

    rows = [
        row(12, [0.1, 0.5, 0.6, 0.7]),  # 0.60: called stuck, never fits -> right
        row(11, [0.1, 0.5, 0.96, 0.9]),  # 0.55: called stuck, fits at 3 -> wrong
        row(4, [0.1, 0.5, 0.7, 0.95]),  # 0.20: called fits, fits at 4 -> right
        row(9, [0.1, 0.3, 0.5, 0.5]),  # 0.45: called fits, never -> wrong
        row(2, [0.1, 0.2, 0.9, 0.99]),  # 0.10: called fits, fits at 4 -> right
        row(15, [0.1, 0.2, 0.3, 0.3], trace="delta"),  # another trace: left out
        row(15, [0.1, 0.2, 0.3, 0.3], init=0.05),  # another scale: left out
        row(15, [0.1, 0.2, 0.3, 0.3], tracked=False),  # not tracked at epoch 2: left out
    ]
    items = sign.table(list(enumerate(rows, 1)), epoch=2, threshold=0.5)
    assert [t["row"] for t in items] == [1, 2, 3, 4, 5]
    assert [t["share"] for t in items] == [0.6, 0.55, 0.2, 0.45, 0.1] and items[0]["val"] == 0.6
    assert {t["op"] for t in items} == {3 / 20}
    assert [t["fit"] for t in items] == [None, 3, 4, None, 4]
    m, p = sign.two_by_two(items)
    assert m == [[1, 1], [1, 2]] and p == pytest.approx(fisher_exact([[1, 1], [1, 2]])[1])
    # the validation twin is called on its own value (here first equal to the share); then two rows
    # move across the threshold the other way from their test share
    assert [t["val_called_stuck"] for t in items] == [True, True, False, False, False]
    rows[1]["epochs"][1]["val_departure_tok0"], rows[3]["epochs"][1]["val_departure_tok0"] = 0.4, 0.5
    del rows[4]["epochs"][1]["val_departure_tok0"]  # a row older than the metric: no twin call
    items = sign.table(list(enumerate(rows, 1)), epoch=2, threshold=0.5)
    assert [t["val_called_stuck"] for t in items] == [True, False, False, True, None]
    twins, m, p, far = sign.twin_tally(items)
    assert [t["row"] for t in twins] == [1, 2, 3, 4]  # row 5 has no twin: not counted as "fits"
    assert m == [[2, 0], [0, 2]]  # rows 1, 4 never fit and are called stuck; rows 2, 3 fit and are not
    assert p == pytest.approx(fisher_exact([[2, 0], [0, 2]])[1])
    assert far["row"] == 2  # |0.40 - 0.55| = 0.15, the largest (row 4: |0.50 - 0.45| = 0.05)
    rows[0]["epochs"][1]["val_departure_tok0"] = 0.3  # |0.30 - 0.60| = 0.30: below its share, farther
    assert sign.twin_tally(sign.table(list(enumerate(rows, 1)), epoch=2, threshold=0.5))[3]["row"] == 1
    assert sign.twin_tally([])[3] is None


def test_calibration_profiles_build():
    """Every profile of the README's calibration table that the code supports is a valid trial."""
    import yaml

    from stabray.config import parse_trial_config

    calibrate = load_calibrate()
    profiles = yaml.safe_load(calibrate.PROFILES.read_text())
    built = 0
    for name, entry in profiles["profiles"].items():
        if (entry or {}).get("not_shipped"):
            with pytest.raises(UserError, match="not shipped"):
                calibrate.profile_config(name, profiles)
            continue
        cfg = parse_trial_config(calibrate.profile_config(name, profiles))
        get_task(cfg.task.name, **cfg.task.params)
        built += 1
    assert built >= 30
    d17 = parse_trial_config(calibrate.profile_config("d17_mix34_init1", profiles))
    assert d17.model.init_std == 0.1 and d17.task.params == {"decimals": 1, "train_sizes": [3, 4]}


@pytest.mark.parametrize(
    ("sweep_name", "profile", "eval_stride", "seeds"),
    [
        ("dijkstra_lengthgen", "L32_lab12_mix34w13_randpos512_s3_e160_h128_l3", None, [0, 1, 2]),
        ("dijkstra_lengthgen_mix35", "L37_lab12_mix35w113_randpos512_s3_e160_h128_l3", [2, 3, 4], [0, 1, 2, 3]),
        ("lego_cyclic_lengthgen", "l81_cyc_mix24w113_delta_randpos192_h128_l3_e160", None, [0, 1, 2]),
        ("lego_cyclic_lengthgen_mix25", "l86_cyc_mix25w1113_delta_randpos192_h128_l3_e160_lr1e3", None, [0, 1, 2, 3]),
        (
            "lego_cyclic_lengthgen_op",
            "l89_cyc_mix25w1113_deltaop_randpos192_h128_l3_e160_lr1e3_wd1e1",
            None,
            [0, 1, 2, 3, 4],
        ),
        (
            "lego_cyclic_lengthgen_span256",
            "l105_cyc_mix26w11114_deltaop_randpos256_h128_l3_e160_lr1e3_wd1e1",
            None,
            [1, 2, 8],
        ),
    ],
)
def test_lengthgen_sweep_trains_what_its_calibration_profile_trained(sweep_name, profile, eval_stride, seeds):
    """sweeps/dijkstra_lengthgen.yaml is profile L32 as a sweep, dijkstra_lengthgen_mix35.yaml is L37
    evaluated at the per-input stride (calibrate.py --eval-strides 2,3,4 scored the same models so),
    lego_cyclic_lengthgen.yaml is l81, lego_cyclic_lengthgen_mix25.yaml l86, lego_cyclic_lengthgen_op.yaml l89
    and lego_cyclic_lengthgen_span256.yaml l105:
    the same examples (task and its cache key, split sizes), model, method and training; only what is
    measured differs (the EAF and the end-of-trial analyses are on in the sweep, off in calibration)."""
    import yaml

    from stabray.config import parse_trial_config

    calibrate = load_calibrate()
    profiles = yaml.safe_load(calibrate.PROFILES.read_text())
    cfg = calibrate.profile_config(profile, profiles)
    if eval_stride is not None:
        cfg["model"]["position_eval_stride"] = eval_stride
    prof = parse_trial_config(cfg)
    spec, _ = load_spec(sweep_name)
    sweep = parse_trial_config(spec.trial_base())
    assert (
        get_task(sweep.task.name, **sweep.task.params).describe()
        == get_task(prof.task.name, **prof.task.params).describe()
    )
    task_fields = {k: v for k, v in sweep.task.model_dump().items() if k != "params"}
    assert task_fields == {k: v for k, v in prof.task.model_dump().items() if k != "params"}
    for section in ("model", "method", "train"):
        assert getattr(sweep, section) == getattr(prof, section), section
    assert sweep.eval.val_examples in (0, prof.eval.val_examples) and sweep.eval.eaf_examples > 0
    assert spec.search.space["seed"].choice == seeds and spec.search.n_trials == len(seeds)
    assert (spec.search.searcher, spec.search.scheduler) == ("grid", "fifo")  # every seed runs every epoch


def test_readme_calibration_table_is_the_results_file():
    """The README's calibration table is calibration_table.py's output on the committed results (a row
    added to one and not the other fails), and its seed means agree with numpy on the same rows."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    results = root / "scripts" / "calibration_results.jsonl"
    out = subprocess.run(
        [sys.executable, str(root / "scripts" / "calibration_table.py"), str(results)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert out in (root / "README.md").read_text()
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    assert out.count("\n| ") >= len(rows)
    l21 = [r for r in rows if r["profile"] == "L21_lab12_mix34_randpos512_s3_e320_h128"]
    n5 = np.array([r["splits"]["test_n5"]["acc"] for r in l21])
    line = next(x for x in out.splitlines() if x.startswith("| L21_lab12_mix34_randpos512_s3_e320_h128 |"))
    assert f"{n5.mean():.3f} ± {n5.std(ddof=1):.3f} (0.580)" in line


def test_calibration_table_readme_option_rewrites_only_the_table(tmp_path):
    """--readme puts calibration_table.py's output between the markers: a README whose table was edited
    by hand comes back byte for byte as committed, and the text around the markers is untouched."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text()
    first = next(x for x in readme.splitlines() if x.startswith("| 1 | d00_default_n4 |"))
    edited = tmp_path / "README.md"
    edited.write_text(readme.replace(first, "| 1 | d00_default_n4 | hand-edited |"))
    assert edited.read_text() != readme
    cmd = [sys.executable, str(root / "scripts" / "calibration_table.py")]
    subprocess.run([*cmd, str(root / "scripts" / "calibration_results.jsonl"), "--readme", str(edited)], check=True)
    assert edited.read_text() == readme
    edited.write_text("no markers here\n")
    bad = subprocess.run(
        [*cmd, str(root / "scripts" / "calibration_results.jsonl"), "--readme", str(edited)],
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0 and "calibration-table: begin" in bad.stderr
    assert edited.read_text() == "no markers here\n"


def test_calibration_table_compare_against_the_formulas(tmp_path):
    """--compare A B: A's mean ± std, its margin over the rule with a one-sample t-test, A - B with
    Welch's test, and the paired test on shared seeds, each checked against the t formulas; a name
    that matches no profile (or two) is an error naming it."""
    import json
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent

    def row(profile, seed, acc):
        split = {"sizes": [5], "acc": acc, "n": 200, "best_rule": 0.5, "best_rule_name": "r"}
        return {"profile": profile, "seed": seed, "splits": {"test_n5": split}}

    a, b = [0.62, 0.71, 0.83], [0.55, 0.5, 0.61, 0.58]
    rows = [row("P1_a", s, x) for s, x in enumerate(a)] + [row("P2_b", s, x) for s, x in enumerate(b)]
    rows.append(row("P2_bb", 0, 0.3))
    res = tmp_path / "r.jsonl"
    res.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cmd = [sys.executable, str(root / "scripts" / "calibration_table.py"), str(res), "--compare"]
    out = subprocess.run([*cmd, "P1", "P2_b"], capture_output=True, text=True, check=True).stdout
    line = next(x for x in out.splitlines() if x.startswith("test_n5:"))
    assert f"A {np.mean(a):.3f} ± {np.std(a, ddof=1):.3f}, rule 0.500, A - rule {np.mean(a) - 0.5:+.3f}" in line
    t1 = (np.mean(a) - 0.5) / (np.std(a, ddof=1) / math.sqrt(3))
    p1 = float(re.search(r"t-test p=([0-9.]+)", line).group(1))
    assert p1 == pytest.approx(_t_pvalue(t1, 2), abs=1.5e-3)
    va, vb = np.var(a, ddof=1) / 3, np.var(b, ddof=1) / 4
    tw = (np.mean(a) - np.mean(b)) / math.sqrt(va + vb)
    dof = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 3)
    assert f"A - B {np.mean(a) - np.mean(b):+.3f}" in line
    pw = float(re.search(r"Welch p=([0-9.]+)", line).group(1))
    assert pw == pytest.approx(_t_pvalue(tw, dof), abs=1.5e-3)
    d = np.array(a) - np.array(b[:3])
    assert "paired on seeds [0, 1, 2]: " + " ".join(f"{x:+.3f}" for x in d) in line
    tp = d.mean() / (d.std(ddof=1) / math.sqrt(3))
    pp = float(re.search(r"\(p=([0-9.]+)\)", line).group(1))
    assert pp == pytest.approx(_t_pvalue(tp, 2), abs=1.5e-3)
    res.write_text("".join(json.dumps(r) + "\n" for r in [*rows, row("P3_one", 1, 0.64)]))
    out = subprocess.run([*cmd, "P3", "P2_b"], capture_output=True, text=True, check=True).stdout
    line = next(x for x in out.splitlines() if x.startswith("test_n5:"))  # one seed: no spread, no test
    diff = f"A - B {0.64 - np.mean(b):+.3f}, on seed 1: {0.64 - b[1]:+.3f}"
    assert line == f"test_n5: A 0.640 (one seed), rule 0.500, A - rule +0.140; {diff}"
    other = [
        {**row("P4_c", s, 0.6), "splits": {"test_n5": {**row("P4_c", s, 0.6)["splits"]["test_n5"], "sizes": [3, 5]}}}
        for s in range(2)
    ]
    res.write_text("".join(json.dumps(r) + "\n" for r in [*rows, *other]))
    out = subprocess.run([*cmd, "P1", "P4"], capture_output=True, text=True, check=True).stdout
    assert "test_n5: not compared: drawn at sizes 3,5 and 5 (different inputs on the two sides)" in out
    assert "A - B" not in out
    assert "kernel paths differ" not in out  # none recorded on either side: one (unknown) path
    machine = {"torch": "2.13.0+cpu", "kernels": "cpu AVX2, X, 1 thread"}
    res.write_text("".join(json.dumps({**r, "machine": machine} if r["profile"] == "P1_a" else r) + "\n" for r in rows))
    out = subprocess.run([*cmd, "P1", "P2_b"], capture_output=True, text=True, check=True).stdout
    assert "kernel paths differ (A: cpu AVX2, X, 1 thread; B: not recorded)" in out
    for bad, named in (("P3", "'P3'"), ("P2", "P2_b, P2_bb")):
        r = subprocess.run([*cmd, "P1", bad], capture_output=True, text=True)
        assert r.returncode != 0 and named in r.stderr and "Traceback" not in r.stderr


def _t_pvalue(t: float, dof: float) -> float:
    """Two-sided p of Student's t from its density, integrated numerically (independent of scipy)."""
    c = math.gamma((dof + 1) / 2) / (math.sqrt(dof * math.pi) * math.gamma(dof / 2))
    x = np.linspace(abs(t), abs(t) + 2000.0, 2_000_001)
    f = c * (1 + x**2 / dof) ** (-(dof + 1) / 2)
    return float(2 * np.sum((f[1:] + f[:-1]) / 2 * np.diff(x)))


def test_welch_against_the_formula():
    from analysis.tables import welch

    a, b = [0.965, 0.96, 0.935], [0.98, 0.97, 0.95, 0.99]
    va, vb = np.var(a, ddof=1) / 3, np.var(b, ddof=1) / 4
    t = (np.mean(a) - np.mean(b)) / math.sqrt(va + vb)
    dof = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 3)
    got = welch(a, b)
    assert got[0] == pytest.approx(t, rel=1e-9) and got[1] == pytest.approx(dof, rel=1e-9)
    assert got[2] == pytest.approx(_t_pvalue(t, dof), abs=2e-4)
    assert welch([0.0, 0.0], [0.0, 0.0])[2] == 1.0 and welch([1.0, 1.0], [0.0, 0.0])[2] == 0.0
    assert welch([0.5], [0.1, 0.2]) is None


def test_method_tests_table():
    """Algorithm 1 minus each method, per logged accuracy: the difference of seed means in points
    and Welch's p on the same seeds; metrics no trial logged and methods without trials are left out."""
    from analysis.tables import method_tests, welch

    rng = np.random.default_rng(2)
    recs, acc = [], {}
    for m in ("alg1", "sft_cot", "nso"):
        for seed in range(3):
            vals = {"test_acc": float(rng.uniform()), "test_acc_n5": float(rng.uniform()), "best_val_acc": 0.5}
            acc.setdefault(m, []).append(vals)
            recs.append(TrialRecord(f"{m}{seed}", {"task": "dijkstra", "method": m, "seed": seed}, vals))
    recs.append(TrialRecord("x", {"task": "dijkstra", "method": "alg1", "seed": 9}, {"test_long_acc": None}))
    table = method_tests(trials_frame(recs))
    assert table.display["Method"].to_list() == ["SFT-CoT", "NSO"]
    assert table.display.columns == ["Task", "Method", "test_acc Δ", "test_acc p", "test_acc_n5 Δ", "test_acc_n5 p"]
    for row in table.display.iter_rows(named=True):
        m = {"SFT-CoT": "sft_cot", "NSO": "nso"}[row["Method"]]
        for metric in ("test_acc", "test_acc_n5"):
            ref, other = [v[metric] for v in acc["alg1"]], [v[metric] for v in acc[m]]
            assert row[f"{metric} Δ"] == f"{100 * (np.mean(ref) - np.mean(other)):+.1f}"
            p = welch(ref, other)[2]
            assert row[f"{metric} p"] == ("<0.001" if p < 0.0005 else f"{p:.3f}")


def test_calibrate_steps_report_tells_a_wrong_chain_from_a_wrong_gather():
    """calibrate.py's steps diagnostic on LEGO delta-trace examples: the written steps compared with the
    example's own token for token (spacing aside), and a wrong answer after the right steps counted
    apart; only for a method whose evaluation chain is the whole chain (SFT-CoT, Algorithm 1 at lam = 1),
    not a compressed one (lam = 0.5) or No CoT. The trial's steps_<metric> is the same measure."""
    from types import SimpleNamespace

    from stabray.evaluate.metrics import writes_whole_chain
    from stabray.methods import get_method
    from stabray.tasks import get_task
    from stabray.tasks.base import extract_final, extract_steps

    calibrate = load_calibrate()
    task = get_task("lego_cyclic", n_vars=5, named_states=True, trace="delta")
    rng = np.random.RandomState(0)
    exs = [task.sample(rng, 5) for _ in range(4)]
    steps, final = exs[1].answer.rsplit("|", 1)
    tokens = final.split()  # [f 2 l 0 m 2 o 3 z 4]
    dropped = " " + " ".join(tokens[:2] + tokens[4:])  # [f 2 m 2 o 3 z 4]: one variable fewer
    wrong_step = exs[2].answer.split(",", 1)
    wrong_step = wrong_step[0][:-1] + ("0" if wrong_step[0][-1] != "0" else "1") + "," + wrong_step[1]
    preds = [
        exs[0].answer.replace(",", " ,"),  # right, spaced as the model writes it
        steps + "|" + dropped,  # the right steps, one variable left out of the final list
        wrong_step,  # a wrong first step, the final list right (it is exact, so it counts)
        "no bar at all",
    ]
    ok = [task.is_correct(e, extract_final(p)) for e, p in zip(exs, preds)]
    assert ok == [True, False, True, False]
    assert extract_steps(wrong_step) != extract_steps(exs[2].answer) != ""
    assert extract_steps("no bar at all") is None and extract_steps("| [f 2]") == ""
    for name, params in (("sft_cot", {}), ("alg1", {"lam": 1.0})):
        rep = calibrate.steps_report(SimpleNamespace(method=get_method(name, **params)), exs, preds, ok)
        # a wrong value, and a text with no chain in it (departs at its first token)
        assert rep == {
            "steps_acc": 0.5,
            "steps_ok_final_wrong": 1,
            "first_departure": {"0": 1, "1": 1},
            "final_after_steps": {"length": {"-2": 1}, "prefix": 0},  # an entry short, from the middle
        }
    for name, params in (("alg1", {"lam": 0.5, "strategy": "equal"}), ("no_cot", {})):
        method = get_method(name, **params)
        assert not writes_whole_chain(method, exs)
        assert calibrate.steps_report(SimpleNamespace(method=method), exs, preds, ok) == {}


def test_first_departure_names_the_token_of_the_step_where_the_chain_goes_wrong():
    """first_departure_token on hand-written LEGO delta chains (steps `name value`): a wrong name is
    token 0, a wrong value token 1, a chain that stops early or goes on is token 2 (the separator or
    the end after a 2-token step); the example's own chain, however spaced, is None."""
    from stabray.evaluate.metrics import first_departure_token as first

    steps = ("f 3", "k 0", "b 5")
    assert first(steps, "f 3, k 0, b 5 | [b 5 f 3 k 0]") is None
    assert first(steps, "f 3 , k 0 ,b 5|[x]") is None  # spacing is not content
    assert first(steps, "f 3, b 0, k 5 | [b 0 f 3 k 5]") == 0  # the wrong variable second
    assert first(steps, "f 3, k 1, b 5 | [b 5 f 3 k 1]") == 1  # the right variable, a wrong value
    assert first(steps, "f 3, k 0 | [f 3 k 0]") == 2  # stops one step early
    assert first(steps, "f 3, k 0, b 5, q 2 | [b 5 f 3 k 0 q 2]") == 2  # one step too many
    assert first(steps, "g 3, k 0, b 5 | [b 5 g 3 k 0]") == 0
    assert first(steps, "| [b 5 f 3 k 0]") == 0  # an empty chain departs at the first token
    # no '|': a chain that never ended, compared whole (a model past its trained sizes writes these)
    assert first(steps, "f 3 , k 0 , q 4 , ]") == 0
    assert first(steps, "f 3, k 2") == 1
    assert first(steps, "f 3, k 0, b 5") == 2  # the whole chain, and no end: departs at the end
    assert first(steps, "f 3, k 0, b 5 [b 5 f 3 k 0]") == 2
    assert first(steps, "") == 0
    assert first(("d 4 7 9",), "d 4 8 9 | x") == 2  # a longer step: the third token


def test_final_difference_counts_short_answers_and_cut_off_ones():
    """calibrate.final_difference on hand-written LEGO named states (an entry is two tokens): the token
    difference per answer, and which answers are the example's cut off before its end (the closing
    bracket aside); spacing is not content, and only the text after the last '|' is read."""
    from types import SimpleNamespace

    calibrate = load_calibrate()
    gold = SimpleNamespace(final="[c 5 i 1 l 1 p 5 r 0 s 3 u 0]")
    preds = [
        "c 5 | [c 5 i 1 l 1 p 5 r 0 s 3]",  # the last entry left out: cut off
        "[ c 5 i 1 l 1 p 5 r 0 s 3 ]",  # the same, spaced
        "[c 5 i 1]",  # cut off after two entries
        "[c 5 l 1 p 5 r 0 s 3 u 0]",  # an entry from the middle left out: short, not cut off
        "[c 5 i 1 l 1 p 5 r 0 s 3 u 1]",  # the right length, a wrong value
        "[c 5 i 1 l 1 p 5 r 0 s 3 u 0 v 2]",  # an entry too many
        "[c 5 i 1 l 1 p 5 r 0 s 3 u 0",  # no closing bracket: one token short, every entry there
    ]
    diff = calibrate.final_difference([gold] * len(preds), preds)
    assert diff == {"length": {"-10": 1, "-2": 3, "-1": 1, "0": 1, "2": 1}, "prefix": 4}
    assert calibrate.final_difference([], []) == {"length": {}, "prefix": 0}


def test_departures_count_every_answer_whose_steps_are_wrong():
    """departures counts each answer steps_match calls wrong exactly once, and none it calls right: on
    the chains of 60 LEGO delta examples and their damaged copies (a token changed, a step dropped or
    added, the '|' or the answer dropped, the text cut anywhere). departure_shares (the trial's
    val_departure_tok<k>) are those counts over all the examples, with every token of a step and its
    end present."""
    import numpy as np

    from stabray.evaluate.metrics import departure_shares, departures, first_departure_token, steps_match
    from stabray.tasks import get_task

    task = get_task("lego_cyclic", n_vars=4, named_states=True, trace="delta")
    rng = np.random.RandomState(0)
    exs, texts = [], []
    for _ in range(60):
        ex = task.sample(rng, int(rng.randint(2, 6)))
        gold = ex.answer
        chain, final = gold.split(" | ")
        cut = int(rng.randint(0, len(gold)))
        steps = list(ex.steps)
        for text in (
            gold,
            gold.replace(" 3", " 4", 1),
            gold.replace(steps[0], steps[0][0] + " x", 1),
            ", ".join(steps[:-1]) + " | " + final,
            chain + ", q 1 | " + final,
            chain,
            chain + " " + final,
            gold[:cut],
        ):
            exs.append(ex)
            texts.append(text)
    same = steps_match(exs, texts)
    counted = departures(exs, texts)
    assert 0 < sum(same) < len(same)
    assert sum(counted.values()) == len(same) - sum(same)
    where = [first_departure_token(e.steps, t) for e, t in zip(exs, texts)]
    assert [w is None for w in where] == same
    shares = departure_shares(exs, texts)
    assert list(shares) == [0, 1, 2]  # a delta step is two tokens (`f 3`); 2 is its end
    assert shares == {k: where.count(k) / len(exs) for k in range(3)}
    assert sum(shares.values()) == pytest.approx(1 - np.mean(same))
    assert departure_shares(exs[:8], texts[:8][:1] * 8) == {0: 0.0, 1: 0.0, 2: 0.0}  # all right: zeros, not gaps


def tiny_calibration(epochs: int) -> list[str]:
    """calibrate.py --set options that shrink an L28 profile to a seconds-long run: 24 training
    graphs, 8 validation and 12 test per split, a 32-wide model, and a 200-position span (at stride 3
    a sequence of 68 tokens or more runs past it)."""
    return [
        f"--set={kv}"
        for kv in (
            f"train.epochs={epochs}",
            "task.train_size=24",
            "task.val_size=8",
            "task.test_size=12",
            "eval.val_examples=8",
            "model.hidden_size=32",
            "model.intermediate_size=64",
            "model.position_span=200",
        )
    ]


def test_calibrate_track_every_reads_the_model_and_does_not_change_the_training(tmp_path):
    """--track-every scores the test split and each longer split during training. The curve's last
    point is the final evaluation's accuracy, and the training it watched is the untracked run's,
    epoch for epoch (the same losses and validation accuracies, the same final accuracies)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    tiny = tiny_calibration(epochs=3)
    cmd = [sys.executable, str(root / "scripts" / "calibrate.py"), "L28_lab12_mix34w13_randpos512_s3_e160_h128", *tiny]
    env = {**os.environ, "PYTHONPATH": str(root), "STABRAY_CACHE": str(tmp_path / "cache")}
    rows = []
    for extra, out in (([], "plain.jsonl"), (["--track-every", "2"], "tracked.jsonl")):
        subprocess.run([*cmd, *extra, "--out", str(tmp_path / out)], check=True, env=env, capture_output=True)
        rows.append(json.loads((tmp_path / out).read_text()))
    plain, tracked = rows
    assert [e.get("track") is not None for e in tracked["epochs"]] == [False, True, True]  # epoch 2, and the last
    assert not any("track" in e for e in plain["epochs"])
    import torch

    assert plain["machine"]["torch"] == torch.__version__  # the kernel path the row ran on, one thread
    assert plain["machine"]["kernels"].startswith(f"cpu {torch.backends.cpu.get_cpu_capability()}, ")
    assert plain["machine"]["kernels"].endswith(", 1 thread")
    strip = [
        {
            k: v
            for k, v in e.items()
            if k not in ("track", "track_steps", "track_departure") and not k.endswith(("time_s", "_per_s"))
        }
        for e in tracked["epochs"]
    ]
    assert strip == [{k: v for k, v in e.items() if not k.endswith(("time_s", "_per_s"))} for e in plain["epochs"]]
    assert set(tracked["epochs"][-1]["track"]) == {"test", "test_n5", "test_n6"} == set(tracked["final"])
    for s, acc in tracked["epochs"][-1]["track"].items():
        assert acc == round(tracked["final"][s]["acc"], 4) == round(plain["final"][s]["acc"], 4)
    # SFT-CoT writes the whole chain: the chain's curve ends at the final evaluation's steps_acc
    assert set(tracked["epochs"][-1]["track_steps"]) == set(tracked["final"])
    for s, acc in tracked["epochs"][-1]["track_steps"].items():
        assert acc == round(tracked["final"][s]["steps_acc"], 4)
        # and where its wrong chains go off, the final evaluation's count, one per wrong written chain
        dep = tracked["epochs"][-1]["track_departure"][s]
        assert dep == tracked["final"][s]["first_departure"]
        assert sum(dep.values()) <= round((1 - acc) * tracked["final"][s]["n"])
    bad = subprocess.run([*cmd, "--track-every", "-1"], env=env, capture_output=True, text=True)
    assert bad.returncode != 0 and "--track-every must be >= 0" in bad.stderr

    # every split's reach at the model's own stride, recounted here from the same examples
    from stabray.train.run import TrialRun

    run = TrialRun({**plain["config"], "cache_dir": str(tmp_path / "cache")})
    beyond_somewhere = 0
    for s, r in plain["final"].items():
        q, exs = r["reach"], run.data[s]
        assert (q["stride"], q["span"]) == (3, 200) and len(exs) == r["n"] == 12
        lengths = [len(run.tokenizer(e.question + e.answer, add_special_tokens=False).input_ids) + 2 for e in exs]
        out = [(n - 1) * 3 >= 200 for n in lengths]
        assert q["n_beyond_span"] == sum(out) and q["max_len"] == max(lengths)
        inside, past = [e for e, o in zip(exs, out) if not o], [e for e, o in zip(exs, out) if o]
        for part, key in ((inside, "rule_within_span"), (past, "rule_beyond_span")):
            want = max(run.task.baseline_accuracy(part).values()) if part else 0.0
            assert q[key] == pytest.approx(want)
        right = q["acc_within_span"] * len(inside) + q["acc_beyond_span"] * len(past)
        assert right == pytest.approx(r["acc"] * r["n"])  # the two parts add up to the split
        beyond_somewhere += bool(past)
    assert beyond_somewhere >= 2  # the check above compared something on both sides of the span


def test_calibrate_eval_strides_and_rescore_pick_each_inputs_stride(tmp_path):
    """--eval-strides scores every split at each stride and at the per-input stride stabray's model
    uses (`model.position_eval_stride` a list); here the picks are recomputed from the encoded
    lengths (ratio, then a count of positions) and the per-input accuracy from the per-stride results;
    stabray's own evaluation of the model given the list writes, input by input, the answer written
    at that input's stride (the tiny model's answers are wrong, but differ between strides), and
    --rescore, which trains nothing, prints the same accuracies."""
    import json
    import math
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    tiny = tiny_calibration(epochs=2)
    prof = "L28_lab12_mix34w13_randpos512_s3_e160_h128"
    cmd = [sys.executable, str(root / "scripts" / "calibrate.py"), prof, *tiny]
    env = {**os.environ, "PYTHONPATH": str(root), "STABRAY_CACHE": str(tmp_path / "cache")}
    out = tmp_path / "strides.jsonl"
    subprocess.run([*cmd, "--eval-strides", "1,2,4", "--out", str(out)], check=True, env=env, capture_output=True)
    row = json.loads(out.read_text())
    from stabray.train.run import TrialRun

    run = TrialRun({**row["config"], "cache_dir": str(tmp_path / "cache")})
    pairs = []
    for e in run.data["train"][:500]:
        enc = run.encoder.encode(run.method.eval_prompt(e), run.method.eval_steps(e), e.final)
        pairs.append((len(enc.input_ids), enc.prompt_len))
    ratio = max(a / b for a, b in pairs)
    fitted = row["eval_strides"]["fitted"]
    assert fitted["ratio"] == pytest.approx(ratio)
    used, differ = set(), 0
    for s in ("test", "test_n5", "test_n6"):
        picks = []
        for e in run.data[s]:
            n = math.ceil(ratio * len(run.encoder.prompt(run.method.eval_prompt(e))))
            picks.append(max((k for k in (1, 2, 4) if all(p * k < 200 for p in range(n))), default=1))
        assert fitted[s]["strides"] == picks
        used |= set(picks)
        ok = [row["eval_strides"][f"{k}_reach"][s]["ok"][i] for i, k in enumerate(picks)]
        assert fitted[s]["acc"] == pytest.approx(sum(ok) / len(ok))
        # and stabray's evaluation, given the list of strides, generated every input at its stride
        mod = row["eval_strides"]["model"][s]
        assert mod["acc"] == pytest.approx(fitted[s]["acc"]) and mod["same_answers"] == len(picks)
        differ += mod["answers_differ_by_stride"]
    assert len(used) >= 2  # the splits' inputs get different strides
    assert differ >= 10  # and their answers depend on it: a wrong stride would have shown
    res = subprocess.run([*cmd, "--label", prof, "--rescore", str(out)], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    last = res.stdout.strip().splitlines()[-1]
    for s in ("test", "test_n5", "test_n6"):
        assert f"{s} {fitted[s]['acc']:.3f} ± 0.000" in last
    bad = subprocess.run([*cmd, "--label", "nope", "--rescore", str(out)], env=env, capture_output=True, text=True)
    assert bad.returncode != 0 and "no row named 'nope'" in bad.stderr
    listed = [*cmd, "--set=model.position_eval_stride=[2, 3]", "--eval-strides", "2,3"]
    bad = subprocess.run(listed, env=env, capture_output=True, text=True)  # refused before training
    assert bad.returncode != 0 and "already a list ([2, 3]): give it one stride" in bad.stderr
