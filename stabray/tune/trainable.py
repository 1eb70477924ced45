"""The Ray Tune function trainable. Any Ray pipeline can pass it to its own `Tuner` with a config
dict (the `TrialConfig` layout: task, model, method, train, eval, seed).

Per epoch it reports train_loss, val_acc, eaf (and times); after the last epoch also test_acc,
test_long_acc, test_longer_acc, loss_gap, final_eaf, best_val_acc, best_epoch, plus the eq. (4)
decomposition rows under `stability_table` when `eval.decomposition_examples` > 0. It checkpoints
every epoch and resumes from Ray's checkpoint. It uses the GPU Ray assigns, else the CPU.
"""

from __future__ import annotations

from typing import Any

import torch

from stabray.tune.report import assigned_cpus, get_checkpoint_dir, placement, report

BUNDLE = "trial_config"  # a param space may hold whole configs under this key (grid over configs)


def unwrap(config: dict[str, Any]) -> dict[str, Any]:
    return config[BUNDLE] if BUNDLE in config else config


def trainable(config: dict[str, Any]) -> None:
    from stabray.train.run import make_run

    config = unwrap(config)
    if not config.get("train", {}).get("threads"):
        torch.set_num_threads(assigned_cpus())
    run = make_run(config)
    get_checkpoint_dir(run.load)  # a restored trial continues from its last epoch
    epochs = run.train_cfg.epochs
    while run.trainer.epoch < epochs:
        m = run.epoch()
        if run.trainer.epoch == epochs:
            m.update(run.final())
            m.update(run.best_epoch())
            m.update(final_stability(run))
        m.update(placement())
        report(m, save=run.save)


def final_stability(run) -> dict[str, Any]:
    """eq. (4) decomposition and weight-noise stability at the end, when configured."""
    out: dict[str, Any] = {}
    ev = run.cfg.eval
    if ev.decomposition_examples and not getattr(getattr(run, "method", None), "latent_thoughts", False):
        # (undefined for latent thoughts: they have no true step values)
        out["stability_table"] = run.decomposition(ev.decomposition_examples)
    if ev.weight_noise_seeds:
        out["weight_noise_loss_increase"] = run.weight_noise(ev.weight_noise_seeds)
    return out
