"""jacreg, the Jacobian-penalty method: its random-projection estimate against the exact squared
Frobenius norms of dense Jacobians (value, unbiasedness within the estimator's own standard error,
and the exact value for given vectors), its gradient against an independent reverse-over-reverse
computation, where the gradient goes (not into the random vectors, not into embedding rows outside
the sampled window, only LoRA adapters), beta = 0 as SFT-CoT's loss, and a sweep through the CLI."""

from __future__ import annotations

import math

import pytest
import torch

from stabray.data.encode import Encoder, collate
from stabray.data.splits import make_splits
from stabray.data.tokenizer import build_tokenizer
from stabray.errors import UserError
from stabray.methods import get_method
from stabray.methods.jacreg import jacobian_penalty, sample_pairs
from stabray.models.build import ModelSpec, build_model
from stabray.models.outputs import embedding_matrix, expected_embedding_fn
from stabray.tasks import get_task

CAP = 3  # output tokens per block: smaller than a 4-node step (6 tokens), so the cap is exercised


@pytest.fixture(scope="module")
def setup():
    """Tiny float64 model; a batch of 4 Dijkstra examples: 3, 2 and 1 intermediate steps, and one with
    none (it has no pair and must count as 0 in the batch mean)."""
    task = get_task("dijkstra", n_nodes=4, decimals=1)
    exs = make_splits(task, {"test": 60}, seed=0, splits=("test",))["test"]
    by_n = {}
    for e in exs:
        by_n.setdefault(len(e.steps), e)
    picked = [by_n[3], by_n[0], by_n[2], by_n[1]]
    tok = build_tokenizer([e.question + e.answer for e in exs])
    enc = Encoder(tok)
    model = build_model(ModelSpec(preset="tiny"), tok, seed=0).double()
    with torch.no_grad():  # a sharper softmax than at init, so the Jacobians are not all tiny
        model.get_input_embeddings().weight.mul_(8.0)
    batch = collate([enc.encode(e.question, e.steps, e.final) for e in picked], enc.pad)
    return model, batch, enc, picked


def dense_blocks(model, enc_ex):
    """Per input step i: A_i = the Jacobian of the outputs of every later block t > i (first CAP
    tokens each) w.r.t. the input embeddings of every token of step i, from the dense Jacobian of
    the whole sequence (torch.autograd.functional.jacobian), with the blocks written here from the
    encoding alone. Returns {i: A_i (rows, cols)}."""
    spans = [*enc_ex.step_spans, (enc_ex.final_span[0], enc_ex.final_span[1] - 1)]  # blocks 1..T
    L = len(enc_ex.input_ids)
    x = embedding_matrix(model)[torch.tensor(enc_ex.input_ids)][None]
    J = torch.autograd.functional.jacobian(expected_embedding_fn(model, L), x, vectorize=True)[0, :, :, 0]
    out = {}
    for i in range(1, len(spans)):
        ins = list(range(*spans[i - 1]))
        outs = [p - 1 for t in range(i + 1, len(spans) + 1) for p in list(range(*spans[t - 1]))[:CAP]]
        out[i] = J[outs][:, :, ins].reshape(len(outs) * J.shape[1], len(ins) * J.shape[3])
    return out


def exact_moments(model, batch):
    """Per example: R_b = sum_i ||A_i||_F^2 and, for one draw (i uniform, v ~ N(0, I)) of
    X = n_b ||A_i v||^2, E[X^2] = n_b sum_i ((tr M_i)^2 + 2 tr(M_i^2)), M_i = A_i^T A_i (Gaussian
    quadratic forms: E[(v^T M v)^2] = (tr M)^2 + 2 tr(M^2))."""
    R, EX2 = [], []
    for e in batch.encoded:
        blocks = dense_blocks(model, e)
        R.append(sum(float(A.pow(2).sum()) for A in blocks.values()))
        n = len(blocks)
        M = [A.T @ A for A in blocks.values()]
        EX2.append(n * sum(float(torch.trace(m)) ** 2 + 2 * float(m.pow(2).sum()) for m in M))
    return R, EX2


