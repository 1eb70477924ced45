"""The training loop and trial runner on a tiny config: finite falling loss, checkpoints that
resume exactly, evaluation that parses, and the pretrained + LoRA path on a local random checkpoint."""

import json

import numpy as np
import pytest
import torch
from conftest import scored_by_hand

from stabray.config import parse_trial_config
from stabray.errors import UserError
from stabray.train import load_run
from stabray.train.run import TrialRun


def tiny_config(cache_dir, **over):
    cfg = {
        "task": {
            "name": "dijkstra",
            "params": {"n_nodes": 4, "decimals": 1},
            "train_size": 64,
            "val_size": 16,
            "test_size": 16,
        },
        "model": {"preset": "tiny"},
        "method": {"name": "alg1", "params": {"lam": 0.5, "bits": 2}},
        "train": {"epochs": 3, "batch_size": 16, "lr": 3e-3, "warmup_steps": 2},
        "eval": {"eaf_examples": 0, "long_splits": ["test_long"]},
        "seed": 0,
        "device": "cpu",
        "cache_dir": cache_dir,
    }
    for k, v in over.items():
        cfg[k] = {**cfg.get(k, {}), **v} if isinstance(v, dict) else v
    return cfg


def test_trial_trains_and_evaluates(cache_dir):
    run = TrialRun(tiny_config(cache_dir))
    losses = [run.epoch()["train_loss"] for _ in range(3)]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    final = run.final()
    assert set(final) >= {"test_acc", "test_long_acc", "test_loss_gap"}
    assert np.isfinite(final["test_loss_gap"])
    test = run.evaluate("test")  # greedy: the same answers final() scored
    assert final["test_acc"] == test.acc == scored_by_hand(run.data["test"], test.predictions)
    res = run.evaluate("val")
    assert res.n == 16 and res.acc == scored_by_hand(run.data["val"], res.predictions)
    gold = [f"{' '.join(e.steps)} | {e.final}" for e in run.data["val"]]  # the reference's control
    assert scored_by_hand(run.data["val"], gold) == 1.0 and scored_by_hand(run.data["val"], gold[1:] + gold[:1]) < 1


@pytest.mark.parametrize(
    "method", [{"name": "alg1", "params": {"lam": 0.5, "bits": 2}}, {"name": "sft_cot", "params": {}}]
)
def test_reported_accuracy_counts_the_answers_that_are_right(cache_dir, monkeypatch, method):
    """The accuracy of answers known by construction: generation replaced by the gold answer on every
    other validation example and another example's final answer on the rest (its own chain kept),
    so exactly half are right; for a method that writes the whole chain, every chain is right and the
    chain score is 1. An untrained model scores 0 and could not tell a scorer that always says 0."""
    import stabray.evaluate.metrics as metrics

    run = TrialRun(tiny_config(cache_dir, method=method))
    exs = run.data["val"]
    answers, right = [], 0
    for i, ex in enumerate(exs):
        final = ex.final if i % 2 == 0 else next(e.final for e in exs if e.final != ex.final)
        right += final == ex.final
        enc = run.encoder.encode(run.method.eval_prompt(ex), run.method.eval_steps(ex), final)
        answers.append(list(enc.input_ids[enc.prompt_len :]))
    monkeypatch.setattr(metrics, "generate_per_input", lambda *a, **k: answers)
    res = run.evaluate("val")
    assert right == 8 and res.n == 16 and res.acc == 0.5
    if method["name"] == "sft_cot":  # writes the whole chain (alg1 at lam 0.5 writes part of it)
        assert res.steps_acc == 1.0


