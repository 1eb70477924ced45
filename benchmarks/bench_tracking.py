"""EAF tracking share per task: the time the per-epoch EAF takes, as a share of the whole epoch
(training + validation + EAF), on every shipped spec of the paper's seven tasks at laptop scale,
through the real training loop (`stabray.train.make_run`, what a sweep trial runs).

    python benchmarks/bench_tracking.py [--smoke] [--json out.json] [--tasks dfs ...] [--windows 3]

Each task trains its spec's trial (the spec's own model, data and `eval` settings; the searched
values at λ = 1, the longest chain, and the spec's default bits and lr) for one warm-up epoch (its
EAF starts the power iteration cold; reported apart) and then `--windows` windows of `eval.eaf_every`
epochs each (the EAF is measured once per window, warm-started). A window's share = EAF seconds /
(epoch seconds summed over the window). Reported: median and range of the windows' shares per task;
target (issue 22): <= 15% on every spec. One torch thread, like a sweep trial with 1 CPU.

`--seeds-check` (default: dfs, the one spec whose tracking settings are cut) also trains that spec on 3
training seeds for `--check-epochs` epochs and, on the same final model, compares the EAF the spec's
settings give (what its trials log) with a reference estimate (the base settings: 8 examples, output
cap 8, 10 power iterations from a cold start). Reported: the seed-to-seed spread of the reference
(sample standard deviation over the seeds) and the shift |spec - reference| per seed; the cheaper
setting should move the EAF by less than that spread (target: median shift / spread <= 1).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import command, figure, json_out, load, positive_int  # noqa: E402

TASKS = ["dijkstra", "bellman_ford", "mst_prim", "bfs", "dfs", "lego_cyclic", "lego_symmetry"]
TARGET = "<= 15"


def trial_config(spec_name: str, overrides: dict | None = None, seed: int = 0) -> dict:
    """The spec's trial at λ = 1 (longest chain) and its defaults for the other searched values."""
    from stabray.config import set_path
    from stabray.spec import load_spec

    spec, _ = load_spec(spec_name, overrides or {})
    cfg = spec.trial_base()
    if "lam" in cfg["method"]["params"] or "lam" in spec.search.space:
        cfg["method"]["params"]["lam"] = 1.0
    cfg["train"]["threads"] = 1
    cfg["device"] = "cpu"
    cfg["seed"] = seed
    for k, v in (overrides or {}).items():
        if k.split(".")[0] in cfg:
            set_path(cfg, k, v)
    return cfg


def epoch_times(run) -> tuple[float, float]:
    """(whole epoch s, EAF s) of one `run.epoch()`."""
    t0 = time.perf_counter()
    m = run.epoch()
    return time.perf_counter() - t0, float(m.get("eaf_time_s", 0.0))


def bench_task(name: str, windows: int, overrides: dict) -> dict:
    from stabray.train import make_run

    cfg = trial_config(name, overrides)
    every = int(cfg["eval"].get("eaf_every", 1))
    need = 1 + windows * every
    cfg["train"]["epochs"] = max(cfg["train"]["epochs"], need)
    run = make_run(cfg)
    warm_epoch, warm_eaf = epoch_times(run)  # cold EAF start, allocator, first data draw
    shares, epoch_s, eaf_s = [], [], []
    for _ in range(windows):
        ep = [epoch_times(run) for _ in range(every)]
        e, f = sum(x for x, _ in ep), sum(y for _, y in ep)
        shares.append(100 * f / e)
        epoch_s.append(e / every)
        eaf_s.append(f)
    return {
        "eaf_every": every,
        "eaf_examples": cfg["eval"]["eaf_examples"],
        "eaf_iters": cfg["eval"]["eaf_iters"],
        "eaf_token_cap": cfg["eval"]["eaf_token_cap"],
        "first_epoch_s": warm_epoch,
        "first_eaf_s": warm_eaf,
        "first_share_pct": 100 * warm_eaf / warm_epoch,
        "window_share_pct": shares,
        "epoch_s": epoch_s,
        "eaf_s_per_window": eaf_s,
    }


