"""Every stability quantity is measured on the chain the method trains on and produces: Alg. 1's
compressed gold chain (EAF, loss gap, eq. (4) table), no EAF / table for methods without a chain,
the model's own chain on request, the table read at a fixed T, and LSQ's learned steps in the
optimizer and in checkpoints."""

import json

import numpy as np
import pytest
import torch

from stabray.data.encode import encode_generated
from stabray.evaluate.metrics import final_answer_loss
from stabray.methods.alg1 import keep_count
from stabray.stability import estimate_eaf
from stabray.train import load_run
from stabray.train.run import TrialRun


def config(cache_dir, method, params, **eval_over):
    return {
        "task": {
            "name": "dijkstra",
            "params": {"n_nodes": 4, "decimals": 1},
            "train_size": 48,
            "val_size": 16,
            "test_size": 32,
        },
        "model": {"preset": "tiny"},
        "method": {"name": method, "params": params},
        "train": {"epochs": 1, "batch_size": 16, "lr": 3e-3, "warmup_steps": 1},
        "eval": {
            "eaf_examples": 12,
            "eaf_iters": 3,
            "long_splits": [],
            "decomposition_examples": 12,
            "stability_T": 5,
            **eval_over,
        },
        "seed": 0,
        "device": "cpu",
        "cache_dir": cache_dir,
    }


def max_new(run, split, n=None):
    """The decoding budget of evaluation: the longest full answer + 8 tokens."""
    exs = run.data[split][:n] if n else run.data[split]
    return (
        max(len(e.input_ids) - e.prompt_len for e in (run.encoder.encode(x.question, x.steps, x.final) for x in exs))
        + 8
    )


@pytest.fixture(scope="module")
def alg1_run(tmp_path_factory):
    run = TrialRun(config(str(tmp_path_factory.mktemp("cache")), "alg1", {"lam": 0.5, "bits": 2}))
    run.epoch()
    return run


def test_alg1_is_measured_on_its_compressed_chain(alg1_run):
    """lam = 0.5 on 4-node graphs keeps one of the 1-3 steps: the EAF, the loss gap and the eq. (4)
    table see a chain of T = 2 blocks, not the full one (T up to 4)."""
    run = alg1_run
    exs = run.data["test"][:12]
    assert max(len(e.steps) for e in exs) >= 2  # the full chain is longer than the compressed one
    enc = run.eval_encoded("test", 12)
    assert [len(e.step_spans) for e in enc] == [keep_count(len(x.steps), 0.5) for x in exs]
    for e, x in zip(enc, exs):
        assert e == run.encoder.encode(x.question, run.method.eval_steps(x), x.final)
    # test_eaf = the estimator on exactly these encodings
    want = estimate_eaf(run.model, enc, iters=3, token_cap=8).eaf
    assert run.final()["test_eaf"] == pytest.approx(want, rel=1e-6)
    # the loss gap's gold prefix is the compressed chain
    res = run.evaluate("test", loss_gap=True)
    gens = run.method.generate(run.model, run.encoder, [x.question for x in run.data["test"]], max_new(run, "test"))
    own, gold = [], []
    sep = list(run.encoder.ids("|"))
    for x, g in zip(run.data["test"], gens):
        e = run.encoder.encode(x.question, run.method.eval_steps(x), x.final)
        gold.append((list(e.input_ids), e.final_span[0]))
        pos = max((p for p in range(len(g)) if g[p : p + len(sep)] == sep), default=-1)
        prefix = list(run.encoder.prompt(x.question)) + (g[: pos + len(sep)] if pos >= 0 else [])
        own.append((prefix + list(e.input_ids[e.final_span[0] :]), len(prefix)))
    want_gap = float(
        np.mean(
            final_answer_loss(run.model, run.encoder, own, "cpu")
            - final_answer_loss(run.model, run.encoder, gold, "cpu")
        )
    )
    assert res.loss_gap == pytest.approx(want_gap, rel=1e-5)
    rows = run.decomposition(12)
    assert [r["T"] for r in rows] == [1, 2]  # one kept step + the answer


