"""The trial runner protocol: what the Ray trainable, the `stability` command and `analysis/` need
from one trial, whatever kind of task it trains on.

A task names its runner by registry name (`Task.runner`, "text" by default); `make_run(config)`
builds it and `load_run(dir)` rebuilds it from a checkpoint directory. Two runners exist:
`stabray.train.run.TrialRun` ("text": token sequences, a causal LM, greedy decoding) and
`stabray.train.icl.ICLRun` ("icl": continuous in-context gradient-descent steps, exact Jacobians).

    run = make_run(config)
    while not run.done:
        metrics = run.epoch()                 # train one epoch, then validate
    metrics |= run.final() | run.best_epoch() | run.final_stability()
    run.save(directory)
"""

from __future__ import annotations

import abc
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stabray.config import TrialConfig, parse_trial_config
from stabray.errors import UserError
from stabray.errors import one_line as _one_line
from stabray.record import STABILITY_TABLE
from stabray.registry import Registry


def best_epoch(history: list[dict[str, float]], metric: str = "val_acc") -> dict[str, float]:
    """best_<metric> and best_epoch (ties: the earlier epoch) over the epochs run so far."""
    if not history:
        raise UserError("best_epoch: no epoch has run yet")
    if not any(metric in h for h in history):
        known = sorted({k for h in history for k in h} - {"epoch"})
        raise UserError(f"best_epoch: {metric!r} is not a per-epoch metric of this run; it has {', '.join(known)}")
    best = max(history, key=lambda h: (h.get(metric, float("-inf")), -h["epoch"]))
    return {f"best_{metric}": best[metric], "best_epoch": best["epoch"]}