def test_estimate_is_unbiased_against_dense_frobenius_norms(setup):
    """Mean over M calls (1 sampled example each, K projections) of the penalty vs the exact batch
    mean of R. Tolerance: 4 standard errors of that mean, computed from the dense Jacobians:
    Var(one call) = E_r[Var(X_r) / K] + Var_r(E X_r) with X_r = scale * n_r ||A_i v||^2, r uniform
    over the B' examples with a pair; a false failure has probability ~6e-5."""
    model, batch, _, _ = setup
    R, EX2 = exact_moments(model, batch)
    B = len(R)
    have = [b for b in range(B) if R[b] > 0]
    assert len(have) == 3 and R[1] == 0.0  # the example without steps has no pair
    target = sum(R) / B
    scale = len(have) / B
    K, M = 50, 120
    within = sum(scale**2 * (EX2[b] - R[b] ** 2) / K for b in have) / len(have)
    between = sum((scale * R[b]) ** 2 for b in have) / len(have) - (scale * sum(R[b] for b in have) / len(have)) ** 2
    se = math.sqrt((within + between) / M)
    torch.manual_seed(0)
    est = []
    with torch.no_grad():
        for _ in range(M):
            pairs = sample_pairs(batch.encoded, CAP, samples=1, projections=K)
            est.append(float(jacobian_penalty(model, batch, pairs)))
    mean = sum(est) / M
    assert abs(mean - target) < 4 * se, (mean, target, se)
    assert se < 0.2 * target  # the check has power: 4 se is under 80% of the value


