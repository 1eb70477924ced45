"""`python -m stabray stability <checkpoint dir | MLflow run id>`: the eq. (4) decomposition
(Table 2's columns for T = 1..T_max, or up to --T) of a trained checkpoint on its test split, on the
method's evaluation prompt and gold chain; prints the table and the row at T (Tables 2-3 are at
T = 5: `--T 5`, or T_max if the chains are shorter), writes stability.csv and stability.json to
--out, and logs them to the run under `stability/`.

A checkpoint directory is what a trial runner's `save` writes (state.pt: tensors only, loaded with
weights_only=True; history.json, trial_config.json, tokenizer/).
A run id is resolved to its checkpoint by `stabray.tracking.checkpoint_dir_of(run_id)`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from stabray.errors import UserError, check_output_folder


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "stability", help="eq. (4) decomposition of a checkpoint (Table 2)", description=__doc__.splitlines()[0]
    )
    p.add_argument("target", help="checkpoint directory or MLflow run id")
    p.add_argument("--n", type=int, default=64, help="test examples evaluated (default 64)")
    p.add_argument("--out", default=None, help="output folder (default: <checkpoint>/stability)")
    p.add_argument("--force", action="store_true", help="overwrite stability.csv / stability.json in --out")
    p.add_argument("--run-id", default=None, help="MLflow run to log to (default: the target when it is a run id)")
    p.add_argument(
        "--tracking-uri", default=None, help="MLflow tracking URI (default: MLFLOW_TRACKING_URI or ./mlflow.db)"
    )
    p.add_argument("--iters", type=int, default=10, help="power iterations (default 10)")
    p.add_argument(
        "--token-cap", type=int, default=8, help="output tokens per step (default 8; the input side is the whole step)"
    )
    p.add_argument(
        "--T",
        type=int,
        default=0,
        dest="T",
        help="evaluate the chain up to step T and report the row at min(T, T_max) (Tables 2-3: 5; default: T_max)",
    )
    p.add_argument("--aggregation", choices=["block", "token_mean"], default="block")
    p.add_argument("--include-question", action="store_true", help="count the question as step 0")
    p.set_defaults(func=run)


def _resolve(target: str, tracking_uri: str | None) -> tuple[Path, str | None]:
    """(checkpoint directory, MLflow run id or None) of a directory or a run id."""
    from stabray.tracking import checkpoint_dir_of

    path = Path(target)
    if path.is_dir():
        return path, None
    if path.exists():
        raise UserError(f"{target}: a file, not a checkpoint directory")
    if "/" in target or target.startswith("."):  # a path, not an MLflow run id
        raise UserError(f"{target}: no such checkpoint directory")
    return Path(checkpoint_dir_of(target, tracking_uri)), target


OUTPUTS = ("stability.csv", "stability.json")


def run(args) -> int:
    if args.n < 1 or args.iters < 1 or args.token_cap < 1:
        raise UserError("--n, --iters and --token-cap must be >= 1")
    if args.T < 0:
        raise UserError(f"--T must be >= 1 (or 0 = T_max), got {args.T}")
    ckpt, run_id = _resolve(args.target, args.tracking_uri)
    run_id = args.run_id or run_id
    if args.run_id:  # the run to log to must exist before the work starts
        from stabray.tracking import run_data

        run_data(args.run_id, args.tracking_uri)
    out = Path(args.out) if args.out else ckpt / "stability"
    check_output_folder(out, OUTPUTS, args.force)  # other files in it are kept; ours only with --force
    from stabray.progress import stage
    from stabray.record import DECOMP_KEYS
    from stabray.train import StabilityOptions, load_run
    from stabray.train.runner import at_T

    with stage(f"loading {ckpt}"):
        trial = load_run(ckpt)
    opts = StabilityOptions(
        n=args.n,
        iters=args.iters,
        token_cap=args.token_cap,
        aggregation=args.aggregation,
        include_question=args.include_question,
        T=args.T,
    )
    with stage(f"measuring eq. (4) on {args.n} test examples ({args.iters} power iterations per Jacobian)"):
        table = trial.stability_table(opts)
    if table.note:
        print(table.note)
    rows = table.rows
    at = at_T(rows, args.T)
    out.mkdir(parents=True, exist_ok=True)
    import polars as pl

    df = pl.DataFrame(rows) if rows else pl.DataFrame(schema=list(DECOMP_KEYS))
    with pl.Config(tbl_rows=-1, tbl_cols=-1, float_precision=4):
        print(df)
    if at:
        shown = ", ".join(
            f"{k.removeprefix('test_').removesuffix('_at_T')} {v:.4g}" for k, v in at.items() if k != "stability_T"
        )
        print(f"at T = {int(at['stability_T'])}: {shown}")
    df.write_csv(out / "stability.csv")
    (out / "stability.json").write_text(
        json.dumps(
            {
                "checkpoint": str(ckpt),
                "n": table.n_examples,
                "iters": args.iters,
                "token_cap": args.token_cap,
                "aggregation": args.aggregation,
                "include_question": args.include_question,
                "T": args.T,
                "at_T": at,
                "note": table.note,
                "rows": [
                    {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()} for r in rows
                ],
            },
            indent=1,
            default=str,
        )
    )
    print(f"wrote {out / 'stability.csv'} and {out / 'stability.json'}")
    if run_id:
        from stabray.tracking import log_artifacts

        log_artifacts(run_id, out, "stability", args.tracking_uri)
        print(f"logged to run {run_id} under stability/")
    return 0
