"""The trial record (stabray.record): params with the method's defaults, every reported key declared
once, one status vocabulary, registries that name classes once, and the runner protocol."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from stabray.record import METRICS, STABILITY_TABLE, STATUSES, is_metric, trial_params, trial_status


def _config(method: dict) -> dict:
    return {"task": {"name": "dijkstra", "params": {"n_nodes": 4}}, "method": method, "train": {"lr": 1e-3}}


def test_params_carry_the_methods_own_defaults():
    # alg1 without params trains at lam 0.2, full precision: the record says so (it used to say 1.0)
    p = trial_params(_config({"name": "alg1"}))
    assert (p["lam"], p["bits"], p["strategy"]) == (0.2, 32, "random")
    p = trial_params(_config({"name": "alg1", "params": {"lam": 0.5, "bits": 2}}))
    assert (p["lam"], p["bits"]) == (0.5, 2)
    p = trial_params(_config({"name": "sft_cot"}))
    assert (p["lam"], p["bits"]) == (1.0, 32)  # what SFT-CoT means: every step, full precision
    p = trial_params(_config({"name": "coconut"}))
    assert "lam" not in p and p["latents_per_step"] == 1  # no implied lam for a method that has none
    assert trial_params({**_config({"name": "alg1"}), "task": {"name": "prim"}})["task"] == "mst_prim"  # aliases


def test_params_carry_an_embedded_models_shape():
    """hidden_size and num_layers: the preset's unless overridden (the length-generalization sweep's
    mini preset at 128 wide and 3 layers logs 128 and 3, not the preset's 64 and 2); none for a
    pretrained model."""
    from stabray.config import PRESETS
    from stabray.spec import load_spec

    cfg = {**_config({"name": "sft_cot"}), "model": {"preset": "mini"}}
    p = trial_params(cfg)
    assert (
        (p["model"], p["hidden_size"], p["num_layers"])
        == ("embedded-mini", 64, 2)
        == (
            "embedded-mini",
            PRESETS["mini"]["hidden_size"],
            PRESETS["mini"]["num_layers"],
        )
    )
    p = trial_params(_config({"name": "sft_cot"}))  # no model section: the default preset, small
    assert (p["hidden_size"], p["num_layers"]) == (128, 2)
    spec, _ = load_spec("dijkstra_lengthgen")
    p = trial_params(spec.trial_base())
    assert (p["model"], p["hidden_size"], p["num_layers"]) == ("embedded-mini", 128, 3)
    # randomized positions: the span and the evaluation stride tell configurations apart
    assert (p["positions"], p["position_span"], p["position_eval_stride"]) == ("random", 512, "3")
    listed = {**spec.trial_base(), "model": {**spec.trial_base()["model"], "position_eval_stride": [2, 3, 4]}}
    assert trial_params(listed)["position_eval_stride"] == "2,3,4"
    assert "positions" not in trial_params(_config({"name": "sft_cot"}))
    p = trial_params({**_config({"name": "sft_cot"}), "model": {"pretrained": "gpt2", "lora": {"rank": 8}}})
    assert "hidden_size" not in p and "num_layers" not in p and p["lora_rank"] == 8
    from stabray.tune.summary import sweep_params

    parent = sweep_params(spec)  # the sweep's parent run says the same
    assert (parent["model"], parent["hidden_size"], parent["num_layers"]) == ("embedded-mini", 128, 3)
    assert (parent["positions"], parent["position_span"], parent["position_eval_stride"]) == ("random", 512, "3")
    # a searched field is the best trial's at the end, not the spec's at the start (MLflow keeps the first)
    searching, _ = load_spec(
        "dijkstra_lengthgen",
        {
            "search.space.model.position_eval_stride": {"choice": [3, [2, 3, 4]]},
            "search.space.train.epochs": {"choice": [80, 160]},
        },
    )
    parent = sweep_params(searching)
    assert "position_eval_stride" not in parent and "epochs" not in parent
    assert parent["space.model.position_eval_stride"] and parent["position_span"] == 512
    # searching what a param derives from leaves that param out too (the spec's preset is no trial's),
    # and the end of the sweep logs the best trial's: a row of trial_params
    from stabray.tune.summary import derived_names, searched_names

    presets, _ = load_spec("dijkstra", {"search.space.model.preset": {"choice": ["mini", "small"]}})
    parent = sweep_params(presets)
    assert not {"preset", "model", "hidden_size", "num_layers"} & set(parent), parent
    assert derived_names(presets) == ["model", "hidden_size", "num_layers"]
    best = trial_params({**presets.trial_base(), "model": {**presets.trial_base()["model"], "preset": "small"}})
    at_end = {n: best[n] for n in derived_names(presets)}
    assert at_end == {"model": "embedded-small", "hidden_size": 128, "num_layers": 2}
    assert "preset" in searched_names(presets) and derived_names(spec) == []


def test_statuses():
    assert trial_status(failed=True, done=True, has_final=True) == "FAILED"
    assert trial_status(failed=False, done=True, has_final=True) == "FINISHED"
    assert trial_status(failed=False, done=True, has_final=False) == "STOPPED"
    assert trial_status(failed=False, done=False, has_final=False) == "RUNNING"
    assert trial_status(failed=False, done=False, has_final=False, killed=True) == "KILLED"
    assert set(STATUSES) == {"FINISHED", "STOPPED", "FAILED", "RUNNING", "KILLED"}


def test_mlflow_status_of_an_asha_stopped_trial():
    from stabray.tracking import ended_status

    assert ended_status({"epoch": 3, "val_acc": 0.5}, error=False) == (
        "FINISHED",
        {"stabray.status": "STOPPED", "stabray.stopped_at_epoch": "3"},
    )
    assert ended_status({"epoch": 12, "test_acc": 0.9}, error=False) == ("FINISHED", {})
    assert ended_status({"epoch": 2}, error=True) == ("FAILED", {})


def _reported_keys(run) -> set[str]:
    keys = set(run.epoch())
    keys |= set(run.final()) | set(run.best_epoch()) | set(run.final_stability())
    return keys


def test_every_key_a_text_trial_reports_is_declared(tmp_path):
    from stabray.train import make_run

    run = make_run(
        {
            "task": {"name": "dijkstra", "params": {"n_nodes": 4}, "train_size": 16, "val_size": 8, "test_size": 8},
            "model": {"preset": "tiny"},
            "method": {"name": "alg1", "params": {"lam": 0.5}},
            "train": {"epochs": 1, "batch_size": 8, "warmup_steps": 1},
            "eval": {"eaf_examples": 8, "eaf_iters": 2, "decomposition_examples": 2, "weight_noise_seeds": 1},
            "device": "cpu",
            "cache_dir": str(tmp_path),
        }
    )
    keys = _reported_keys(run)
    undeclared = {k for k in keys if not is_metric(k) and k != STABILITY_TABLE}
    assert not undeclared, f"declare these in stabray.record.METRICS: {sorted(undeclared)}"
    assert {"val_acc", "val_eaf", "test_acc", "test_eaf", "test_loss_gap", STABILITY_TABLE} <= keys


def test_every_key_an_icl_trial_reports_is_declared():
    from stabray.train import make_run

    run = make_run(
        {
            "task": {"name": "icl_linear", "params": {"T_max": 3, "d": 3, "n": 6}, "train_size": 32, "val_size": 8},
            "method": {"name": "sft_cot"},
            "train": {"epochs": 1, "batch_size": 16},
            "eval": {"eaf_examples": 4, "decomposition_examples": 4, "weight_noise_seeds": 1},
            "device": "cpu",
        }
    )
    keys = _reported_keys(run)
    undeclared = {k for k in keys if not is_metric(k) and k != STABILITY_TABLE}
    assert not undeclared, f"declare these in stabray.record.METRICS: {sorted(undeclared)}"


def test_search_metrics_come_from_the_record(tmp_path):
    from stabray.errors import SpecError
    from stabray.record import searchable_metrics
    from stabray.spec import load_spec

    assert {"val_acc", "val_eaf", "train_loss"} <= set(searchable_metrics())
    assert not {"epoch_time_s", "test_acc"} & set(searchable_metrics())  # timings and final metrics: no
    with pytest.raises(SpecError, match="search.metric"):
        load_spec("dijkstra", {"search.metric": "epoch_time_s"})
    # an objective only some trials report validates where every trial of the search reports it
    # (tests/test_bad_input.py has the refusals): the written chain's score with a whole-chain method,
    # Algorithm 1 at lam 1 included, and the EAF measured every epoch
    whole = {"search.metric": "steps_val_acc", "search.space.lam": None}
    for over in ({**whole, "method.name": "sft_cot", "search.space.bits": None}, {**whole, "method.params.lam": 1.0}):
        spec, _ = load_spec("dijkstra", over)
        assert spec.search.metric == "steps_val_acc"
    spec, _ = load_spec("dijkstra", {"search.metric": "val_eaf", "search.mode": "min"})
    assert spec.search.metric == "val_eaf" and spec.eval.eaf_every == 1
    with pytest.raises(SpecError, match="search.space.lam: value 0.5"):
        load_spec("dijkstra", {"search.metric": "steps_val_acc", "search.space.lam": {"choice": [1.0, 0.5]}})
    assert all(m.meaning for m in METRICS.values())


def test_every_objective_has_a_direction_and_the_search_is_held_to_it():
    """Each searchable metric says which way is better (accuracies up; losses, errors and the EAF down),
    and a sweep that optimises one the other way is refused, while the right way validates."""
    from stabray.errors import SpecError
    from stabray.record import searchable_metrics
    from stabray.spec import load_spec

    better = {m: METRICS[m].better for m in searchable_metrics()}
    assert all(b in ("max", "min") for b in better.values()), better
    assert {m for m, b in better.items() if b == "max"} == {m for m in better if m.endswith("_acc")}
    for metric, mode in (("train_loss", "min"), ("val_eaf", "min"), ("val_acc", "max")):
        assert load_spec("dijkstra", {"search.metric": metric, "search.mode": mode})[0].search.mode == mode
        wrong = {"min": "max", "max": "min"}[mode]
        with pytest.raises(SpecError, match=f"search.mode: {wrong}, but {metric} is better"):
            load_spec("dijkstra", {"search.metric": metric, "search.mode": wrong})
    # several objectives in any order (the base's metric/mode, val_acc max, agree with the lists)
    pareto = {"search.metrics": ["val_eaf", "val_acc"], "search.modes": ["min", "max"]}
    assert load_spec("dijkstra_pareto", pareto)[0].search.objectives() == [("val_eaf", "min"), ("val_acc", "max")]


def test_registries_name_classes_once():
    from stabray.methods import METHODS, Method
    from stabray.registry import Registry
    from stabray.tasks import TASKS
    from stabray.train import RUNNERS

    for reg in (TASKS, METHODS):
        for name in reg.names():
            assert reg.get(name).name == name
    for name in TASKS.names():  # every task names a registered runner
        assert TASKS.get(name).runner in RUNNERS
    reg = Registry("method")
    with pytest.raises(ValueError, match="drop its `name`"):

        @reg.register("x")
        class X(Method):
            name = "y"


def test_report_and_ray_dirs_never_import_ray(tmp_path):
    """`python -m stabray report` (and reading a Ray Tune dir) stays out of Ray: analysis/ reaches
    trials through stabray.record and stabray.tracking only."""
    d = tmp_path / "trial_0"
    d.mkdir()
    cfg = {"task": {"name": "dijkstra", "params": {}}, "method": {"name": "alg1", "params": {}}, "seed": 0}
    (d / "params.json").write_text(json.dumps(cfg))
    (d / "result.json").write_text(json.dumps({"val_acc": 0.5, "test_acc": 0.4, "trial_id": "t0"}) + "\n")
    code = (
        "import sys; from stabray.cli import build_parser; build_parser();"
        f"from analysis.load import load_ray; df = load_ray({str(tmp_path)!r}).trials;"
        "assert df['lam'].to_list() == [0.2], df['lam'].to_list();"
        "assert 'ray' not in sys.modules, 'ray was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
