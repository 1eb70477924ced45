"""The sweep command end to end (Ray + Optuna + ASHA + MLflow) on a tiny config, and spec
validation errors (exit code 2, naming the field and the file, before Ray starts)."""

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from stabray.cli import main

SWEEPS = Path(__file__).resolve().parent.parent / "sweeps"


def write_spec(tmp_path, **over):
    spec = {
        "include": str(SWEEPS / "_base.yaml"),
        "name": "mini",
        "task": {
            "name": "dijkstra",
            "params": {"n_nodes": 4, "decimals": 1},
            "train_size": 48,
            "val_size": 8,
            "test_size": 8,
        },
        "model": {"preset": "tiny"},
        "train": {"epochs": 2, "batch_size": 16, "warmup_steps": 1},
        "eval": {"eaf_examples": 4, "eaf_iters": 2, "decomposition_examples": 0, "long_splits": ["test_long"]},
        "search": {"num_samples": 2, "max_concurrent": 2},
        "device": "cpu",
    }
    for k, v in over.items():
        spec[k] = {**spec.get(k, {}), **v} if isinstance(v, dict) else v
    p = tmp_path / "mini.yaml"
    p.write_text(yaml.safe_dump(spec))
    return p


def test_mini_sweep_logs_parent_and_children(tmp_path, monkeypatch, capsys):
    from mlflow import MlflowClient

    monkeypatch.setenv("STABRAY_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    rc = main(["sweep", str(write_spec(tmp_path)), "--tracking-uri", uri, "--storage", str(tmp_path / "runs")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "== sweep mini: 2 trials (0 failed)" in out and "browse: python -m stabray ui" in out

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("mini")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    parents = [r for r in runs if r.data.tags.get("stabray.role") == "sweep"]
    children = [r for r in runs if r.data.tags.get("stabray.role") == "trial"]
    assert len(parents) == 1 and len(children) == 2  # no duplicates
    pid = parents[0].info.run_id
    for c in children:
        assert c.data.tags["mlflow.parentRunId"] == pid and c.info.status == "FINISHED"
        assert {"task", "method", "lam", "bits", "lr", "seed", "model"} <= set(c.data.params)
        assert float(c.data.params["lam"]) in (0.1, 0.2, 0.5, 1.0)
        assert int(c.data.params["bits"]) in (1, 2, 3, 4, 32)
        assert {"val_acc", "val_eaf", "train_loss"} <= set(c.data.metrics)
        hist = client.get_metric_history(c.info.run_id, "val_acc")
        assert sorted(m.step for m in hist) == list(range(1, len(hist) + 1))  # one value per epoch
        # 2 epochs under ASHA's grace period: no trial can be stopped, so every one logs its final metrics
        assert {"test_acc", "test_long_acc", "test_loss_gap", "test_eaf"} <= set(c.data.metrics)
        cfg = json.loads(Path(client.download_artifacts(c.info.run_id, "trial_config.json", str(tmp_path))).read_text())
        assert cfg["task"]["name"] == "dijkstra"
        assert c.data.tags["stabray.torch"] == torch.__version__  # what computed it, from the trial's worker
        assert c.data.tags["stabray.kernels"].startswith(f"cpu {torch.backends.cpu.get_cpu_capability()}, ")
        ckpt = Path(c.data.tags["stabray.checkpoint"])  # the run points at its latest checkpoint
        assert (ckpt / "state.pt").exists() and ckpt.name.startswith("checkpoint_")

    # `stability <run id>` resolves the run to that checkpoint
    from stabray.tracking import checkpoint_dir_of

    assert Path(checkpoint_dir_of(children[0].info.run_id, uri)) == Path(children[0].data.tags["stabray.checkpoint"])


@pytest.mark.parametrize(
    "over,field",
    [
        ({"task": {"params": {"n_nodse": 4}}}, "task.params"),
        ({"task": {"name": "dijkstar"}}, "task.name"),
        ({"method": {"name": "alg2"}}, "method.name"),
        ({"search": {"space": {"lam": {"choice": [0.0, 0.5]}}}}, "search.space.lam"),
        ({"search": {"space": {"bits": {"choice": [1, 5]}}}}, "search.space.bits"),
        ({"search": {"space": {"lr": {"loguniform": [-1.0, 1.0e-3]}}}}, "search.space.lr"),
        ({"train": {"epochz": 3}}, "train.epochz"),
        ({"resources": {"gpu": -1}}, "resources.gpu"),
        ({"search": {"space": {"lora_rank": {"choice": [16]}}}}, "search.space.lora_rank"),
    ],
)
def test_spec_errors_exit_2_naming_field_and_file(tmp_path, capsys, over, field):
    path = write_spec(tmp_path, **over)
    rc = main(["sweep", str(path), "--storage", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert rc == 2
    assert str(path) in err and field in err
    assert not (tmp_path / "runs").exists()  # failed before Ray started


@pytest.mark.parametrize(
    "over,message",
    [
        ({"train": {"epochz": 3}}, "train.epochz: unknown key; did you mean epochs?"),
        ({"trian": {"epochs": 3}}, "trian: unknown key; did you mean train?"),
        ({"model": {"preset": "tiny", "lora": {"rnk": 4}}}, "model.lora.rnk: unknown key; did you mean rank?"),
        (
            {"search": {"space": {"lr": {"loguniformm": [1e-4, 1e-3]}}}},
            "search.space.lr.loguniformm: unknown key; did you mean loguniform or uniform?",
        ),
        ({"eval": {"long_split": ["test_long"]}}, "eval.long_split: unknown key; did you mean long_splits?"),
        (  # nothing close: no guess, the keys allowed there instead
            {"train": {"zzz": 3}},
            "train.zzz: unknown key; the keys here are batch_size, epochs, grad_clip, group_by_length, lr, "
            "max_steps_per_epoch, schedule, threads, warmup_steps, weight_decay\n",
        ),
    ],
)
def test_unknown_key_names_the_closest_allowed_key(tmp_path, capsys, over, message):
    path = write_spec(tmp_path, **over)
    assert main(["sweep", str(path), "--storage", str(tmp_path / "runs")]) == 2
    assert message in capsys.readouterr().err


def test_known_keys_follow_the_models():
    from stabray.config import SweepSpec, TrainCfg, TrialConfig, known_keys

    assert known_keys(TrialConfig, ("train",)) == sorted(TrainCfg.model_fields)
    assert known_keys(SweepSpec, ("model", "lora")) == ["alpha", "dropout", "rank", "target_modules"]
    assert "loguniform" in known_keys(SweepSpec, ("search", "space", "lr"))  # through dict[str, Dist]
    assert known_keys(TrialConfig, ("task", "params")) == []  # free-form: no allowed list to guess from


def test_set_below_search_space_takes_a_dotted_field_as_one_key():
    """`--set search.space.model.position_eval_stride=...` searches that field (a space key is a
    dotted path, as in a spec file); a key ending in a distribution's kind gives the key that
    distribution, replacing its old one; an override replaces every key searching the same field
    (shorthand or path), and null drops the search."""
    from stabray.spec import load_spec

    spec, _ = load_spec(
        "dijkstra_lengthgen",
        {
            "search.space.model.position_eval_stride": {"choice": [3, [2, 3, 4]]},
            "search.space.lr.loguniform": [1e-4, 1e-2],
            "search.searcher": "optuna",
        },
    )
    assert spec.search.space["model.position_eval_stride"].choice == [3, [2, 3, 4]]
    assert spec.search.space["lr"].loguniform == (1e-4, 1e-2)
    assert "model" not in spec.search.space
    spec, _ = load_spec("dijkstra_lengthgen", {"search.space.model.position_eval_stride.choice": [2, 3]})
    assert spec.search.space["model.position_eval_stride"].choice == [2, 3]
    base, _ = load_spec("dijkstra")
    assert base.search.space["lr"].loguniform is not None  # the spec's lr: a range
    spec, _ = load_spec("dijkstra", {"search.space.lr.choice": [0.003]})  # not choice *and* loguniform
    assert spec.search.space["lr"].model_dump(exclude_none=True) == {"choice": [0.003]}
    spec, _ = load_spec("dijkstra", {"search.space.train.lr": {"choice": [0.01]}})
    assert "lr" not in spec.search.space and spec.search.space["train.lr"].choice == [0.01]
    spec, _ = load_spec("dijkstra", {"search.space.lam": None, "search.space.bits.choice": None})
    assert set(spec.search.space) == {"lr"}


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["search=3", "search.space.lr.choice=[1e-3]"], "search is 3, not a mapping"),
        (["search.space=[1]", "search.space.lr.choice=[1e-3]"], "search.space is [1], not a mapping"),
        (["search.space.model.hidden_sise={choice: [64]}"], "hidden_sise: unknown key; did you mean hidden_size?"),
    ],
)
def test_bad_search_space_overrides_are_named(tmp_path, capsys, sets, message):
    argv = ["sweep", "dijkstra", "--dry-run", "--storage", str(tmp_path / "runs")]
    for s in sets:
        argv += ["--set", s]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and f"--set {sets[-1]}" in err and "Traceback" not in err


