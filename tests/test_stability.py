"""Stability measurement: the power-iteration estimator against the dense Jacobian (block and
token_mean), the batched estimator against the per-pair loop, rho / EAF against a hand-computed
chain, peft and parametrized (QAT-style) models, warm starts, the eq. (4) rows, weight noise."""

from __future__ import annotations

import math

import pytest
import torch

from stabray.data.encode import Encoder
from stabray.data.splits import make_splits
from stabray.data.tokenizer import build_tokenizer
from stabray.models.build import ModelSpec, build_model
from stabray.stability import EAFTracker, eaf_from_norms, estimate_eaf, estimate_eaf_loop, rho_matrix
from stabray.stability.decomposition import ROW_KEYS, decompose, inference_loss, parse_steps, weight_noise_stability
from stabray.stability.jacobian import embedding_matrix, expected_embedding_fn, measuring, probes_of
from stabray.tasks import get_task

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def setup():
    task = get_task("dijkstra", n_nodes=4)
    exs = make_splits(task, {"test": 40}, seed=0, splits=("test",))["test"]
    exs = sorted([e for e in exs if len(e.steps) >= 1], key=lambda e: -len(e.steps))
    tok = build_tokenizer([e.question + e.answer for e in exs])
    enc = Encoder(tok)
    model = build_model(ModelSpec(preset="tiny"), tok, seed=0)
    with torch.no_grad():  # a sharper softmax than at init, so the Jacobians are not all tiny
        model.get_input_embeddings().weight.mul_(8.0)
    return exs, enc, model


def _encode(enc, exs):
    return [enc.encode(e.question, e.steps, e.final) for e in exs]


def _dense_blocks(model, e, aggregation, cap):
    """Each (i, t)'s norm from the dense Jacobian (torch.autograd.functional.jacobian +
    matrix_norm(ord=2)) of the whole sequence, with the blocks written here from the encoding alone:
    input = every token of step i, output = the positions predicting the first `cap` tokens of block t
    (a step or the final answer without EOS). `block`: the whole block; `token_mean`: the mean over
    token pairs of the d x d blocks."""
    spans = [*e.step_spans, (e.final_span[0], e.final_span[1] - 1)]  # blocks 1..T
    E = embedding_matrix(model)
    L = len(e.input_ids)
    with measuring(model):
        x = E[torch.tensor(e.input_ids)][None]
        J = torch.autograd.functional.jacobian(expected_embedding_fn(model, L), x, vectorize=True)[0, :, :, 0]
    out = {}  # J: (L, d, L, d) = d output at position p / d input at position q
    for i in range(1, len(spans)):
        for t in range(i + 1, len(spans) + 1):
            ins = list(range(*spans[i - 1]))
            outs = [p - 1 for p in range(*spans[t - 1])][:cap]
            if aggregation == "block":
                blk = J[outs][:, :, ins].reshape(len(outs) * J.shape[1], len(ins) * J.shape[3])
                out[(i, t)] = float(torch.linalg.matrix_norm(blk, ord=2))
            else:
                norms = [float(torch.linalg.matrix_norm(J[b, :, a], ord=2)) for a in ins for b in outs]
                out[(i, t)] = sum(norms) / len(norms)
    return out


@pytest.mark.parametrize("aggregation,cap", [("block", 8), ("block", 3), ("token_mean", 2)])
def test_power_iteration_matches_dense_jacobian(setup, aggregation, cap):
    """Steps longer than the cap (4-node steps are 6 tokens): the whole input step is differentiated,
    only the output side is capped."""
    exs, enc, model = setup
    e = _encode(enc, exs[:1])[0]
    longest = max(b - a for a, b in e.step_spans)
    assert cap == 8 or longest > cap  # the capped cases really cut the output side
    res = estimate_eaf(model, [e], iters=50, token_cap=cap, aggregation=aggregation)
    dense = _dense_blocks(model, e, aggregation, cap)
    assert dense and min(dense.values()) > 1e-6
    for (i, t), ref in dense.items():
        assert abs(float(res.norms[i, t]) - ref) <= 0.01 * ref, (i, t, float(res.norms[i, t]), ref)


