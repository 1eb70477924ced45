"""Per-input evaluation stride (`model.position_eval_stride: [k1, k2, ...]`): the rule that picks a
stride from the prompt, and every evaluation path (generation, loss gap, EAF, inference loss, a
trial) checked against a model built with that one fixed stride, example by example."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

from stabray.config import parse_trial_config
from stabray.data.encode import Encoder
from stabray.data.splits import draw
from stabray.data.tokenizer import build_tokenizer
from stabray.errors import UserError
from stabray.evaluate.generate import generate_per_input, greedy
from stabray.evaluate.metrics import evaluate_split
from stabray.methods import get_method
from stabray.models.build import ModelSpec, build_model
from stabray.models.positions import (
    RandomPositions,
    common_stride,
    fitting_stride,
    input_strides,
    length_ratio,
    set_length_ratio,
)
from stabray.stability import EAFTracker, estimate_eaf
from stabray.stability.decomposition import decompose, inference_loss
from stabray.tasks import get_task
from stabray.train.run import TrialRun

SPAN = 600  # with the length ratio 3 below, prompts of 45 to 103 tokens get strides 3, 2 and 1
STRIDES = (1, 2, 3)


def test_fitting_stride_agrees_with_counting_positions():
    """Against a count done another way: the expected length with exact fractions, every position
    0, k, 2k, ... of it listed and compared with the span; the largest stride whose positions all fit,
    else the smallest."""
    g = torch.Generator().manual_seed(0)
    for _ in range(400):
        n = int(torch.randint(1, 60, (1,), generator=g))
        num, den = int(torch.randint(10, 40, (1,), generator=g)), int(torch.randint(4, 12, (1,), generator=g))
        span = int(torch.randint(8, 200, (1,), generator=g))
        strides = sorted({int(k) for k in torch.randint(1, 7, (3,), generator=g)})
        exact = Fraction(num, den) * n
        expected = exact.numerator // exact.denominator + (
            exact.denominator != 1 and exact.numerator % exact.denominator != 0
        )
        fits = [k for k in strides if all(p * k < span for p in range(expected))]
        want = max(fits) if fits else min(strides)
        assert fitting_stride(n, num / den, span, strides) == want
    assert length_ratio([(10, 4), (21, 7), (9, 3)]) == 3.0
    with pytest.raises(ValueError, match="at least one"):
        length_ratio([(5, 0)])


@pytest.fixture(scope="module")
def setup():
    """Dijkstra examples of 3 to 6 nodes, a tokenizer over them, and two models with one set of
    random weights: `fit` picks its stride per input out of STRIDES, `fixed[k]` always uses k."""
    task = get_task("dijkstra", labels=12, decimals=1, train_sizes=[3, 4], long_sizes=[5, 6])
    exs = draw(task, "test", 12, 0, [3, 4, 5, 6])
    tok = build_tokenizer([t for e in exs for t in (e.question, e.question_nohint, e.answer)])
    enc = Encoder(tok)
    spec = dict(preset="tiny", init_std=0.3, positions="random", position_span=SPAN)
    fit = build_model(ModelSpec(**spec, position_eval_stride=STRIDES), tok, seed=3).eval()
    fixed = {}
    for k in STRIDES:
        fixed[k] = build_model(ModelSpec(**spec, position_eval_stride=k), tok, seed=3).eval()
        fixed[k].load_state_dict(fit.state_dict())
    return task, exs, enc, fit, fixed


def prompt_lengths(enc, method, exs):
    return [len(enc.prompt(method.eval_prompt(e))) for e in exs]


def test_a_stride_per_input_needs_the_length_ratio(setup):
    _, exs, enc, fit, fixed = setup
    (m,) = [m for m in fit.modules() if isinstance(m, RandomPositions)]
    m.length_ratio = None
    with pytest.raises(RuntimeError, match="set_length_ratio"):
        input_strides(fit, [5])
    assert input_strides(fixed[2], [5]) is None  # a fixed stride: nothing to pick
    assert set_length_ratio(fixed[2], [(10, 5)]) is None


def test_generation_and_loss_gap_run_each_input_at_its_stride(setup):
    """Batched generation and the loss gap with per-input strides equal, example by example, the
    same weights at that example's fixed stride; the examples span at least two strides."""
    task, exs, enc, fit, fixed = setup
    method = get_method("sft_cot")
    lens = prompt_lengths(enc, method, exs)
    set_length_ratio(fit, [(3 * n, n) for n in lens])  # expected length 3 x prompt
    strides = input_strides(fit, lens)
    assert strides == [fitting_stride(n, 3.0, SPAN, STRIDES) for n in lens]
    assert len(set(strides)) >= 2
    prompts = [method.eval_prompt(e) for e in exs]
    got = generate_per_input(method, fit, enc, prompts, 12, batch_size=5)
    for p, k, out in zip(prompts, strides, got):
        assert out == greedy(fixed[k], enc, [p], 12)[0]
    assert sum(map(len, got)) > 20  # tokens were generated to compare
    res = evaluate_split(fit, enc, task, exs, method, loss_gap=True, max_new_tokens=12, batch_size=5)
    refs = [
        evaluate_split(fixed[k], enc, task, [e], method, loss_gap=True, max_new_tokens=12) for e, k in zip(exs, strides)
    ]
    assert res.predictions == [r.predictions[0] for r in refs]
    assert res.loss_gap == pytest.approx(sum(r.loss_gap for r in refs) / len(refs), rel=1e-5, abs=1e-6)
    # and a fixed stride differs somewhere: the comparison can fail
    assert any(greedy(fixed[1], enc, [p], 12)[0] != out for p, out in zip(prompts, got))
    losses = [inference_loss(fixed[k], enc, [e], max_new_tokens=12, method=method) for e, k in zip(exs, strides)]
    assert inference_loss(fit, enc, exs, max_new_tokens=12, method=method) == pytest.approx(
        sum(losses) / len(losses), rel=1e-5
    )


