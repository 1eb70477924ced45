"""One laptop-calibration trial without Ray: a profile of scripts/calibration_profiles.yaml (plus
--set overrides), trained to the end with one torch thread, then exact-match accuracy on every
evaluation split beside the task's trivial rules on the same examples, broken down by input size
(and for a method that writes the whole chain, how often the written steps are the example's and
at which token of a step a wrong chain first goes off, `steps_report`); one JSON line appended to
--out (`scripts/calibration_table.py` turns the lines into the README's calibration table).

    PYTHONPATH=. python scripts/calibrate.py d17_mix34_init1 --seed 1
    PYTHONPATH=. python scripts/calibrate.py d17_mix34_init1 --set train.epochs=20 --label d17_e20
    PYTHONPATH=. python scripts/calibrate.py L28_lab12_mix34w13_randpos512_s3_e160_h128 --track-every 10
    PYTHONPATH=. python scripts/calibrate.py l89 --seed 2 --save runs/l89_s2   # a short name: l89_...
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import yaml

from stabray.errors import UserError, did_you_mean, run_script, unwritable


def graded(run, split: str) -> tuple[list, list[str], list[bool]]:
    """A whole split's examples, the model's greedy answers, and whether each final answer is exact."""
    from stabray.tasks.base import extract_final

    exs = run.data[split]
    preds = run.evaluate(split).predictions
    return exs, preds, [run.task.is_correct(e, extract_final(p)) for e, p in zip(exs, preds)]


def split_report(run, split: str) -> dict:
    exs, preds, ok = graded(run, split)
    rules = run.task.baseline_accuracy(exs)
    best = max(rules.items(), key=lambda kv: kv[1]) if rules else ("none", 0.0)
    by = defaultdict(list)
    for e, o in zip(exs, ok):
        by[e.meta.get("n")].append((e, o))
    by_size = {}
    for n, pairs in sorted(by.items()):
        b = run.task.baseline_accuracy([e for e, _ in pairs])
        by_size[str(n)] = {
            "n": len(pairs),
            "acc": sum(o for _, o in pairs) / len(pairs),
            "best_rule": max(b.values()) if b else 0.0,
        }
    acc = sum(ok) / len(ok)
    # examples the model answers right that no trivial rule does (a model can score below the best
    # rule and still solve examples the rules cannot: that part is not explained by a shortcut)
    fns = list(run.task.trivial_baselines().values())
    no_rule = [not any(run.task.is_correct(e, f(e)) for f in fns) for e in exs]
    reach = position_reach(run, split, preds)
    return (
        ({"reach": reach} if reach else {})
        | steps_report(run, exs, preds, ok)
        | {
            "acc": acc,
            "no_rule_n": sum(no_rule),
            "no_rule_acc": sum(o for o, nr in zip(ok, no_rule) if nr) / max(1, sum(no_rule)),
            "n": len(ok),
            "std": math.sqrt(acc * (1 - acc) / len(ok)),
            "best_rule": best[1],
            "best_rule_name": best[0],
            "rules": rules,
            "by_size": by_size,
            "sizes": sorted({e.meta.get("n") for e in exs}),
            "sample_pred": preds[:2],
            "sample_gold": [e.answer for e in exs[:2]],
            "wrong": [(p, e.answer) for e, p, o in zip(exs, preds, ok) if not o][:4],  # (predicted, gold)
        }
    )


def steps_report(run, exs: list, preds: list[str], ok: list[bool]) -> dict:
    """For a method whose evaluation chain is the whole chain (`writes_whole_chain`: SFT-CoT, ...):
    `steps_acc`, the fraction of answers whose written steps are the example's token for token (the
    trial's steps_<metric>), `steps_ok_final_wrong`, how many of the wrong answers follow the chain
    right and then get the final answer wrong (e.g. a LEGO delta trace that resolves every variable
    and then lists one too few), and `first_departure`: over the written chains that are not the
    example's, how many first depart from it at each token of a step
    (`stabray.evaluate.metrics.first_departure_token`; for a LEGO delta step `f 3`, "0" is a wrong
    variable, "1" a wrong value, "2" a chain that stops or goes on where it should not, or never
    ends); its counts add up to the answers whose steps are not the
    example's, (1 - steps_acc) * n; `final_after_steps`, how the final answers of the
    steps_ok_final_wrong answers differ from the example's (`final_difference`). {} for other
    methods."""
    from stabray.evaluate.metrics import departures, steps_match, writes_whole_chain

    if not writes_whole_chain(run.method, exs):
        return {}
    same = steps_match(exs, preds)
    return {
        "steps_acc": sum(same) / len(same),
        "steps_ok_final_wrong": sum(s and not o for s, o in zip(same, ok)),
        "first_departure": departures(exs, preds),
        "final_after_steps": final_difference(
            [e for e, right, o in zip(exs, same, ok) if right and not o],
            [p for p, right, o in zip(preds, same, ok) if right and not o],
        ),
    }


def final_difference(exs: list, preds: list[str]) -> dict[str, dict[str, int]]:
    """How written final answers differ from the examples' (normalized tokens after the last '|'):
    `length`, the count of answers per token difference ({"-2": 105}: two tokens short; a LEGO named
    state's entry is two tokens, `r 4`), and `prefix`, how many are the example's with its end cut
    off (short, and token for token the same up to where they stop)."""
    from stabray.tasks.base import extract_final, normalize_answer

    length: Counter = Counter()
    prefix = 0
    for e, p in zip(exs, preds):
        have, gold = normalize_answer(extract_final(p)).split(), normalize_answer(e.final).split()
        length[len(have) - len(gold)] += 1
        # an answer ends with its closing token (`]`): "cut off" compares what comes before it
        body, gold_body = (have[:-1], gold[:-1]) if have and gold and have[-1] == gold[-1] else (have, gold)
        prefix += len(body) < len(gold_body) and gold_body[: len(body)] == body
    return {"length": {str(k): length[k] for k in sorted(length)}, "prefix": prefix}


def token_count(run, text: str) -> int:
    return len(run.tokenizer(text, add_special_tokens=False).input_ids)


def sequence_lengths(run, split: str) -> list[int]:
    """Tokens of each example's whole gold sequence: BOS, question, answer, EOS."""
    return [token_count(run, e.question + e.answer) + 2 for e in run.data[split]]


def reach_report(run, split: str, predictions: list[str], stride: int, span: int, lengths: list[int]) -> dict:
    """Randomized positions: accuracy on the examples whose whole gold sequence (BOS, question,
    answer, EOS) stays inside the trained positions at this evaluation stride ((length - 1) * stride
    < span) and on the rest, which reach rotary phases training never drew; the best trivial rule on
    the same two subsets (the ones inside are the shorter, easier graphs); per example, right or
    wrong (`ok`), so other selections can be scored from the JSON line."""
    from stabray.tasks.base import extract_final

    exs = run.data[split]
    ok = [run.task.is_correct(e, extract_final(p)) for e, p in zip(exs, predictions)]
    inside = [(n - 1) * stride < span for n in lengths]
    part = {True: [e for e, i in zip(exs, inside) if i], False: [e for e, i in zip(exs, inside) if not i]}
    rule = {k: max(run.task.baseline_accuracy(v).values(), default=0.0) if v else 0.0 for k, v in part.items()}
    n_in = sum(inside)
    return {
        "acc": sum(ok) / len(ok),
        "n_within_span": n_in,
        "acc_within_span": sum(o for o, i in zip(ok, inside) if i) / max(1, n_in),
        "rule_within_span": rule[True],
        "acc_beyond_span": sum(o for o, i in zip(ok, inside) if not i) / max(1, len(ok) - n_in),
        "rule_beyond_span": rule[False],
        "max_len": max(lengths),
        "ok": ok,
    }


def position_reach(run, split: str, predictions: list[str]) -> dict | None:
    """Randomized positions at one fixed evaluation stride only (None otherwise; a stride per input
    is reported by --eval-strides): at the model's own evaluation stride, how many of
    the split's gold sequences run past the trained positions ((length - 1) * stride >= span), and
    the accuracy and best trivial rule inside and beyond, from predictions already made. A larger
    graph is longer, so part of a +1 or +2 split can fail for the position range as much as for its
    size; this tells the two apart in every row."""
    from stabray.models.positions import RandomPositions

    mods = [m for m in run.model.modules() if isinstance(m, RandomPositions)]
    if not mods or len(mods[0].eval_strides) > 1:  # a stride per input: --eval-strides reports it
        return None
    stride, span = mods[0].eval_stride, mods[0].span
    r = reach_report(run, split, predictions, stride, span, sequence_lengths(run, split))
    keep = ("acc_within_span", "rule_within_span", "acc_beyond_span", "rule_beyond_span", "max_len")
    beyond = len(r["ok"]) - r["n_within_span"]
    return {"stride": stride, "span": span, "n_beyond_span": beyond} | {k: r[k] for k in keep}


def fitted_strides(run, span: int, strides: list[int]) -> tuple[dict[str, list[int]], float]:
    """Per example of every evaluation split, the stride a trial with `model.position_eval_stride:
    strides` would use for it (stabray.models.positions): the largest of `strides` at which its
    expected sequence fits inside the trained positions, from its prompt alone (expected length =
    prompt tokens x the largest whole sequence / prompt ratio of 500 training examples, both as the
    method encodes them, BOS and EOS included), so no gold answer decides; the smallest stride when
    none fits."""
    from stabray.models.positions import fitting_stride, length_ratio

    ratio = length_ratio(run.length_pairs(run.data["train"][:500]))
    chosen = {}
    for split in ("test", *run.long_splits):
        prompts = [len(run.encoder.prompt(run.method.eval_prompt(e))) for e in run.data[split]]
        chosen[split] = [fitting_stride(n, ratio, span, strides) for n in prompts]
    return chosen, ratio


PROFILES = Path(__file__).with_name("calibration_profiles.yaml")


def full_name(name: str, profiles: dict) -> str:
    """The profile `name` names: itself, or the one profile whose name starts with `name` + "_" (the
    short names the docs use, `l89` for l89_cyc_...). Rows always carry the full name."""
    entries = profiles["profiles"]
    if name in entries:
        return name
    matches = [e for e in entries if e.startswith(name + "_")]
    return matches[0] if len(matches) == 1 else name


def profile_config(name: str, profiles: dict) -> dict:
    """A profile's trial config: its parent's (or the base) with its `set` fields replaced."""
    from stabray.config import set_path

    entries = profiles["profiles"]
    if name not in entries:
        hint = did_you_mean(name, entries, before="; ") or f" ({len(entries)} profiles in {PROFILES.name})"
        raise UserError(f"no calibration profile {name!r}{hint}")
    entry = entries[name] or {}
    if entry.get("not_shipped"):
        raise UserError(f"profile {name!r} needs a prototype option that is not shipped: {entry['not_shipped']}")
    cfg = profile_config(entry["parent"], profiles) if entry.get("parent") else copy.deepcopy(profiles["base"])
    for k, v in (entry.get("set") or {}).items():
        set_path(cfg, k, copy.deepcopy(v))
    return cfg


def rescore(path: Path, label: str, cfg: dict) -> None:
    """--rescore: per row, the accuracy at the per-input stride (`fitted_strides`) from the row's
    per-example results at each stride, and how many inputs the row's own recorded choice put at
    another stride; then the mean and sample standard deviation over the rows."""
    import statistics

    if str(Path(__file__).resolve().parent) not in sys.path:  # the sibling script, also when imported
        sys.path.insert(0, str(Path(__file__).resolve().parent))
    from calibration_table import read_rows  # noqa: E402

    from stabray.models.positions import RandomPositions
    from stabray.train.run import TrialRun

    rows = [r for r in read_rows([str(path)], need=("profile",)) if r["profile"] == label and r.get("eval_strides")]
    if not rows:
        raise UserError(f"{path}: no row named {label!r} with per-stride results (--eval-strides)")
    per_split: dict[str, list[float]] = {}
    for r in rows:
        # the row's own config (data and tokenizer only: nothing is trained), so its stored
        # per-example results line up with the examples they were scored on
        run = TrialRun({**r["config"], "cache_dir": cfg.get("cache_dir")})
        span = next(m.span for m in run.model.modules() if isinstance(m, RandomPositions))  # the row's model's
        ks = sorted(int(k) for k in r["eval_strides"] if k.isdigit())
        chosen, ratio = fitted_strides(run, span, ks)
        parts = []
        for split, picks in chosen.items():
            ok = [r["eval_strides"][f"{k}_reach"][split]["ok"][i] for i, k in enumerate(picks)]
            acc = sum(ok) / len(ok)
            per_split.setdefault(split, []).append(acc)
            old = r["eval_strides"].get("fitted", {}).get(split, {}).get("strides")
            moved = f", {sum(a != b for a, b in zip(old, picks))} moved" if old else ""
            counts = "/".join(str(picks.count(k)) for k in ks)
            parts.append(f"{split} {acc:.3f} (strides {','.join(map(str, ks))}: {counts}{moved})")
        print(f"seed {r['seed']} ratio {ratio:.3f}: " + "; ".join(parts), flush=True)
    print(
        f"{label}, {len(rows)} rows: "
        + "; ".join(
            f"{s} {statistics.mean(v):.3f} ± {statistics.stdev(v) if len(v) > 1 else 0.0:.3f}"
            for s, v in per_split.items()
        )
    )


def check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[list[int], list[tuple[str, str]]]:
    """Everything about the command line that can be wrong, before any data or model is built (a run
    trains for up to two hours; its row is written at the end): the --eval-strides list, the --set
    items, and the places --out and --save write to. Returns (strides, [(key, yaml value)])."""
    strides = []
    for k in filter(None, args.eval_strides.split(",")):
        if not k.strip().isdigit() or int(k) < 1:
            ap.error(f"--eval-strides {args.eval_strides}: expected strides >= 1 separated by commas, got {k!r}")
        strides.append(int(k))
    if args.eval_strides and not strides:
        ap.error(f"--eval-strides {args.eval_strides!r}: no stride given (e.g. 2,3,4)")
    sets = []
    for item in args.set:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            ap.error(f"--set {item!r}: expected KEY=VALUE (e.g. train.epochs=80)")
        sets.append((key.strip(), value))
    out = Path(args.out)
    if not args.rescore:
        if out.is_dir():
            ap.error(f"--out {out}: a folder; give a JSON-lines file (rows are appended to it)")
        if not out.absolute().parent.is_dir():
            ap.error(f"--out {out}: the folder {out.absolute().parent} does not exist")
        if (why := unwritable(out.absolute().parent)) is not None:
            ap.error(f"--out {out}: {why}")
    if args.save:
        if Path(args.save).is_file():
            ap.error(f"--save {args.save}: a file is there; give a folder")
        if (why := unwritable(Path(args.save))) is not None:
            ap.error(f"--save {args.save}: {why}")
    if args.track_every < 0:
        ap.error(f"--track-every must be >= 0 (0 = off), got {args.track_every}")
    return strides, sets


def check_config(cfg: dict, profile: str, sets: list[tuple[str, str]], base: dict) -> None:
    """The profile's trial config with the --set overrides (`cfg`), validated before any data or model
    is built. When the profile's own config (`base`, before the overrides) passes, the overrides caused
    the problem: it is named by the --set that wrote the field (or one above or below it: a check across
    two fields names their section), else by all of them; otherwise by the profile."""
    if (problem := config_problem(cfg)) is None:
        return
    if not sets or config_problem(base) is not None:
        raise UserError(f"profile {profile}: {problem}")
    field = problem.split(":", 1)[0]
    near = [(k, v) for k, v in sets if field == k or field.startswith(k + ".") or k.startswith(field + ".")]
    raise UserError(", ".join(f"--set {k}={v}" for k, v in (near[-1:] or sets)) + f": {problem}")


def config_problem(cfg: dict) -> str | None:
    """What the trial config validation says is wrong with `cfg` (without its "trial config: "), or None."""
    from stabray.config import parse_trial_config

    try:
        parse_trial_config(cfg)
    except UserError as e:
        return str(e).removeprefix("trial config: ")
    return None


def main() -> None:
    """The command; an input error (UserError: an unknown profile, a bad --set) is one line, exit 2
    (stabray.errors.run_script)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile", help="a profile of scripts/calibration_profiles.yaml")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--label", default="", help="the row's name in the table (default: the profile)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    ap.add_argument("--cache-dir", default=None, help="dataset cache (default: $STABRAY_CACHE)")
    ap.add_argument("--out", default="calibration.jsonl")
    ap.add_argument(
        "--track-every",
        type=int,
        default=0,
        metavar="N",
        help="every N epochs and after the last, also score the test split and every longer split (a "
        "learning curve per size in each epoch's `track`, and for a method that writes the whole chain the written "
        "chain's in `track_steps` and where its wrong chains first go off in `track_departure`; it reads the "
        "model and does not change the training)",
    )
    ap.add_argument(
        "--eval-strides",
        default="",
        metavar="K,K,...",
        help="model.positions: random only: also score every split at these evaluation strides (same trained model)",
    )
    ap.add_argument(
        "--rescore",
        default="",
        metavar="FILE",
        help="train nothing: for every row of FILE (JSON lines) named like this run (--label, else the profile) "
        "that has per-stride results (--eval-strides), score each example at the stride stabray's model picks "
        "for it (model.position_eval_stride: a list) from the stored per-example results",
    )
    ap.add_argument(
        "--save",
        default="",
        metavar="DIR",
        help="after training, keep the trained model in DIR as a trial checkpoint (TrialRun.save: tensors only, "
        "read back with weights_only; the tokenizer; the config), for diagnostics that read the model without "
        "training it again (scripts/answer_probe.py)",
    )
    args = ap.parse_args()
    eval_ks, sets = check_args(ap, args)

    import torch

    from stabray.config import set_path
    from stabray.evaluate.metrics import departures
    from stabray.train.loop import kernels
    from stabray.train.run import TrialRun

    torch.set_num_threads(1)
    profiles = yaml.safe_load(PROFILES.read_text())
    args.profile = full_name(args.profile, profiles)
    cfg = profile_config(args.profile, profiles)
    base = copy.deepcopy({**cfg, "seed": args.seed, "cache_dir": args.cache_dir})
    for k, v in sets:
        try:
            set_path(cfg, k, yaml.safe_load(v))
        except yaml.YAMLError as e:
            ap.error(f"--set {k}={v}: not a YAML value ({str(e).splitlines()[0]})")
    cfg["seed"] = args.seed
    cfg["cache_dir"] = args.cache_dir
    check_config(cfg, args.profile, sets, base)
    if args.eval_strides and cfg.get("model", {}).get("positions") != "random":  # checked before training
        raise UserError(f"--eval-strides needs a profile with model.positions: random ({args.profile} has none)")
    if args.eval_strides and isinstance(cfg["model"].get("position_eval_stride"), list):
        raise UserError(
            "--eval-strides scores the trained model at each listed stride, and the per-input pick among them; "
            f"the run's model.position_eval_stride is already a list ({cfg['model']['position_eval_stride']}): "
            "give it one stride"
        )
    if args.rescore:
        rescore(Path(args.rescore), args.label or args.profile, cfg)
        return
    t0, c0 = time.perf_counter(), time.process_time()
    run = TrialRun(cfg)
    n_params = sum(p.numel() for p in run.model.parameters() if p.requires_grad)
    label = args.label or args.profile
    print(f"[{label} seed {args.seed}] params {n_params}, vocab {len(run.tokenizer)}", flush=True)
    epochs = []
    while not run.done:
        m = run.epoch()
        epochs.append({k: round(float(v), 4) for k, v in m.items() if isinstance(v, (int, float))})
        off = f" off@tok0 {m['val_departure_tok0']:.2f}" if "val_departure_tok0" in m else ""  # the stop_if sign
        print(
            f"  epoch {m['epoch']:2d} loss {m['train_loss']:.4f} val {m['val_acc']:.3f}{off} "
            f"tok/s {m['tokens_per_s']:.0f} t={time.perf_counter() - t0:.0f}s",
            flush=True,
        )
        if args.track_every and (m["epoch"] % args.track_every == 0 or run.done):
            res = {s: run.evaluate(s) for s in ("test", *run.long_splits)}
            epochs[-1]["track"] = {s: round(r.acc, 4) for s, r in res.items()}
            line = " ".join(f"{s} {a:.3f}" for s, a in epochs[-1]["track"].items())
            steps = {s: round(r.steps_acc, 4) for s, r in res.items() if r.steps_acc is not None}
            if steps:  # the written chain's learning curve beside the answer's (steps_<metric>)
                epochs[-1]["track_steps"] = steps
                line += "  steps: " + " ".join(f"{s} {a:.3f}" for s, a in steps.items())
                dep = {s: departures(run.data[s], r.predictions) for s, r in res.items() if s in steps}
                epochs[-1]["track_departure"] = dep  # where the wrong chains first go off, as it learns
                line += "  first off at token: " + " ".join(
                    f"{s} " + "/".join(f"{i}:{n}" for i, n in d.items()) for s, d in dep.items() if d
                )
            print("    track: " + line, flush=True)
    if args.save:
        run.save(args.save)
    final = {s: split_report(run, s) for s in ("test", *run.long_splits)}
    strides = {}
    if args.eval_strides:
        from stabray.models.positions import RandomPositions

        mods = [m for m in run.model.modules() if isinstance(m, RandomPositions)]
        kept = mods[0].eval_stride
        lengths = {s: sequence_lengths(run, s) for s in final}  # the same at every stride
        preds: dict[int, dict[str, list[str]]] = {}
        for k in eval_ks:
            for m in mods:
                m.eval_stride = k
            preds[k] = {s: run.evaluate(s).predictions for s in final}
            reports = {s: reach_report(run, s, preds[k][s], k, mods[0].span, lengths[s]) for s in final}
            strides[str(k)] = {s: r["acc"] for s, r in reports.items()}
            strides[f"{k}_reach"] = reports
            print(f"  eval stride {k}:", flush=True)
            for s, r in reports.items():
                print(
                    f"    {s:8s} {r['acc']:.3f}; {r['n_within_span']} inside the span {r['acc_within_span']:.3f} "
                    f"(rule {r['rule_within_span']:.3f}), beyond {r['acc_beyond_span']:.3f} "
                    f"(rule {r['rule_beyond_span']:.3f})",
                    flush=True,
                )
        ks = sorted(eval_ks)
        chosen, ratio = fitted_strides(run, mods[0].span, ks)
        fitted = {}
        for s, picks in chosen.items():
            ok = [strides[f"{k}_reach"][s]["ok"][i] for i, k in enumerate(picks)]
            fitted[s] = {"acc": sum(ok) / len(ok), "strides": picks}
        strides["fitted"] = {"ratio": ratio, **fitted}
        print(
            f"  per-input stride (largest of {ks} that fits the expected length, ratio {ratio:.2f}): "
            + " ".join(f"{s} {r['acc']:.3f}" for s, r in fitted.items()),
            flush=True,
        )
        # the same choice made by stabray's own evaluation: the model given the list of strides
        # (model.position_eval_stride: ks) generates each input at its stride (by_input_stride)
        from stabray.models.positions import set_length_ratio

        for m in mods:
            m.eval_strides = tuple(ks)
        set_length_ratio(run.model, run.length_pairs(run.data["train"][:500]))
        strides["model"] = {}
        for s in final:
            res, picks = run.evaluate(s), chosen[s]
            strides["model"][s] = {
                "acc": res.acc,
                # answers identical to the ones generated at the example's stride above, and
                # examples whose answers differ between strides (where the check could fail)
                "same_answers": sum(p == preds[k][s][i] for i, (p, k) in enumerate(zip(res.predictions, picks))),
                "answers_differ_by_stride": sum(len({preds[k][s][i] for k in ks}) > 1 for i in range(res.n)),
            }
        print(
            f"  stabray's evaluation with model.position_eval_stride {ks}: "
            + " ".join(
                f"{s} {r['acc']:.3f} ({r['same_answers']} answers as above)" for s, r in strides["model"].items()
            ),
            flush=True,
        )
        for m in mods:
            m.eval_strides, m.eval_stride, m.length_ratio = (kept,), kept, None
    rec = {  # the fields scripts/calibration_table.py reads, then the details
        "profile": label,
        "seed": args.seed,
        "source": "stabray",
        "task": run.task.name,
        "splits": {
            s: {k: r[k] for k in ("sizes", "acc", "n", "best_rule", "best_rule_name")} for s, r in final.items()
        },
        "params": n_params,
        "wall_min": round((time.perf_counter() - t0) / 60, 2),
        "cpu_min": round((time.process_time() - c0) / 60, 2),
        "overrides": args.set,
        **({"from_profile": args.profile} if args.label else {}),  # the profile a --label row ran
        "config": cfg,
        "epochs": epochs,
        "final": final,
        "eval_strides": strides,
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": kernels(run.device),  # rows from another kernel path are draws, not reruns
    }
    with open(args.out, "a") as f:
        f.write(json.dumps(rec) + "\n")
    for s, r in final.items():
        bys = " ".join(f"{n}:{v['acc']:.2f}/{v['best_rule']:.2f}" for n, v in r["by_size"].items())
        print(
            f"  {s:12s} acc {r['acc']:.3f} (n {r['n']})  best rule {r['best_rule']:.3f}  [{bys}]  "
            f"right where every rule is wrong: {r['no_rule_acc']:.3f} of {r['no_rule_n']}"
        )
        if "steps_acc" in r:
            print(
                f"  {'':12s} steps as the example's: {r['steps_acc']:.3f}; "
                f"{r['steps_ok_final_wrong']} wrong answers after the right steps"
                + (
                    " (final answer's tokens vs the example's: "
                    + ", ".join(f"{int(k):+d}: {n}" for k, n in r["final_after_steps"]["length"].items())
                    + f"; {r['final_after_steps']['prefix']} cut short)"
                    if r.get("final_after_steps", {}).get("length")
                    else ""
                )
                + (
                    "; the chain first off at a step's token "
                    + ", ".join(f"{i}: {n}" for i, n in r["first_departure"].items())
                    if r.get("first_departure")
                    else ""
                )
            )
        if "reach" in r:
            q = r["reach"]
            parts = [
                f"{side} {q[f'acc_{key}']:.3f} (rule {q[f'rule_{key}']:.3f})"
                for side, key, n in (
                    ("inside", "within_span", r["n"] - q["n_beyond_span"]),
                    ("beyond", "beyond_span", q["n_beyond_span"]),
                )
                if n
            ]
            print(
                f"  {'':12s} {q['n_beyond_span']} of {r['n']} run past the trained positions at stride {q['stride']} "
                f"(span {q['span']}): " + ", ".join(parts)
            )
    print(f"  wall {rec['wall_min']:.2f} min, cpu {rec['cpu_min']:.2f} min")
    print(f"  pred {final['test']['sample_pred'][0]!r}\n  gold {final['test']['sample_gold'][0]!r}")
    for s, r in final.items():
        for pred, gold in r["wrong"][:2]:
            print(f"  {s} wrong: pred {pred!r}\n  {' ' * len(s)}        gold {gold!r}")


if __name__ == "__main__":
    raise SystemExit(run_script(main))
