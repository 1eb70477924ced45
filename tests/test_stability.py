"""Stability measurement: the power-iteration estimator against the dense Jacobian (block and
token_mean), the batched estimator against the per-pair loop, rho / EAF against a hand-computed
chain, peft and parametrized (QAT-style) models, warm starts, the eq. (4) rows against a hand
computation of every term, weight noise against its closed form."""

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
from stabray.stability.jacobian import embedding_matrix, measuring, probes_of
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


def _expected(model, x: torch.Tensor) -> torch.Tensor:
    """The outputs the measure differentiates, written here from its definition: the expected
    embedding softmax(logits) @ E at every position of input embeddings x (1, L, d)."""
    E = embedding_matrix(model)
    return torch.softmax(model(inputs_embeds=x, use_cache=False).logits[..., : E.shape[0]].float(), -1) @ E.float()


def _dense_jacobian(model, x: torch.Tensor) -> torch.Tensor:
    """(L, d, L, d): d output at position p / d input at position q, for x (1, L, d)."""
    return torch.autograd.functional.jacobian(lambda z: _expected(model, z), x, vectorize=True)[0, :, :, 0]


def _dense_blocks(model, e, aggregation, cap):
    """Each (i, t)'s norm from the dense Jacobian (torch.autograd.functional.jacobian +
    matrix_norm(ord=2)) of the whole sequence, with the blocks written here from the encoding alone:
    input = every token of step i, output = the positions predicting the first `cap` tokens of block t
    (a step or the final answer without EOS). `block`: the whole block; `token_mean`: the mean over
    token pairs of the d x d blocks."""
    spans = [*e.step_spans, (e.final_span[0], e.final_span[1] - 1)]  # blocks 1..T
    E = embedding_matrix(model)
    with measuring(model):
        x = E[torch.tensor(e.input_ids)][None]
        J = _dense_jacobian(model, x)
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


def test_tracker_warm_start_and_model_state_restored(setup, monkeypatch):
    import stabray.stability.jacobian as jacobian

    exs, enc, model = setup
    es = _encode(enc, exs[:2])
    model.train()
    flags = [p.requires_grad for p in model.parameters()]
    ran, power_iteration = [], jacobian.power_iteration

    def counted(*args, **kw):  # the iteration count each chunk ran (its 8th positional argument)
        ran.append(args[7])
        return power_iteration(*args, **kw)

    monkeypatch.setattr(jacobian, "power_iteration", counted)
    tr = EAFTracker(warm_iters=2)
    cold = estimate_eaf(model, es, iters=30, token_cap=3, tracker=tr)
    assert set(tr.vectors) == {0, 1} and ran and set(ran) == {30}
    ran.clear()
    warm = estimate_eaf(model, es, iters=30, token_cap=3, tracker=tr)  # 2 iterations from converged vectors
    assert ran and set(ran) == {2}  # the warm path ran, not 30 cold iterations again
    assert warm.eaf == pytest.approx(cold.eaf, rel=0.01)
    ran.clear()  # and 2 iterations from the cold start vectors would not do: the warm vectors matter
    two = estimate_eaf(model, es, iters=2, token_cap=3)
    assert abs(two.eaf - cold.eaf) > abs(warm.eaf - cold.eaf)
    assert model.training and [p.requires_grad for p in model.parameters()] == flags


class _RoundSTE(torch.autograd.Function):  # no setup_context/vmap: must stay outside torch.func
    @staticmethod
    def forward(ctx, w, levels: int):
        return torch.round(w * levels) / levels

    @staticmethod
    def backward(ctx, g):
        return g, None


class _Quant(torch.nn.Module):
    """Rounding to 1/levels (256: nearly the identity; 8: visibly another function)."""

    def __init__(self, levels: int = 256):
        super().__init__()
        self.levels = levels

    def forward(self, w):
        return _RoundSTE.apply(w, self.levels)


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

    # the measure reads the quantized weights: a coarse quantizer gives the EAF of a plain model whose
    # weights were replaced by their quantized values, and not the full-precision model's
    coarse = build_model(ModelSpec(preset="tiny"), enc.tok, seed=1)
    plain = build_model(ModelSpec(preset="tiny"), enc.tok, seed=1)
    with torch.no_grad():
        for m in plain.modules():
            if isinstance(m, torch.nn.Linear) and m is not plain.get_output_embeddings():
                m.weight.copy_(torch.round(m.weight * 8) / 8)
    for m in coarse.modules():
        if isinstance(m, torch.nn.Linear) and m is not coarse.get_output_embeddings():
            parametrize.register_parametrization(m, "weight", _Quant(8))
    res_c = estimate_eaf(coarse, es, iters=20, token_cap=3)
    res_p = estimate_eaf(plain, es, iters=20, token_cap=3)
    full = estimate_eaf(base, es, iters=20, token_cap=3)
    assert res_c.eaf == pytest.approx(res_p.eaf, rel=1e-4)
    assert abs(res_c.eaf - full.eaf) > 0.05 * full.eaf, (res_c.eaf, full.eaf)


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


