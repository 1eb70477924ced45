"""The embedded tokenizer's vocabulary is what the cached splits hold (and 0..127 with numbers "word"),
so text drawn later (a fresh training split under task.resample_train, a saved model read at other
sizes) can hold tokens it lacks, which the model would read, and be trained to write, as <unk>.
Such text is refused with the tokens named: by `make_run` before any training, by the sweep's
driver before Ray's trials start, and by a run that loads a saved tokenizer."""

from __future__ import annotations

from collections import Counter

import pytest

from stabray.errors import UserError

DIJKSTRA = {
    "task": {
        "name": "dijkstra",
        "params": {"n_nodes": 4, "decimals": 3},
        "train_size": 60,
        "val_size": 8,
        "test_size": 8,
        "resample_train": True,
    },
    "model": {"preset": "tiny"},
    "method": {"name": "sft_cot"},
    "train": {"epochs": 2, "max_steps_per_epoch": 1},
    "eval": {"eaf_examples": 0, "loss_gap": False, "decomposition_examples": 0},
}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("STABRAY_CACHE", str(tmp_path / "cache"))


def config(**sections) -> dict:
    import copy

    c = copy.deepcopy(DIJKSTRA)
    for k, v in sections.items():
        c[k] = {**c[k], **v}
    return c


def encoded_unknowns(tok, texts) -> Counter:
    """The reference: what the tokenizer itself encodes as <unk>, located by its offsets."""
    out = Counter()
    for t in texts:
        enc = tok(t, add_special_tokens=False, return_offsets_mapping=True)
        out.update(t[a:b] for i, (a, b) in zip(enc["input_ids"], enc["offset_mapping"]) if i == tok.unk_token_id)
    return out


def test_unknown_tokens_are_what_the_tokenizer_encodes_as_unk():
    """Counted against the tokenizer's own encoding: new numbers and words (words mode), new words only
    (digits mode: every number is digit pieces), and a letter no pre-token covers (the encoded path)."""
    from stabray.data.tokenizer import build_tokenizer, unknown_tokens

    seen = ["dist a 0.25 b 130 | c", "a b c 7"]
    later = ["dist a 0.5 b 0.25 | zeta 130 131 0.5", "c 127 eta", "a \u00e9t\u00e9 b", "<bot><latent> a<eot> 0.5"]
    tok = build_tokenizer(seen)
    got = unknown_tokens(tok, later)
    assert got == encoded_unknowns(tok, later)
    assert {k: got[k] for k in ("0.5", "zeta", "131", "eta")} == {"0.5": 3, "zeta": 1, "131": 1, "eta": 1}
    assert "127" not in got and sum(v for k, v in got.items() if "\u00e9" in k) >= 1  # 0..127 always in
    assert unknown_tokens(tok, seen) == Counter()
    digits = build_tokenizer(seen, numbers="digits")
    got = unknown_tokens(digits, later)
    assert got == encoded_unknowns(digits, later)
    assert got["zeta"] == 1 and got["eta"] == 1 and not any(k[0].isdigit() for k in got)


def test_make_run_refuses_fresh_training_text_it_cannot_read_before_training():
    """3-decimal Dijkstra distances in a fresh split are mostly new numbers: refused at make_run (which
    builds, but does not train), with the count, the tokens and the fix; the fix (digits) builds and
    reads epoch 1 whole; without resample_train nothing is drawn later, so nothing is refused."""
    from stabray.train.runner import make_run

    with pytest.raises(UserError) as e:
        make_run(config())
    msg = str(e.value)
    assert msg.startswith("task.resample_train: epoch 1's fresh training split holds ")
    assert "that the tokenizer (built from the cached splits) lacks and would read as <unk>: '" in msg
    assert msg.endswith("set model.numbers: digits (a number is one token per digit, so every number is known)")
    run = make_run(config(model={"numbers": "digits"}))
    unk = run.tokenizer.unk_token_id
    texts = [t for e in run.fresh_train(1) for t in (e.question, e.answer)]
    assert unk not in {i for t in texts for i in run.tokenizer(t)["input_ids"]}
    make_run(config(task={"resample_train": False}))


