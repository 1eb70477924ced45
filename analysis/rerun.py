"""Re-run each (task, method)'s selected configuration with n seeds, as one Ray Tune run logged to
the same MLflow experiment (through `stabray.tune.run_configs`, imported only when needed).

The selected trial's own seed counts as the first one; `seed+1, seed+2, ...` follow, and seeds the
configuration already finished are not run again, so the configuration ends with n seeds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import polars as pl

from analysis.load import load_mlflow, load_ray, load_trial_config
from analysis.select import GROUP, seeds_of, select_best


def seed_plan(base_seed: int, done: Iterable[int], n_seeds: int) -> list[int]:
    """The seeds still to run so that the configuration has `n_seeds` distinct seeds in total:
    `base_seed, base_seed+1, ...`, skipping the ones in `done`."""
    done = set(done)
    todo, s = [], base_seed
    while len(done) + len(todo) < n_seeds:
        if s not in done:
            todo.append(s)
        s += 1
    return todo


def expand_seeds(config: dict, done: Iterable[int], n_seeds: int) -> list[dict]:
    """Copies of a trainable config, one per seed still to run (only `seed` changes)."""
    base = int(config.get("seed", 0))
    return [{**config, "seed": s} for s in seed_plan(base, done, n_seeds)]


def plan_reruns(
    trials: pl.DataFrame, configs: dict[str, dict], n_seeds: int = 3, by: Sequence[str] = GROUP
) -> list[dict]:
    """Configs to run: for every selected trial (one per group `by`), its config with each missing
    seed. `configs` maps trial_id -> the trainable config of the selected trials."""
    selected = select_best(trials, by)
    all_seeds = seeds_of(trials, selected, by)
    out = []
    for r in selected.iter_rows(named=True):
        cfg = configs.get(r["trial_id"])
        if cfg is None:
            from stabray.errors import UserError

            raise UserError(f"trial {r['trial_id']} (run {r['run_id']}): no trial_config.json to re-run it from")
        done = all_seeds.filter(pl.col("config_key") == r["config_key"])["seed"].drop_nulls().to_list()
        out += expand_seeds(cfg, done, n_seeds)
    return out


def _name(part) -> str:
    """A trial config's task or method name (the config holds {name: ..., params: ...})."""
    return part.get("name", str(part)) if isinstance(part, dict) else str(part)


def planned_reruns(
    experiment: str,
    uri: str,
    n_seeds: int,
    *,
    by: Sequence[str] = GROUP,
    parents: set[str] | None = None,
    ray_dir: str | None = None,
) -> list[dict]:
    """The configs `rerun` would run: each selected configuration's config with every missing seed."""
    # selection needs no stability artifacts: skip downloading them
    loaded = (
        load_ray(ray_dir, experiment) if ray_dir else load_mlflow(experiment, uri, stability=False, parents=parents)
    )
    selected = select_best(loaded.trials, by)
    configs = dict(loaded.configs)
    for r in selected.iter_rows(named=True):
        if r["trial_id"] not in configs and r["run_id"]:
            cfg = load_trial_config(r["run_id"], experiment, uri)
            if cfg is not None:
                configs[r["trial_id"]] = cfg
    return plan_reruns(loaded.trials, configs, n_seeds, by)


def rerun(
    experiment: str,
    tracking_uri: str | None = None,
    n_seeds: int = 3,
    storage: str | None = None,
    ray_dir: str | None = None,
    dry_run: bool = False,
    *,
    by: Sequence[str] = GROUP,
    address: str | None = None,
    parents: set[str] | None = None,
) -> list[dict]:
    """Plan and (unless `dry_run`) run the re-runs; returns the configs run. One configuration is
    selected per group `by` (default (task, method)); `parents` restricts the trials read to those
    sweeps (default: the whole experiment); `address`: the Ray cluster (as `sweep --address`)."""
    from stabray.tracking import resolve_tracking_uri

    uri = resolve_tracking_uri(tracking_uri)
    todo = planned_reruns(experiment, uri, n_seeds, by=by, parents=parents, ray_dir=ray_dir)
    for c in todo:
        print(f"rerun: task={_name(c.get('task'))} method={_name(c.get('method'))} seed={c.get('seed')}")
    if not todo:
        print(f"rerun: every selected configuration already has {n_seeds} seeds")
    if todo and not dry_run:
        from stabray.tune import run_configs  # pulls in Ray: imported only when there is work

        run_configs(todo, experiment=experiment, tracking_uri=uri, storage=storage, address=address)
    return todo