def test_checkpoint_resume_equals_straight_through(cache_dir, tmp_path):
    straight = TrialRun(tiny_config(cache_dir))
    for _ in range(3):
        m_straight = straight.epoch()
    first = TrialRun(tiny_config(cache_dir))
    first.epoch()
    first.save(tmp_path / "ck")
    resumed = load_run(tmp_path / "ck")
    assert resumed.trainer.epoch == 1 and len(resumed.history) == 1
    for _ in range(2):
        m_resumed = resumed.epoch()
    assert m_resumed["train_loss"] == pytest.approx(m_straight["train_loss"], rel=1e-5)
    for a, b in zip(straight.model.parameters(), resumed.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert json.loads((tmp_path / "ck" / "trial_config.json").read_text())["method"]["name"] == "alg1"


def test_same_seed_same_result(cache_dir):
    a, b = TrialRun(tiny_config(cache_dir)), TrialRun(tiny_config(cache_dir))
    assert a.epoch()["train_loss"] == b.epoch()["train_loss"]


def test_bad_trial_config(cache_dir):
    with pytest.raises(UserError, match="train.lr"):
        parse_trial_config(tiny_config(cache_dir, train={"lr": -1.0}))
    with pytest.raises(UserError, match="train.epoch: unknown key; did you mean epochs"):
        parse_trial_config(tiny_config(cache_dir, train={"epoch": 3}))
    with pytest.raises(UserError, match="did you mean 'dijkstra'"):
        TrialRun(tiny_config(cache_dir, task={"name": "dijkstar"}))


def test_embedded_shapes_are_checked_against_the_presets():
    from typing import get_args

    from stabray.config import PRESETS, ModelCfg

    assert set(get_args(ModelCfg.model_fields["preset"].annotation)) == set(PRESETS)
    assert ModelCfg(preset="mini", num_layers=3).shape() == {**PRESETS["mini"], "num_layers": 3}
    assert ModelCfg(preset="mini", hidden_size=96, num_heads=3, family="gpt2").shape()["hidden_size"] == 96
    ModelCfg(preset="mini", hidden_size=96, num_heads=3)  # 32 per head: fine under RoPE
    with pytest.raises(ValueError, match="is odd; RoPE"):
        ModelCfg(preset="mini", hidden_size=96, num_heads=32)  # 3 per head
    ModelCfg(preset="mini", hidden_size=96, num_heads=32, family="gpt2")  # learned positions: any size
    with pytest.raises(ValueError, match="not a multiple of num_heads 3"):
        ModelCfg(preset="tiny", num_heads=3, family="bloom")
    ModelCfg(pretrained="some/model")  # a pretrained model's shape is its own: no shape field beside it
    with pytest.raises(ValueError, match="num_heads 3 applies to the embedded decoder only"):
        ModelCfg(pretrained="some/model", num_heads=3)


def test_cuda_without_a_gpu_is_an_error_not_a_cpu_run(cache_dir, monkeypatch):
    import torch

    from stabray.train import pick_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match="device: cuda, but torch sees no CUDA GPU"):
        TrialRun(tiny_config(cache_dir, device="cuda"))
    assert pick_device("auto").type == "cpu" and pick_device("cpu").type == "cpu"


def test_resample_train_draws_fresh_examples(cache_dir):
    run = TrialRun(tiny_config(cache_dir, task={"resample_train": True}))
    e0, e1 = run.fresh_train(0), run.fresh_train(1)
    assert e0 is run.data["train"] and len(e1) == len(e0)
    evalq = {e.question for s in ("val", "test") for e in run.data[s]}
    assert not evalq & {e.question for e in e1}
    assert {e.question for e in e0} != {e.question for e in e1}


