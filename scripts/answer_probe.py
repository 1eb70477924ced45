"""Where a LEGO model's final state goes wrong after a right chain, read from a saved model
(`scripts/calibrate.py --save DIR`, or a sweep trial's checkpoint folder).

A LEGO named final state lists every variable in alphabetical order with its value
(`[c 1 f 0 l 2 ...]`), the same order as the question's `vars: [c f l ...]`. The script reads the
model on every example of each split two ways:

1. generated (stabray's evaluation, greedy): of the answers whose chain is the example's and whose
   final state is not, where the state first differs (`first_difference`): a variable left out (the
   name written is a later one's), the list ended early, a wrong value, or another name;
2. teacher-forced on the example's own chain and state: at every entry, whether the model's most
   likely next token is that entry's name (what greedy decoding writes there after a right prefix),
   broken down by the entry's place in the list, by the place of the variable's step in the chain,
   by the evaluation stride the model reads the example at (`model.position_eval_stride`), and by
   the entry's distance from the same name in the question's `vars` list in rotary positions
   (tokens x stride), the offset a lookup of the next name has to span.

    PYTHONPATH=. python scripts/answer_probe.py /work/runs/l89_s1_model --splits test test_n6 test_n7
    PYTHONPATH=. python scripts/answer_probe.py /work/runs/l105_s2_model --long-sizes 9 10   # other sizes
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path

from stabray.errors import UserError, run_script


def entries(final: str) -> list[tuple[str, str]]:
    """(name, value) pairs of a named final state `[c 1 f 0]` (normalized tokens); a trailing name
    without a value is kept with value ''."""
    from stabray.tasks.base import normalize_answer

    toks = [t for t in normalize_answer(final).split() if t not in ("[", "]")]
    return [(toks[i], toks[i + 1] if i + 1 < len(toks) else "") for i in range(0, len(toks), 2)]


def first_difference(gold: list[tuple[str, str]], have: list[tuple[str, str]]) -> tuple[str, int] | None:
    """How a written state first differs from the example's, and at which entry (0-based): "left out"
    (the name written there is a later entry's: `skipped` entries missing), "ended" (the list stops),
    "too long" (entries after the last), "value" (right name, wrong value), "other name" (a name not
    later in the list). None when they are the same."""
    for j, g in enumerate(gold):
        if j >= len(have):
            return "ended", j
        if have[j] == g:
            continue
        if have[j][0] == g[0]:
            return "value", j
        later = [name for name, _ in gold[j + 1 :]]
        return ("left out", j) if have[j][0] in later else ("other name", j)
    return ("too long", len(gold)) if len(have) > len(gold) else None


def load(model_dir: Path, long_sizes: list[int] | None = None):
    """The saved model (stabray.train.load_run: a directory written by `calibrate.py --save` or a
    trial checkpoint, every file checked before use), refused unless it answers a LEGO task; with
    `long_sizes`, its longer test splits at those sizes instead of its own (`test_n<k>`)."""
    from stabray.train import load_run

    run = load_run(model_dir, {"task": {"params": {"long_sizes": long_sizes}}} if long_sizes else None)
    if not run.task.name.startswith("lego"):
        raise UserError(f"{model_dir}: a {run.task.name} model; the probe reads LEGO named final states")
    return run


def name_positions(run, ex) -> tuple[list[int], list[int], list[int]]:
    """The teacher-forced sequence's ids, the index of each final-state entry's name token, and the
    index of the same name in the question's `vars: [...]` list."""
    enc = run.encoder.encode(run.method.eval_prompt(ex), run.method.eval_steps(ex), ex.final)
    ids = list(enc.input_ids)
    start, _ = enc.final_span
    toks = [run.tokenizer.decode([i]).strip() for i in ids]
    if toks[start] != "[":
        raise UserError(f"the final state does not start with '[' ({toks[start]!r}): not a LEGO named state")
    names = [start + 1 + 2 * j for j in range(len(entries(ex.final)))]
    v0 = next(i for i in range(len(toks) - 1) if toks[i] == "vars" and toks[i + 1] in (":", "["))
    open_ = toks.index("[", v0)
    in_vars = [open_ + 1 + j for j in range(len(names))]
    for a, b in zip(names, in_vars):
        if toks[a] != toks[b]:
            raise UserError(f"entry {toks[a]!r} and vars' {toks[b]!r} differ: the state is not in the vars order")
    return ids, names, in_vars


def teacher_forced(run, exs, seqs=None) -> list[list[tuple[bool, str]]]:
    """Per example, per final-state entry: whether the model's top next token at that entry's name
    is the name, and the token it puts there. `seqs`: the examples' `name_positions`, when the caller
    has them."""
    import torch

    from stabray.models.positions import by_input_stride

    seqs = seqs if seqs is not None else [name_positions(run, e) for e in exs]
    lens = [len(run.encoder.prompt(run.method.eval_prompt(e))) for e in exs]
    model = run.model.eval()

    @torch.no_grad()
    def read(idx: list[int]) -> list[list[tuple[bool, str]]]:
        out = []
        for i in idx:  # one at a time: no padding to reason about
            ids, names, _ = seqs[i]
            x = torch.tensor([ids], device=run.device)
            logits = model(input_ids=x, attention_mask=torch.ones_like(x)).logits[0]
            top = logits.argmax(-1).tolist()
            out.append([(top[q - 1] == ids[q], run.tokenizer.decode([top[q - 1]]).strip()) for q in names])
        return out

    return by_input_stride(model, lens, read)


def strides(run, exs) -> list[int]:
    """The evaluation stride of each example's positions (1 without randomized positions)."""
    from stabray.models.positions import RandomPositions, input_strides

    lens = [len(run.encoder.prompt(run.method.eval_prompt(e))) for e in exs]
    per_input = input_strides(run.model, lens)
    if per_input is not None:
        return per_input
    mods = [m for m in run.model.modules() if isinstance(m, RandomPositions)]
    return [mods[0].eval_stride if mods else 1] * len(exs)


def probe(run, split: str) -> dict:
    from stabray.tasks.base import extract_final, extract_steps

    exs = run.data[split]
    preds = run.evaluate(split).predictions
    kinds: Counter = Counter()
    left_out_at: Counter = Counter()
    for e, p in zip(exs, preds):
        if extract_steps(p) != extract_steps(e.answer):
            continue
        d = first_difference(entries(e.final), entries(extract_final(p)))
        if d is not None:
            kinds[d[0]] += 1
            if d[0] == "left out":
                left_out_at[d[1]] += 1
    seqs = [name_positions(run, e) for e in exs]
    forced = teacher_forced(run, exs, seqs)
    by_slot, by_step, by_gap, by_stride = (defaultdict(list) for _ in range(4))
    wrote: Counter = Counter()
    for e, f, k, (_, names, in_vars) in zip(exs, forced, strides(run, exs), seqs):
        gold = entries(e.final)
        chain = e.meta.get("chain") or []
        for j, ((ok, tok), (name, _)) in enumerate(zip(f, gold)):
            by_slot[j].append(ok)
            by_step[chain.index(name) if name in chain else -1].append(ok)
            by_gap[(names[j] - in_vars[j]) * k // 20 * 20].append(ok)
            by_stride[k].append(ok)
            if not ok:
                later = [n for n, _ in gold[j + 1 :]]
                wrote[
                    "the next entry's name"
                    if later[:1] == [tok]
                    else "a later entry's name"
                    if tok in later
                    else "']'"
                    if tok == "]"
                    else "another token"
                ] += 1

    def rate(d):
        return {str(k): [round(1 - sum(v) / len(v), 3), len(v)] for k, v in sorted(d.items())}

    n_ok = sum(run.task.is_correct(e, extract_final(p)) for e, p in zip(exs, preds))
    return {
        "split": split,
        "n": len(exs),
        "acc": n_ok / max(len(exs), 1),
        "right_chain_wrong_state": dict(kinds),
        "left_out_at_entry": {str(k): v for k, v in sorted(left_out_at.items())},
        "forced_error_by_entry": rate(by_slot),
        "forced_error_by_chain_step": rate(by_step),
        "forced_error_by_stride": rate(by_stride),
        "forced_error_by_position_distance": rate(by_gap),
        "forced_wrong_writes": dict(wrote),
    }


def training_distances(run, batches: int = 200, seed: int = 0) -> dict[str, list[float]]:
    """Per final-state entry, quantiles (5%, 50%, 95%, max) of its name's distance in positions from the
    same name in `vars` as training draws them (`model.positions: random`): batches of the training
    split's size mix drawn as the trainer's (train.batch_size examples), one sorted table per batch sized
    to its longest sequence (`draw_positions`). {} for a model without randomized positions."""
    import numpy as np
    import torch

    from stabray.models.positions import draw_positions, has_random_positions

    if not has_random_positions(run.model):
        return {}
    rng, gen = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    train = run.data["train"]
    seqs = {}
    dist = defaultdict(list)
    for _ in range(batches):
        idx = rng.choice(len(train), size=min(run.train_cfg.batch_size, len(train)), replace=False)
        for i in idx:
            if i not in seqs:
                seqs[i] = name_positions(run, train[i])
        table = draw_positions(run.model, max(len(seqs[i][0]) for i in idx), gen)
        for i in idx:
            _, names, in_vars = seqs[i]
            for j, (a, b) in enumerate(zip(names, in_vars)):
                dist[j].append(int(table[a] - table[b]))
    for m in run.model.modules():  # leave no drawn table behind
        if hasattr(m, "table"):
            m.table = None
    return {
        str(j): [float(np.quantile(v, q)) for q in (0.05, 0.5, 0.95)] + [float(max(v))] for j, v in sorted(dist.items())
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="+", type=Path, help="saved model folders (calibrate.py --save)")
    ap.add_argument("--splits", nargs="*", default=None, help="splits to read (default: test and the long ones)")
    ap.add_argument("--out", default="", help="append one JSON line per model and split here")
    ap.add_argument(
        "--stride",
        type=int,
        default=0,
        metavar="K",
        help="read every example at evaluation stride K (model.positions: random) instead of the model's own choice",
    )
    ap.add_argument(
        "--long-sizes",
        type=int,
        nargs="+",
        default=None,
        metavar="N",
        help="read the saved model on longer test splits at these sizes (test_n<N>) instead of its own",
    )
    args = ap.parse_args()
    if args.stride < 0:
        ap.error(f"--stride {args.stride}: a stride >= 1 (or 0: the model's own choice)")
    if args.out:  # lines are appended to it: an existing file is fine
        from stabray.commands.data import check_output_file

        try:
            check_output_file(args.out, force=True)
        except UserError as e:
            ap.error(str(e))
    probe_models(args)


def probe_models(args) -> None:
    import torch

    torch.set_num_threads(1)
    import contextlib

    from stabray.models.positions import eval_stride, has_random_positions

    for d in args.model:
        run = load(d, args.long_sizes)
        if args.stride and not has_random_positions(run.model):
            raise UserError(f"--stride: {d} has no randomized positions (model.positions: random)")
        train = training_distances(run)
        if train:
            print(f"{d} training: name-to-vars distance in positions per entry [5%, 50%, 95%, max]")
            print("  " + " ".join(f"{j}:{'/'.join(f'{x:.0f}' for x in q)}" for j, q in train.items()))
        for split in args.splits or ("test", *run.long_splits):
            if split not in run.data:
                raise UserError(f"{d}: no split {split!r} (has {sorted(run.data)})")
            with eval_stride(run.model, args.stride) if args.stride else contextlib.nullcontext():
                r = probe(run, split) | {"model": str(d), "stride": args.stride or None, "training_distances": train}
            print(f"{d} {split}: acc {r['acc']:.3f} (n {r['n']})")
            print(
                f"  right chain, wrong state: {r['right_chain_wrong_state']}; "
                f"left out at entry {r['left_out_at_entry']}"
            )
            for key in [k for k in r if k.startswith("forced_error_by_")]:
                print(f"  {key} [error, n]: " + " ".join(f"{k}:{v[0]:.3f}/{v[1]}" for k, v in r[key].items()))
            print(f"  forced, what it writes instead: {r['forced_wrong_writes']}")
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    raise SystemExit(run_script(main))