def test_two_space_keys_searching_one_field_in_a_spec_file_are_refused(tmp_path, capsys):
    path = write_spec(tmp_path, search={"space": {"lr": {"choice": [1e-3]}, "train.lr": {"choice": [2e-3]}}})
    assert main(["sweep", str(path), "--dry-run", "--storage", str(tmp_path / "runs")]) == 2
    assert "searches train.lr, which search.space." in capsys.readouterr().err


def test_method_flag_with_a_space_override_of_its_own_key(tmp_path, capsys):
    """`--method alg1 --set search.space.lam.choice=[0.3]`: the user's lam replaces the method's own."""
    assert main(["sweep", "dijkstra", "--method", "alg1", "--set", "search.space.lam.choice=[0.3]", "--dry-run"]) == 0
    out = yaml.safe_load(capsys.readouterr().out)
    space = out["search"]["space"]
    assert space["lam"]["choice"] == [0.3] and "method.params.lam" not in space and "method.params.bits" in space


def test_a_spec_value_the_search_always_replaces_is_not_an_error(tmp_path, capsys):
    """bits: 7 under `method.params` is no valid bit-width, but where bits is searched no trial uses
    it; where it is not searched, the error names method.params (not a searched key)."""
    from stabray.spec import load_spec

    lr = {"lr": {"loguniform": [1e-3, 3e-3]}}
    method = {"name": "alg1", "params": {"lam": 0.5, "bits": 7}}
    searched = write_spec(tmp_path, method=method, search={"space": {"bits": {"choice": [2, 4]}, **lr}})
    spec, _ = load_spec(str(searched))
    assert spec.method.params["bits"] == 7
    fixed = write_spec(tmp_path, method=method, search={"space": {"bits": None, **lr}})  # null: not searched
    assert main(["sweep", str(fixed), "--storage", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "method.params: method 'alg1': bits must be one of" in err and "search.space" not in err


def test_unknown_spec_name(capsys):
    assert main(["sweep", "dijkstr"]) == 2
    assert "did you mean dijkstra" in capsys.readouterr().err


@pytest.mark.parametrize(
    "path", sorted(p for p in SWEEPS.rglob("*.yaml") if not p.name.startswith("_")), ids=lambda p: p.stem
)
def test_every_shipped_spec_validates(path):
    from stabray.spec import load_spec

    spec, _ = load_spec(str(path))
    assert spec.name and spec.search.num_samples >= 1
    assert path.read_text().startswith("#")  # opens with what it studies and the command
    assert "python -m stabray sweep" in path.read_text().split("\ninclude")[0]


def test_multi_method_sweep_groups_trials_by_method(tmp_path, monkeypatch, capsys):
    from mlflow import MlflowClient

    monkeypatch.setenv("STABRAY_CACHE", str(tmp_path / "cache"))
    spec = write_spec(
        tmp_path,
        methods=["sft_cot", {"name": "nso", "space": {"sigma": {"choice": [0.01]}}}],
        search={"num_samples": 1, "max_concurrent": 1},
    )
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert main(["sweep", str(spec), "--tracking-uri", uri, "--storage", str(tmp_path / "runs")]) == 0
    assert "2 trials (0 failed)" in capsys.readouterr().out
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("mini").experiment_id], max_results=100)
    role = lambda r: r.data.tags.get("stabray.role")  # noqa: E731
    (parent,) = [r for r in runs if role(r) == "sweep"]
    groups = {r.data.tags["stabray.method"]: r for r in runs if role(r) == "method"}
    assert set(groups) == {"sft_cot", "nso"}
    assert all(g.data.tags["mlflow.parentRunId"] == parent.info.run_id for g in groups.values())
    trials = [r for r in runs if role(r) == "trial"]
    assert len(trials) == 2
    for t in trials:  # each trial sits under its own method's group run, with that method's params
        m = t.data.params["method"]
        assert t.data.tags["mlflow.parentRunId"] == groups[m].info.run_id
    nso = next(t for t in trials if t.data.params["method"] == "nso")
    assert float(nso.data.params["sigma"]) == 0.01


