"""Bad input through the Python API (what a researcher meets reusing stabray in their own code and Ray
pipelines): `make_run`, a runner's methods, `run_configs`, `run_sweep`, the trainable, `analysis`.
Each refusal is a UserError naming the field or argument, before data or a model is built where the
check can be made then; each has a control that the same call with a good value works."""

from __future__ import annotations

import copy
import math

import numpy as np
import polars as pl
import pytest

from stabray.errors import SpecError, UserError

TINY = {
    "task": {
        "name": "dijkstra",
        "params": {"n_nodes": 4, "decimals": 1},
        "train_size": 16,
        "val_size": 4,
        "test_size": 4,
    },
    "model": {"preset": "tiny"},
    "train": {"epochs": 1, "max_steps_per_epoch": 1},
    "eval": {"eaf_examples": 0},
}


def config(**sections) -> dict:
    c = copy.deepcopy(TINY)
    c.update(copy.deepcopy(sections))
    return c


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("STABRAY_CACHE", str(tmp_path / "cache"))


LEARNED = {"preset": "tiny", "family": "gpt2", "max_positions": 16}
REFUSED = [
    ("learned_positions_too_few", {"model": LEARNED}, ["model.max_positions: 16", "learned positions of family gpt2"]),
    ("pretrained_missing", {"model": {"pretrained": "/nonexistent/model"}}, ["model.pretrained", "no such directory"]),
    (
        "quantize_lora_without_lora",
        {"method": {"name": "alg1", "params": {"quantize": "lora", "bits": 2}}},
        ["method.params", "quantize='lora' quantizes LoRA adapters, and the model has none"],
    ),
    (
        "gaussian_noise_on_merged",
        {"method": {"name": "alg1", "params": {"quantize": "merged", "noise": "gaussian", "bits": 2}}},
        ["noise='gaussian' perturbs layer weights"],
    ),
    ("method_float_infinite", {"method": {"name": "nso", "params": {"sigma": math.inf}}}, ["sigma must be a finite"]),
    (
        "countdown_no_target",
        {"task": {**TINY["task"], "name": "countdown", "params": {"max_target": 0}}},
        ["max_target must be >= 1, got 0"],
    ),
    (
        "countdown_no_number",
        {"task": {**TINY["task"], "name": "countdown", "params": {"max_number": 0}}},
        ["max_number must be >= 1, got 0"],
    ),
    (
        "task_float_infinite",
        {"task": {**TINY["task"], "name": "sat3", "params": {"ratio": math.inf}}},
        ["ratio must be a finite number"],
    ),
    (
        "icl_with_a_model_field",
        {"task": {"name": "icl_linear", "train_size": 8, "val_size": 4, "test_size": 4}, "model": {"family": "gpt2"}},
        ["model.family", "reads no model section"],
    ),
    (
        "icl_on_cuda",
        {"task": {"name": "icl_linear", "train_size": 8, "val_size": 4, "test_size": 4}, "device": "cuda"},
        ["device", "trains on the CPU"],
    ),
    ("flag_not_a_bool", {"train": {"epochs": 1, "group_by_length": "yes"}}, ["group_by_length", "true or false"]),
]