def test_table_at_T_metrics(alg1_run, cache_dir):
    run = alg1_run
    out = run.final_stability()
    rows = out["stability_table"]
    assert out["stability_T"] == 2 == rows[-1]["T"]  # T = 5 asked, T_max = 2 on the compressed chain
    assert out["test_eaf_at_T"] == rows[-1]["eaf"] and out["test_sum_eps_at_T"] == rows[-1]["sum_eps"]
    assert out["test_bound_at_T"] == rows[-1]["bound"] and out["test_loss_gap_at_T"] == rows[-1]["loss_gap"]
    full = TrialRun(config(cache_dir, "sft_cot", {}, stability_T=2))
    out = full.final_stability()
    rows = out["stability_table"]
    assert len(rows) == 4 and out["stability_T"] == 2 and out["test_eaf_at_T"] == rows[1]["eaf"]


@pytest.mark.parametrize("method", ["no_cot", "implicit_cot"])
def test_methods_without_a_chain_log_no_eaf_and_no_table(method, cache_dir, tmp_path, capsys):
    """No chain at evaluation: the sums over steps are empty, so nothing is reported as a measured 0."""
    from stabray.cli import main

    run = TrialRun(config(cache_dir, method, {}))
    m = run.epoch()
    assert "val_eaf" not in m
    final = run.final()
    assert "test_eaf" not in final
    assert ("test_loss_gap" in final) == (method == "implicit_cot")  # No CoT: both prefixes are the prompt
    assert run.final_stability() == {} and not run.has_decomposition
    run.save(tmp_path / "ck")
    assert main(["stability", str(tmp_path / "ck"), "--n", "4", "--out", str(tmp_path / "out")]) == 0
    assert "answers without a chain" in capsys.readouterr().out
    assert json.loads((tmp_path / "out" / "stability.json").read_text())["rows"] == []


def test_encode_generated_round_trips_the_gold_layout(alg1_run):
    enc = alg1_run.encoder
    for x in alg1_run.data["test"][:12]:
        for steps in (x.steps, (), None):
            gold = enc.encode(x.question, steps, x.final)
            gen = list(gold.input_ids[gold.prompt_len : -1])  # as decoded: EOS removed
            assert encode_generated(enc, x.question, gen) == gold


def test_eaf_on_the_models_own_chain(alg1_run, cache_dir, monkeypatch):
    """The EAF on the model's own greedy chain is the estimator's on those encodings. Its generation is
    then replaced by texts known by construction: answers without steps, and chains with steps but
    an empty final answer, give sums without a term (the run logs no EAF, not a 0); the gold text on
    every other example (the rest answer with the final alone) gives chains with steps, measured, and
    the run's EAF is the estimator's on exactly those encodings."""
    cfg = config(cache_dir, "alg1", {"lam": 0.5, "bits": 2}, eaf_chain="generated")
    run = TrialRun(cfg)
    run.model.load_state_dict(alg1_run.model.state_dict())
    exs = run.data["val"][:12]
    gens = run.method.generate(run.model, run.encoder, [x.question for x in exs], max_new(run, "val", 12))
    enc = run.eval_encoded("val", 12, "generated")
    assert enc == [encode_generated(run.encoder, x.question, g) for x, g in zip(exs, gens)]
    assert [list(e.input_ids[e.prompt_len : -1]) for e in enc] == gens

    def written(steps, final):  # as decoded: EOS removed
        def text(x, i):
            e = run.encoder.encode(x.question, steps(x, i), final(x))
            return list(e.input_ids[e.prompt_len : -1])

        return [text(x, i) for i, x in enumerate(exs)]

    cases = {
        "no step": written(lambda x, i: (), lambda x: x.final),
        "steps, empty final": written(lambda x, i: x.steps, lambda x: ""),
        "gold on every other": written(lambda x, i: x.steps if i % 2 == 0 else (), lambda x: x.final),
    }
    got = {}
    for name, texts in cases.items():
        monkeypatch.setattr("stabray.train.run.generate_per_input", lambda *a, texts=texts, **k: texts)
        enc = run.eval_encoded("val", 12, "generated")
        res = estimate_eaf(run.model, enc, iters=3)
        got[name] = (sum(bool(e.step_spans) for e in enc), res.T, res.measured, run.eaf("val"))
        if res.measured:
            assert got[name][3] == pytest.approx(res.eaf, rel=1e-6) and res.eaf > 0
    with_steps = sum(bool(x.steps) for x in exs)
    assert got["no step"] == (0, 1, False, None)
    assert got["steps, empty final"][0] == with_steps > 0 and got["steps, empty final"][1] >= 2  # T >= 2 ...
    assert got["steps, empty final"][2:] == (False, None)  # ... and still no term: no final answer to read
    assert got["gold on every other"][0] == sum(bool(x.steps) for x in exs[::2]) > 0
    assert got["gold on every other"][2] is True