def test_grid_methods_share_one_tuner_and_its_slots(tmp_path, monkeypatch, capsys):
    """A sweep whose methods are all plain grids runs them in one Tuner: a method's trials start while
    the previous method's are still running (one Tuner per method would wait), each trial still sits
    under its own method's group run, named by its own method's searched values, and the run's
    folder holds one Tuner (what --resume restores)."""
    from mlflow import MlflowClient

    monkeypatch.setenv("STABRAY_CACHE", str(tmp_path / "cache"))
    spec = write_spec(
        tmp_path,
        methods=["sft_cot", {"name": "nso", "space": {"sigma": {"choice": [0.01]}}}],
        search={
            "num_samples": 1,
            "max_concurrent": 2,
            "searcher": "grid",
            "scheduler": "fifo",
            "space": {"lam": None, "bits": None, "lr": None},
        },
    )
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert main(["sweep", str(spec), "--tracking-uri", uri, "--storage", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "methods sft_cot (1), nso (1): 2 trials, 2 at a time" in out and "2 trials (0 failed)" in out
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("mini").experiment_id], max_results=100)
    role = lambda r: r.data.tags.get("stabray.role")  # noqa: E731
    (parent,) = [r for r in runs if role(r) == "sweep"]
    groups = {r.data.tags["stabray.method"]: r for r in runs if role(r) == "method"}
    assert set(groups) == {"sft_cot", "nso"} and all(g.info.status == "FINISHED" for g in groups.values())
    trials = {t.data.params["method"]: t for t in runs if role(t) == "trial"}
    assert set(trials) == {"sft_cot", "nso"}
    for m, t in trials.items():
        assert t.data.tags["mlflow.parentRunId"] == groups[m].info.run_id and t.info.status == "FINISHED"
    assert trials["nso"].info.run_name.startswith("nso-sigma0.01") and "sigma" not in trials["sft_cot"].info.run_name
    first, second = sorted(trials.values(), key=lambda t: t.info.start_time)
    assert second.info.start_time < first.info.end_time  # side by side, not one method after the other
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert (run_dir / "tuner.pkl").exists() and not (run_dir / "sft_cot").exists()
    assert json.loads((run_dir / "stabray_sweep.json").read_text())["one_tuner"] is True


