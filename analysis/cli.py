"""Argument parsing for `python -m analysis` and, through `register` / `register_icl_figures`,
`python -m stabray report` / `python -m stabray icl-figures`."""

from __future__ import annotations

import argparse

RAY_DIR_HELP = (
    "read a sweep's Ray Tune folder instead of MLflow: a run folder (stabray_runs/<sweep>-<time>) or the "
    "storage root (then its newest run of --experiment)"
)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--experiment", required=True, help="MLflow experiment = sweep name, e.g. dijkstra")
    p.add_argument(
        "--tracking-uri",
        default=None,
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite at ./mlflow.db); "
        "use an absolute sqlite path, sqlite:////abs/mlflow.db",
    )


def _report(args) -> int:
    from analysis.report import build_report
    from analysis.select import Rule

    build_report(
        args.experiment,
        args.tracking_uri,
        args.ray_dir,
        args.out,
        log_to_mlflow=not args.no_log,
        force=args.force,
        rule=Rule(args.select, args.delta),
        objectives=args.objectives,
    )
    return 0


def _rerun(args) -> int:
    from analysis.rerun import rerun

    rerun(args.experiment, args.tracking_uri, args.seeds, args.storage, args.ray_dir, args.dry_run)
    return 0


def register(subparsers) -> None:
    """Add the `report` subcommand (sets `func(args) -> int`)."""
    p = subparsers.add_parser("report", help="write every table and figure of a sweep into a folder")
    _common(p)
    p.add_argument("--ray-dir", default=None, help=RAY_DIR_HELP)
    p.add_argument("--out", default=None, help="output folder (default ./reports/<experiment>)")
    p.add_argument("--force", action="store_true", help="overwrite the files of an existing --out folder")
    p.add_argument("--no-log", action="store_true", help="do not log the folder to the sweep's parent run")
    p.add_argument(
        "--select",
        default="best_acc",
        choices=["best_acc", "eaf_within", "knee"],
        help="how each task and method's configuration is chosen: best_acc = best validation accuracy (default); "
        "eaf_within = lowest EAF within --delta of the best validation accuracy; knee = the knee of the "
        "accuracy-vs-EAF Pareto front",
    )
    p.add_argument(
        "--delta",
        type=float,
        default=0.01,
        help="eaf_within: accuracy tolerance, absolute (0.01 = one point; default 0.01)",
    )
    p.add_argument(
        "--objectives",
        default=None,
        metavar="M:MODE,...",
        help="the Pareto front's objectives, e.g. val_acc:max,val_eaf:min (default: the sweep's own when it searched "
        "several, else val_acc:max,val_eaf:min)",
    )
    p.set_defaults(func=_report)


def register_rerun(subparsers) -> None:
    """Add the `rerun` subcommand: the selected configurations with n seeds."""
    p = subparsers.add_parser("rerun", help="re-run each (task, method)'s selected configuration with n seeds")
    _common(p)
    p.add_argument("--seeds", type=int, default=3, help="seeds per configuration in total (paper: 3)")
    p.add_argument("--storage", default=None, help="Ray Tune storage path")
    p.add_argument("--ray-dir", default=None, help=RAY_DIR_HELP)
    p.add_argument("--dry-run", action="store_true", help="print the plan only")
    p.set_defaults(func=_rerun)


def _table3_study(args) -> int:
    from pathlib import Path

    from analysis.load import load
    from analysis.tables import BITS_STUDY, TABLE_EXTS, bits_study
    from stabray.errors import check_output_folder

    if args.out:
        check_output_folder(args.out, [f"{BITS_STUDY}.{ext}" for ext in TABLE_EXTS], args.force)
    table = bits_study(load(args.experiment, args.tracking_uri, args.ray_dir).trials)
    print(table.to_markdown())
    if args.out:
        for path in table.write(Path(args.out)):
            print(f"wrote {path}")
    return 0


def register_table3_study(subparsers) -> None:
    """Add the `table3-study` subcommand: Table 3 of a grid study (λ x bits x seeds), mean ± std."""
    p = subparsers.add_parser(
        "table3-study",
        help="Table 3 of a grid study (e.g. sweeps/table3_dijkstra.yaml): per λ and bits, mean ± std over seeds",
    )
    _common(p)
    p.add_argument("--ray-dir", default=None, help=RAY_DIR_HELP)
    p.add_argument("--out", default=None, help="also write the table (md, tex, csv) into this folder")
    p.add_argument("--force", action="store_true", help="overwrite table3_study.* when --out holds them already")
    p.set_defaults(func=_table3_study)