@dataclass(frozen=True)
class StabilityOptions:
    """How the `stability` command measures a checkpoint (the Jacobian estimator's settings)."""

    n: int = 64  # test examples
    iters: int = 10  # power iterations
    token_cap: int = 8  # output tokens per step block (the input side is the whole step)
    aggregation: str = "block"  # block | token_mean
    include_question: bool = False  # count the question as step 0
    T: int = 0  # evaluate the chain up to T (rows 1..min(T, T_max)); 0 = T_max

    def __post_init__(self):
        for name in ("n", "iters", "token_cap"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise UserError(f"stability options: {name} must be a positive integer, got {getattr(self, name)!r}")
        if self.aggregation not in ("block", "token_mean"):
            raise UserError(f"stability options: aggregation must be block or token_mean, got {self.aggregation!r}")
        if not isinstance(self.T, int) or self.T < 0:
            raise UserError(f"stability options: T must be 0 (T_max) or a positive integer, got {self.T!r}")


@dataclass(frozen=True)
class StabilityTable:
    rows: list[dict[str, float]]  # one per T = 1..T_max
    n_examples: int
    note: str = ""  # what the rows hold when it is not the full eq. (4) table


class Runner(abc.ABC):
    """One trial: config, model, trainer, per-epoch history; the hooks below."""

    cfg: TrialConfig
    history: list[dict[str, float]]  # per-epoch metrics (kept in checkpoints)
    trainer: Any  # has `.epoch`, the number of epochs completed

    @property
    def epochs_done(self) -> int:
        return int(self.trainer.epoch)

    @property
    def done(self) -> bool:
        return self.epochs_done >= self.cfg.train.epochs

    @abc.abstractmethod
    def epoch(self) -> dict[str, float]:
        """Train one epoch, then validate; the per-epoch metrics (stabray.record.METRICS)."""

    @abc.abstractmethod
    def final(self) -> dict[str, float]:
        """Test and length-generalization metrics of the final model."""

    @abc.abstractmethod
    def decomposition(self, n: int, split: str = "test", max_T: int | None = None) -> list[dict[str, float]]:
        """The eq. (4) table (stabray.record.DECOMP_KEYS) for T = 1..min(max_T, T_max) on n examples."""

    @abc.abstractmethod
    def weight_noise(self, seeds: int) -> float:
        """Appendix B.2: mean increase of the inference loss under weight noise."""

    @abc.abstractmethod
    def stability_table(self, opts: StabilityOptions) -> StabilityTable:
        """What `python -m stabray stability` prints for this trial's checkpoint."""

    @abc.abstractmethod
    def save(self, path: str | Path) -> None: ...

    @abc.abstractmethod
    def load(self, path: str | Path) -> None: ...

    @property
    def eaf_due(self) -> bool:
        """Whether the epoch just trained measures the per-epoch EAF (every eval.eaf_every epochs,
        and always the last one, so a finished trial's last result has it)."""
        return self.epochs_done % self.cfg.eval.eaf_every == 0 or self.done

    def best_epoch(self, metric: str = "val_acc") -> dict[str, float]:
        return best_epoch(self.history, metric)

    def check_more_epochs(self) -> None:
        """A UserError when every configured epoch has run: another would train past the learning-rate
        schedule (which ends at train.epochs) and count epochs the config does not have."""
        if self.done:
            raise UserError(
                f"all {self.cfg.train.epochs} epochs (train.epochs) have run; make a run with more epochs to train on"
            )

    def check_eval_args(self, split: str, **counts: int) -> None:
        """A UserError for a split this run does not have, or a count (examples, seeds) below 1."""
        if split not in self.data:
            raise UserError(f"split {split!r}: this run has {', '.join(self.data)}")
        for name, n in counts.items():
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise UserError(f"{name} must be a positive integer, got {n!r}")

    def final_stability(self) -> dict[str, Any]:
        """The eq. (4) table and weight-noise stability at the end, as configured in `eval`."""
        out: dict[str, Any] = {}
        ev = self.cfg.eval
        if ev.decomposition_examples and self.has_decomposition:
            rows = self.decomposition(ev.decomposition_examples)
            out[STABILITY_TABLE] = rows
            out.update(at_T(rows, ev.stability_T))
        if ev.weight_noise_seeds:
            out["weight_noise_loss_increase"] = self.weight_noise(ev.weight_noise_seeds)
        return out

    # whether `decomposition` is defined for this trial (a method may not give every step a true value)
    has_decomposition: bool = True


# final metric <- column of the eq. (4) table, read at one T (stability_T)
AT_T = {
    "test_eaf_at_T": "eaf",
    "test_sum_eps_at_T": "sum_eps",
    "test_bound_at_T": "bound",
    "test_loss_gap_at_T": "loss_gap",
}


def at_T(rows: list[dict[str, float]], T: int) -> dict[str, float]:
    """The table's row at min(T, T_max) (T = 0: T_max) as final metrics, plus `stability_T`, the T
    it is at. Undefined entries (NaN: a latent thought has no loss) are left out, and so is the whole
    row at T = 1 (no measured example has an intermediate step): its EAF, sum of errors and bound
    are empty sums and its loss gap compares the prompt with itself, each 0 by definition."""
    if not rows:
        return {}
    T_max = max(int(r["T"]) for r in rows)
    T_used = T_max if T <= 0 else min(T, T_max)
    row = next(r for r in rows if int(r["T"]) == T_used)
    out = {"stability_T": float(T_used)}
    if T_used < 2:
        return out
    for name, col in AT_T.items():
        v = row.get(col)
        if v is not None and math.isfinite(float(v)):
            out[name] = float(v)
    return out


RUNNERS: Registry[type[Runner]] = Registry("runner")


def make_run(
    config: dict[str, Any] | TrialConfig, tokenizer_dir: str | Path | None = None, check: bool = True
) -> Runner:
    """The runner the config's task names, built from the config (`tokenizer_dir`: a saved tokenizer).
    `check`: first hold the config to a sweep's rules (`stabray.spec.run_problem`); `load_run` skips
    it, since a checkpoint's config trained under the rules of its day."""
    from stabray.spec import problem_text, run_problem
    from stabray.tasks import TASKS

    cfg = config if isinstance(config, TrialConfig) else parse_trial_config(config)
    if check and (problem := run_problem(cfg)):
        raise UserError(f"trial config: {problem_text(problem)}")
    return RUNNERS.get(TASKS.get(cfg.task.name).runner)(cfg, tokenizer_dir=tokenizer_dir)


# A checkpoint directory: the tensors (model, optimizer, scheduler, RNG state) in STATE, loaded with
# torch.load(weights_only=True), which refuses anything but tensors and plain containers, so a
# crafted file cannot run code; everything else is JSON.
STATE, HISTORY, CONFIG = "state.pt", "history.json", "trial_config.json"


def save_state(path: Path, model: dict, trainer: dict, history: list[dict[str, float]]) -> None:
    """Write a checkpoint's tensors (STATE) and its per-epoch history (HISTORY, JSON)."""
    import torch

    torch.save({"model": model, "trainer": trainer}, path / STATE)
    (path / HISTORY).write_text(json.dumps(history))


def read_state(path: str | Path, map_location: Any = "cpu") -> tuple[dict, list[dict[str, float]]]:
    """(tensors, history) of a checkpoint directory; a UserError naming the file when it is missing,
    damaged, or holds objects other than tensors and plain containers (never unpickled)."""
    import pickle

    import torch

    f = Path(path) / STATE
    try:
        state = torch.load(f, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise UserError(f"{Path(path)}: not a stabray checkpoint (no {STATE})") from None
    except pickle.UnpicklingError as e:
        if "weights_only" in str(e) or "Unsupported global" in str(e):
            raise UserError(
                f"{f}: refused: it holds Python objects other than tensors and plain containers, and "
                "unpickling them could run code (a stabray checkpoint never does)"
            ) from None
        raise UserError(f"{f}: damaged ({one_line(e)})") from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:  # torch's reader: truncated or not a checkpoint
        detail = one_line(e)
        raise UserError(f"{f}: damaged or not a torch checkpoint" + (f" ({detail})" if detail else "")) from None
    if not isinstance(state, dict) or not {"model", "trainer"} <= set(state):
        raise UserError(f"{f}: not a stabray checkpoint (expected the keys model and trainer)")
    history = state.pop("history", None)  # checkpoints written before HISTORY kept it here
    if history is None:
        h = Path(path) / HISTORY
        history = _read_json(h) if h.exists() else []
    if not isinstance(history, list):
        raise UserError(f"{Path(path) / HISTORY}: expected a list of per-epoch metrics")
    return state, history


def one_line(e: BaseException) -> str:
    """An exception's message on one line, cut at 300 characters (a damaged file's error can quote it)."""
    return _one_line(e)[:300]


def _read_json(f: Path) -> Any:
    try:
        return json.loads(f.read_text(encoding="utf-8"))
    except (ValueError, OSError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise UserError(f"{f}: not valid JSON ({one_line(e)})") from None


def load_run(path: str | Path, overrides: dict | None = None) -> Runner:
    """A runner rebuilt from a checkpoint directory written by its `save`. `overrides` (a nested dict,
    merged over the saved trial config before it is checked) changes what the run reads, not the
    model: e.g. `{"task": {"params": {"long_sizes": [9, 10]}}}` scores the saved model on other sizes."""
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"{path}: not a checkpoint directory")
    for name in (STATE, CONFIG):
        if not (path / name).is_file():
            raise UserError(f"{path}: not a stabray checkpoint (no {name})")
    read_state(path)  # refuse a damaged or crafted state before building anything (it is read again below)
    cfg = _read_json(path / CONFIG)
    if not isinstance(cfg, dict):
        raise UserError(f"{path / CONFIG}: expected a trial config (a JSON object)")
    if overrides:
        from stabray.config import deep_merge

        cfg = deep_merge(cfg, overrides)
    try:
        cfg = parse_trial_config(cfg)
    except UserError as e:
        raise UserError(f"{path / CONFIG}{' with the overrides' if overrides else ''}: {e}") from None
    tok = path / "tokenizer"
    run = make_run(cfg, tokenizer_dir=tok if tok.exists() else None, check=False)
    try:
        run.load(path)
    except UserError:
        raise
    except (RuntimeError, KeyError, ValueError, TypeError) as e:  # load_state_dict: keys or shapes differ
        raise state_misfit(path, e, f"the model of its {CONFIG}") from None
    return run


def state_misfit(path: str | Path, e: Exception, model: str) -> UserError:
    """The error for saved weights that do not fit `model` (torch's "Error(s) in loading state_dict for
    X:", then one indented line per problem): the first problem, and how many more."""
    text = str(e)
    if "Missing key" in text and ".parametrizations.weight.original" in text and "Unexpected key" in text:
        plain = text.split("Unexpected key", 1)[1]
        if ".parametrizations." not in plain:  # the saved weights are plain where the model quantizes them
            return UserError(
                f"{path}: the checkpoint holds plain weights where {model} is fake-quantized (QAT bits < 32): "
                "a model.family gpt2 run saved before stabray quantized GPT-2's Conv1D layers trained at full "
                "precision under its bits label; read it as what it is with bits 32 (load_run's overrides: "
                "{'method': {'params': {'bits': 32}}})"
            )
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = lines[1] if len(lines) > 1 else (lines[0] if lines else type(e).__name__)
    more = f" (and {len(lines) - 2} more)" if len(lines) > 2 else ""
    return UserError(f"{path}: the saved state does not fit {model}: {first[:200]}{more}")
