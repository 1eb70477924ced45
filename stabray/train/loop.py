"""The plain-PyTorch training loop. It imports neither Ray nor MLflow: the Ray trainable, the
benchmarks and users' own scripts all drive this same `Trainer`."""

from __future__ import annotations

import math
import time
from typing import Callable

import numpy as np
import torch

from stabray.config import TrainCfg
from stabray.data.encode import Encoder, collate
from stabray.errors import UserError
from stabray.methods.base import Method
from stabray.models.positions import draw_positions, has_random_positions
from stabray.tasks.base import Example


def pick_device(prefer: str = "auto") -> torch.device:
    """The torch device for `prefer`: "cpu"; "cuda" (an error when torch sees no GPU: never a silent
    fall back to the CPU); "auto": the GPU when torch sees one, else the CPU."""
    if prefer == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if prefer == "cuda":
        raise UserError(
            "device: cuda, but torch sees no CUDA GPU here (torch.cuda.is_available() is False: no GPU on "
            f"this node or none given to this process, or a CPU build of torch, {torch.__version__}); "
            "use device: auto or cpu"
        )
    return torch.device("cpu")


def kernels(device: torch.device | None = None) -> dict[str, str]:
    """What computes the numbers on `device` (default: the CPU): torch's version (`torch`) and the kernel
    path (`kernels`): ATen's CPU capability (AVX512, AVX2, ...; `ATEN_CPU_CAPABILITY` can lower it), the CPU
    model and the torch thread count, or the CUDA version and GPU name.

    The same spec and seed give bit-identical losses on the same path, but another path sums in another
    order: measured on the laptop profile L09, `ATEN_CPU_CAPABILITY=avx2` (or `MKL_CBWR=COMPATIBLE`)
    instead of AVX512 moves the training loss at the 4th decimal by epoch 3, and the final accuracies then
    differ by a few points. Results from different paths are draws, not reruns (docs/calibration.md)."""
    device = device or torch.device("cpu")
    if device.type == "cuda":
        path = f"cuda {torch.version.cuda}, {torch.cuda.get_device_name(device)}"
    else:
        n = torch.get_num_threads()
        path = f"cpu {torch.backends.cpu.get_cpu_capability()}, {cpu_model()}, {n} thread{'s' if n != 1 else ''}"
    return {"torch": torch.__version__, "kernels": path}


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo, else `platform.processor()`, else "unknown CPU")."""
    import platform
    from pathlib import Path

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def lr_schedule(optimizer, cfg: TrainCfg, total_steps: int, offset: int = 0) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over cfg.warmup_steps, then constant or cosine down to 10% of the peak, over
    `total_steps`; the scheduler's step k reads the schedule at k + offset (a fresh optimizer that
    keeps the schedule's place)."""
    total = max(1, total_steps)

    def lr_lambda(k: int) -> float:
        step = k + offset
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.schedule == "constant":
            return 1.0
        frac = min(1.0, (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)


class Trainer:
    """Owns the model, optimizer, schedule and epoch counter; `train_epoch()` runs one epoch."""

    def __init__(
        self,
        model: torch.nn.Module,
        method: Method,
        encoder: Encoder,
        train_data: list[Example] | Callable[[int], list[Example]],
        cfg: TrainCfg,
        seed: int = 0,
        device: torch.device | str = "cpu",
    ):
        self.model, self.method, self.encoder, self.cfg, self.seed = model, method, encoder, cfg, seed
        self.device = torch.device(device)
        self.train_data = train_data
        self.epoch = 0  # epochs completed
        self.params = method.trainable_parameters(model)
        n = len(self._examples(0))
        steps = math.ceil(n / cfg.batch_size)
        self.steps_per_epoch = min(steps, cfg.max_steps_per_epoch) if cfg.max_steps_per_epoch else steps
        self.total_steps = self.steps_per_epoch * cfg.epochs
        # The schedule in use: (start, total, offset) = it was (re)built at global step `start` over
        # `total` steps, reading the schedule at k + offset (stored in checkpoints: a resumed run
        # rebuilds the same one). Resets (Method.on_train_step) rebuild it.
        self.sched = (0, self.total_steps, 0)
        self._build_optimizer()
        self.resets = 0  # optimizer resets so far
        self.autocast = self.device.type == "cuda" and torch.cuda.is_bf16_supported()
        self.random_positions = has_random_positions(model)  # model.positions: random

    def _build_optimizer(self) -> None:
        self.optimizer = torch.optim.AdamW(self.params, lr=self.cfg.lr, weight_decay=self.cfg.weight_decay)
        _, total, offset = self.sched
        self.scheduler = lr_schedule(self.optimizer, self.cfg, total, offset)

    def reset(self, what: str, step: int) -> None:
        """A fresh optimizer at global step `step`; what="schedule" also restarts the learning-rate
        schedule (warm-up, then its shape) over the remaining steps, "optimizer" keeps its place."""
        if what == "schedule":
            self.sched = (step, self.total_steps - step, 0)
        elif what == "optimizer":
            start, total, offset = self.sched
            self.sched = (step, total, offset + step - start)
        else:
            raise ValueError(f"reset must be 'optimizer' or 'schedule', got {what!r}")
        self._build_optimizer()
        self.resets += 1

    def _examples(self, epoch: int) -> list[Example]:
        return self.train_data(epoch) if callable(self.train_data) else self.train_data

    def train_epoch(self) -> dict[str, float]:
        """One epoch; returns train_loss (mean over steps), tokens (non-pad) and tokens_per_s."""
        epoch = self.epoch
        rng = np.random.default_rng([self.seed, epoch])  # shuffling and per-epoch step resampling
        examples = self._examples(epoch)
        bs = self.cfg.batch_size
        losses, tokens, t0 = [], 0, time.perf_counter()  # the epoch's time includes encoding, either way
        # Randomized positions: a step's table holds one position per token of its longest row, drawn over
        # the whole span, so its density follows that length. Uniform batches nearly always hold one of
        # the longest examples; grouped ones draw for the epoch's longest too, not for their own length
        # (a batch of short rows would otherwise see positions twice as sparse as evaluation expects).
        table_length = None
        if self.cfg.group_by_length:  # the epoch's views encoded first: their lengths decide the batches
            encoded = [self.encode(ex, epoch, rng) for ex in examples]
            lengths = [len(e.input_ids) for e in encoded]
            batches, table_length = length_grouped_batches(lengths, bs, rng), max(lengths, default=0)
        else:  # each batch encoded when it is trained on
            encoded, order = None, rng.permutation(len(examples))
            batches = [order[i : i + bs] for i in range(0, len(order), bs)]
        self.model.train()
        for b, idx in enumerate(batches[: self.steps_per_epoch]):
            step = epoch * self.steps_per_epoch + b  # global optimizer step
            reset = self.method.on_train_step(step, self.steps_per_epoch)
            if reset:
                self.reset(reset, step)
            items = [encoded[i] for i in idx] if encoded else [self.encode(examples[i], epoch, rng) for i in idx]
            batch = collate(items, self.encoder.pad).to(self.device)  # keeps the step spans
            if self.random_positions:  # this step's positions, the same on a resumed run
                g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
                draw_positions(self.model, table_length or batch["input_ids"].shape[1], g)
            tokens += int(batch["attention_mask"].sum())
            self.optimizer.zero_grad(set_to_none=True)
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
                loss = self.method.step(self.model, batch)
            if not math.isfinite(loss):
                raise FloatingPointError(f"training loss became {loss} at epoch {epoch + 1}, step {b + 1}")
            if self.cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip)
            self.optimizer.step()
            self.scheduler.step()
            losses.append(loss)
        self.epoch += 1
        dt = time.perf_counter() - t0
        return {
            "train_loss": float(np.mean(losses)),
            "tokens": float(tokens),
            "tokens_per_s": tokens / dt if dt > 0 else 0.0,
            "epoch_time_s": dt,
        }

    def encode(self, example: Example, epoch: int, rng: np.random.Generator):
        """The example as the method trains on it this epoch (its view), encoded."""
        prompt, steps = self.method.train_view(example, epoch, rng)
        return self.encoder.encode(prompt, steps, example.final)

    def state_dict(self) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "epoch": self.epoch,
            "torch_rng": torch.get_rng_state(),
            "sched": list(self.sched),
            "resets": self.resets,
        }

    def load_state_dict(self, state: dict) -> None:
        self.sched = tuple(state.get("sched", (0, self.total_steps, 0)))
        self.resets = int(state.get("resets", 0))
        self._build_optimizer()
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.epoch = int(state["epoch"])
        torch.set_rng_state(state["torch_rng"])


def length_grouped_batches(lengths: list[int], batch_size: int, rng: np.random.Generator) -> list[list[int]]:
    """An epoch's batches (example indices) of similar lengths, for `train.group_by_length`: transformers'
    length-grouped order (`get_length_grouped_indices`, as `TrainingArguments.group_by_length`: a random
    permutation cut into mega-batches of up to 50 batches, each sorted by length), cut into batches, whose
    order is then shuffled (in the library's order every mega-batch runs from its longest examples to its
    shortest). Every index appears once; all randomness comes from `rng`."""
    from transformers.trainer_pt_utils import get_length_grouped_indices

    g = torch.Generator().manual_seed(int(rng.integers(2**62)))
    order = get_length_grouped_indices(lengths, batch_size, generator=g)
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]