@pytest.fixture
def local_pretrained(tmp_path):
    """A tiny random Llama-style checkpoint with its own tokenizer, saved like a hub model."""
    from conftest import tiny_llama

    from stabray.data.splits import make_splits
    from stabray.data.tokenizer import build_tokenizer
    from stabray.tasks import get_task

    task = get_task("dijkstra", n_nodes=4, decimals=1)
    texts = [
        t
        for exs in make_splits(
            task, {"train": 64, "val": 16, "test": 16}, splits=("train", "val", "test", "test_long")
        ).values()
        for e in exs
        for t in (e.question, e.answer)
    ]
    tok = build_tokenizer(texts)
    torch.manual_seed(0)
    model = tiny_llama(tok)
    path = tmp_path / "tiny-llama"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def test_pretrained_path_with_lora(cache_dir, local_pretrained, tmp_path):
    cfg = tiny_config(
        cache_dir,
        model={"pretrained": local_pretrained, "lora": {"rank": 4, "alpha": 8}},
        method={"name": "alg1", "params": {"lam": 0.5, "bits": 2}},
    )
    run = TrialRun(cfg)
    trainable = {n for n, p in run.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    # QAT wraps the LoRA A/B matrices (the paper's code), not the frozen base weights
    from torch.nn.utils import parametrize

    wrapped = [n for n, m in run.model.named_modules() if parametrize.is_parametrized(m)]
    assert wrapped and all("lora_A" in n or "lora_B" in n for n in wrapped)
    before = {n: p.detach().clone() for n, p in run.model.named_parameters()}
    m = run.epoch()
    assert np.isfinite(m["train_loss"])
    changed = {n for n, p in run.model.named_parameters() if not torch.equal(before[n], p.detach())}
    assert changed and changed <= trainable  # only LoRA parameters moved
    run.save(tmp_path / "ck")
    again = load_run(tmp_path / "ck")
    for (_, a), (_, b) in zip(run.model.named_parameters(), again.model.named_parameters()):
        torch.testing.assert_close(a, b)


def test_eaf_every_measures_every_kth_and_the_last_epoch(cache_dir):
    """eval.eaf_every = 2 over 3 epochs: the EAF at epochs 2 and 3 only, and at epoch 2 it is what
    the estimator gives on that epoch's model (same training: the EAF touches no training RNG)."""
    from stabray.stability import estimate_eaf

    ev = {"eaf_examples": 4, "eaf_iters": 3, "eaf_every": 2, "long_splits": ["test_long"]}
    run = TrialRun(tiny_config(cache_dir, eval=ev))
    every = TrialRun(tiny_config(cache_dir, eval={**ev, "eaf_every": 1}))
    got = []
    for _ in range(3):
        m, ref = run.epoch(), every.epoch()
        assert m["train_loss"] == ref["train_loss"]  # skipping the EAF leaves training unchanged
        got.append(m.get("val_eaf"))
        if m["epoch"] == 2:  # the first measured epoch starts the power iteration cold
            cold = estimate_eaf(run.model, run.eval_encoded("val", 4), iters=3, token_cap=8, method=run.method)
            assert m["val_eaf"] == pytest.approx(cold.eaf, rel=1e-6)
    assert got[0] is None and got[1] is not None and got[2] is not None
    assert [h.get("val_eaf") is not None for h in run.history] == [False, True, True]


def test_eaf_is_not_logged_where_no_measured_chain_has_a_step(cache_dir):
    """At 4 nodes some Dijkstra answers need no step. Measured on only such examples the EAF is an
    empty sum (the estimator's 0 at T_max = 1), which the run leaves out of val_eaf and test_eaf
    rather than log as a perfectly stable 0; one example more, with a step, brings both back."""
    from stabray.stability import estimate_eaf

    run = TrialRun(tiny_config(cache_dir))
    val, test = ([len(e.steps) for e in run.data[s]] for s in ("val", "test"))
    k = next(i for i, n in enumerate(val) if n)  # the first validation example with a step
    j = next(i for i, n in enumerate(test) if n)
    assert min(k, j) >= 1, "the draw must open both splits with step-less examples"
    n = min(k, j)
    ev = {"eaf_examples": n, "eaf_iters": 2, "long_splits": ["test_long"]}
    empty = TrialRun(tiny_config(cache_dir, eval=ev, train={"epochs": 1}))
    m = empty.epoch()
    res = estimate_eaf(empty.model, empty.eval_encoded("val", n), iters=2, method=empty.method)
    assert res.T == 1 and res.eaf == 0.0  # what would have been logged
    assert "val_eaf" not in m and "eaf_time_s" not in m and "test_eaf" not in empty.final()
    more = TrialRun(tiny_config(cache_dir, eval={**ev, "eaf_examples": max(k, j) + 1}, train={"epochs": 1}))
    m = more.epoch()
    assert m["val_eaf"] > 0 and more.final()["test_eaf"] > 0


def test_length_grouped_batches_cover_every_example_once_with_less_padding():
    from stabray.train.loop import length_grouped_batches

    rng = np.random.default_rng(0)
    lengths = [int(x) for x in rng.choice([60, 90, 120], size=1000) + rng.integers(0, 30, size=1000)]

    def padded(batches):  # tokens computed: every row of a batch padded to its longest
        return sum(len(b) * max(lengths[i] for i in b) for b in batches)

    batches = length_grouped_batches(lengths, 16, np.random.default_rng(1))
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(1000)) and sorted(len(b) for b in batches) == [8] + [16] * 62
    shuffled = np.random.default_rng(2).permutation(1000)
    uniform = padded([shuffled[i : i + 16] for i in range(0, 1000, 16)])
    by_length = sorted(range(1000), key=lambda i: lengths[i])
    floor = padded([by_length[i : i + 16] for i in range(0, 1000, 16)])  # one global sort: the least padding
    assert floor <= padded(batches) <= floor * 1.05 < 0.8 * uniform
    assert batches == length_grouped_batches(lengths, 16, np.random.default_rng(1))  # reproducible
    tops = [max(lengths[i] for i in b) for b in batches]
    assert tops != sorted(tops, reverse=True)  # batch order shuffled, not longest-first within mega-batches