def test_lsq_steps_train_and_are_checkpointed(alg1_run, tmp_path):
    run = alg1_run
    steps = {n: p for n, p in run.model.named_parameters() if n.endswith(".step") or n.endswith(".offset")}
    assert steps and all(p.requires_grad for p in steps.values())
    in_opt = {id(p) for g in run.trainer.optimizer.param_groups for p in g["params"]}
    assert all(id(p) in in_opt for p in steps.values())
    fresh = TrialRun(run.cfg)  # same seed, untrained: the initial steps
    init = dict(fresh.model.named_parameters())
    assert any(not torch.equal(p, init[n]) for n, p in steps.items())  # the epoch moved them
    run.save(tmp_path / "ck")
    back = dict(load_run(tmp_path / "ck").model.named_parameters())
    assert all(torch.equal(p, back[n]) for n, p in steps.items())


def test_at_T_leaves_out_the_empty_sums_of_T_1():
    """The *_at_T metrics read one row of the eq. (4) table; at T = 1 (no intermediate step) every one
    of them is 0 by definition (empty sums, the prompt against itself), so only stability_T is given."""
    from stabray.train.runner import at_T

    row = {"eaf": 0.0, "sum_eps": 0.0, "bound": 0.0, "loss_gap": 0.0}
    rows = [{"T": 1, **row}, {"T": 2, "eaf": 1.5, "sum_eps": 0.2, "bound": 0.3, "loss_gap": 0.1}]
    assert at_T(rows[:1], 5) == at_T(rows, 1) == {"stability_T": 1.0}
    assert at_T(rows, 0) == {
        "stability_T": 2.0,
        "test_eaf_at_T": 1.5,
        "test_sum_eps_at_T": 0.2,
        "test_bound_at_T": 0.3,
        "test_loss_gap_at_T": 0.1,
    }


def test_stability_cli_at_T(tmp_path):
    """`stability --T 2` on a full-chain checkpoint: rows 1..2 only (the chain is cut after step 2) and
    the row at T = 2 reported; `--T 9` beyond T_max reports the row at T_max."""
    from stabray.cli import main

    cfg = config(str(tmp_path / "cache"), "sft_cot", {})
    run = TrialRun(cfg)
    run.save(tmp_path / "ck")
    args = ["stability", str(tmp_path / "ck"), "--n", "12", "--iters", "3"]
    assert main([*args, "--T", "2", "--out", str(tmp_path / "t2")]) == 0
    got = json.loads((tmp_path / "t2" / "stability.json").read_text())
    assert [r["T"] for r in got["rows"]] == [1, 2] and got["at_T"]["stability_T"] == 2
    assert got["at_T"]["test_eaf_at_T"] == pytest.approx(got["rows"][1]["eaf"])
    assert main([*args, "--T", "9", "--out", str(tmp_path / "t9")]) == 0
    got = json.loads((tmp_path / "t9" / "stability.json").read_text())
    assert got["at_T"]["stability_T"] == got["rows"][-1]["T"] == 4  # 4-node chains: at most 3 steps
    assert main([*args, "--T", "-1"]) == 2