@pytest.mark.parametrize("with_cache", [True, False])
def test_given_vectors_give_the_exact_value(setup, with_cache):
    """For fixed examples, blocks and vectors the estimate is scale * mean of n_r ||A_i v||^2 exactly
    (to float64 round-off), with the prefix from the CE forward's cache or differentiated from 0."""
    model, batch, _, _ = setup
    rows, choice = [0, 2, 3], [[2, 0, 0], [1, 1, 0]]  # example 0: 3 steps -> blocks 1..3; 2: 2; 3: 1
    pairs = sample_pairs(batch.encoded, CAP, samples=3, projections=2, rows=rows, choice=choice)
    L, d = batch["input_ids"].shape[1], model.config.hidden_size
    v = torch.randn(2, 3, L, d, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    fwd = model(**batch, use_cache=True) if with_cache else None
    with torch.no_grad():
        got = float(jacobian_penalty(model, batch, pairs, vectors=v, forward=fwd))
    want = 0.0
    for k in range(2):
        for r, b in enumerate(rows):
            e = batch.encoded[b]
            blocks = dense_blocks(model, e)
            i = choice[k][r] + 1
            ins = list(range(*e.step_spans[i - 1]))
            want += len(blocks) * float((blocks[i] @ v[k, r, ins].reshape(-1)).pow(2).sum())
    want *= (3 / 4) / 6  # scale B'/B = 3/4; mean over 2 projections x 3 examples
    assert got == pytest.approx(want, rel=1e-9)


def reference_penalty(model, batch, pairs, v):
    """The same estimate by reverse-over-reverse autograd on the whole sequence (no window, no
    cache, no torch.func): J v = d/du <J^T u, v>."""
    E = model.get_input_embeddings()
    total = 0.0
    for k in range(len(pairs.ins)):
        for r, b in enumerate(pairs.rows):
            x = E(batch["input_ids"][b : b + 1])
            L = x.shape[1]
            out = expected_embedding_fn(model, L)(x)  # (1, L, d)
            u = torch.zeros_like(out, requires_grad=True)
            (g,) = torch.autograd.grad(out, x, u, create_graph=True)
            t = torch.zeros_like(x)
            t[0, pairs.ins[k][r]] = v[k, r, pairs.ins[k][r]]
            (jv,) = torch.autograd.grad(g, u, t, create_graph=True)
            total = total + pairs.n[r] * jv[0, pairs.outs[k][r]].pow(2).sum()
    return pairs.scale * total / (len(pairs.ins) * len(pairs.rows))


def test_gradient_matches_reverse_over_reverse_and_skips_the_vectors(setup):
    model, batch, _, _ = setup
    pairs = sample_pairs(batch.encoded, CAP, samples=2, projections=2, rows=[0, 2], choice=[[0, 1], [2, 0]])
    L, d = batch["input_ids"].shape[1], model.config.hidden_size
    v = torch.randn(2, 2, L, d, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    v.requires_grad_(True)  # the method must treat the vectors as constants
    params = [p for p in model.parameters() if p.requires_grad]
    model.zero_grad(set_to_none=True)
    got = jacobian_penalty(model, batch, pairs, vectors=v, forward=model(**batch, use_cache=True))
    g_got = torch.autograd.grad(got, params + [v], allow_unused=True)
    assert g_got[-1] is None  # no gradient through the random vectors
    want = reference_penalty(model, batch, pairs, v.detach())
    g_want = torch.autograd.grad(want, params)
    assert float(got.detach()) == pytest.approx(float(want.detach()), rel=1e-9)
    nonzero = 0
    for (name, _), a, b in zip([(n, p) for n, p in model.named_parameters() if p.requires_grad], g_got, g_want):
        assert a is not None, name  # every weight is reached through the penalty
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7 * float(b.abs().max()), msg=name)  # round-off
        nonzero += bool(a.abs().max() > 0)
    assert nonzero == len(params)


def test_embedding_rows_outside_the_window_get_no_gradient(setup):
    """With an untied output head, the penalty's gradient reaches the input embedding only through
    the evaluation point and the prefix (the E of the output map is detached): rows of tokens that
    occur in the sampled example up to its last output read, and no other row."""
    _, batch, enc, _ = setup
    model = build_model(ModelSpec(preset="tiny"), enc.tok, seed=0).double()
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    assert model.lm_head.weight is not model.get_input_embeddings().weight
    pairs = sample_pairs(batch.encoded, CAP, samples=1, projections=1, rows=[3], choice=[[0]])
    res = model(**batch, use_cache=True)
    pen = jacobian_penalty(model, batch, pairs, forward=res)
    (g,) = torch.autograd.grad(pen, model.get_input_embeddings().weight)
    end = max(pairs.outs[0][0]) + 1
    inside = set(batch["input_ids"][3, :end].tolist())
    touched = set(torch.nonzero(g.abs().sum(1)).flatten().tolist())
    assert touched and touched <= inside, touched - inside
    assert len(touched) >= len(inside) - 1  # (a token may have an exactly zero row by chance; at most one)


def test_lora_penalty_reaches_only_adapters(setup, tmp_path):
    from conftest import tiny_llama

    from stabray.models.build import LoraSpec

    _, batch, enc, _ = setup
    tok = enc.tok
    torch.manual_seed(0)
    base = tiny_llama(tok)
    base.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    model = build_model(ModelSpec(pretrained=str(tmp_path / "m"), lora=LoraSpec(rank=4, alpha=8)), tok)
    with torch.no_grad():  # B = 0 at init would make every A gradient vanish
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    pairs = sample_pairs(batch.encoded, CAP, samples=2, projections=1)
    pen = jacobian_penalty(model, batch, pairs, forward=model(**batch, use_cache=True))
    pen.backward()
    grads = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().max() > 0}
    assert grads and all("lora_" in n for n in grads), grads
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        n for n, p in model.named_parameters() if "lora_" in n
    }


def test_beta_zero_is_sft_cot_and_beta_adds_the_penalty(setup):
    model, batch, _, _ = setup
    sft = get_method("sft_cot").loss(model, batch).detach()
    assert float(get_method("jacreg", beta=0.0).loss(model, batch).detach()) == float(sft)  # bit for bit
    beta = 0.5
    m = get_method("jacreg", beta=beta, samples=2, projections=3, token_cap=CAP)
    torch.manual_seed(5)
    got = m.loss(model, batch).detach()
    torch.manual_seed(5)  # the same draws by hand
    pairs = sample_pairs(batch.encoded, CAP, samples=2, projections=3)
    pen = jacobian_penalty(model, batch, pairs, forward=model(**batch, use_cache=True)).detach()
    assert float(pen) > 0
    assert float(got) == pytest.approx(float(sft) + beta * float(pen), rel=1e-12)
    model.eval()  # evaluation: the CE alone, and no draw from the training RNG
    try:
        state = torch.get_rng_state()
        assert float(m.loss(model, batch).detach()) == float(sft)
        assert torch.equal(state, torch.get_rng_state())
    finally:
        model.train()


