"""Every registered method on a tiny config through the real entry point (TrialRun): a finite,
falling loss; gradients on exactly the parameters the method trains (embedded model and LoRA);
generation that the task can score; identical results under a fixed seed. Then each method's own
mechanics against a hand computation: the implicit-CoT schedule, Coconut's latent passes and
decoding, NSO's symmetric gradient, Algorithm 1's ablations."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import scored_by_hand
from torch import nn

from stabray.data.encode import collate
from stabray.errors import UserError
from stabray.methods import METHODS, get_method
from stabray.methods.alg1 import GaussianWeightNoise, compress_indices
from stabray.methods.base import load_spaces
from stabray.methods.coconut import LATENT
from stabray.methods.implicit_cot import drop_leading_tokens
from stabray.methods.qat import quantize
from stabray.stability import ROW_KEYS
from stabray.tasks import extract_final, get_task
from stabray.tasks.base import TOKEN_RE, Example
from stabray.train.run import TrialRun

# Method settings that exercise each method's mechanics within 3 epochs (unknown methods: defaults).
PARAMS = {
    # 4 bits: at 2 bits with seed 0 this 3-epoch tiny model (LSQ, the default quantizer) reaches the same
    # loss as the fixed quantizer (2.55 vs 2.53) but greedy decoding repeats "|", which holds no final
    # answer, while seeds 1 and 2 parse 8 of 8: which degenerate string an untrained model repeats is
    # chance, and the check below is about decoding, not about the bit-width
    "alg1": {"lam": 0.5, "bits": 4},
    "coconut": {"max_stage": 1},
    "implicit_cot": {"remove_per_epoch": 8.0},
    "nso": {"sigma": 0.01},
}
EPOCHS = 3


def config(cache_dir, name, **over):
    cfg = {
        "task": {
            "name": "dijkstra",
            "params": {"n_nodes": 4, "decimals": 1},
            "train_size": 48,
            "val_size": 8,
            "test_size": 8,
        },
        "model": {"preset": "tiny"},
        "method": {"name": name, "params": PARAMS.get(name, {})},
        "train": {"epochs": EPOCHS, "batch_size": 16, "lr": 1e-2, "warmup_steps": 1},
        "eval": {"eaf_examples": 0, "long_splits": []},
        "seed": 0,
        "device": "cpu",
        "cache_dir": cache_dir,
    }
    cfg.update(over)
    return cfg


def fixed_batch(run, epoch):
    """The first 16 training examples as the method shows them at `epoch`."""
    rng = np.random.default_rng([0, epoch])
    items = [run.encoder.encode(*run.method.train_view(e, epoch, rng), e.final) for e in run.data["train"][:16]]
    return collate(items, run.encoder.pad)


def eval_loss(run, batch):
    run.model.eval()
    with torch.no_grad():
        loss = float(run.method.loss(run.model, batch))
    run.model.train()
    return loss


# -- the battery: every registered method ----------------------------------------------------------
@pytest.mark.parametrize("name", METHODS.names())
def test_method_trains_evaluates_and_repeats(name, cache_dir):
    run = TrialRun(config(cache_dir, name))
    probe = fixed_batch(run, EPOCHS - 1)  # the view the last epoch trains on
    before = eval_loss(run, probe)
    losses = [run.trainer.train_epoch()["train_loss"] for _ in range(EPOCHS)]
    after = eval_loss(run, probe)
    assert np.all(np.isfinite(losses)) and np.isfinite(after)
    assert after < before - 0.1, (before, after, losses)
    res = run.evaluate("val")
    assert res.acc == scored_by_hand(run.data["val"], res.predictions) and len(res.predictions) == 8
    assert sum(bool(extract_final(p)) for p in res.predictions) >= 4, res.predictions
    again = TrialRun(config(cache_dir, name))  # same seed: the same first epoch, bit for bit
    assert again.trainer.train_epoch()["train_loss"] == losses[0]


@pytest.mark.parametrize("name", METHODS.names())
def test_gradients_on_every_weight_of_the_embedded_model(name, cache_dir):
    run = TrialRun(config(cache_dir, name))
    params = dict(run.model.named_parameters())
    assert all(p.requires_grad for p in params.values())  # from scratch: everything trains
    run.method.step(run.model, fixed_batch(run, EPOCHS - 1))
    assert {n for n, p in params.items() if p.grad is not None} == set(params)
    # and not all zeros (a missing straight-through estimator gives zeros, not None); LSQ's offset is
    # the exception: dQ/db is 0 inside the clip range, where every weight sits at the initial step
    zero = {n for n, p in params.items() if not p.grad.abs().max() > 0}
    assert all(n.endswith(".offset") for n in zero), sorted(zero)


@pytest.fixture(scope="module")
def local_pretrained(tmp_path_factory):
    """A tiny random Llama checkpoint with its own tokenizer, saved like a hub model."""
    from conftest import tiny_llama

    from stabray.data.splits import make_splits
    from stabray.data.tokenizer import build_tokenizer

    task = get_task("dijkstra", n_nodes=4, decimals=1)
    splits = make_splits(task, {"train": 48, "val": 8, "test": 8}, splits=("train", "val", "test"))
    tok = build_tokenizer(
        [t for exs in splits.values() for e in exs for t in (e.question, e.question_nohint, e.answer)]
    )
    torch.manual_seed(0)
    model = tiny_llama(tok)
    path = tmp_path_factory.mktemp("pretrained") / "tiny-llama"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("name", METHODS.names())
def test_lora_trains_only_adapters(name, cache_dir, local_pretrained):
    run = TrialRun(config(cache_dir, name, model={"pretrained": local_pretrained, "lora": {"rank": 4, "alpha": 8}}))
    params = dict(run.model.named_parameters())
    trainable = {n for n, p in params.items() if p.requires_grad}
    # no pretrained weight trains: only LoRA A/B and what a method adds itself (Coconut's <bot>/<eot>
    # rows as peft TrainableTokens, MTP's extra heads)
    from safetensors.torch import load_file

    pretrained = set(load_file(f"{local_pretrained}/model.safetensors"))
    assert trainable and not {n.removeprefix("base_model.model.") for n in trainable} & pretrained
    assert any("lora_" in n for n in trainable)
    assert any("trainable_tokens_delta" in n for n in trainable) == (name == "coconut")
    before = {n: p.detach().clone() for n, p in params.items()}
    run.trainer.train_epoch()
    assert {n for n, p in params.items() if p.grad is not None} <= trainable
    changed = {n for n, p in params.items() if not torch.equal(before[n], p.detach())}
    assert changed and changed <= trainable
    res = run.evaluate("val", n=4)
    assert len(res.predictions) == 4


def test_spaces_yaml_covers_every_method():
    spaces = load_spaces()
    for name in METHODS.names():
        cls = METHODS.get(name)
        fields = {f.name for f in __import__("dataclasses").fields(cls.Params)}
        assert set(cls.default_space) <= fields
        if name in spaces:
            assert cls.default_space == spaces[name]


# -- implicit CoT ----------------------------------------------------------------------------------
EX = Example(
    question="q:\ntrace | pi:\n", steps=("[0 0 1]", "[0 0 0]", "[1 0 0]"), final="[1 1 0]", question_nohint="q:\npi:\n"
)


@pytest.mark.parametrize("per_epoch", [0.5, 1.0, 2.0])
def test_implicit_removes_leading_steps_linearly(per_epoch):
    m = get_method("implicit_cot", remove_per_epoch=per_epoch, unit="steps", removal_smoothing=0)
    rng = np.random.default_rng(0)
    for epoch in range(8):
        prompt, steps = m.train_view(EX, epoch, rng)
        gone = min(3, int(np.floor(per_epoch * epoch)))
        assert prompt == EX.question and steps == EX.steps[gone:]  # leading steps go first
    assert m.eval_prompt(EX) == EX.question and m.eval_steps(EX) == ()  # answers "| final"


@pytest.mark.parametrize(
    "method, key, value, word",
    [
        ("coconut", "reset_optimizer", "maybe", "true or false"),
        ("implicit_cot", "reset_optimizer", 1, "true or false"),
        ("coconut", "max_stage", "abc", "an integer"),
        ("coconut", "max_stage", 2.5, "an integer"),
        ("alg1", "bits", True, "an integer"),
        ("nso", "sigma", "abc", "a finite number"),
        ("nso", "sigma", float("inf"), "a finite number"),
        ("mtp", "mtp_weight", "nan", "a finite number"),
        ("alg1", "quantizer", 1, "a string"),
    ],
)
def test_hyperparameters_of_the_wrong_type_are_user_errors(method, key, value, word):
    """Flags, counts and rates of every method are checked by type, naming the hyperparameter."""
    with pytest.raises(UserError, match=f"method '{method}': {key} must be {word}, got {value!r}"):
        get_method(method, **{key: value})


def test_hyperparameters_take_yaml_and_numpy_spellings():
    """`1e-3` (a string to YAML), numpy scalars from a search and 4.0 for an integer become the
    field's own type."""
    assert get_method("nso", sigma="1e-3").params.sigma == 1e-3
    m = get_method("alg1", lam=np.float64(0.5), bits=np.int64(4))
    assert type(m.params.lam) is float and type(m.params.bits) is int and m.params.bits == 4
    assert get_method("alg1", bits=4.0).params.bits == 4 and type(get_method("alg1", lam=1).params.lam) is float
    assert get_method("coconut", reset_optimizer=np.bool_(False)).params.reset_optimizer is False


