"""Multi-token prediction: the loss equals CE_1 + w * sum_j CE_j computed by hand, position by
position; the heads are part of the model (parameters, checkpoints) but not of its forward pass or
decoding; only the intended parameters get gradients; it trains on a tiny star-graph trial."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import scored_by_hand

from stabray.data.tokenizer import build_tokenizer
from stabray.errors import UserError
from stabray.methods import get_method
from stabray.models import ModelSpec, build_model


def tiny(preset="tiny", **kw):
    tok = build_tokenizer(["a b c d e [ ] |"])
    return build_model(ModelSpec(preset=preset, **kw), tok, seed=0), tok


def hand_batch(vocab: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, vocab, (2, 9), generator=g)
    labels = ids.clone()
    labels[0, :3] = -100  # prompt
    labels[1, :5] = -100
    labels[1, 8] = -100  # padding
    mask = torch.ones_like(ids)
    mask[1, 8] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


@pytest.mark.parametrize("head,from_layer", [("linear", -1), ("mlp", 1), ("mlp", 0)])
def test_loss_is_sum_of_per_offset_cross_entropies(head, from_layer):
    model, tok = tiny()
    method = get_method("mtp", k=4, head=head, mtp_weight=0.3, from_layer=from_layer)
    model = method.prepare(model)
    batch = hand_batch(len(tok))
    loss = method.loss(model, batch)

    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True)
    h = out.hidden_states[from_layer]
    logits = {1: out.logits}
    for j, hd in enumerate(model.mtp_heads.heads, start=2):
        logits[j] = model.get_output_embeddings()(hd(h))
    expected = 0.0
    labels = batch["labels"]
    for j in range(1, 5):  # offset j: logits at t against the label at t + j, mean over valid pairs
        pred, gold = [], []
        for b in range(labels.shape[0]):
            for t in range(labels.shape[1] - j):
                if labels[b, t + j] != -100:
                    pred.append(logits[j][b, t])
                    gold.append(labels[b, t + j])
        ce = F.cross_entropy(torch.stack(pred), torch.stack(gold))
        expected = expected + (1.0 if j == 1 else 0.3) * ce
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    # the next-token term is the model's own loss
    torch.testing.assert_close(method.losses(model, batch)[0], model(**batch).loss, rtol=1e-5, atol=1e-6)


def test_heads_are_parameters_but_not_in_the_forward_pass():
    model, tok = tiny()
    ids = torch.randint(10, len(tok), (1, 6))
    before = model(input_ids=ids).logits
    n_before = sum(p.numel() for p in model.parameters())
    method = get_method("mtp", k=3, head="mlp")
    model = method.prepare(model)
    assert len(model.mtp_heads.heads) == 2  # offsets 2 and 3
    assert sum(p.numel() for p in model.parameters()) > n_before
    assert any(k.startswith("mtp_heads.") for k in model.state_dict())
    torch.testing.assert_close(model(input_ids=ids).logits, before)
    assert method.generate.__func__ is get_method("sft_cot").generate.__func__  # ordinary decoding


def test_only_intended_parameters_get_gradients():
    # the heads read the first block's output of a 2-layer model: their loss must reach the heads,
    # the embeddings and block 0, and nothing in block 1 (the MTP planning paper's "shallow head" decoupling)
    model, tok = tiny("mini")
    method = get_method("mtp", k=3, from_layer=1)
    model = method.prepare(model)
    batch = hand_batch(len(tok))
    extra = torch.stack(method.losses(model, batch)[1:]).sum()
    extra.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert all(g is not None and g.abs().sum() > 0 for n, g in grads.items() if n.startswith("mtp_heads."))
    assert grads["model.embed_tokens.weight"].abs().sum() > 0
    assert any(g is not None and g.abs().sum() > 0 for n, g in grads.items() if ".layers.0." in n)
    assert all(
        g is None or g.abs().sum() == 0 for n, g in grads.items() if ".layers.1." in n or n == "model.norm.weight"
    )
    # the full loss (step) reaches every parameter of the trunk and the heads
    model.zero_grad(set_to_none=True)
    method.step(model, batch)
    assert all(p.grad is not None for p in model.parameters())


def test_qat_quantizes_the_trunk_not_the_heads():
    from torch.nn.utils import parametrize

    model, _ = tiny()
    model = get_method("mtp", k=2, bits=2).prepare(model)
    assert parametrize.is_parametrized(model.model.layers[0].self_attn.q_proj)
    assert not any(parametrize.is_parametrized(m) for m in model.mtp_heads.modules())


def test_compression_reuses_algorithm_1():
    from stabray.tasks.base import Example

    ex = Example("q", tuple(str(i) for i in range(10)), "f", "q")
    m = get_method("mtp", lam=0.2)
    a = m.train_view(ex, 0, np.random.default_rng([0, 0]))[1]
    b = get_method("alg1", lam=0.2).train_view(ex, 0, np.random.default_rng([0, 0]))[1]
    assert a == b and len(a) == 2
    assert get_method("mtp").train_view(ex, 0, np.random.default_rng(0))[1] == ex.steps


@pytest.mark.parametrize(
    "params,field",
    [
        ({"k": 1}, "k"),
        ({"k": 8}, "k"),
        ({"head": "conv"}, "head"),
        ({"mtp_weight": -1.0}, "mtp_weight"),
        ({"lam": 0.0}, "lam"),
        ({"bits": 5}, "bits"),
        ({"heads": 2}, "heads"),
    ],
)
def test_bad_params(params, field):
    with pytest.raises(UserError, match=field):
        get_method("mtp", **params)


def test_from_layer_out_of_range():
    model, _ = tiny()
    with pytest.raises(UserError, match="from_layer"):
        get_method("mtp", from_layer=5).prepare(model)


def star_config(cache_dir, method):
    return {
        "task": {"name": "star_graph", "params": {"path_len": 4}, "train_size": 64, "val_size": 8, "test_size": 8},
        "model": {"preset": "tiny"},
        "method": method,
        "train": {"epochs": 4, "batch_size": 16, "lr": 1e-2, "warmup_steps": 1},
        "eval": {"eaf_examples": 2, "eaf_iters": 2, "long_splits": ["test_long"], "loss_gap": False},
        "seed": 0,
        "device": "cpu",
        "cache_dir": cache_dir,
    }


def test_mtp_trial_trains_and_checkpoints(cache_dir, tmp_path):
    from stabray.train import load_run
    from stabray.train.run import TrialRun

    run = TrialRun(star_config(cache_dir, {"name": "mtp", "params": {"k": 3, "head": "linear", "bits": 4}}))
    ms = [run.epoch() for _ in range(4)]
    losses = [m["train_loss"] for m in ms]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    val = run.evaluate("val")
    assert np.isfinite(ms[-1]["val_eaf"]) and ms[-1]["val_acc"] == val.acc == scored_by_hand(
        run.data["val"], val.predictions
    )
    run.save(tmp_path / "ck")
    back = load_run(tmp_path / "ck")
    for a, b in zip(run.model.mtp_heads.parameters(), back.model.mtp_heads.parameters()):
        torch.testing.assert_close(a, b)
