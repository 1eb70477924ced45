"""scripts/answer_probe.py: how a LEGO final state differs from the example's, and the teacher-forced
reading of a saved model checked against greedy decoding from the same prefix."""

from __future__ import annotations

import pytest
import torch

from tests.test_script_input import exit_code
from tests.test_sizes import load_calibrate

probe = load_calibrate("answer_probe")


def test_entries_and_first_difference_by_hand():
    gold = probe.entries("[c 1 f 0 l 2 r 2]")
    assert gold == [("c", "1"), ("f", "0"), ("l", "2"), ("r", "2")]
    assert probe.entries("[c 1 f]") == [("c", "1"), ("f", "")]
    diff = probe.first_difference
    assert diff(gold, gold) is None
    assert diff(gold, probe.entries("[c 1 l 2 r 2]")) == ("left out", 1)  # f skipped
    assert diff(gold, probe.entries("[c 1 f 0 r 2]")) == ("left out", 2)  # l skipped
    assert diff(gold, probe.entries("[c 1 f 0 l 2]")) == ("ended", 3)  # the last one missing
    assert diff(gold, probe.entries("[c 1 f 3 l 2 r 2]")) == ("value", 1)
    assert diff(gold, probe.entries("[c 1 z 0 l 2 r 2]")) == ("other name", 1)
    assert diff(gold, probe.entries("[f 0 c 1 l 2 r 2]")) == ("left out", 0)  # a later name first
    assert diff(gold, probe.entries("[c 1 f 0 c 1 r 2]")) == ("other name", 2)  # an earlier name again
    assert diff(gold, probe.entries("[c 1 f 0 l 2 r 2 s 1]")) == ("too long", 4)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from stabray.train.run import TrialRun

    root = tmp_path_factory.mktemp("probe")
    cfg = {
        "task": {
            "name": "lego_cyclic",
            "params": {"train_sizes": [2, 3], "long_sizes": [4], "named_states": True, "trace": "delta_op"},
            "train_size": 64,
            "val_size": 8,
            "test_size": 12,
        },
        "model": {"preset": "tiny", "positions": "random", "position_span": 96, "position_eval_stride": [1, 2]},
        "method": {"name": "sft_cot"},
        "train": {"epochs": 1, "batch_size": 16, "lr": 3e-3, "warmup_steps": 1},
        "eval": {"eaf_examples": 0, "loss_gap": False, "decomposition_examples": 0},
        "seed": 0,
        "device": "cpu",
        "cache_dir": str(root / "cache"),
    }
    run = TrialRun(cfg)
    run.epoch()
    run.save(root / "model")
    return run, root / "model"


def test_saved_model_reads_back_the_same(saved):
    run, path = saved
    back = probe.load(path)
    ref = run.model.state_dict()
    assert all(torch.equal(v, ref[k]) for k, v in back.model.state_dict().items())
    assert back.data["test_n4"][0].answer == run.data["test_n4"][0].answer


def test_saved_model_reads_other_sizes(saved):
    """--long-sizes: the same weights, the trial's other splits unchanged, longer test splits at the
    asked sizes (each example of that many variables), named test_n<k>; a size the task refuses is
    named."""
    from stabray.errors import UserError

    run, path = saved
    back = probe.load(path, [5, 6])
    ref = run.model.state_dict()
    assert all(torch.equal(v, ref[k]) for k, v in back.model.state_dict().items())
    assert tuple(back.long_splits) == ("test_n5", "test_n6") and "test_n4" not in back.data
    assert back.data["test"] == run.data["test"] and back.data["val"] == run.data["val"]
    for k in (5, 6):
        assert {len(probe.entries(e.final)) for e in back.data[f"test_n{k}"]} == {k}
    with pytest.raises(UserError, match="long_sizes: every entry .* must be an integer in 2..25, got 0"):
        probe.load(path, [0])


def test_name_positions_point_at_the_names(saved):
    run, _ = saved
    for ex in run.data["test_n4"][:6]:
        ids, names, in_vars = probe.name_positions(run, ex)
        written = [run.tokenizer.decode([ids[q]]).strip() for q in names]
        assert written == [n for n, _ in probe.entries(ex.final)] == sorted(written)
        assert [run.tokenizer.decode([ids[q]]).strip() for q in in_vars] == written
        assert all(a > b for a, b in zip(names, in_vars))


def test_teacher_forced_top_token_is_greedy_decodings_next(saved):
    """At every entry, the forced top token is what greedy decoding writes after that entry's gold prefix
    (prompt, chain and the entries before it), each example at the model's own stride."""
    from stabray.evaluate.generate import greedy
    from stabray.models.positions import eval_stride

    run = probe.load(saved[1])
    exs = run.data["test_n4"][:6] + run.data["test"][:6]
    forced = probe.teacher_forced(run, exs)
    strides = probe.strides(run, exs)
    assert set(strides) <= {1, 2}
    checked = 0
    for ex, f, k in zip(exs, forced, strides):
        ids, names, _ = probe.name_positions(run, ex)
        for (ok, tok), q in zip(f, names):
            text = run.tokenizer.decode(ids[1:q])  # the prefix up to the entry's name, BOS off
            with eval_stride(run.model, k):
                (nxt,) = greedy(run.model, run.encoder, [text], max_new_tokens=1)
            assert run.encoder.prompt(text) == ids[:q]  # the same tokens as the forced read
            assert (nxt[:1] == [ids[q]]) == ok and run.tokenizer.decode(nxt[:1]).strip() == tok
            checked += 1
    assert checked == sum(len(probe.entries(e.final)) for e in exs)


def test_training_distances_follow_the_drawn_tables(saved):
    """Quantiles ordered, every distance positive (the answer comes after the question) and inside the span."""
    run, _ = saved
    got = probe.training_distances(run, batches=20)
    assert set(got) == {"0", "1", "2"}  # training chains have at most 3 variables
    for q5, q50, q95, top in got.values():
        assert 0 < q5 <= q50 <= q95 <= top < 96
    assert all(getattr(m, "table", None) is None for m in run.model.modules())


def test_calibrate_save_refuses_a_file_before_training(tmp_path, monkeypatch, capsys):
    """`calibrate.py --save` at a path that is a file stops before a model is built (no TrialRun)."""
    calibrate = load_calibrate("calibrate")
    (tmp_path / "f").write_text("x")
    monkeypatch.setattr("stabray.train.run.TrialRun.__init__", lambda *a, **k: pytest.fail("trained anyway"))
    argv = [
        "calibrate.py",
        "l89_cyc_mix25w1113_deltaop_randpos192_h128_l3_e160_lr1e3_wd1e1",
        "--save",
        str(tmp_path / "f"),
    ]
    monkeypatch.setattr("sys.argv", argv)
    assert (
        exit_code(calibrate.main) == 2
        and "--save " + str(tmp_path / "f") + ": a file is there" in capsys.readouterr().err
    )