@pytest.mark.parametrize("over, fragments", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_make_run_refuses_what_the_sweep_command_refuses(over, fragments, monkeypatch):
    import stabray.data.splits as splits
    from stabray.train import make_run

    def no_data(*a, **k):
        raise AssertionError("examples were generated before the refusal")

    monkeypatch.setattr(splits, "draw", no_data)
    with pytest.raises(UserError) as e:
        make_run(config(**over))
    for frag in fragments:
        assert frag in str(e.value), (frag, str(e.value))


def test_the_good_values_of_the_same_fields_build_a_run():
    """The control of the refusals above: each field at a value that works."""
    from stabray.train import make_run

    goods = [
        {"model": {**LEARNED, "max_positions": 512}},
        {"method": {"name": "alg1", "params": {"quantize": "base", "bits": 2}}},
        {"method": {"name": "nso", "params": {"sigma": 0.1}}},
        {"task": {**TINY["task"], "name": "countdown", "params": {"max_target": 50, "n_numbers": 3}}},
        {"task": {"name": "icl_linear", "train_size": 8, "val_size": 4, "test_size": 4}},
        {"train": {"epochs": 1, "max_steps_per_epoch": 1, "group_by_length": np.bool_(True)}},
    ]
    for over in goods:
        assert make_run(config(**over)) is not None


def test_a_runner_refuses_misuse_and_loads_only_what_fits(tmp_path):
    from stabray.train import make_run
    from stabray.train.runner import StabilityOptions

    run = make_run(config())
    with pytest.raises(UserError, match="no epoch has run yet"):
        run.best_epoch()
    run.epoch()
    assert run.done and run.best_epoch()["best_epoch"] == 1
    with pytest.raises(UserError, match=r"all 1 epochs \(train.epochs\) have run"):
        run.epoch()
    assert run.epochs_done == 1  # nothing trained past the schedule
    with pytest.raises(UserError, match="'val_accc' is not a per-epoch metric of this run; it has .*val_acc"):
        run.best_epoch("val_accc")
    with pytest.raises(UserError, match="n must be a positive integer, got 0"):
        run.decomposition(0)
    with pytest.raises(UserError, match="split 'tst': this run has train, val, test"):
        run.decomposition(2, split="tst")
    with pytest.raises(UserError, match="seeds must be a positive integer, got 0"):
        run.weight_noise(0)
    with pytest.raises(UserError, match="n must be a positive integer"):
        StabilityOptions(n=0)
    with pytest.raises(UserError, match="aggregation must be block or token_mean"):
        StabilityOptions(aggregation="mean")

    ck = tmp_path / "ck"
    run.save(ck)
    other = config(task={**TINY["task"], "params": {"n_nodes": 5, "decimals": 1}})
    with pytest.raises(UserError, match=r"tokenizer differs from this run's \(\d+ of \d+ tokens"):
        make_run(other).load(ck)
    with pytest.raises(UserError, match="the saved state does not fit .*size mismatch"):
        make_run(config(model={"preset": "tiny", "hidden_size": 64})).load(ck)
    same = make_run(config())
    same.load(ck)  # the control: the same config reads the checkpoint back
    assert same.history == run.history and same.done


def test_a_checkpoint_is_loaded_under_the_rules_it_trained_under(tmp_path):
    """`load_run` builds the run without `make_run`'s checks: a checkpoint whose config is refused today
    (QAT on LoRA targets of a model without LoRA, which trained at full precision) still loads, with its
    weights and history, for `stability` and the figures to read; `make_run` refuses the same config."""
    import json

    from stabray.train import load_run, make_run
    from stabray.train.runner import CONFIG

    run = make_run(config(method={"name": "alg1", "params": {"bits": 32}}))
    run.epoch()
    run.save(tmp_path / "ck")
    old = json.loads((tmp_path / "ck" / CONFIG).read_text())
    old["method"]["params"].update(bits=4, quantize="lora")
    (tmp_path / "ck" / CONFIG).write_text(json.dumps(old))
    with pytest.raises(UserError, match="quantize='lora' quantizes LoRA adapters"):
        make_run(old)
    back = load_run(tmp_path / "ck")
    assert back.history == run.history and back.cfg.method.params["quantize"] == "lora"


def test_a_gpt2_checkpoint_saved_without_quantized_conv1d_layers_is_named(tmp_path):
    """Before stabray quantized GPT-2's Conv1D layers a family gpt2 QAT run trained at full precision and
    saved plain weights; read under its config (bits 2) it is refused, saying so and how to read it;
    with the override bits 32 it loads, its weights intact."""
    import json

    import torch

    from stabray.train import load_run, make_run
    from stabray.train.runner import CONFIG

    gpt2 = {"preset": "tiny", "family": "gpt2", "max_positions": 256}
    run = make_run(config(model=gpt2, method={"name": "alg1", "params": {"bits": 32, "lam": 1.0}}))
    run.save(tmp_path / "ck")
    old = json.loads((tmp_path / "ck" / CONFIG).read_text())
    old["method"]["params"]["bits"] = 2
    (tmp_path / "ck" / CONFIG).write_text(json.dumps(old))
    with pytest.raises(
        UserError, match="checkpoint holds plain weights where the model built from the run.s config is fake"
    ):
        load_run(tmp_path / "ck")
    back = load_run(tmp_path / "ck", {"method": {"params": {"bits": 32}}})
    ref = run.model.state_dict()
    assert all(torch.equal(v, ref[k]) for k, v in back.model.state_dict().items())


def test_run_configs_leaves_a_local_model_path_to_the_cluster_through_ray_client():
    """Through Ray Client the trials run elsewhere: a local model directory missing here is not refused
    (as the sweep command does); on this machine it is."""
    from stabray.tune.sweep import checked_configs

    cfg = config(model={"pretrained": "/nonexistent/shared/model"})
    with pytest.raises(UserError, match="config 0: model.pretrained /nonexistent/shared/model: no such directory"):
        checked_configs([cfg])
    assert checked_configs([cfg], local_paths=False)[0]["model"]["pretrained"] == "/nonexistent/shared/model"


def test_run_configs_checks_every_config_before_ray_or_mlflow(tmp_path):
    """`run_configs`' input, checked without Ray: a list of dicts, each a valid trial config, written out
    whole (the default method filled in, as the MLflow callback reads it)."""
    from stabray.tune.sweep import checked_configs, run_configs

    for bad, frag in [
        ([], "non-empty list"),
        (config(), "got dict"),
        ([config(), 3], "config 1 is a int"),
        ([{**config(), "trian": {}}], "config 0: trial config: trian: unknown key; did you mean train?"),
        ([config(model={"preset": "tiny", "family": "gpt2", "max_positions": 16})], "config 0: model.max_positions"),
    ]:
        with pytest.raises(UserError, match=frag):
            checked_configs(bad)
    (one,) = checked_configs([config()])
    assert one["method"] == {"name": "sft_cot", "params": {}} and one["task"]["train_size"] == 16
    searched = config(method={"name": "alg1", "params": {"lam": np.float32(0.5), "bits": np.int64(2)}})
    (plain,) = checked_configs([searched])  # numpy values, as a search gives them: plain JSON numbers
    assert plain["method"]["params"] == {"lam": 0.5, "bits": 2} and type(plain["method"]["params"]["bits"]) is int
    uri = f"sqlite:///{tmp_path}/m.db"
    with pytest.raises(UserError, match="non-empty list"):
        run_configs([], "x", tracking_uri=uri, storage=str(tmp_path / "runs"))
    assert not (tmp_path / "m.db").exists() and not (tmp_path / "runs").exists()


def test_the_trainable_refuses_a_relative_cache_dir_before_any_work(monkeypatch):
    import stabray.train as train
    from stabray.tune.trainable import trainable

    monkeypatch.setattr(train, "make_run", lambda *a, **k: pytest.fail("make_run was reached"))
    with pytest.raises(UserError, match="cache_dir './relcache' is relative"):
        trainable({**config(), "cache_dir": "./relcache"})
    with pytest.raises(UserError, match="trial config: train: Input should be a valid dictionary"):
        trainable({**config(), "train": None})


def test_run_sweep_holds_a_spec_built_in_python_to_load_specs_rules(tmp_path):
    from stabray.config import SweepSpec
    from stabray.spec import load_spec
    from stabray.tune.sweep import run_sweep

    spec, path = load_spec("dijkstra")
    raw = spec.model_dump()
    raw["method"] = {"name": "alg2", "params": {}}
    where = {"tracking_uri": f"sqlite:///{tmp_path}/m.db", "storage": str(tmp_path / "runs")}
    with pytest.raises(SpecError, match="method.name"):
        run_sweep(SweepSpec.model_validate(raw), path, **where)
    with pytest.raises(UserError, match="a sweep needs a SweepSpec .* got tuple"):
        run_sweep(load_spec("dijkstra"), path, **where)
    assert not (tmp_path / "m.db").exists() and not (tmp_path / "runs").exists()
    with pytest.raises(UserError, match="overrides must be a dict"):
        load_spec("dijkstra", [("train.epochs", 2)])


def test_analysis_takes_a_rule_or_group_by_name_and_names_its_arguments():
    from analysis.load import load
    from analysis.select import Rule, select_best

    df = pl.DataFrame(
        {
            "task": ["a", "a", "a"],
            "method": ["m", "m", "m"],
            "status": ["FINISHED"] * 3,
            "best_val_acc": [0.70, 0.695, 0.5],
            "val_acc": [0.70, 0.695, 0.5],
            "val_eaf": [3.0, 1.0, 0.5],
            "trial_id": ["t1", "t2", "t3"],
        }
    )
    assert select_best(df, by="task")["trial_id"].to_list() == ["t1"]
    assert select_best(df, rule="eaf_within")["trial_id"].to_list() == ["t2"]  # within 0.01 of the best, lower EAF
    assert select_best(df, rule=Rule("eaf_within", 0.5))["trial_id"].to_list() == ["t3"]
    with pytest.raises(UserError, match=r"selection rule delta \(--delta\) -1: must be a number >= 0"):
        Rule("eaf_within", -1)
    with pytest.raises(UserError, match="experiment must be"):
        load(None)


def test_the_stability_functions_refuse_arguments_that_would_give_a_wrong_number():
    """A batch of -1 examples measured none and reported an EAF of 0; a negative C2 step gave a bound of
    1e25; norms and T that do not match read past the matrix. The control: the same calls with good
    arguments give finite numbers."""
    import torch

    from stabray.data.encode import Encoder
    from stabray.data.tokenizer import build_tokenizer
    from stabray.models.build import ModelSpec, build_model
    from stabray.stability import decompose, estimate_eaf, inference_loss
    from stabray.stability.jacobian import eaf_from_norms
    from stabray.tasks import get_task

    task = get_task("dijkstra", n_nodes=4, decimals=1)
    exs = [task.sample(np.random.RandomState(i), 4) for i in range(2)]
    tok = build_tokenizer([t for e in exs for t in (e.question, e.question_nohint, e.answer)])
    model, enc = build_model(ModelSpec(preset="tiny"), tok), Encoder(tok)
    encoded = [enc.encode(e.question, e.steps, e.final) for e in exs]
    with pytest.raises(ValueError, match="batch_size must be >= 1, got -1"):
        estimate_eaf(model, encoded, iters=1, token_cap=1, batch_size=-1)
    assert math.isfinite(estimate_eaf(model, encoded, iters=1, token_cap=1, batch_size=1).eaf)
    with pytest.raises(ValueError, match="c2_delta must be a finite number > 0, got -1"):
        decompose(model, enc, exs, iters=1, token_cap=1, c2_delta=-1)
    with pytest.raises(ValueError, match="no examples"):
        decompose(model, enc, [], iters=1, token_cap=1)
    with pytest.raises(ValueError, match="no examples"):
        inference_loss(model, enc, [])
    assert math.isfinite(inference_loss(model, enc, exs))
    norms = torch.rand(4, 4) + 0.5
    with pytest.raises(ValueError, match="T must be in 0..3"):
        eaf_from_norms(norms, T=10)
    with pytest.raises(ValueError, match="square"):
        eaf_from_norms(torch.rand(4, 3))
    assert eaf_from_norms(norms) == eaf_from_norms(norms, T=3) > 0  # the default T is the last step