def test_grid_configs_match_ray_space_expansion():
    """`grid_configs` lists the trials Ray Tune's grid_search expansion of `ray_space` gives (as a multiset)."""
    from ray.tune.search.variant_generator import generate_variants

    from stabray.spec import load_spec
    from stabray.tune.sweep import grid_configs, ray_space

    spec, _ = load_spec(str(SWEEPS / "dijkstra_methods.yaml"))
    spec = spec.model_copy(update={"search": spec.search.model_copy(update={"num_samples": 2})})
    from stabray.spec import method_specs

    for _, sub in method_specs(spec):
        ours = [json.dumps(c, sort_keys=True) for c in grid_configs(sub)]
        theirs = [json.dumps(v, sort_keys=True) for _, v in generate_variants(ray_space(sub))] * 2
        assert sorted(ours) == sorted(theirs) and len(ours) == sub.search.n_trials


def test_method_flag_runs_one_method_with_its_space(tmp_path):
    from stabray.commands.sweep import method_space_overrides
    from stabray.spec import load_spec

    spec, _ = load_spec("dijkstra", method_space_overrides("dijkstra", "nso") | {"method.name": "nso"})
    assert spec.method.name == "nso" and not spec.methods
    assert "method.params.sigma" in spec.search.space and "lam" not in spec.search.space
    assert "lr" in spec.search.space


