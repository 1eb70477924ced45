"""`python -m stabray sweep <spec>`: validate the spec, run the sweep, print the best trials."""

from __future__ import annotations

import argparse
import shlex
import sys
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
    p.add_argument(
        "--storage", help="where Ray Tune results go: a folder (default ./stabray_runs) or s3://bucket/prefix"
    )
    p.add_argument(
        "--address",
        help="Ray cluster address (default: $RAY_ADDRESS, else the cluster `ray start` recorded here, else start "
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
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check the spec, tracking store, storage and Ray address; print the resolved spec, run nothing",
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="show Ray Tune's own status tables and the trials' output instead of stabray's live view",
    )
    p.set_defaults(func=run)


def parse_overrides(args) -> tuple[dict, dict]:
    """(overrides {dotted path: value}, sources {dotted path: the flag that set it, for errors})."""
    from stabray.config import load_yaml, yaml_problem
    from stabray.errors import UserError

    out, sources = {}, {}
    for item in args.set:
        k, sep, v = item.partition("=")
        if not sep or not k.strip():
            raise UserError(f"--set {item!r}: expected KEY=VALUE")
        try:
            out[k] = load_yaml(v)
        except yaml.YAMLError as e:
            raise UserError(f"--set {item}: the value is not valid YAML: {yaml_problem(e)}") from None
        sources[k] = f"--set {item}"
    if args.method:
        out["method.name"] = args.method
        sources["method.name"] = f"--method {args.method}"
    if args.num_samples is not None:
        out["search.num_samples"] = args.num_samples
        sources["search.num_samples"] = f"--num-samples {args.num_samples}"
    return out, sources


def run(args) -> int:
    from stabray.errors import UserError
    from stabray.spec import load_spec

    for flag, value in (("--method", args.method), ("--storage", args.storage), ("--tracking-uri", args.tracking_uri)):
        if value is not None and not value.strip():  # an unset shell variable: not the same as leaving it out
            raise UserError(f"{flag} is empty; give a value or leave the flag out")
    overrides, sources = parse_overrides(args)
    if args.method:  # first the method's own space and params, then the user's --set on top of them
        # (a --set below search.space replaces the key searching the same field: stabray.spec.set_override)
        overrides = {**method_space_overrides(args.spec, args.method), **overrides}
    spec, path = load_spec(args.spec, overrides, sources)  # every error here exits 2, before Ray starts
    if not (args.address or "").startswith("ray://"):  # through Ray Client the trials run elsewhere
        from stabray.config import local_model_problem
        from stabray.errors import UserError

        if problem := local_model_problem(spec.model.pretrained):
            raise UserError(f"{sources.get('model.pretrained', path)}: {problem}")
    if args.dry_run:  # the store and the storage too: what a real run would check before Ray starts
        from stabray.tracking import check_experiment, check_store, resolve_tracking_uri
        from stabray.tune.storage import open_storage

        results = open_storage(args.storage or spec.storage, "--storage" if args.storage else "storage")
        uri = resolve_tracking_uri(args.tracking_uri, spec.mlflow.tracking_uri)
        experiment = spec.mlflow.experiment or spec.name
        if args.resume:  # the run it would continue, its record checked, and the store that record names
            from stabray.tune.sweep import resumed_run

            run, saved = resumed_run(results, spec.name)
            uri, experiment = saved["tracking_uri"], saved["experiment"]
        check_store(uri, create=True, write=True)
        check_experiment(uri, experiment)
        from stabray.tune.sweep import check_address, check_local_resources

        check_address(args.address)  # an address nothing answers at, or a stale one recorded here
        check_local_resources(spec, args.address)
        print(yaml.safe_dump(spec.model_dump(), sort_keys=False))
        if args.resume:
            where = f"{results.uri.rstrip('/')}/{run}"
            print(f"would continue {where} (MLflow experiment {saved['experiment']!r} at {uri})")
            from stabray.spec import method_specs
            from stabray.tune import ray_state

            folders = [run] + [f"{run}/{label}" for label, _ in method_specs(spec) if label is not None]
            for folder in (f for f in folders if results.exists(f"{f}/tuner.pkl")):
                if why := ray_state.damage(results, folder):
                    print(
                        f"  Ray Tune's state of {folder} cannot be read ({why}): it would be set aside and its "
                        "trials run again"
                    )
        return 0
    from stabray.tracking import Store
    from stabray.tune.summary import log_sweep_summary, print_summary
    from stabray.tune.sweep import run_sweep

    t0 = time.perf_counter()
    try:
        _, info = run_sweep(
            spec,
            path,
            tracking_uri=args.tracking_uri,
            storage=args.storage,
            resume=args.resume,
            address=args.address,
            verbose=args.verbose,
        )
    except KeyboardInterrupt:  # a second Ctrl-C: stopped at once
        print(f"interrupted; continue the sweep with:\n  {resume_command(args)}", file=sys.stderr)
        return 130
    parents = {info["parent_run_id"], *info["groups"].values()}
    store = Store(info["tracking_uri"], info["experiment"])
    records, _ = store.trial_records(stability=False, parents=parents)
    print_summary(spec, records, info, time.perf_counter() - t0)
    if info.get("complete", True):  # the parent run's best trial, summary.md and plots
        log_sweep_summary(store, info["parent_run_id"], spec, records, time.perf_counter() - t0)
    if not info.get("complete", True):
        why = f"stopped by {info['interrupted']}" if info.get("interrupted") else "interrupted"
        print(
            f"the sweep was {why} before all its trials ended (MLflow: KILLED); continue it with:\n"
            f"  {resume_command(args)}",
            flush=True,
        )
        return 130
    return 0


def resume_command(args) -> str:
    """The command that continues this sweep: the same spec and flags, plus --resume."""
    parts = ["python", "-m", "stabray", "sweep", args.spec]
    for flag, value in (
        ("--method", args.method),
        ("--num-samples", args.num_samples),
        ("--tracking-uri", args.tracking_uri),
        ("--storage", args.storage),
        ("--address", args.address),
    ):
        if value is not None:
            parts += [flag, str(value)]
    for item in args.set:
        parts += ["--set", item]
    if getattr(args, "verbose", False):
        parts.append("--verbose")
    return shlex.join([*parts, "--resume"])


def method_space_overrides(spec_name: str, method: str) -> dict:
    """--method X: X alone, searching its own default space plus the spec's non-method keys (lr...)."""
    from stabray.config import read_yaml
    from stabray.errors import UserError
    from stabray.methods import METHODS
    from stabray.spec import find_spec, method_space, space_path

    path = find_spec(spec_name)
    raw = read_yaml(path)
    space = dict((raw.get("search") or {}).get("space") or {})
    keep = {k: v for k, v in space.items() if not space_path(k).startswith("method.")}
    try:
        name = METHODS.canonical(method)
    except UserError as e:
        raise UserError(f"--method {method}: {e}") from None
    listed = raw.get("methods")
    if isinstance(listed, list) and listed:
        names = [e.get("name") if isinstance(e, dict) else e for e in listed]
        if name not in {METHODS.canonical(n) for n in names if isinstance(n, str) and n in METHODS}:
            raise UserError(
                f"--method {method}: {path} sweeps the methods {', '.join(map(str, names))}, and {name} is not "
                "one of them (leave out --method to run them all)"
            )
    entry = next((e for e in listed or [] if isinstance(e, dict) and e.get("name") == name), {})
    keep.update({k: d.model_dump(exclude_none=True) for k, d in method_space(name, entry.get("space")).items()})
    return {"search.space": keep, "methods": None, "method.params": entry.get("params", {})}
