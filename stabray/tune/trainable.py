"""The Ray Tune function trainable. Any Ray pipeline can pass it to its own `Tuner` with a config
dict (the `TrialConfig` layout: task, model, method, train, eval, seed).

Per epoch it reports the runner's per-epoch metrics (train_loss, val_acc, val_eaf, times); after the last
epoch also the final ones (test_acc, test_long_acc, test_longer_acc, test_loss_gap, test_eaf,
best_val_acc, best_epoch; every name is declared in `stabray.record.METRICS`), plus the eq. (4)
table under `stabray.record.STABILITY_TABLE` when `eval.decomposition_examples` > 0. Its first result after
each start or restore also says what computed it (`stabray.record.KERNEL_KEYS`). It checkpoints
every epoch and resumes from Ray's checkpoint. It uses the GPU Ray assigns, else the CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from stabray.config import TrialConfig, parse_trial_config
from stabray.errors import UserError
from stabray.record import unwrap
from stabray.tune.report import assigned_cpus, get_checkpoint_dir, placement, report


def trainable(config: dict[str, Any] | TrialConfig) -> None:
    from stabray.train import make_run
    from stabray.train.loop import kernels

    cfg = config if isinstance(config, TrialConfig) else parse_trial_config(unwrap(config))
    if cfg.cache_dir is not None and not Path(cfg.cache_dir).expanduser().is_absolute():
        raise UserError(
            f"trial config: cache_dir {cfg.cache_dir!r} is relative, and Ray runs each trial in its own folder "
            "(each would generate and cache the data apart); give an absolute path"
        )
    if not cfg.train.threads:
        torch.set_num_threads(assigned_cpus())
    run = make_run(cfg)
    get_checkpoint_dir(run.load)  # a restored trial continues from its last epoch
    first = True
    while not run.done:
        m = run.epoch()
        if first:  # what computes this trial's numbers, once per start or restore (MLflow tags)
            m.update(kernels(getattr(run, "device", None)))
            first = False
        if run.done:
            m.update(run.final())
            m.update(run.best_epoch())
            m.update(run.final_stability())
        m.update(placement())
        report(m, save=run.save)