def test_implicit_token_unit_cuts_inside_a_step():
    n_tok = [len(TOKEN_RE.findall(s)) for s in EX.steps]  # 5 tokens each: [ 0 0 1 ]
    m = get_method("implicit_cot", remove_per_epoch=3, unit="tokens", removal_smoothing=0)
    rng = np.random.default_rng(0)
    assert m.train_view(EX, 0, rng)[1] == EX.steps
    assert m.train_view(EX, 1, rng)[1] == ("1]", "[0 0 0]", "[1 0 0]")  # 3 tokens gone
    assert m.train_view(EX, 2, rng)[1] == ("0 0 0]", "[1 0 0]")  # 6 = the first step and "["
    for n in range(sum(n_tok) + 2):
        kept = drop_leading_tokens(EX.steps, n)
        assert sum(len(TOKEN_RE.findall(s)) for s in kept) == max(0, sum(n_tok) - n)
    with pytest.raises(UserError, match="unit"):
        get_method("implicit_cot", unit="words")


def test_implicit_default_is_deng_token_schedule_over_optimizer_steps():
    """Default: task tokens, 8 per epoch, linear in optimizer steps (the training loop drives the
    method), removal smoothing lambda = 4 and optimizer resets on."""
    m = get_method("implicit_cot")
    p = m.params
    assert (p.unit, p.remove_per_epoch, p.removal_smoothing, p.reset_optimizer) == ("tokens", 8.0, 4.0, True)
    off = get_method("implicit_cot", removal_smoothing=0)
    S = 10  # optimizer steps per epoch
    for step in range(0, 3 * S):
        off.on_train_step(step, S)
        n = int(np.floor(8 * step / S))
        assert off.train_view(EX, step // S, np.random.default_rng(step))[1] == drop_leading_tokens(EX.steps, n)


@pytest.mark.parametrize("lam", [4.0, 1.0])
def test_removal_smoothing_is_the_exponential_law(lam):
    """P(o) = (1 - e^-lam) e^(-lam o): frequencies of the extra removed units over many examples."""
    m = get_method("implicit_cot", unit="tokens", removal_smoothing=lam)
    rng = np.random.default_rng(0)
    n_tok = sum(len(TOKEN_RE.findall(s)) for s in EX.steps)
    N = 20000
    counts = np.zeros(n_tok + 1)
    for _ in range(N):  # epoch 0, nothing scheduled: every removed token is the offset o
        kept = m.train_view(EX, 0, rng)[1]
        counts[n_tok - sum(len(TOKEN_RE.findall(s)) for s in kept)] += 1
    p = (1 - np.exp(-lam)) * np.exp(-lam * np.arange(4))
    tol = 4 * np.sqrt(p * (1 - p) / N) + 1e-4  # 4 binomial standard errors
    assert np.all(np.abs(counts[:4] / N - p) <= tol), (counts[:4] / N, p)


def test_implicit_resets_the_optimizer_when_the_schedule_grows(cache_dir):
    """3 optimizer steps per epoch, 2 tokens per epoch: the scheduled count floor(2 s / 3) grows at
    steps 2, 3, 5, 6, 8, and each growth builds a fresh AdamW (its step count restarts)."""
    cfg = config(cache_dir, "implicit_cot")
    cfg["method"]["params"] = {"remove_per_epoch": 2.0}
    run = TrialRun(cfg)
    assert run.trainer.steps_per_epoch == 3
    for _ in range(EPOCHS):
        run.trainer.train_epoch()
    assert run.trainer.resets == 5
    assert all(int(st["step"]) == 1 for st in run.trainer.optimizer.state.values())  # reset before step 8
    assert run.trainer.sched == (8, 9, 8)  # the schedule kept its place: offset 8 at global step 8
    cfg["method"]["params"] = {"remove_per_epoch": 2.0, "reset_optimizer": False}
    run = TrialRun(cfg)
    for _ in range(EPOCHS):
        run.trainer.train_epoch()
    assert run.trainer.resets == 0 and all(int(st["step"]) == 9 for st in run.trainer.optimizer.state.values())


# -- Coconut ---------------------------------------------------------------------------------------
def test_coconut_resets_optimizer_and_schedule_at_stage_switches(cache_dir, tmp_path):
    """max_stage 1, one epoch per stage: the curriculum changes at epochs 1 and 2 (stage 2 is the
    final one); each switch builds a fresh optimizer and restarts the schedule over the remaining
    steps, and a checkpoint taken between switches resumes to the same weights."""
    from stabray.train import load_run

    cfg = config(cache_dir, "coconut")  # max_stage 1
    straight = TrialRun(cfg)
    for _ in range(EPOCHS):
        straight.trainer.train_epoch()
    S = straight.trainer.steps_per_epoch
    assert straight.trainer.resets == 2 and straight.trainer.sched == (2 * S, S, 0)
    first = TrialRun(cfg)
    first.epoch()
    first.epoch()
    first.save(tmp_path / "ck")
    resumed = load_run(tmp_path / "ck")
    resumed.trainer.train_epoch()
    assert resumed.trainer.resets == 2
    for a, b in zip(straight.model.parameters(), resumed.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    cfg["method"]["params"] = {"max_stage": 1, "reset_optimizer": False}
    off = TrialRun(cfg)
    for _ in range(EPOCHS):
        off.trainer.train_epoch()
    assert off.trainer.resets == 0


def test_coconut_curriculum_and_latent_count():
    m = get_method("coconut", latents_per_step=2, max_stage=2, epochs_per_stage=2)
    rng = np.random.default_rng(0)
    for epoch, (skip, n_lat) in enumerate([(0, 0), (0, 0), (1, 2), (1, 2), (2, 4), (2, 4), (3, 4), (3, 4)]):
        prompt, steps = m.train_view(EX, epoch, rng)
        assert prompt == EX.question + "<bot>" + LATENT * n_lat + "<eot>" and steps == EX.steps[skip:]
    assert m.eval_prompt(EX).count(LATENT) == 4 and m.eval_steps(EX) == ()
    short = get_method("coconut", max_stage=5, pad_to_max=False)  # no padding: min(T, max_stage) latents
    assert short.eval_prompt(EX).count(LATENT) == 3


@pytest.fixture(scope="module")
def coconut_run(tmp_path_factory):
    cfg = config(str(tmp_path_factory.mktemp("cache")), "coconut", model={"preset": "mini"})
    cfg["method"]["params"] = {"max_stage": 2}
    return TrialRun(cfg)


def test_coconut_latents_are_hidden_states_and_carry_gradient(coconut_run):
    run, m = coconut_run, coconut_run.method
    batch = fixed_batch(run, 2)  # stage 2: two latents after <bot>
    lat = batch["input_ids"] == m.ids[LATENT]
    assert (lat.sum(1) == 2).all()
    ids, mask, labels = batch["input_ids"][:1], batch["attention_mask"][:1], batch["labels"][:1]
    assert (labels[lat[:1]] == -100).all()  # no loss on latents
    p0, p1 = [int(i) for i in lat[0].nonzero()]
    model = run.model
    probe = model.model.layers[0].self_attn.q_proj.weight  # an early-layer weight

    def by_hand(detach):
        x = model.get_input_embeddings()(ids)
        for p in (p0, p1):  # each latent = last hidden state at the position before it
            h = model(inputs_embeds=x[:, :p], output_hidden_states=True).hidden_states[-1][:, p - 1]
            h = h.detach() if detach else h
            x = torch.cat([x[:, :p], h[:, None], x[:, p + 1 :]], 1)
        loss = model(inputs_embeds=x, attention_mask=mask, labels=labels).loss
        return loss, torch.autograd.grad(loss, probe)[0]

    x, _ = m.fill_latents(model, ids, mask)
    ref_loss, ref_grad = by_hand(detach=False)
    loss = m.loss(model, {"input_ids": ids, "attention_mask": mask, "labels": labels})
    grad = torch.autograd.grad(loss, probe)[0]
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(grad, ref_grad)
    _, cut_grad = by_hand(detach=True)  # without the latent path the early-layer gradient differs
    assert (grad - cut_grad).norm() > 1e-3 * grad.norm()


def test_coconut_generate_matches_naive_decoding(coconut_run):
    run, m = coconut_run, coconut_run.method
    exs = run.data["val"][:3]
    prompts = [m.eval_prompt(e) for e in exs]
    batched = m.generate(run.model, run.encoder, prompts, max_new_tokens=6, batch_size=3)
    model = run.model.eval()
    for p, got in zip(prompts, batched):  # one prompt at a time, no cache, no padding
        ids = torch.tensor([run.encoder.prompt(p)])
        with torch.no_grad():
            x, _ = m.fill_latents(model, ids, torch.ones_like(ids))
            want = []
            for _ in range(6):
                nxt = int(model(inputs_embeds=x).logits[0, -1].argmax())
                if nxt == run.encoder.eos:
                    break
                want.append(nxt)
                x = torch.cat([x, model.get_input_embeddings()(torch.tensor([[nxt]]))], 1)
        assert got == want
    run.model.train()


def test_coconut_eaf_steps_are_latents_against_dense_jacobian(coconut_run):
    """With the method, each latent slot is a step: J_i^(t) between latents is d(hidden state fed into
    slot t) / d(input at slot i); into the final answer, d(expected embeddings) / d(input at slot i).
    Checked against dense Jacobians written here from the model alone, latents filled by hand."""
    from stabray.stability import estimate_eaf

    run, m = coconut_run, coconut_run.method
    model = run.model.eval()
    with torch.no_grad():  # a sharper softmax, so the answer's Jacobians are not tiny
        model.get_input_embeddings().weight.mul_(4.0)
    try:
        enc = run.eval_encoded("val", 1)[0]
        slots = [p for p, t in enumerate(enc.input_ids) if t == m.ids[LATENT]]
        assert len(slots) == 2 and enc.step_spans == ()
        res = estimate_eaf(model, [enc], iters=60, token_cap=8, method=m)
        assert res.T == 3  # latent 1, latent 2, the final answer
        ids = torch.tensor([enc.input_ids])
        with torch.no_grad():
            x = model.get_input_embeddings()(ids)
            for p in slots:
                x[0, p] = model(inputs_embeds=x[:, :p], output_hidden_states=True).hidden_states[-1][0, p - 1]
        a, b = enc.final_span[0], enc.final_span[1] - 1  # the answer without EOS
        E = model.get_input_embeddings().weight.detach()

        def out(z, i, t):
            xi = torch.cat([x[:, : slots[i - 1]], z[None, None], x[:, slots[i - 1] + 1 :]], 1)
            r = model(inputs_embeds=xi, output_hidden_states=True)
            if t <= len(slots):
                return r.hidden_states[-1][0, slots[t - 1] - 1]
            return (torch.softmax(r.logits[0, a - 1 : b - 1], -1) @ E).flatten()

        for i, t in [(1, 2), (1, 3), (2, 3)]:
            J = torch.autograd.functional.jacobian(lambda z, i=i, t=t: out(z, i, t), x[0, slots[i - 1]].clone())
            ref = float(torch.linalg.matrix_norm(J.reshape(-1, J.shape[-1]), ord=2))
            assert ref > 1e-6
            assert float(res.norms[i, t]) == pytest.approx(ref, rel=0.01), (i, t)
        # without the method the latents are plain tokens: no steps, a different (empty) chain
        assert estimate_eaf(model, [enc], iters=5).T == 1
    finally:
        with torch.no_grad():
            model.get_input_embeddings().weight.div_(4.0)
        run.model.train()


def test_coconut_loss_gap_and_inference_loss_fill_latents(coconut_run):
    from stabray.evaluate.metrics import final_answer_loss
    from stabray.stability import inference_loss

    run, m = coconut_run, coconut_run.method
    e = run.eval_encoded("val", 1)[0]
    items = [(list(e.input_ids), e.final_span[0])]
    got = float(final_answer_loss(run.model, run.encoder, items, "cpu", method=m)[0])
    plain = float(final_answer_loss(run.model, run.encoder, items, "cpu")[0])
    ids = torch.tensor([e.input_ids])
    with torch.no_grad():
        x, pos = m.fill_latents(run.model.eval(), ids, torch.ones_like(ids))
        logits = run.model(inputs_embeds=x, position_ids=pos).logits[0]
    tgt = ids[0, e.final_span[0] :]
    want = float(torch.nn.functional.cross_entropy(logits[e.final_span[0] - 1 : -1], tgt))
    assert got == pytest.approx(want, rel=1e-5) and abs(got - plain) > 1e-4
    # the weight-noise measure's loss: the method's prompt, decoding and inputs
    assert math.isfinite(inference_loss(run.model, run.encoder, run.data["val"][:2], method=m))
    run.model.train()


def test_coconut_latent_errors_and_decomposition_by_hand(coconut_run):
    """eps_t / r_t over latent slots against a hand computation: the true value of latent j is the
    model's last hidden state at the end of gold step j read as text (stage-0 format); eps_j = the
    hidden state fed into slot j given true earlier latents minus it; r_j = the model's own latent j
    minus it; the answer's loss gap = CE given own latents - CE given true latents. Table 4's row is
    the last (T = L + 1); latent rows carry no loss."""
    from stabray.stability.decomposition import decompose, latent_errors

    run, m = coconut_run, coconut_run.method
    model = run.model.eval()
    enc_ = run.encoder
    E = model.get_input_embeddings().weight.detach()
    ex = next(e for e in run.data["test"] if len(e.steps) == 1)  # 1 step, 2 latents: the pad rule is used
    le = latent_errors(model, enc_, ex, m, token_cap=8)
    with torch.no_grad():
        text = enc_.encode(ex.question + "<bot><eot>", ex.steps, ex.final)
        h = model(input_ids=torch.tensor([text.input_ids]), output_hidden_states=True).hidden_states[-1][0]
        gold = [h[text.step_spans[0][1] - 1]] * 2  # latent 2 is beyond the last step: the last step's proxy
        enc = enc_.encode(m.eval_prompt(ex), (), ex.final)
        ids = torch.tensor([enc.input_ids])
        slots = [p for p, t in enumerate(enc.input_ids) if t == m.ids[LATENT]]
        x = E[ids].clone()
        free = E[ids].clone()
        for j, p in enumerate(slots):
            x[0, p] = gold[j]
            free[0, p] = model(inputs_embeds=free[:, :p], output_hidden_states=True).hidden_states[-1][0, p - 1]
        ht = model(inputs_embeds=x, output_hidden_states=True).hidden_states[-1][0]
        eps = [float((ht[p - 1] - gold[j]).norm()) for j, p in enumerate(slots)]
        r = [float((free[0, p] - gold[j]).norm()) for j, p in enumerate(slots)]
        a, b = enc.final_span[0], enc.final_span[1] - 1
        y = ids[0, a:b]

        def ce(inp):
            lg = model(inputs_embeds=inp).logits[0, a - 1 : b - 1]
            return float(torch.nn.functional.cross_entropy(lg, y)), float((torch.softmax(lg, -1) @ E - E[y]).norm())

        (ce_true, err_true), (ce_free, err_free) = ce(x), ce(free)
    assert le.slots == slots
    assert le.eps == pytest.approx(eps + [err_true], rel=1e-5)
    assert le.r == pytest.approx(r + [err_free], rel=1e-5)
    assert eps[0] == pytest.approx(r[0], rel=1e-5)  # latent 1 has no earlier latent: both prefixes agree
    assert le.answer_true[0] == pytest.approx(ce_true, rel=1e-5) and le.answer_gen[0] == pytest.approx(
        ce_free, rel=1e-5
    )

    rows = decompose(model, enc_, [ex], method=m, iters=20)
    assert [row["T"] for row in rows] == [1, 2, 3]
    assert rows[1]["sum_eps"] == pytest.approx(eps[0], rel=1e-5)
    assert rows[2]["sum_eps"] == pytest.approx(eps[0] + eps[1], rel=1e-5)
    assert rows[2]["loss_gap"] == pytest.approx(abs(ce_free - ce_true), rel=1e-4)
    assert rows[2]["bound"] == pytest.approx(rows[2]["first_order"] + rows[2]["second_order"])
    assert rows[2]["C1"] > 0 and rows[2]["C2"] > 0 and rows[2]["eaf"] > 0
    assert all(math.isnan(row["loss_gap"]) and math.isnan(row["bound"]) for row in rows[:2])
    assert run.decomposition(2)[-1]["T"] == 3  # the runner's table: Coconut has one now
    run.model.train()


def test_stability_cli_on_a_coconut_checkpoint(coconut_run, tmp_path, capsys):
    """A latent-thought checkpoint: the CLI prints the eq. (4) table over the latent steps, and its EAF
    equals estimate_eaf with the method at the true latents."""
    from stabray.cli import main
    from stabray.stability import eaf_from_norms, estimate_eaf
    from stabray.stability.decomposition import latent_errors

    run = coconut_run
    run.save(tmp_path / "ckpt")
    assert main(["stability", str(tmp_path / "ckpt"), "--n", "2", "--iters", "3", "--out", str(tmp_path / "out")]) == 0
    assert "latent thoughts" in capsys.readouterr().out
    lines = (tmp_path / "out" / "stability.csv").read_text().splitlines()
    assert lines[0].split(",") == list(ROW_KEYS) and len(lines) == 1 + 3  # T = 1 (no step before), 2, 3
    # the EAF over the latent slots, Jacobians at the true latents (the text proxies)
    exs = run.data["test"][:2]
    inputs = [latent_errors(run.model, run.encoder, e, run.method).gold_inputs for e in exs]
    res = estimate_eaf(run.model, run.eval_encoded("test", 2), iters=3, method=run.method, inputs=inputs)
    eaf = float(lines[-1].split(",")[ROW_KEYS.index("eaf")])
    assert eaf == pytest.approx(eaf_from_norms(res.norms, 3), rel=1e-6)


# -- NSO -------------------------------------------------------------------------------------------
class Cubic(nn.Module):
    """loss = sum((W x)^3) / n: its gradient 3 (Wx)^2 x^T / n is not linear in W, so the +-U average
    differs from the plain gradient by 3 (Ux)^2 x^T / n."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2, bias=False)

    def forward(self, x):
        return SimpleNamespace(loss=self.lin(x).pow(3).sum() / len(x))


@pytest.mark.parametrize("m", [1, 3])
def test_nso_gradient_is_the_symmetric_average(m):
    torch.manual_seed(0)
    model, x = Cubic(), torch.randn(4, 3)
    W = model.lin.weight.detach().clone()
    method = get_method("nso", sigma=0.3, samples=m)
    torch.manual_seed(123)
    loss = method.step(model, {"x": x})
    torch.manual_seed(123)  # the same noise draws, by hand
    expect, expect_loss = torch.zeros_like(W), 0.0
    for _ in range(m):
        U = torch.randn_like(W) * 0.3
        for V in (W + U, W - U):
            y = x @ V.T  # (n, 2)
            expect += 3 * (y**2).T @ x / len(x) / (2 * m)
            expect_loss += float(y.pow(3).sum() / len(x)) / (2 * m)
    torch.testing.assert_close(model.lin.weight.grad, expect)
    assert loss == pytest.approx(expect_loss, rel=1e-5)
    assert torch.equal(model.lin.weight.detach(), W)  # weights restored exactly
    plain = 3 * ((x @ W.T) ** 2).T @ x / len(x)
    assert (model.lin.weight.grad - plain).norm() > 1e-3


# -- Algorithm 1 ablations -------------------------------------------------------------------------
def test_alg1_strategies_through_train_view():
    ex = Example(question="q", steps=tuple(f"[{i}]" for i in range(10)), final="[9]", question_nohint="q")
    rng = np.random.default_rng(0)
    view = {
        s: get_method("alg1", lam=0.3, strategy=s).train_view(ex, 0, rng)[1]
        for s in ("drop_first", "drop_last", "equal")
    }
    assert view["drop_first"] == ("[7]", "[8]", "[9]") and view["drop_last"] == ("[0]", "[1]", "[2]")
    assert view["equal"] == tuple(f"[{i}]" for i in compress_indices(10, 0.3, "equal", rng)) == ("[1]", "[5]", "[8]")


@pytest.mark.parametrize("bits", [1, 2, 4])
def test_gaussian_noise_matches_quantization_scale(bits):
    torch.manual_seed(0)
    w = torch.randn(8, 4096)
    noise = GaussianWeightNoise(bits)
    err = (quantize(w, bits) - w).pow(2).mean(1).sqrt()  # per-row RMS of the quantization error
    a, b = noise(w) - w, noise(w) - w
    torch.testing.assert_close(a.pow(2).mean(1).sqrt(), err, rtol=0.05, atol=0)
    assert not torch.equal(a, b)  # resampled every forward pass
    assert torch.equal(noise.eval()(w), w)  # no noise at evaluation


def test_alg1_gaussian_trains_with_noise_only_in_training(cache_dir):
    cfg = config(cache_dir, "alg1")
    cfg["method"]["params"] = {"lam": 0.5, "bits": 2, "noise": "gaussian"}
    run = TrialRun(cfg)
    batch = fixed_batch(run, 0)
    run.model.train()
    with torch.no_grad():
        assert float(run.method.loss(run.model, batch)) != float(run.method.loss(run.model, batch))
    assert eval_loss(run, batch) == eval_loss(run, batch)
    assert np.isfinite(run.trainer.train_epoch()["train_loss"])


@pytest.mark.parametrize("quantizer", ["lsq", "fixed"])
def test_lora_merged_quantization_is_q_of_w0_plus_ba(quantizer, cache_dir, local_pretrained, tmp_path):
    """quantize=merged: each adapted layer computes with Q(W0 + s B A) (the paper's Q of the
    full-precision weight), gradients reach A and B, the learned steps train and are checkpointed."""
    from stabray.methods.qat import MergedLoRAQuantize, lora_layers, lsq_quantize, quantize
    from stabray.train import load_run

    cfg = config(cache_dir, "alg1", model={"pretrained": local_pretrained, "lora": {"rank": 4, "alpha": 8}})
    cfg["method"]["params"] = {"lam": 0.5, "bits": 2, "quantize": "merged", "quantizer": quantizer}
    run = TrialRun(cfg)
    layers = lora_layers(run.model)
    assert layers and all(
        isinstance(lay.base_layer.parametrizations.weight[0], MergedLoRAQuantize) for _, lay in layers
    )
    _, lay = layers[0]
    with torch.no_grad():
        for p in lay.lora_B.parameters():
            p.normal_(0, 0.05)  # B = 0 at init: make the adapter matter
    a = lay.active_adapters[0]
    W0 = lay.base_layer.parametrizations.weight.original
    merged = W0 + lay.scaling[a] * lay.lora_B[a].weight @ lay.lora_A[a].weight
    q = lay.base_layer.parametrizations.weight[0].quant
    Wq = lsq_quantize(merged, q.step, q.offset, 2) if quantizer == "lsq" else quantize(merged, 2)
    x = torch.randn(3, W0.shape[1])
    torch.testing.assert_close(lay(x), x @ Wq.T, rtol=1e-5, atol=1e-6)
    lay(x).sum().backward()
    assert lay.lora_A[a].weight.grad.abs().sum() > 0 and lay.lora_B[a].weight.grad.abs().sum() > 0
    assert not W0.requires_grad  # the base stays frozen
    steps = {n: p for n, p in run.model.named_parameters() if n.endswith((".step", ".offset"))}
    assert bool(steps) == (quantizer == "lsq") and all(p.requires_grad for p in steps.values())
    run.model.zero_grad()
    run.trainer.train_epoch()
    run.save(tmp_path / "ck")
    back = dict(load_run(tmp_path / "ck").model.named_parameters())
    assert all(torch.equal(p, back[n]) for n, p in steps.items())
    with pytest.raises(UserError, match="no LoRA"):
        TrialRun({**config(cache_dir, "alg1"), "method": {"name": "alg1", "params": {"bits": 2, "quantize": "merged"}}})