def _icl_figures(args) -> int:
    from analysis.icl_figures import run

    run(args.source, args.experiment, args.tracking_uri, args.ray_dir, args.task, args.out, args.force)
    return 0


def register_icl_figures(subparsers) -> None:
    """Add the `icl-figures` subcommand: Figures 3 and 6 (PNG) of an in-context GD trial."""
    p = subparsers.add_parser(
        "icl-figures",
        help="Figures 3 and 6 (losses, Jacobians, EAF vs T) of an icl_linear / icl_quadratic trial",
        description="Figures 3 and 6 of the paper as PNG, from a checkpoint dir, a Ray trial dir, an MLflow "
        "run id, or a sweep's best ICL trial (--experiment)",
    )
    p.add_argument(
        "source",
        nargs="?",
        default=None,
        help="checkpoint dir, Ray trial dir or MLflow run id (omit with --experiment)",
    )
    p.add_argument("--experiment", default=None, help="sweep name: plot its best ICL trial")
    p.add_argument("--task", default=None, help="with --experiment: which ICL task, when the sweep has several")
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (sqlite:////abs/mlflow.db)")
    p.add_argument("--ray-dir", default=None, help=RAY_DIR_HELP)
    p.add_argument("--out", default=None, help="folder for the PNGs (default: ./reports/<task>)")
    p.add_argument("--force", action="store_true", help="overwrite the figures when --out holds them already")
    p.set_defaults(func=_icl_figures)


def _reproduce(args) -> int:
    from analysis.studies import reproduce

    reproduce(
        args.study,
        args.profile,
        seeds=args.seeds,
        tracking_uri=args.tracking_uri,
        storage=args.storage,
        out=args.out,
        address=args.address,
        dry_run=args.dry_run,
    )
    return 0


def register_reproduce(subparsers) -> None:
    """Add the `reproduce` subcommand: one of the paper's tables, figures or ablations, end to end."""
    from analysis.studies import DEFAULT_SEEDS, PROFILES, STUDIES

    listing = "\n".join(f"  {name:<22}{s.what}" for name, s in STUDIES.items())
    p = subparsers.add_parser(
        "reproduce",
        help="run (or reuse) the sweeps of one of the paper's tables or figures and write it",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Reuse each sweep the study needs when the MLflow store holds a finished one, else run it; "
        "select and rerun to n seeds where the study says so; write its tables (md, tex, csv) and figures (png) "
        "into --out and log them to the run <study>-<profile> of the MLflow experiment 'reproduce'.",
        epilog=f"studies:\n{listing}\n\nprofiles: laptop (the embedded decoder, tens of minutes each on 2 CPU "
        "cores), paper (Qwen2.5-1.5B + LoRA, sweeps/paper and sweeps/studies/paper, a GPU cluster)",
    )
    p.add_argument("study", help="which study (listed below)")
    p.add_argument("--profile", default="laptop", help=f"one of {', '.join(PROFILES)} (default laptop)")
    p.add_argument("--dry-run", action="store_true", help="print the plan (trials, trial-epochs, reuse) and stop")
    p.add_argument(
        "--seeds",
        type=int,
        default=DEFAULT_SEEDS,
        help=f"seeds per configuration (default {DEFAULT_SEEDS}): a grid's seed axis, or the reruns of a selection",
    )
    p.add_argument(
        "--tracking-uri", default=None, help="MLflow store (default: $MLFLOW_TRACKING_URI, else ./mlflow.db)"
    )
    p.add_argument("--storage", default=None, help="where Ray Tune results go (default ./stabray_runs)")
    p.add_argument("--out", default=None, help="output folder (default ./reports/reproduce-<study>-<profile>)")
    p.add_argument("--address", default=None, help="Ray cluster address, as `sweep --address` ('local': a fresh one)")
    p.set_defaults(func=_reproduce)


def build_parser() -> argparse.ArgumentParser:
    from stabray.cli import Parser  # errors on one line, exit 2

    parser = Parser(prog="python -m analysis", description="tables and figures from logged trials")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    register(sub)
    register_rerun(sub)
    register_icl_figures(sub)
    register_table3_study(sub)
    register_reproduce(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    import sys

    from stabray.cli import one_line
    from stabray.errors import UserError

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