def test_group_by_length_pads_less_trains_and_resumes(cache_dir, tmp_path, monkeypatch):
    import stabray.train.loop as loop

    over = {
        # 256 examples: 4 mega-batches of 4 batches (transformers groups within mega-batches of at most a
        # quarter of the data, so a split of 4 batches or fewer would not be grouped at all)
        "task": {"params": {"n_nodes": 6, "decimals": 1, "train_sizes": [2, 6]}, "train_size": 256},
        "eval": {"eaf_examples": 0, "long_splits": [], "loss_gap": False},
    }
    computed = []
    real_collate = loop.collate

    def counting(items, pad):
        computed.append(len(items) * max(len(e.input_ids) for e in items))
        return real_collate(items, pad)

    monkeypatch.setattr(loop, "collate", counting)
    padded = {}
    for grouped in (False, True):
        computed.clear()
        run = TrialRun(tiny_config(cache_dir, **over, train={"epochs": 3, "group_by_length": grouped}))
        m = run.epoch()
        padded[grouped] = (sum(computed), m["tokens"])
    assert padded[True][1] == padded[False][1]  # the same examples, every one once
    assert padded[True][0] < 0.85 * padded[False][0]  # 2- and 6-node graphs: far less padding grouped
    cfg = tiny_config(cache_dir, **over, train={"epochs": 3, "group_by_length": True})
    straight = TrialRun(cfg)
    losses = [straight.epoch()["train_loss"] for _ in range(3)]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    first = TrialRun(cfg)
    first.epoch()
    first.save(tmp_path / "ck")
    resumed = load_run(tmp_path / "ck")
    for _ in range(2):
        last = resumed.epoch()
    assert last["train_loss"] == pytest.approx(losses[-1], rel=1e-5)


def test_group_by_length_draws_random_positions_for_the_epochs_longest_example(cache_dir, monkeypatch):
    """With `model.positions: random`, a grouped step's position table is as long as the epoch's longest
    example (as a uniform batch's nearly always is), not its own rows' length: the density of training
    positions stays what the evaluation stride was chosen for."""
    import stabray.train.loop as loop

    drawn, longest = [], []
    real_draw, real_collate = loop.draw_positions, loop.collate
    monkeypatch.setattr(
        loop, "draw_positions", lambda model, length, g: drawn.append(length) or real_draw(model, length, g)
    )
    monkeypatch.setattr(
        loop,
        "collate",
        lambda items, pad: longest.append(max(len(e.input_ids) for e in items)) or real_collate(items, pad),
    )
    over = {
        "task": {"params": {"n_nodes": 6, "decimals": 1, "train_sizes": [2, 6]}, "train_size": 256},
        "model": {"preset": "tiny", "positions": "random", "position_span": 512},
        "eval": {"eaf_examples": 0, "long_splits": [], "loss_gap": False},
    }
    for grouped in (False, True):
        drawn.clear(), longest.clear()
        TrialRun(tiny_config(cache_dir, **over, train={"epochs": 1, "group_by_length": grouped})).epoch()
        assert len(drawn) == len(longest) == 16
        if grouped:
            assert drawn == [max(longest)] * 16 and min(longest) < 0.7 * max(longest)  # short batches among them
        else:
            assert drawn == longest


@pytest.mark.parametrize("capability", ["", "avx2", "default"])
def test_kernels_names_the_path_torch_dispatches_to(capability):
    """`kernels()` reports the ATen CPU capability torch runs with, read in a fresh process (lowered by
    ATEN_CPU_CAPABILITY, which is read once at start-up), and the thread count; not a fixed string."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    if capability:
        env["ATEN_CPU_CAPABILITY"] = capability
    code = (
        "import json, torch; torch.set_num_threads(1); from stabray.train.loop import kernels; "
        "print(json.dumps([kernels(), torch.backends.cpu.get_cpu_capability()]))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    got, truth = json.loads(out)
    assert got["torch"] == torch.__version__
    assert got["kernels"].startswith(f"cpu {truth}, ") and got["kernels"].endswith(", 1 thread")
    if capability == "default":
        assert truth in ("DEFAULT", "NO AVX")  # the generic kernels, whatever this CPU supports
    elif capability == "avx2" and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        assert truth == "AVX2"