def test_eaf_measures_each_input_at_its_stride(setup):
    """The EAF's per-example spectral norms with per-input strides equal those of the fixed-stride
    model on the examples of that stride (measured together, in the same order); warm starts are
    kept per group of examples."""
    _, exs, enc, fit, fixed = setup
    method = get_method("sft_cot")
    lens = prompt_lengths(enc, method, exs)
    set_length_ratio(fit, [(3 * n, n) for n in lens])
    strides = input_strides(fit, lens)
    encoded = [enc.encode(method.eval_prompt(e), method.eval_steps(e), e.final) for e in exs]
    tracker = EAFTracker()
    res = estimate_eaf(fit, encoded, iters=4, token_cap=2, tracker=tracker)
    for k in sorted(set(strides)):
        idx = [i for i, s in enumerate(strides) if s == k]
        ref = estimate_eaf(fixed[k], [encoded[i] for i in idx], iters=4, token_cap=2).per_example
        n = ref.shape[1]
        torch.testing.assert_close(res.per_example[idx][:, :n, :n], ref, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert sorted(len(g) for g in tracker.groups) == sorted(strides.count(k) for k in set(strides))
    again = estimate_eaf(fit, encoded, iters=4, token_cap=2, tracker=tracker)  # warm-started per group
    assert math.isfinite(again.eaf) and len(tracker.groups) == len(set(strides))


def test_common_stride_is_the_longest_inputs(setup):
    _, exs, enc, fit, _ = setup
    (m,) = [m for m in fit.modules() if isinstance(m, RandomPositions)]
    set_length_ratio(fit, [(30, 1)])
    lens = [5, 12, 30]  # expected 150, 360, 900 tokens: strides 3, 1, 1 (none fits the last)
    assert input_strides(fit, lens) == [3, 1, 1]
    with common_stride(fit, [5, 6]):
        assert m.eval_stride == 3
    assert m.eval_stride == 1  # restored


def test_decomposition_measures_every_term_at_the_sets_one_stride(setup):
    """Table 2's rows with per-input strides equal the rows of the same weights at the stride of the
    set's longest input, every column (the EAF and rho included: inside `common_stride` nothing
    regroups the examples by stride); the examples span several strides, and at another stride the
    rows differ, so the comparison can fail."""
    _, exs, enc, fit, fixed = setup
    method = get_method("sft_cot")
    lens = prompt_lengths(enc, method, exs)
    set_length_ratio(fit, [(3 * n, n) for n in lens])
    strides = input_strides(fit, lens)
    assert len(set(strides)) >= 2
    kw = dict(method=method, iters=3, token_cap=2, max_new_tokens=8, max_T=3)
    got = decompose(fit, enc, exs, **kw)
    want = decompose(fixed[min(strides)], enc, exs, **kw)
    other = decompose(fixed[max(strides)], enc, exs, **kw)
    assert len(got) == len(want) >= 2
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for key in g:
            assert g[key] == pytest.approx(w[key], rel=1e-5, abs=1e-7, nan_ok=True), key
    assert any(g["eaf"] != pytest.approx(o["eaf"], rel=1e-3) for g, o in zip(got, other))
    assert all(m.eval_strides == STRIDES for m in fit.modules() if isinstance(m, RandomPositions))  # restored


def test_config_takes_a_list_of_strides_and_names_a_bad_one(cache_dir):
    base = {"task": {"name": "dijkstra"}, "model": {"preset": "tiny", "positions": "random"}}
    ok = parse_trial_config({**base, "model": {**base["model"], "position_eval_stride": [2, 3, 4]}})
    assert ok.model.position_eval_stride == [2, 3, 4]
    for bad in ([], [0, 2], [2, 2], 0, [True, 3], ["2", 3], [2.0, 3]):  # no silent [1, 3] or [2, 3]
        with pytest.raises(UserError, match="position_eval_stride:? must be a positive integer or a list"):
            parse_trial_config({**base, "model": {**base["model"], "position_eval_stride": bad}})
    with pytest.raises(UserError, match="model: position_eval_stride applies to positions: random only"):
        parse_trial_config({**base, "model": {"preset": "tiny", "position_eval_stride": [2, 3]}})


def test_trial_with_per_input_strides_sets_its_ratio_and_reports(cache_dir):
    """A trial reads the ratio off its training examples as the method encodes them, trains, and
    its final evaluation (accuracy per split, loss gap, EAF) runs."""
    cfg = {
        "task": {
            "name": "dijkstra",
            "params": {"labels": 12, "decimals": 1, "train_sizes": [3], "long_sizes": [4]},
            "train_size": 16,
            "val_size": 8,
            "test_size": 8,
        },
        "model": {"preset": "tiny", "init_std": 0.1, "positions": "random", "position_span": 256},
        "method": {"name": "sft_cot"},
        "train": {"epochs": 1, "batch_size": 8, "threads": 1},
        "eval": {"eaf_examples": 8, "eaf_iters": 2, "loss_gap": True},
        "cache_dir": cache_dir,
    }
    cfg["model"]["position_eval_stride"] = [1, 2, 4]
    run = TrialRun(cfg)
    (m,) = [m for m in run.model.modules() if isinstance(m, RandomPositions)]
    pairs = []
    for e in run.data["train"]:
        full = run.encoder.encode(run.method.eval_prompt(e), run.method.eval_steps(e), e.final)
        pairs.append((len(full.input_ids), len(run.encoder.prompt(run.method.eval_prompt(e)))))
    assert m.length_ratio == max(a / b for a, b in pairs)
    run.epoch()
    out = run.final()
    assert {"test_acc", "test_loss_gap", "test_eaf"} <= set(out) and math.isfinite(out["test_eaf"])
    assert m.eval_stride == 1  # the smallest listed stride between evaluations