def test_lora_rank_searched_when_lora_is_on(tmp_path):
    from stabray.spec import load_spec

    path = write_spec(tmp_path, model={"pretrained": "some/model", "lora": {"rank": 8}})
    spec, _ = load_spec(str(path))
    assert spec.search.space["lora_rank"].choice == [16, 32, 64]
    spec, _ = load_spec(str(write_spec(tmp_path)))  # no LoRA: no rank
    assert "lora_rank" not in spec.search.space


def test_method_flag_keeps_the_users_set_on_its_space(capsys):
    """--method X replaces the search space by X's; a --set of a space key still wins over it."""
    assert main(["sweep", "dijkstra", "--method", "alg1", "--set", "search.space.bits={choice: [2]}", "--dry-run"]) == 0
    space = yaml.safe_load(capsys.readouterr().out)["search"]["space"]
    bits = [k for k in space if k.endswith("bits")]
    assert bits == ["bits"] and space["bits"]["choice"] == [2]


def test_sample_points_cover_what_a_distribution_can_produce():
    from stabray.config import Dist
    from stabray.spec import MAX_ENUMERATED, load_spec, sample_points

    spec, _ = load_spec("dijkstra")
    space = {
        "a": Dist(randint=(1, 8)),
        "b": Dist(randint=(0, 10 * MAX_ENUMERATED)),
        "c": Dist(uniform=(0.2, 0.6)),
        "d": Dist(loguniform=(1e-4, 1e-2)),
    }
    pts = sample_points(spec.model_copy(update={"search": spec.search.model_copy(update={"space": space})}))
    assert pts["a"] == list(range(1, 9))  # every integer, both ends included
    assert len(pts["b"]) == MAX_ENUMERATED and pts["b"][0] == 0 and pts["b"][-1] == 10 * MAX_ENUMERATED
    g = (5**0.5 - 1) / 2  # the golden fraction: a point inside the range that no whole number can be
    assert pts["c"] == pytest.approx([0.2, 0.4, 0.2 + 0.4 * g, 0.6])
    assert pts["d"] == pytest.approx([1e-4, 1e-3, 1e-4 * 100**g, 1e-2])
    ints = sample_points(
        spec.model_copy(update={"search": spec.search.model_copy(update={"space": {"e": Dist(uniform=(8, 16))}})})
    )
    assert any(not float(v).is_integer() for v in ints["e"])  # the middle, 12, is whole; the golden point is not


PAPER_TASKS = {  # the paper's seven evaluations (Table 1) and their sizes (section 4)
    "dijkstra": ("n_nodes", 10),
    "bellman_ford": ("n_nodes", 10),
    "mst_prim": ("n_nodes", 10),
    "bfs": ("n_nodes", 10),
    "dfs": ("n_nodes", 10),
    "lego_cyclic": ("n_vars", 8),
    "lego_symmetry": ("n_vars", 8),
}


