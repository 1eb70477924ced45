"""`python -m stabray sweep <spec>`: validate the spec, run the sweep, print the best trials."""

from __future__ import annotations

import argparse
import time

import yaml


def register(sub) -> None:
    p = sub.add_parser(
        "sweep",
        help="run a hyperparameter sweep from sweeps/<name>.yaml or a path",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run Optuna + ASHA over a spec's search space with Ray Tune; every trial is logged to MLflow.",
    )
    p.add_argument("spec", help="a shipped spec name (dijkstra) or a path to a YAML file")
    p.add_argument("--method", help="override the spec's method (e.g. sft_cot, alg1)")
    p.add_argument("--num-samples", type=int, help="number of trials")
    p.add_argument("--tracking-uri", help="MLflow store (default: $MLFLOW_TRACKING_URI, else sqlite ./mlflow.db)")
    p.add_argument("--storage", help="Ray Tune results directory (default ./stabray_runs)")
    p.add_argument(
        "--address",
        help="Ray cluster address (default: $RAY_ADDRESS, else join a running cluster, else start "
        "one locally); 'local' always starts a fresh local instance",
    )
    p.add_argument("--resume", action="store_true", help="continue the latest interrupted run of this sweep")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a spec field, e.g. --set train.epochs=2 --set search.num_samples=4",
    )
    p.add_argument("--dry-run", action="store_true", help="validate and print the resolved spec, run nothing")
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="show Ray Tune's own status tables and the trials' output instead of stabray's live view",
    )
    p.set_defaults(func=run)


def parse_overrides(args) -> dict:
    from stabray.errors import UserError

    out = {}
    for item in args.set:
        if "=" not in item:
            raise UserError(f"--set {item!r}: expected KEY=VALUE")
        k, v = item.split("=", 1)
        out[k] = yaml.safe_load(v)
    if args.method:
        out["method.name"] = args.method
        out.setdefault("method.params", {})
    if args.num_samples is not None:
        out["search.num_samples"] = args.num_samples
    return out


def run(args) -> int:
    from stabray.spec import load_spec

    overrides = parse_overrides(args)
    if args.method:
        overrides.update(method_space_overrides(args.spec, args.method))
    spec, path = load_spec(args.spec, overrides)  # every error here exits 2, before Ray starts
    if args.dry_run:
        print(yaml.safe_dump(spec.model_dump(), sort_keys=False))
        return 0
    from stabray.tracking import Store
    from stabray.tune.summary import log_sweep_summary, print_summary
    from stabray.tune.sweep import run_sweep

    t0 = time.perf_counter()
    _, info = run_sweep(
        spec,
        path,
        tracking_uri=args.tracking_uri,
        storage=args.storage,
        resume=args.resume,
        address=args.address,
        verbose=args.verbose,
    )
    parents = {info["parent_run_id"], *info["groups"].values()}
    store = Store(info["tracking_uri"], info["experiment"])
    records, _ = store.trial_records(stability=False, parents=parents)
    print_summary(spec, records, info, time.perf_counter() - t0)
    if info.get("complete", True):  # the parent run's best trial, summary.md and plots
        log_sweep_summary(store, info["parent_run_id"], spec, records, time.perf_counter() - t0)
    if not info.get("complete", True):
        print(
            f"the sweep was interrupted before all {spec.search.num_samples} trials ended; continue it with:\n"
            f"  python -m stabray sweep {args.spec} --resume" + (f" --storage {args.storage}" if args.storage else "")
        )
        return 130
    return 0


def method_space_overrides(spec_name: str, method: str) -> dict:
    """--method X: X alone, searching its own default space plus the spec's non-method keys (lr...)."""
    from stabray.config import read_yaml
    from stabray.methods import METHODS
    from stabray.spec import find_spec, method_space, space_path

    raw = read_yaml(find_spec(spec_name))
    space = dict((raw.get("search") or {}).get("space") or {})
    keep = {k: v for k, v in space.items() if not space_path(k).startswith("method.")}
    name = METHODS.canonical(method)
    entry = next((e for e in raw.get("methods") or [] if isinstance(e, dict) and e.get("name") == name), {})
    keep.update({k: d.model_dump(exclude_none=True) for k, d in method_space(name, entry.get("space")).items()})
    return {"search.space": keep, "methods": None, "method.params": entry.get("params", {})}