def _block_terms(model, ids: list[int], blk: list[int], W: torch.Tensor) -> tuple[float, float, float]:
    """(mean cross-entropy, ||o - y||_F, ||d CE / d o||_F) of the tokens at positions `blk` of the
    sequence `ids`, from one plain forward: o = softmax(logits) @ E at the positions predicting them,
    y their input embeddings, and the loss read as a function of o through logits = o W^T (autograd)."""
    E = embedding_matrix(model).float()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, :, : E.shape[0]].float()
    pos, y = [q - 1 for q in blk], torch.tensor([ids[q] for q in blk])
    ce = float(torch.nn.functional.cross_entropy(logits[pos], y))
    o = torch.softmax(logits[pos], -1) @ E
    err = float((o - E[y]).norm())
    o = o.detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(torch.nn.functional.cross_entropy(o @ W.float().T, y), o)
    return ce, err, float(grad.norm())


def test_decomposition_terms_against_a_hand_computation(setup):
    """Rows T = 1..3 of eq. (4) on one example, every term computed here from its definition (module
    docstring of stabray.stability.decomposition) without the module's code: rho from dense Jacobians
    (rho_1^(3) = ||J_1^(3)|| + ||J_2^(3)|| ||J_1^(2)||), eps_t / r_t / C1 / the losses from plain forwards
    and autograd, C2 as ||J(x + delta) - J(x)|| / ||delta|| of dense Jacobians at the measure's seeded
    delta. The model's own chain is one greedy token that is not a separator (max_new_tokens=1): no
    steps, so block t's self-generated prefix is the prompt (and `|` before the final answer)."""
    from stabray.tasks.base import FINAL_SEP, STEP_SEP

    exs, enc, model = setup
    ex = next(e for e in exs if len(e.steps) == 2)  # blocks 1, 2 = steps, 3 = the final answer
    e = enc.encode(ex.question, ex.steps, ex.final)
    cap, c2_delta = 8, 1e-2
    rows = decompose(model, enc, [ex], iters=60, token_cap=cap, c2_delta=c2_delta, max_new_tokens=1)
    assert [r["T"] for r in rows] == [1, 2, 3]

    E = embedding_matrix(model)
    head = model.get_output_embeddings()
    W = head.weight.detach() if head is not None else E
    ids = list(e.input_ids)
    spans = [*e.step_spans, (e.final_span[0], e.final_span[1] - 1)]
    blocks = {t: list(range(*spans[t - 1]))[:cap] for t in (1, 2, 3)}
    prompt = ids[: e.prompt_len]
    with measuring(model):
        with torch.no_grad():  # the model's own first token: not a separator, so its chain has no step
            first = int(model(input_ids=torch.tensor([prompt])).logits[0, -1, : E.shape[0]].argmax())
        assert first not in (enc.ids(STEP_SEP)[0], enc.ids(FINAL_SEP)[0], enc.ids(FINAL_SEP.lstrip())[0])
        true = {t: _block_terms(model, ids, b, W) for t, b in blocks.items()}
        gen = {}
        for t, b in blocks.items():
            pre = prompt + (list(enc.ids(FINAL_SEP.lstrip())) if t == 3 else [])
            gen[t] = _block_terms(model, pre + [ids[q] for q in b], list(range(len(pre), len(pre) + len(b))), W)
        # dense Jacobians at x and at x + delta (delta: the measure's seeded draw on the steps' tokens)
        L = blocks[3][-1]  # the last position read: the one predicting block 3's last capped token
        x = E[torch.tensor(ids[:L])][None]
        mask = torch.zeros(1, L, 1)
        mask[0, list(range(*spans[0])) + list(range(*spans[1]))] = 1.0
        delta = torch.randn(x.shape, generator=torch.Generator().manual_seed(0)) * mask
        delta = delta * (float((x * mask).norm()) * c2_delta / float(delta.norm()))
        J, J2 = _dense_jacobian(model, x), _dense_jacobian(model, x + delta)

    def norm(M, i, t):  # block (i, t): inputs = every token of step i, outputs = block t's predictors
        ins, outs = list(range(*spans[i - 1])), [q - 1 for q in blocks[t]]
        return float(torch.linalg.matrix_norm(M[outs][:, :, ins].reshape(len(outs) * M.shape[1], -1), ord=2))

    N = {(i, t): norm(J, i, t) for i, t in ((1, 2), (1, 3), (2, 3))}
    rho = {(1, 2): N[1, 2], (1, 3): N[1, 3] + N[2, 3] * N[1, 2], (2, 3): N[2, 3], (2, 2): 1.0, (3, 3): 1.0}
    dJ = {k: norm(J2 - J, *k) / float(delta.norm()) for k in N}
    eps = {t: true[t][1] for t in blocks}
    r = {t: gen[t][1] for t in blocks}
    for T in (2, 3):
        row = rows[T - 1]
        C1 = max(true[T][2], gen[T][2])
        C2 = max(v for (i, t), v in dJ.items() if t <= T)
        first = C1 * sum(rho[t, T] * eps[t] for t in range(1, T))
        second = C1 * C2 / 2 * sum(rho[t, T] * sum(r[i] for i in range(1, t)) ** 2 for t in range(2, T + 1))
        want = {
            "eaf": sum(rho[i, T] for i in range(1, T)),
            "sum_eps": sum(eps[t] for t in range(1, T)),
            "C1": C1,
            "C2": C2,
            "loss_gap": abs(gen[T][0] - true[T][0]),
            "first_order": first,
            "second_order": second,
            "bound": first + second,
        }
        for k, v in want.items():
            assert row[k] == pytest.approx(v, rel=2e-2), (T, k, row[k], v)
        assert row["ratio"] == pytest.approx(row["bound"] / row["loss_gap"])
    assert rows[0]["loss_gap"] == 0 and rows[0]["eaf"] == 0 and rows[0]["sum_eps"] == 0


