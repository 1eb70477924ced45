"""`python -m stabray stability <checkpoint dir | MLflow run id>`: the eq. (4) decomposition
(Table 2's columns for T = 1..T_max) of a trained checkpoint on its test split; prints the table,
writes stability.csv and stability.json to --out, and logs them to the run under `stability/`.

A checkpoint directory is what `TrialRun.save` writes (state.pt, tokenizer/, trial_config.json).
A run id is resolved to its checkpoint by `stabray.tracking.checkpoint_dir_of(run_id)`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from stabray.errors import UserError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "stability", help="eq. (4) decomposition of a checkpoint (Table 2)", description=__doc__.splitlines()[0]
    )
    p.add_argument("target", help="checkpoint directory or MLflow run id")
    p.add_argument("--n", type=int, default=64, help="test examples evaluated (default 64)")
    p.add_argument("--out", default=None, help="output folder (default: <checkpoint>/stability)")
    p.add_argument("--run-id", default=None, help="MLflow run to log to (default: the target when it is a run id)")
    p.add_argument(
        "--tracking-uri", default=None, help="MLflow tracking URI (default: MLFLOW_TRACKING_URI or ./mlflow.db)"
    )
    p.add_argument("--iters", type=int, default=10, help="power iterations (default 10)")
    p.add_argument("--token-cap", type=int, default=8, help="tokens per step block (default 8)")
    p.add_argument("--aggregation", choices=["block", "token_mean"], default="block")
    p.add_argument("--include-question", action="store_true", help="count the question as step 0")
    p.set_defaults(func=run)


def _resolve(target: str, tracking_uri: str | None) -> tuple[Path, str | None]:
    path = Path(target)
    if path.is_dir():
        return path, None
    import stabray.tracking as tracking

    resolve = getattr(tracking, "checkpoint_dir_of", None)
    if resolve is None:
        raise UserError(
            f"{target!r} is not a directory, and resolving an MLflow run id to its checkpoint needs "
            "stabray.tracking.checkpoint_dir_of (not available in this checkout); "
            "pass the checkpoint directory and --run-id"
        )
    return Path(resolve(target, tracking_uri)), target


def run(args) -> int:
    if args.n < 1 or args.iters < 1 or args.token_cap < 1:
        raise UserError("--n, --iters and --token-cap must be >= 1")
    ckpt, run_id = _resolve(args.target, args.tracking_uri)
    run_id = args.run_id or run_id
    from stabray.stability.decomposition import decompose
    from stabray.train.checkpoint import load_run

    trial = load_run(ckpt)
    method = getattr(trial, "method", None)
    if not hasattr(trial, "encoder"):  # a continuous task (icl_*): exact Jacobians, the runner's own table
        rows = trial.decomposition(args.n)
        examples = range(min(args.n, len(trial.data["test"][0])))
    elif method is not None and method.latent_thoughts:
        # Latent thoughts have no true value, so eps_t, r_t and the bound are undefined: the EAF over
        # the latent steps per T is what is measurable.
        from stabray.stability import eaf_from_norms, estimate_eaf

        examples = trial.data["test"][: args.n]
        res = estimate_eaf(
            trial.model,
            trial.eval_encoded("test", args.n),
            iters=args.iters,
            token_cap=args.token_cap,
            aggregation=args.aggregation,
            include_question=args.include_question,
            method=method,
        )
        rows = [{"T": T, "eaf": eaf_from_norms(res.norms, T, args.include_question)} for T in range(1, res.T + 1)]
        print(
            f"method {method.name!r} reasons in latent thoughts: the steps are its {res.T - 1} latent slots; "
            "the eq. (4) terms need true step values, so only the EAF per T is reported"
        )
    else:
        examples = trial.data["test"][: args.n]
        rows = decompose(
            trial.model,
            trial.encoder,
            examples,
            iters=args.iters,
            token_cap=args.token_cap,
            aggregation=args.aggregation,
            include_question=args.include_question,
        )
    out = Path(args.out) if args.out else ckpt / "stability"
    out.mkdir(parents=True, exist_ok=True)
    import polars as pl

    df = pl.DataFrame(rows)
    with pl.Config(tbl_rows=-1, tbl_cols=-1, float_precision=4):
        print(df)
    df.write_csv(out / "stability.csv")
    (out / "stability.json").write_text(
        json.dumps(
            {
                "checkpoint": str(ckpt),
                "n": len(examples),
                "iters": args.iters,
                "token_cap": args.token_cap,
                "aggregation": args.aggregation,
                "include_question": args.include_question,
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

        log_artifacts(run_id, out, "stability", tracking_uri=args.tracking_uri)
        print(f"logged to run {run_id} under stability/")
    return 0