def test_rho_and_eaf_formula():
    # T = 3: ||J_1^(2)|| = a, ||J_1^(3)|| = b, ||J_2^(3)|| = c
    a, b, c = 2.0, 0.5, 3.0
    N = torch.zeros(4, 4, dtype=torch.float64)
    N[1, 2], N[1, 3], N[2, 3] = a, b, c
    rho = rho_matrix(N)
    assert rho[1, 2] == a and rho[2, 3] == c and rho[3, 3] == 1.0
    assert rho[1, 3] == pytest.approx(b + c * a)
    assert eaf_from_norms(N) == pytest.approx((b + c * a) + c)
    assert eaf_from_norms(N, T=2) == pytest.approx(a)
    N[0, 1], N[0, 2], N[0, 3] = 1.0, 1.0, 1.0  # the question as step 0
    assert eaf_from_norms(N, include_question=True) == pytest.approx(
        (b + c * a) + c + (1.0 + c * 1.0 + b * 1.0 + c * a * 1.0)
    )


def test_batched_matches_per_pair_loop(setup):
    exs, enc, model = setup
    es = _encode(enc, [exs[-1], exs[len(exs) // 2]])  # few steps: the loop is slow by design
    kw = dict(iters=3, token_cap=3)
    batched = estimate_eaf(model, es, batch_size=2, **kw)
    loop = estimate_eaf_loop(model, es, **kw)
    ok = ~torch.isnan(loop.per_example)
    assert torch.equal(ok, ~torch.isnan(batched.per_example))
    rel = (batched.per_example[ok] - loop.per_example[ok]).abs() / loop.per_example[ok]
    assert float(rel.max()) <= 0.01
    assert batched.eaf == pytest.approx(loop.eaf, rel=0.01)


def test_sup_over_examples_with_different_step_counts(setup):
    exs, enc, model = setup
    long, short = exs[0], exs[-1]
    assert len(long.steps) > len(short.steps)
    es = _encode(enc, [long, short])
    res = estimate_eaf(model, es, iters=3, token_cap=3)
    assert res.T == len(long.steps) + 1 and res.norms.shape == (res.T + 1, res.T + 1)
    Ts = len(short.steps) + 1
    assert torch.isnan(res.per_example[1, 1, Ts + 1 :]).all()  # the short one lacks those pairs
    assert float(res.norms[1, Ts]) == pytest.approx(float(torch.nan_to_num(res.per_example[:, 1, Ts], nan=0).max()))


def test_tracker_warm_start_and_model_state_restored(setup):
    exs, enc, model = setup
    es = _encode(enc, exs[:2])
    model.train()
    flags = [p.requires_grad for p in model.parameters()]
    tr = EAFTracker(warm_iters=2)
    cold = estimate_eaf(model, es, iters=30, token_cap=3, tracker=tr)
    assert set(tr.vectors) == {0, 1}
    warm = estimate_eaf(model, es, iters=30, token_cap=3, tracker=tr)  # 2 iterations from converged vectors
    assert warm.eaf == pytest.approx(cold.eaf, rel=0.01)
    assert model.training and [p.requires_grad for p in model.parameters()] == flags


class _RoundSTE(torch.autograd.Function):  # no setup_context/vmap: must stay outside torch.func
    @staticmethod
    def forward(ctx, w):
        return torch.round(w * 256) / 256

    @staticmethod
    def backward(ctx, g):
        return g


class _Quant(torch.nn.Module):
    def forward(self, w):
        return _RoundSTE.apply(w)


def test_peft_and_parametrized_models(setup):
    from peft import LoraConfig, get_peft_model
    from torch.nn.utils import parametrize

    exs, enc, _ = setup
    es = _encode(enc, exs[:1])
    base = build_model(ModelSpec(preset="tiny"), enc.tok, seed=1)
    ref = estimate_eaf(base, es, iters=5, token_cap=3)
    peft_model = get_peft_model(base, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    res = estimate_eaf(peft_model, es, iters=5, token_cap=3)  # LoRA B = 0 at init: same function
    assert res.eaf == pytest.approx(ref.eaf, rel=1e-4)

    q = build_model(ModelSpec(preset="tiny"), enc.tok, seed=1)
    for m in q.modules():
        if isinstance(m, torch.nn.Linear):
            parametrize.register_parametrization(m, "weight", _Quant())
    res_q = estimate_eaf(q, es, iters=5, token_cap=3)
    assert math.isfinite(res_q.eaf) and res_q.eaf > 0


def test_parse_steps(setup):
    _, enc, _ = setup
    ids = lambda s: list(enc.ids(s))  # noqa: E731
    gen = ids("[0 1]") + ids(", ") + ids("[1 1]") + ids(" | ") + ids("[1 1]")
    assert parse_steps(gen, enc) == [ids("[0 1]"), ids("[1 1]")]
    assert parse_steps(ids(" | ") + ids("[1 1]"), enc) == []
    assert parse_steps(ids("[0 1]") + ids(", ") + ids("[1"), enc) == [ids("[0 1]")]  # cut off


def test_decomposition_rows(setup):
    exs, enc, model = setup
    rows = decompose(model, enc, exs[:3], iters=3, token_cap=4)
    assert [r["T"] for r in rows] == list(range(1, len(exs[0].steps) + 2))
    assert all(tuple(r) == ROW_KEYS for r in rows)
    r1 = rows[0]
    assert r1["loss_gap"] == 0 and r1["bound"] == 0 and r1["eaf"] == 0 and math.isnan(r1["ratio"])
    for r in rows[1:]:
        assert r["bound"] == pytest.approx(r["first_order"] + r["second_order"])
        assert r["C1"] > 0 and r["C2"] > 0 and r["eaf"] > 0 and r["sum_eps"] > 0
    assert [r["C2"] for r in rows] == sorted(r["C2"] for r in rows)  # a max over growing pair sets


def test_weight_noise_restores_weights(setup):
    exs, enc, model = setup
    before = [p.detach().clone() for p in model.parameters()]
    inc = weight_noise_stability(model, lambda m: inference_loss(m, enc, exs[:2]), sigma=0.05, seeds=2)
    assert math.isfinite(inc)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.slow  # trains one epoch first (~25 s CPU)
def test_cli_on_a_qat_checkpoint(tmp_path, capsys):
    from stabray.cli import main
    from stabray.train.run import TrialRun

    cfg = {
        "task": {
            "name": "dijkstra",
            "params": {"n_nodes": 4, "decimals": 1},
            "train_size": 32,
            "val_size": 8,
            "test_size": 8,
        },
        "model": {"preset": "tiny"},
        "method": {"name": "alg1", "params": {"lam": 0.5, "bits": 2}},
        "train": {"epochs": 1, "batch_size": 16, "lr": 3e-3, "warmup_steps": 1},
        "eval": {"eaf_examples": 0, "long_splits": []},
        "seed": 0,
        "device": "cpu",
        "cache_dir": str(tmp_path / "cache"),
    }
    run = TrialRun(cfg)
    run.epoch()
    run.save(tmp_path / "ckpt")
    assert (
        main(
            [
                "stability",
                str(tmp_path / "ckpt"),
                "--n",
                "3",
                "--iters",
                "2",
                "--token-cap",
                "3",
                "--out",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    header = (tmp_path / "out" / "stability.csv").read_text().splitlines()[0]
    assert header.split(",") == list(ROW_KEYS)
    assert main(["stability", str(tmp_path / "nope")]) == 2  # neither a directory nor resolvable


@pytest.mark.parametrize(
    "family,include_question,delta", [("qwen2", False, None), ("qwen2", True, 0.01), ("gpt2", False, 0.01)]
)
def test_prefix_cache_is_exact(setup, family, include_question, delta):
    """The constant prefix run once as a KV cache gives the whole-sequence estimator's norms
    (RoPE and learned absolute positions; the question as step 0; the C2 finite differences)."""
    from stabray.stability.jacobian import batched_norms

    exs, enc, _ = setup
    model = build_model(ModelSpec(preset="tiny", family=family), enc.tok, seed=1)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(8.0)
    es = _encode(enc, [exs[0], exs[len(exs) // 2], exs[-1]])  # different lengths in one batch
    probes = [probes_of(e, 3, "block", include_question) for e in es]
    kw = dict(iters=4, batch_size=3, delta_rel=delta)
    cached = batched_norms(model, es, probes, prefix_cache=True, **kw)
    full = batched_norms(model, es, probes, prefix_cache=False, **kw)
    for c, f in zip(cached, full):
        assert c.shape == f.shape and len(c) > 0 and float(f.min()) > 0
        torch.testing.assert_close(c, f, rtol=1e-4, atol=1e-7)