def test_a_batch_without_step_spans_and_bad_values_are_user_errors(setup):
    model, batch, _, _ = setup
    with pytest.raises(UserError, match="collate"):
        get_method("jacreg").loss(model, dict(batch))  # a plain dict has no step spans
    for bad in ({"beta": -1.0}, {"beta": float("nan")}, {"projections": 0}, {"samples": 0}, {"token_cap": 0}):
        with pytest.raises(UserError, match=next(iter(bad))):
            get_method("jacreg", **bad)
    with pytest.raises(UserError, match="lam"):
        get_method("jacreg", lam=0.0)


def test_qat_and_compression_compose_like_alg1(setup):
    from torch.nn.utils import parametrize

    _, batch, enc, exs = setup
    m = get_method("jacreg", lam=0.5, bits=4, token_cap=CAP)
    a = get_method("alg1", lam=0.5, bits=4)
    model = m.prepare(build_model(ModelSpec(preset="tiny"), enc.tok, seed=0))
    assert any(parametrize.is_parametrized(mod) for mod in model.modules())
    rng_a, rng_m = [__import__("numpy").random.default_rng(0) for _ in range(2)]
    assert [m.train_view(e, 0, rng_m) for e in exs] == [a.train_view(e, 0, rng_a) for e in exs]
    assert [m.eval_steps(e) for e in exs] == [a.eval_steps(e) for e in exs]
    loss = m.loss(model, batch)
    loss.backward()
    assert torch.isfinite(loss)
    steps = [p for n, p in model.named_parameters() if n.endswith(".step")]
    # LSQ's steps train through CE and penalty (not None and not all zeros)
    assert steps and all(p.grad is not None and p.grad.abs().max() > 0 for p in steps)


def test_default_space_validates_and_a_sweep_runs_through_the_cli(tmp_path, monkeypatch, capsys):
    import yaml
    from mlflow import MlflowClient

    from stabray.cli import main
    from stabray.methods import METHODS
    from stabray.spec import load_spec

    assert set(METHODS.get("jacreg").default_space) >= {"beta", "projections"}
    sweeps = __import__("pathlib").Path(__file__).resolve().parent.parent / "sweeps"
    spec = {
        "include": str(sweeps / "_base.yaml"),
        "name": "jacreg-mini",
        "task": {
            "name": "dijkstra",
            "params": {"n_nodes": 4, "decimals": 1},
            "train_size": 32,
            "val_size": 8,
            "test_size": 8,
        },
        "model": {"preset": "mini"},
        "method": {"name": "jacreg"},
        "train": {"epochs": 1, "batch_size": 16, "warmup_steps": 1},
        "eval": {
            "eaf_examples": 4,
            "eaf_iters": 2,
            "decomposition_examples": 0,
            "weight_noise_seeds": 0,
            "long_splits": [],
        },
        "search": {"num_samples": 1, "max_concurrent": 1, "scheduler": "fifo", "space": {"lam": None, "bits": None}},
        "device": "cpu",
    }
    path = tmp_path / "jacreg-mini.yaml"
    path.write_text(yaml.safe_dump(spec))
    loaded, _ = load_spec(str(path), {"method.name": "jacreg"})
    assert loaded.method.name == "jacreg"
    monkeypatch.setenv("STABRAY_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    rc = main(["sweep", str(path), "--method", "jacreg", "--tracking-uri", uri, "--storage", str(tmp_path / "runs")])
    assert rc == 0
    assert "1 trials (0 failed)" in capsys.readouterr().out
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("jacreg-mini")
    trials = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("stabray.role") == "trial"]
    assert len(trials) == 1 and trials[0].info.status == "FINISHED"
    p = trials[0].data.params
    assert p["method"] == "jacreg" and {"beta", "projections", "samples"} <= set(p)
    assert math.isfinite(trials[0].data.metrics["train_loss"])