def test_weight_noise_restores_weights(setup):
    exs, enc, model = setup
    before = [p.detach().clone() for p in model.parameters()]
    inc = weight_noise_stability(model, lambda m: inference_loss(m, enc, exs[:2]), sigma=0.05, seeds=2)
    assert math.isfinite(inc) and inc != 0.0  # the noise reached the model the loss is read from
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_weight_noise_against_an_exact_increase(setup):
    """With eval_fn = sum of squared weights the mean increase is known in closed form: over the
    seeds, sum_p ||p + sigma n_p||^2 - ||p||^2 = sum_p (2 sigma p.n_p + sigma^2 ||n_p||^2), with
    n_p ~ N(0, 1) drawn per seed s by torch.Generator().manual_seed(s) in parameter order (the
    measure's documented draw). A perturbation that missed the model, or a wrong scale, fails it."""
    _, _, model = setup
    sigma, seeds = 0.01, 3
    params = [p.detach().double() for p in model.parameters()]
    ref = []
    for s in range(seeds):
        g = torch.Generator().manual_seed(s)
        noise = [torch.randn(p.shape, generator=g).double() for p in params]
        ref.append(sum(float((2 * sigma * p * n + sigma**2 * n * n).sum()) for p, n in zip(params, noise)))
    sq = lambda m: sum(float(p.detach().double().pow(2).sum()) for p in m.parameters())  # noqa: E731
    inc = weight_noise_stability(model, sq, sigma=sigma, seeds=seeds)
    assert inc == pytest.approx(sum(ref) / seeds, rel=1e-4)
    assert inc > 0.5 * sigma**2 * sum(p.numel() for p in params)  # of the size of sigma^2 per weight


def test_weight_noise_on_a_qat_model_reaches_the_quantized_weights(tmp_path, monkeypatch):
    """On a fake-quantized model (2 bits) the noise is added to the weights the layers compute with,
    after quantization, and not to the latent weights or the quantizer's step and offset (noise on a
    step moves a whole row: about 4x sigma at 4 bits). Checked in closed form as above, over the
    effective weights, with the documented draw (plain parameters in order, then each parametrized
    weight); the parametrizations and every parameter come back as they were."""
    from torch.nn.utils import parametrize

    from stabray.train.runner import make_run

    monkeypatch.setenv("STABRAY_CACHE", str(tmp_path))
    cfg = {
        "task": {
            "name": "dijkstra",
            "params": {"n_nodes": 4, "decimals": 1},
            "train_size": 16,
            "val_size": 4,
            "test_size": 4,
        },
        "model": {"preset": "tiny"},
        "method": {"name": "alg1", "params": {"bits": 2, "lam": 1.0}},
        "train": {"epochs": 1},
        "eval": {"eaf_examples": 0},
    }
    model = make_run(cfg).model
    quantized = [m for m in model.modules() if parametrize.is_parametrized(m)]
    assert len(quantized) == 7
    plain = [p.detach().double() for n, p in model.named_parameters() if ".parametrizations." not in n]
    effective = [m.weight.detach().double() for m in quantized]
    sigma, seeds = 0.01, 2
    ref = []
    for s in range(seeds):
        g = torch.Generator().manual_seed(s)
        noise = [torch.randn(w.shape, generator=g).double() for w in plain + effective]
        ref.append(sum(float((2 * sigma * w * n + sigma**2 * n * n).sum()) for w, n in zip(plain + effective, noise)))

    def sq(m):
        own = sum(
            float(p.detach().double().pow(2).sum()) for n, p in m.named_parameters() if ".parametrizations." not in n
        )
        return own + sum(float(q.weight.detach().double().pow(2).sum()) for q in quantized)

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    inc = weight_noise_stability(model, sq, sigma=sigma, seeds=seeds)
    assert inc == pytest.approx(sum(ref) / seeds, rel=1e-4)
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    assert all(len(m.parametrizations.weight) == 1 for m in quantized)
    assert all(torch.equal(m.weight.double(), w) for m, w in zip(quantized, effective))


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
