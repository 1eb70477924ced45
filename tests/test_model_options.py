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
    with pytest.raises(UserError, match="init_std 0.1 applies to the embedded decoder only"):
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


# --- randomized positions (model.positions: random; stabray.models.positions) -----------------------


def test_random_positions_remap_training_positions_only(tok):
    """Same weights: in eval mode the wrapped model equals the plain RoPE model (positions 0, 1, ...);
    in training mode it equals the plain model given the drawn table as explicit position ids
    (transformers' own position path), and differs from contiguous positions."""
    from stabray.models.positions import draw_positions

    plain = build_model(ModelSpec(preset="tiny", init_std=0.1), tok, seed=3)
    rand = build_model(ModelSpec(preset="tiny", init_std=0.1, positions="random", position_span=64), tok, seed=3)
    assert set(plain.state_dict()) == set(rand.state_dict())  # checkpoints are interchangeable
    rand.load_state_dict(plain.state_dict())
    ids = torch.randint(5, len(tok), (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain.eval(), rand.eval()
        torch.testing.assert_close(rand(input_ids=ids).logits, plain(input_ids=ids).logits, rtol=0, atol=0)
        plain.train(), rand.train()
        table = draw_positions(rand, 9, torch.Generator().manual_seed(1))
        explicit = plain(input_ids=ids, position_ids=table[None].expand(2, -1)).logits
        torch.testing.assert_close(rand(input_ids=ids).logits, explicit, rtol=0, atol=0)
        assert not torch.allclose(explicit, plain(input_ids=ids).logits)


def test_eval_stride_spaces_evaluation_positions_and_generation_keeps_them(tok):
    """model.position_eval_stride k: in eval mode position p becomes k p. A forward equals the plain
    model given 0, k, 2k, ... as position ids, and batched greedy generation (left padding, KV cache)
    equals a cache-free greedy loop on the plain model with those ids, prompt by prompt."""
    from stabray.data.encode import Encoder
    from stabray.evaluate.generate import greedy

    plain = build_model(ModelSpec(preset="tiny", init_std=0.3), tok, seed=5).eval()
    spec = ModelSpec(preset="tiny", init_std=0.3, positions="random", position_span=64, position_eval_stride=2)
    rand = build_model(spec, tok, seed=5).eval()
    rand.load_state_dict(plain.state_dict())
    ids = torch.randint(5, len(tok), (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = plain(input_ids=ids, position_ids=2 * torch.arange(9)[None].expand(2, -1)).logits
        torch.testing.assert_close(rand(input_ids=ids).logits, ref, rtol=0, atol=0)
        assert not torch.allclose(ref, plain(input_ids=ids).logits)
    enc = Encoder(tok)
    prompts = ["a b c", "[ 12 : 0.5 , a b | c ]"]
    got = greedy(rand, enc, prompts, max_new_tokens=8)
    assert sum(map(len, got)) >= 8  # something was generated to compare
    for prompt, out in zip(prompts, got):
        seq = enc.prompt(prompt)
        want = []
        with torch.no_grad():
            for _ in range(8):
                pos = 2 * torch.arange(len(seq))[None]
                nxt = int(plain(input_ids=torch.tensor([seq]), position_ids=pos).logits[0, -1].argmax())
                if nxt == enc.eos:
                    break
                want.append(nxt)
                seq.append(nxt)
        assert out == want


def test_drawn_positions_are_a_sorted_uniform_subset():
    """Each draw is strictly increasing inside 0..span-1, and every value is drawn with probability
    length/span (the inclusion probability of a uniform subset): 4,000 draws, 5 of 20, so each
    frequency is 0.25 with binomial std 0.007; the bound 0.035 is 5 std."""
    from stabray.models.positions import RandomPositions, draw_positions

    holder = torch.nn.Sequential(RandomPositions(torch.nn.Identity(), span=20))
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(20)
    for _ in range(4000):
        t = draw_positions(holder, 5, g)
        assert t.numel() == 5 and bool((t[1:] > t[:-1]).all()) and 0 <= int(t[0]) and int(t[-1]) < 20
        counts[t] += 1
    assert float((counts / 4000 - 0.25).abs().max()) < 0.035
    with pytest.raises(UserError, match="more than model.position_span=20"):
        draw_positions(holder, 21, g)


def test_drawn_span_varies_the_density_of_positions():
    """position_span_min: each step's span is drawn uniformly from max(length, span_min)..span, so the
    last position of a 5-of-(5..40) draw is below the drawn span: over 3,000 draws its mean is the
    mean over s of E[max of 5 of 0..s-1] = 5 (s + 1) / 6 - 1 (independent formula), within 5 std,
    and nearly contiguous draws (last position 4 to 6) occur."""
    from stabray.models.positions import RandomPositions, draw_positions

    holder = torch.nn.Sequential(RandomPositions(torch.nn.Identity(), span=40, span_min=1))
    g = torch.Generator().manual_seed(0)
    last = torch.tensor([float(draw_positions(holder, 5, g)[-1]) for _ in range(3000)])
    expect = sum(5 * (s + 1) / 6 - 1 for s in range(5, 41)) / 36
    assert abs(float(last.mean()) - expect) < 5 * float(last.std()) / 3000**0.5
    assert int((last <= 6).sum()) > 20 and int((last >= 35).sum()) > 60  # about 300 and 140 expected


def test_random_positions_options_are_checked(tok):
    with pytest.raises(UserError, match="needs model.family qwen2"):
        build_model(ModelSpec(preset="tiny", family="gpt2", positions="random"), tok)
    with pytest.raises(UserError, match="position_span applies to model.positions: random only"):
        build_model(ModelSpec(preset="tiny", position_span=64), tok)
    with pytest.raises(UserError, match="position_eval_stride applies to model.positions: random only"):
        build_model(ModelSpec(preset="tiny", position_eval_stride=2), tok)
    with pytest.raises(UserError, match="position_span_min=80 exceeds the span 64"):
        build_model(ModelSpec(preset="tiny", positions="random", position_span=64, position_span_min=80), tok)


@pytest.mark.parametrize("method", ["sft_cot", "coconut", "jacreg"])
def test_trial_trains_on_drawn_positions_and_evaluates_on_plain_ones(cache_dir, method):
    """A trial with random positions: every method's training runs on the step's table (the last
    step's table covers its batch), two runs with one seed draw the same tables (same weights after
    an epoch), and evaluation runs the model in eval mode, where positions are the plain ones."""
    from stabray.models.positions import RandomPositions

    cfg = {
        "task": {
            "name": "lego_cyclic",
            "params": {"n_vars": 3, "train_sizes": [2, 3], "named_states": True, "trace": "delta"},
            "train_size": 16,
            "val_size": 4,
            "test_size": 4,
            "resample_train": True,
        },
        "model": {"preset": "tiny", "init_std": 0.1, "positions": "random", "position_span": 128},
        "method": {"name": method},
        "train": {"epochs": 1, "batch_size": 8, "threads": 1},
        "eval": {"eaf_examples": 0, "loss_gap": False},
        "cache_dir": cache_dir,
    }
    runs = []
    for _ in range(2):  # one after the other: jacreg's probes come from the global RNG the run seeds
        runs.append(TrialRun(cfg))
        runs[-1].epoch()
    (mod,) = [m for m in runs[0].model.modules() if isinstance(m, RandomPositions)]
    assert mod.table is not None and int(mod.table[-1]) < 128 and mod.table.numel() > 30
    assert bool((mod.table[1:] > mod.table[:-1]).all())
    for a, b in zip(runs[0].model.parameters(), runs[1].model.parameters()):
        assert torch.equal(a, b)
    # evaluation (generation, and the EAF where on) runs in eval mode on plain positions: a one-entry
    # table would make any forward that used it fail
    said = runs[0].evaluate("val").predictions
    mod.table = mod.table[:1]
    assert "test_acc" in runs[0].final()
    assert runs[0].evaluate("val").predictions == said  # the same answers: the table was not read


# --- model.init_seed: the initial weights apart from the trial's seed -----------------------------


def _seeded_cfg(cache_dir, seed, init_seed=None):
    return {
        "task": {
            "name": "lego_cyclic",
            "params": {"n_vars": 3, "train_sizes": [2, 3], "named_states": True},
            "train_size": 24,
            "val_size": 4,
            "test_size": 4,
            "resample_train": True,
        },
        "model": {
            "preset": "tiny",
            "init_std": 0.1,
            "positions": "random",
            "position_span": 96,
            "init_seed": init_seed,
        },
        "method": {"name": "sft_cot"},
        "train": {"epochs": 1, "batch_size": 8, "threads": 1},
        "eval": {"eaf_examples": 0, "loss_gap": False},
        "seed": seed,
        "cache_dir": cache_dir,
    }


def _weights(run):
    return [p.detach().clone() for p in run.model.parameters()]


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_init_seed_sets_the_initial_weights_and_nothing_else(cache_dir):
    """init_seed k starts from seed k's weights; the order, views and position draws stay the trial
    seed's: seed 0 with init_seed 0 trains exactly as seed 0, seed 0 with init_seed 1 starts where
    seed 1 starts and ends elsewhere after an epoch (the data is the same: task.data_seed)."""
    runs = {key: TrialRun(_seeded_cfg(cache_dir, *key)) for key in [(0, None), (1, None), (0, 0), (0, 1)]}
    start = {key: _weights(r) for key, r in runs.items()}
    assert _same(start[(0, 1)], start[(1, None)]) and _same(start[(0, 0)], start[(0, None)])
    assert not _same(start[(0, 1)], start[(0, None)])
    assert [e.question for e in runs[(0, 1)].data["test"]] == [e.question for e in runs[(1, None)].data["test"]]
    for r in runs.values():
        r.epoch()
    end = {key: _weights(r) for key, r in runs.items()}
    assert _same(end[(0, 0)], end[(0, None)])  # the same run, bit for bit
    assert not _same(end[(0, 1)], end[(1, None)])  # one start, another order and other position draws


@pytest.mark.parametrize("bad", [-1, 2**32, 1.5, "one"])
def test_init_seed_must_be_a_seed(bad):
    from stabray.config import parse_trial_config

    cfg = {"task": {"name": "lego_cyclic"}, "model": {"init_seed": bad}}
    with pytest.raises(UserError, match=r"model\.init_seed"):
        parse_trial_config(cfg)