@pytest.mark.parametrize("task", sorted(PAPER_TASKS))
def test_paper_spec_has_the_papers_settings(task):
    """sweeps/paper/<task>.yaml: the paper's sizes, 2,000 fixed training examples, LoRA rank 16-64,
    lr within 1e-5 .. 4e-5, lambda in {0.1, 0.2, 0.5, 1}, bits 1-4 and 32, one GPU per trial."""
    from stabray.spec import load_spec

    spec, path = load_spec(f"paper/{task}")
    assert path == SWEEPS / "paper" / f"{task}.yaml"
    field, size = PAPER_TASKS[task]
    assert spec.task.name == task and spec.task.params[field] == size
    assert spec.task.train_size == 2000 and spec.task.resample_train is False
    assert spec.model.pretrained and spec.model.lora is not None
    space = spec.search.space
    assert sorted(space["lam"].choice) == [0.1, 0.2, 0.5, 1.0]
    assert sorted(space["bits"].choice) == [1, 2, 3, 4, 32]
    lo, hi = space["lr"].loguniform
    assert 1e-5 <= lo < hi <= 4e-5
    assert sorted(space["lora_rank"].choice) == [16, 32, 64]
    assert spec.resources.gpu == 1
    assert "long_sizes" not in spec.task.params  # the paper's +10% / +20% sizes


