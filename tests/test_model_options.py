"""Options of the embedded decoder used by the laptop calibration: position encodings (ALiBi via
Bloom, NoPE via GPT-2 without positions), the initialisation std, frozen embeddings and digit-level
numbers."""

from __future__ import annotations

import pytest
import torch

from stabray.data.tokenizer import build_tokenizer
from stabray.errors import UserError
from stabray.models.build import ModelSpec, build_model
from stabray.tasks.base import normalize_answer
from stabray.train.run import TrialRun


@pytest.fixture
def tok():
    return build_tokenizer(["a b c [ ] 0.5 | 12 : ,"])


def test_alibi_model_has_no_positions_and_biases_by_distance(tok):
    """Bloom (ALiBi): no position table, so shifting the same tokens later in the sequence (after
    padding that attention masks out) leaves the outputs unchanged."""
    model = build_model(ModelSpec(preset="tiny", family="bloom", init_std=0.1), tok).eval()
    assert not any("position" in n or "wpe" in n for n, _ in model.named_parameters())
    ids = torch.tensor([[5, 6, 7, 8]])
    pad = tok.pad_token_id
    shifted = torch.tensor([[pad, pad, 5, 6, 7, 8]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1]])
    with torch.no_grad():
        a = model(input_ids=ids).logits[0]
        b = model(input_ids=shifted, attention_mask=mask).logits[0, 2:]
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_nope_model_is_blind_to_positions_but_not_to_order(tok):
    """GPT-2 with its position table zeroed and frozen: a token's output depends on the tokens
    before it (causal attention), not on absolute position ids. With 2 layers the order of earlier
    tokens matters (each earlier token saw a different prefix); one layer would see only their set."""
    model = build_model(ModelSpec(preset="mini", family="gpt2", positions="none"), tok).eval()
    wpe = model.transformer.wpe.weight
    assert not wpe.requires_grad and wpe.abs().sum() == 0
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        a = model(input_ids=ids).logits
        b = model(input_ids=ids, position_ids=torch.tensor([[40, 41, 42, 43]])).logits
        c = model(input_ids=torch.tensor([[6, 5, 7, 8]])).logits
    torch.testing.assert_close(a, b)
    assert not torch.allclose(a[0, -1], c[0, -1])  # the order of earlier tokens still matters
    with_pos = build_model(ModelSpec(preset="tiny", family="gpt2"), tok).eval()
    with torch.no_grad():
        assert not torch.allclose(
            with_pos(input_ids=ids).logits,
            with_pos(input_ids=ids, position_ids=torch.tensor([[40, 41, 42, 43]])).logits,
        )


def test_positions_none_needs_gpt2(tok):
    with pytest.raises(UserError, match="needs model.family gpt2"):
        build_model(ModelSpec(preset="tiny", family="qwen2", positions="none"), tok)


@pytest.mark.parametrize("family", ["qwen2", "gpt2", "bloom"])
def test_init_std_sets_the_weight_scale(family):
    """The empirical std of the token embeddings (normal init, thousands of entries) is the
    configured one to within 5%; without the option it is transformers' 0.02."""
    tok = build_tokenizer([" ".join(f"w{i}" for i in range(300))])
    spec = ModelSpec(preset="mini", family=family)
    default = build_model(spec, tok).get_input_embeddings().weight.detach()
    wide = build_model(ModelSpec(preset="mini", family=family, init_std=0.1), tok).get_input_embeddings().weight
    assert float(default.std()) == pytest.approx(0.02, rel=0.05)
    assert float(wide.detach().std()) == pytest.approx(0.1, rel=0.05)


def test_embedded_only_options_refuse_a_pretrained_model(tok):
    with pytest.raises(UserError, match="init_std applies to the embedded decoder only"):
        build_model(ModelSpec(pretrained="/nonexistent", init_std=0.1), tok)


def test_digit_tokenizer_round_trips_numbers():
    text = "s: 3, A: [[0.0 0.6], [0.7 1.0]]\ntrace | pi:\n[3 1 2 3] | [52134 13245]"
    tok = build_tokenizer([text], numbers="digits")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id not in ids
    pieces = tok.convert_ids_to_tokens(tok("52134 0.25", add_special_tokens=False)["input_ids"])
    assert pieces == ["5", "##2", "##1", "##3", "##4", "0", "##.", "##2", "##5"]
    assert normalize_answer(tok.decode(ids)) == normalize_answer(text)
    # a number never seen is still made of known pieces (that is the point of digits)
    unseen = tok("987.65", add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id not in unseen and tok.decode(unseen).strip() == "987.65"


def test_trial_with_the_options(cache_dir):
    cfg = {
        "task": {
            "name": "lego_cyclic",
            "params": {"n_vars": 3, "train_sizes": [2, 3], "named_states": True},
            "train_size": 32,
            "val_size": 8,
            "test_size": 8,
            "resample_train": True,
        },
        "model": {"preset": "tiny", "freeze_embeddings": True, "init_std": 0.1, "numbers": "digits"},
        "method": {"name": "sft_cot"},
        "train": {"epochs": 2, "batch_size": 8, "threads": 1},
        "eval": {"eaf_examples": 0, "loss_gap": False},
        "cache_dir": cache_dir,
    }
    run = TrialRun(cfg)
    emb = run.model.get_input_embeddings().weight.detach().clone()
    assert run.model.config.initializer_range == 0.1
    first = [p.detach().clone() for p in run.model.parameters() if p.requires_grad]
    for _ in range(2):
        assert torch.isfinite(torch.tensor(run.epoch()["train_loss"]))
    assert torch.equal(emb, run.model.get_input_embeddings().weight)  # frozen
    after = [p for p in run.model.parameters() if p.requires_grad]
    assert any(not torch.equal(a, b) for a, b in zip(first, after))  # the rest trains
    assert {e.meta["n"] for e in run.data["test_long"]} == {4}
    assert set(run.final()) >= {"test_acc", "test_long_acc", "test_longer_acc", "trivial_test_long_acc"}
