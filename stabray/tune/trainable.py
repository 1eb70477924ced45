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

from typing import Any

import torch

from stabray.record import unwrap
from stabray.tune.report import assigned_cpus, get_checkpoint_dir, placement, report


def trainable(config: dict[str, Any]) -> None:
    from stabray.train import make_run
    from stabray.train.loop import kernels

    config = unwrap(config)
    if not config.get("train", {}).get("threads"):
        torch.set_num_threads(assigned_cpus())
    run = make_run(config)
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