def test_prewarm_caches_what_the_trials_read(tmp_path, monkeypatch):
    """The driver's head start while Ray starts fills the dataset cache with exactly the splits a
    trial of the sweep then reads (a trial finds them cached: nothing generated again), and equal to
    generating them afresh."""
    import stabray.data.cache as cache
    from stabray.config import parse_trial_config
    from stabray.data.splits import make_splits
    from stabray.spec import load_spec
    from stabray.tasks import get_task
    from stabray.train.run import read_splits, validation_split
    from stabray.tune.sweep import prewarm

    monkeypatch.setenv("STABRAY_CACHE", str(tmp_path / "cache"))
    spec, _ = load_spec(str(write_spec(tmp_path)))
    prewarm(spec, data=True).join(timeout=120)
    assert len([p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")]) == 1

    def no_generation(*a, **k):
        raise AssertionError("a trial generated the splits again")

    monkeypatch.setattr(cache, "make_splits", no_generation)
    trial = parse_trial_config(spec.trial_base())
    got = read_splits(trial)
    c = spec.task
    fresh = make_splits(
        get_task(c.name, **c.params),
        {"train": c.train_size, "val": c.val_size, "test": c.test_size},
        c.data_seed,
        ("train", "val", "test", "test_long"),
    )
    assert got == fresh
    assert validation_split(trial) == fresh["val"]  # drawn alone (a driver on a cluster): the same list

    prewarm(spec, data=False).join(timeout=120)  # joining another cluster: its trials have their own disks
    spec2, _ = load_spec(str(write_spec(tmp_path, task={"train_size": 40})))
    prewarm(spec2, data=False).join(timeout=120)
    assert len([p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")]) == 1


def test_a_search_on_the_eaf_of_step_less_examples_is_refused_before_any_trial(tmp_path, monkeypatch):
    """About half of 4-node Dijkstra questions answer without a step. Where the first eval.eaf_examples
    validation examples all do, the per-epoch EAF is an empty sum no trial logs, so a search on it
    (objective or stop rule) is refused by the driver's head start, naming the field and the count
    that reaches the first example with a step; one example more, or a search on val_acc, goes on."""
    from stabray.data.splits import make_splits
    from stabray.methods import get_method
    from stabray.spec import load_spec
    from stabray.tasks import get_task
    from stabray.tune.sweep import empty_eaf_draw, prewarm

    monkeypatch.setenv("STABRAY_CACHE", str(tmp_path / "cache"))
    task = get_task("dijkstra", n_nodes=4, decimals=1)
    sizes = {"train": 48, "val": 8, "test": 8}
    for seed in range(40):
        val = make_splits(task, sizes, seed, ("train", "val", "test", "test_long"))["val"]
        k = next((i for i, e in enumerate(val) if e.steps), 0)
        if k >= 2:  # opens with at least two step-less examples, and has one with a step
            break
    assert k >= 2, "no data seed under 40 opens its validation split with two step-less examples"

    def problem(eaf_examples, search, data=True):
        search = {"num_samples": 2, "max_concurrent": 2, **search}
        p = write_spec(tmp_path, task={"data_seed": seed}, eval={"eaf_examples": eaf_examples}, search=search)
        spec, _ = load_spec(str(p))
        t = prewarm(spec, data=data)
        t.join(timeout=120)
        assert not t.is_alive()
        return t.problem

    on_eaf = {"metric": "val_eaf", "mode": "min"}
    got = problem(k, on_eaf)
    assert f"search.metric: val_eaf is measured on the first {k} validation examples" in str(got)
    assert f"raise eval.eaf_examples to {k + 1} or more" in str(got)
    rule = {"stop_if": [{"metric": "val_eaf", "epoch": 1, "when": "> 100"}]}
    assert str(problem(1, rule)).startswith("search.stop_if.0.metric: val_eaf is measured on the first 1 ")
    assert problem(k + 1, on_eaf) is None and problem(k, {}) is None
    # trials on a cluster (data=False): the same refusal from the validation split drawn alone, and
    # nothing written to this machine's dataset cache for it
    shutil.rmtree(tmp_path / "cache", ignore_errors=True)
    assert f"raise eval.eaf_examples to {k + 1} or more" in str(problem(k, on_eaf, data=False))
    import stabray.tune.sweep as sweep_mod

    judged = []  # the check ran (rather than the head start failing quietly) and found a step
    monkeypatch.setattr(sweep_mod, "empty_eaf_draw", lambda *a: judged.append(empty_eaf_draw(*a)) or judged[-1])
    assert problem(k + 1, on_eaf, data=False) is None and judged == [None]
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
    assert empty_eaf_draw("f", val, k, get_method("sft_cot")) is not None
    assert empty_eaf_draw("f", val, k, get_method("coconut")) is None  # its latent slots are steps


def test_spec_yaml_refuses_duplicate_keys_but_keeps_merge_keys():
    """A key given twice is an error naming both lines; `<<: *anchor` merges stay valid YAML, and a
    key after the merge overrides the merged one (YAML's rule, as yaml.safe_load reads it)."""
    import yaml

    from stabray.config import load_yaml

    text = "base: &b {epochs: 2, lr: 0.001}\ntrain:\n  <<: *b\n  epochs: 5\n"
    assert (
        load_yaml(text)
        == yaml.safe_load(text)
        == {
            "base": {"epochs": 2, "lr": 0.001},
            "train": {"epochs": 5, "lr": 0.001},
        }
    )
    with pytest.raises(yaml.YAMLError, match=r"found the key 'epochs' twice \(first on line 2\)"):
        load_yaml("train:\n  epochs: 2\n  lr: 0.1\n  epochs: 3\n")


def test_relative_pretrained_directory_is_made_absolute(tmp_path, monkeypatch):
    """Ray's trial workers run in their trial folders: ./model must name the driver's folder there."""
    import os

    from stabray.config import ModelCfg, local_model_problem

    monkeypatch.chdir(tmp_path)
    (tmp_path / "m").mkdir()
    assert ModelCfg(pretrained="./m").pretrained == str(tmp_path / "m")
    assert ModelCfg(pretrained="~/x").pretrained == os.path.expanduser("~/x")
    assert ModelCfg(pretrained="org/name").pretrained == "org/name"  # a hub name stays one
    assert local_model_problem(str(tmp_path / "m")) is None and local_model_problem("org/name") is None
    assert "no such directory" in local_model_problem(str(tmp_path / "nope"))