def seeds_check(name: str, seeds: int, epochs: int, overrides: dict, ref: dict) -> dict:
    """EAF with the spec's settings vs the reference estimator on the same final model, per seed."""
    import statistics

    from stabray.stability import estimate_eaf
    from stabray.train import make_run

    rows = []
    for s in range(seeds):
        cfg = trial_config(name, overrides, seed=s)
        cfg["train"]["epochs"] = epochs
        run = make_run(cfg)
        while not run.done:
            m = run.epoch()
        t0 = time.perf_counter()
        r = estimate_eaf(
            run.model,
            run.eval_encoded("val", ref["examples"], cfg["eval"]["eaf_chain"]),
            iters=ref["iters"],
            token_cap=ref["token_cap"],
            aggregation=cfg["eval"]["eaf_aggregation"],
            method=run.method,
        )
        rows.append({"seed": s, "spec_eaf": m["val_eaf"], "ref_eaf": float(r.eaf), "ref_s": time.perf_counter() - t0,
                     "spec_eaf_s": m["eaf_time_s"]})  # fmt: skip
        print(
            f"    seed {s}: EAF spec settings {m['val_eaf']:.4g}, reference {r.eaf:.4g} (load {load():.1f})", flush=True
        )
    spread = statistics.stdev(x["ref_eaf"] for x in rows) if len(rows) > 1 else float("nan")
    return {"rows": rows, "spread": spread, "shift": [abs(x["spec_eaf"] - x["ref_eaf"]) for x in rows], "ref": ref}


def main(argv: list[str] | None = None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny data and model, 1 window, two tasks")
    p.add_argument("--json", type=json_out, default=None)
    p.add_argument("--tasks", nargs="*", default=TASKS)
    p.add_argument("--windows", type=positive_int, default=3, help="measured windows of eval.eaf_every epochs per task")
    p.add_argument("--seeds-check", nargs="*", default=["dfs"], help="specs whose EAF is checked against seed spread")
    p.add_argument("--check-epochs", type=positive_int, default=3)
    p.add_argument(
        "--set", action="append", default=[], metavar="K=V", help="override a spec field (e.g. eval.eaf_every=3)"
    )
    p.add_argument("--check-seeds", type=positive_int, default=3)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    over: dict = {k: json.loads(v) if v[:1] in "0123456789[{-tf" else v for k, v in (x.split("=", 1) for x in args.set)}
    tasks, windows = args.tasks, args.windows
    if args.smoke:
        over |= {"task.train_size": 32, "task.val_size": 8, "task.test_size": 8, "model.preset": "tiny"}
        tasks, windows = [t for t in args.tasks if t in ("dijkstra", "dfs")] or args.tasks[:1], 1
    cmd = command(__file__, argv)
    res, figs = {}, []
    for t in tasks:
        t0 = time.perf_counter()
        r = bench_task(t, windows, over)
        res[t] = r
        print(
            f"{t:<14} eaf every {r['eaf_every']} epoch(s) on {r['eaf_examples']} examples, {r['eaf_iters']} iters, "
            f"cap {r['eaf_token_cap']}: share {', '.join(f'{s:.1f}' for s in r['window_share_pct'])} % "
            f"(epoch {min(r['epoch_s']):.1f}-{max(r['epoch_s']):.1f} s; first epoch {r['first_share_pct']:.1f} %, "
            f"cold); {time.perf_counter() - t0:.0f} s, load {load():.1f}",
            flush=True,
        )
        figs.append(
            figure(
                f"eaf_tracking_share_{t}",
                f"EAF tracking share of an epoch, `{t}` spec",
                r["window_share_pct"],
                "%",
                cmd,
                target=TARGET,
                detail=(
                    f"EAF every {r['eaf_every']} epoch(s), {r['eaf_examples']} examples, {r['eaf_iters']} iterations "
                    f"(warm), cap {r['eaf_token_cap']}; epoch {min(r['epoch_s']):.1f}-{max(r['epoch_s']):.1f} s"
                ),
            )
        )
    checks = {}
    ref = {"examples": 8, "token_cap": 8, "iters": 10}
    for t in args.seeds_check:
        ep, sd = (1, 2) if args.smoke else (args.check_epochs, args.check_seeds)
        print(f"  {t}: EAF at the spec's settings vs the reference, {sd} seeds x {ep} epochs", flush=True)
        c = checks[t] = seeds_check(t, sd, ep, over, ref)
        figs.append(
            figure(
                f"eaf_shift_over_seed_spread_{t}",
                f"`{t}` spec: EAF shift from its cheaper tracking settings, over the seed-to-seed spread "
                f"(reference: {ref['examples']} examples, cap {ref['token_cap']}, {ref['iters']} cold iterations)",
                c["shift"],
                "EAF",
                cmd,
                baselines=[c["spread"]] * len(c["shift"]),
                target="<= 1",
                detail=f"after {ep} epochs, {sd} seeds: reference EAF "
                + ", ".join(f"{x['ref_eaf']:.3g}" for x in c["rows"])
                + "; spec settings "
                + ", ".join(f"{x['spec_eaf']:.3g}" for x in c["rows"])
                + f"; spread (sd) {c['spread']:.3g}",
            )
        )
        print(f"  {t}: shift / spread {figs[-1]['ratio']:.2f} (median; spread {c['spread']:.3g})", flush=True)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"smoke": args.smoke, "tasks": res, "seeds_check": checks, "figures": figs}, indent=2)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