def test_a_later_epochs_unknown_token_is_refused_when_drawn(monkeypatch):
    """Epoch 1 is checked at make_run; a later epoch's split as it is drawn (the same message, its
    epoch named). A word the vocabulary lacks is named with the other fix."""
    import dataclasses

    import stabray.train.run as run_mod
    from stabray.train.runner import make_run

    run = make_run(config(task={"params": {"n_nodes": 4, "decimals": 1}}))
    real = run_mod.fresh_split

    def with_a_new_word(c, task, data, epoch):
        exs = real(c, task, data, epoch)
        if epoch == 3:
            exs[0] = dataclasses.replace(exs[0], final=exs[0].final + " zebra")
        return exs

    monkeypatch.setattr(run_mod, "fresh_split", with_a_new_word)
    assert run.fresh_train(2)
    with pytest.raises(UserError) as e:
        run.fresh_train(3)
    assert str(e.value).startswith("task.resample_train: epoch 3's fresh training split holds 1 token(s) in 60 ")
    fix = "set task.resample_train: false (train on the cached split, whose text the tokenizer holds)"
    assert str(e.value).endswith(f"<unk>: 'zebra' (1x); {fix}")


def test_a_saved_tokenizer_refuses_splits_it_cannot_read(tmp_path):
    """A saved 1-decimal run read with 3-decimal questions (load_run's overrides, as answer_probe's
    --long-sizes uses them): refused, naming the split, the checkpoint's tokenizer and what can help
    (no setting adds tokens to a saved vocabulary); the same run read as saved loads."""
    from stabray.train.runner import load_run, make_run

    run = make_run(config(task={"params": {"n_nodes": 4, "decimals": 1}, "resample_train": False}))
    run.save(tmp_path / "m")
    assert load_run(tmp_path / "m").data["test"] == run.data["test"]
    for more in ({}, {"model": {"numbers": "digits"}}):  # the saved vocabulary decides, not the config
        with pytest.raises(UserError) as e:
            load_run(tmp_path / "m", {"task": {"params": {"decimals": 3}}, **more})
        msg = str(e.value)
        assert msg.startswith(f"split 'train' (read with the saved tokenizer of {tmp_path / 'm' / 'tokenizer'}) holds ")
        assert "that the checkpoint's tokenizer (built from its training run's splits) lacks" in msg
        assert msg.endswith(
            "; score it on text like its training run's; a model trained with model.numbers: digits reads every number"
        )


def test_no_cot_is_judged_on_the_text_it_reads():
    """No CoT reads the question without the hint and writes the final answer alone: a number only in
    the steps is not its problem. Countdown's new intermediate results (past 127, in the steps) refuse
    SFT-CoT and not No CoT, whose epoch-1 text the tokenizer reads whole."""
    from stabray.train.run import method_texts
    from stabray.train.runner import make_run

    cd = {
        "name": "countdown",
        "params": {},
        "train_size": 1000,
        "val_size": 50,
        "test_size": 50,
        "resample_train": True,
    }
    base = {**DIJKSTRA, "task": cd, "model": {"preset": "tiny", "numbers": "word"}}
    with pytest.raises(UserError, match="set model.numbers: digits"):
        make_run({**base, "method": {"name": "sft_cot"}})
    run = make_run({**base, "method": {"name": "no_cot"}})
    texts = method_texts(run.method, run.fresh_train(1))
    assert encoded_unknowns(run.tokenizer, texts) == Counter()
    assert all("|" not in t for t in texts[1::2])  # targets: the final alone


def test_the_sweep_driver_refuses_before_any_trial(tmp_path):
    """The driver's head start (while Ray starts) finds the refusal a trial would meet, so no MLflow run
    or trial exists; the shipped countdown spec (digits) passes, with words it is refused."""
    from stabray.spec import load_spec
    from stabray.tune.sweep import prewarm

    def problem(name, overrides=None):
        spec, _ = load_spec(name, overrides)
        t = prewarm(spec, data=True)
        t.join(timeout=300)
        assert not t.is_alive()
        return t.problem

    assert problem("countdown") is None
    got = problem("countdown", {"model.numbers": "word"})
    assert str(got).startswith("task.resample_train: epoch 1's fresh training split holds ")
    assert "set model.numbers: digits" in str(got)
