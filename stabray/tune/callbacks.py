"""A restore-safe MLflow callback (runs on the driver).

Ray's own MLflowLoggerCallback sends one request per metric key and opens duplicate runs after
`Tuner.restore` (it keeps no state). This one keeps {trial_id: run_id} in `get_state()`, which Ray
pickles with the experiment, logs each result with one `log_batch`, and logs only the metrics
declared in `stabray.record` (plus the eq. (4) table as artifacts).
"""

from __future__ import annotations

import math
import sys
import traceback
from typing import Any

from ray.tune import Callback

from stabray.config import get_path
from stabray.record import (
    KERNEL_KEYS,
    STABILITY_TABLE,
    STOPPER_WORDS,
    is_departure_metric,
    is_metric,
    is_trial_config,
    run_name,
    trial_params,
    unwrap,
)
from stabray.tracking import Store, ended_status
from stabray.tracking.store import CHECKPOINT, NOTE, STOPPED_AT, STOPPED_BY, TAG_CHARS, numeric_metrics
from stabray.tune.stop_rules import stop_detail, stopped_by

CURVES = ("train_loss", "val_acc", "steps_val_acc", "val_eaf")  # per-epoch panels in plots/curves.png, if logged
KERNEL_HISTORY = "stabray.kernels_history"  # tag: "<epoch>: <torch>, <path>; ..." once a restore changed the path


class MLflowTuneCallback(Callback):
    def __init__(
        self,
        tracking_uri: str,
        experiment: str,
        parent_run_id: str,
        searched: list[str] = (),
        stopper=None,
        methods: dict[str, tuple[str, list[str]]] | None = None,
        restarted: str | None = None,
    ):
        self.tracking_uri, self.experiment, self.parent_run_id = tracking_uri, experiment, parent_run_id
        # A multi-method sweep run as one Tuner: method -> (its MLflow group run, its searched paths).
        # Each trial then goes under its own method's group and is named by that method's searched
        # paths; without it every trial goes under parent_run_id and `searched` names them all.
        self.methods = {m: (g, list(paths)) for m, (g, paths) in (methods or {}).items()}
        # the sweep's stopper (None, the EafStopper, the search.stop_if RuleStopper, or both in a
        # stop_rules.Stoppers): the same object Ray Tune asks, so their `stopped` says which
        # early-stopped trials they ended (the others were stopped by ASHA)
        self.stopper = stopper
        self.searched = list(searched)  # searched config paths: each logged as a param under its last name
        self.runs: dict[str, str] = {}  # trial_id -> MLflow run id
        self.names: dict[str, str] = {}  # trial_id -> readable run name (unique within the sweep)
        self.ended: set[str] = set()
        self.logged_step: dict[str, int] = {}  # last epoch logged per trial (not pickled: asked of MLflow)
        # Not pickled either (a restored driver asks MLflow instead): the trials whose run this driver
        # session created, so MLflow holds nothing of theirs that this object has not seen (no earlier
        # epochs, not KILLED), and their CURVES as logged, for the closing figure.
        self.fresh: set[str] = set()
        self.curves: dict[str, dict[str, list[tuple[int, float]]]] = {}
        self._store: Store | None = None
        self._lost_checked = False  # once per driver session (not pickled)
        # Why the sweep starts its trials again (Ray Tune could not read its saved state): the runs
        # already under the parents then belong to trials no one will resume. Not pickled, so a later
        # --resume of this Tuner keeps the runs of its own trials.
        self.restarted = restarted

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = Store(self.tracking_uri, self.experiment)
        return self._store

    def get_state(self) -> dict[str, Any]:
        return {"runs": dict(self.runs), "ended": set(self.ended), "names": dict(self.names)}

    def set_state(self, state: dict[str, Any]) -> None:
        self.runs = dict(state.get("runs", {}))
        self.names = dict(state.get("names", {}))
        self.ended = set(state.get("ended", set()))
        self.logged_step = {}
        self.fresh, self.curves = set(), {}
        self._lost_checked = False

    def __getstate__(self):
        d = dict(self.__dict__)
        d["_store"] = None  # MLflow clients are not picklable; reconnect lazily
        d["logged_step"] = {}
        d["fresh"], d["curves"] = set(), {}
        d["_lost_checked"] = False
        d["restarted"] = None
        return d

    def __setstate__(self, state):
        # defaults for pickles from before these fields
        self.__dict__.update({"fresh": set(), "curves": {}, "methods": {}, "restarted": None, **state})

    def on_step_begin(self, iteration, trials, **info):
        """Once, when the sweep (re)starts: a trial run still RUNNING whose trial Ray Tune does not know
        was lost with a killed driver (created after Ray's last saved experiment state). Its run is
        ended KILLED and marked lost, so the sweep's runs are exactly its trials."""
        if self._lost_checked:
            return
        self._lost_checked = True
        known = {t.trial_id for t in trials}
        for parent in self.parents():
            if self.restarted:  # every run already there: its trial will not be resumed
                for rid in self.store.trial_children(parent):
                    self.store.mark_lost(rid, why=self.restarted)
                continue
            for rid, tid in self.store.running_children(parent).items():
                if tid not in known:
                    self.store.mark_lost(rid)
                    self.runs = {t: r for t, r in self.runs.items() if r != rid}

    def parents(self) -> list[str]:
        """The runs this callback's trial runs sit under."""
        return [g for g, _ in self.methods.values()] if self.methods else [self.parent_run_id]

    def parent_of(self, cfg: dict[str, Any]) -> str:
        m = self.methods.get(cfg["method"]["name"])
        return m[0] if m else self.parent_run_id

    def searched_of(self, cfg: dict[str, Any]) -> list[str]:
        m = self.methods.get(cfg["method"]["name"])
        return m[1] if m else self.searched

    def _run_id(self, trial) -> str:
        if trial.trial_id not in self.runs:
            # After a driver crash the restored state may predate a run we created: look it up first.
            cfg = unwrap(trial.config)
            if not is_trial_config(cfg):  # Ray's own fallback when its restore fails: a restart with {}
                raise RuntimeError(
                    f"Ray Tune started trial {trial.trial_id} without a stabray trial config (keys: "
                    f"{sorted(cfg) or 'none'}). This happens when Ray cannot restore a run it resumes and "
                    "starts it again instead; its log above says why."
                )
            found = self.store.find_child(self.parent_of(cfg), trial.trial_id)
            if found:
                self.runs[trial.trial_id] = found
                return found
            params = trial_params(cfg)
            for path in self.searched_of(cfg):  # e.g. task.params.init_gain -> init_gain, unless already there
                params.setdefault(path.rsplit(".", 1)[-1], get_path(cfg, path))
            self.runs[trial.trial_id] = self.store.start_child(
                self.parent_of(cfg),
                trial.trial_id,
                run_name=self.name_of(trial),
                params=params,
                tags={
                    "stabray.task": cfg["task"]["name"],
                    "stabray.method": cfg["method"]["name"],
                    NOTE: self._starting(cfg),  # the description on_trial_start sets, in the same request
                },
                config=cfg,
            )
            self.fresh.add(trial.trial_id)
            self.curves[trial.trial_id] = {k: [] for k in CURVES}
        return self.runs[trial.trial_id]

    def stopped_by(self, trial_id: str) -> str:
        """Who stopped an early-stopped trial: "eaf_stop" (the EAF rule), "stop_if" (a search.stop_if
        rule) or "asha"."""
        return stopped_by(self.stopper, trial_id)

    def name_of(self, trial) -> str:
        """The trial's readable name (alg1-lam0.2-b4-lr0.0031-s0), made unique with -2, -3, ..."""
        if trial.trial_id not in self.names:
            cfg = unwrap(trial.config)
            base = run_name(cfg, self.searched_of(cfg))
            taken, name, k = set(self.names.values()), base, 1
            while name in taken:
                k += 1
                name = f"{base}-{k}"
            self.names[trial.trial_id] = name
        return self.names[trial.trial_id]

    def on_trial_start(self, iteration, trials, trial, **info):
        rid = self._run_id(trial)
        if trial.trial_id in self.fresh:  # created just now, RUNNING, with its description
            return
        self.store.reopen(rid)  # KILLED when an interrupted sweep is resumed: RUNNING again
        self.store.set_description(rid, self._starting(unwrap(trial.config)))

    def _starting(self, cfg: dict[str, Any]) -> str:
        return f"{self._about(cfg)}, up to {get_path(cfg, 'train.epochs')} epochs."

    def _about(self, cfg: dict[str, Any]) -> str:
        values = ", ".join(f"{p.rsplit('.', 1)[-1]} = {get_path(cfg, p)}" for p in self.searched_of(cfg))
        return f"One trial of the sweep **{self.experiment}**: {cfg['method']['name']} on {cfg['task']['name']}" + (
            f" with {values}" if values else ""
        )

    def on_trial_result(self, iteration, trials, trial, result, **info):
        rid = self._run_id(trial)
        step = int(result.get("training_iteration", 0))
        if trial.trial_id not in self.logged_step:  # first result since start or restore: ask MLflow
            fresh = trial.trial_id in self.fresh  # a run created by this session has logged nothing yet
            self.logged_step[trial.trial_id] = 0 if fresh else self.store.last_step(rid, "train_loss")
        kernels = {f"stabray.{k}": str(result[k]) for k in KERNEL_KEYS if k in result}
        if kernels:  # the first result after a start or restore: what computes the trial from now on
            self.store.set_tags(rid, {**kernels, **self._kernel_history(rid, kernels, step)})
        if step <= self.logged_step[trial.trial_id]:
            return  # a resumed trial re-reporting an epoch already logged before the crash
        self.logged_step[trial.trial_id] = step
        metrics = {k: v for k, v in result.items() if is_metric(k)}
        self.store.log_metrics(rid, metrics, step=step)
        if trial.trial_id in self.curves:
            for k, v in numeric_metrics(metrics).items():
                if k in CURVES or is_departure_metric(k):
                    self.curves[trial.trial_id].setdefault(k, []).append((step, as_stored(v)))
        table = result.get(STABILITY_TABLE)
        if table:
            log_stability_table(self.store, rid, table)

    def _kernel_history(self, rid: str, kernels: dict[str, str], step: int) -> dict[str, str]:
        """`stabray.kernels_history` when a restore runs on another torch or kernel path than the run's
        tags name: "<first epoch>: <torch>, <path>; ..." per stretch, so the run says which epochs each
        computed (the tags themselves name the newest). Nothing while the path stays the same."""
        tags = self.store.tags(rid)
        before = {k: tags[k] for k in (f"stabray.{k}" for k in KERNEL_KEYS) if k in tags}
        now = {**before, **kernels}
        if not before or before == now:
            return {}
        past = tags.get(KERNEL_HISTORY) or f"1: {', '.join(before.values())}"
        return {KERNEL_HISTORY: f"{past}; {step}: {', '.join(now.values())}"[-TAG_CHARS:]}

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
        # the latest checkpoint (older ones are deleted: num_to_keep=1), for `stabray stability <run id>`
        self.store.set_tag(self._run_id(trial), CHECKPOINT, checkpoint_uri(checkpoint))

    def on_trial_complete(self, iteration, trials, trial, **info):
        rid = self._run_id(trial)
        if trial.trial_id not in self.ended:
            status, tags = ended_status(trial.last_result or {}, error=False)
            if STOPPED_AT in tags:
                tags[STOPPED_BY] = self.stopped_by(trial.trial_id)
            self._close(trial, rid, tags.get(STOPPED_AT), tags=tags)
            self.store.end(rid, status)
            self.ended.add(trial.trial_id)

    def _close(
        self, trial, rid: str, stopped_at: str | None = None, error: str = "", tags: dict[str, str] | None = None
    ) -> None:
        """The trial's end in its description (set in one request with `tags`), and its curves as
        plots/curves.png."""
        from stabray.tune import plots

        cfg = unwrap(trial.config)
        last = trial.last_result or {}
        epochs = get_path(cfg, "train.epochs", "?")
        if error:
            outcome = f"**Failed** after epoch {last.get('epoch', 0)}: `{error}` (full traceback: error.txt)."
        elif stopped_at is not None:
            tag = self.stopped_by(trial.trial_id)
            who = STOPPER_WORDS[tag]
            if tag == "stop_if":  # the rule and the value it read (not when the EAF rule, asked first, also stopped it)
                who += f" ({stop_detail(self.stopper, trial.trial_id)})"
            outcome = (
                f"**Stopped by {who}** after epoch {stopped_at} of {epochs} (tags stabray.status = STOPPED, "
                "stabray.stopped_at_epoch, stabray.stopped_by); it has no test metrics."
            )
        else:
            outcome = f"**Finished** all {epochs} epochs."
        shown = [k for k in ("val_acc", "best_val_acc", "test_acc", "val_eaf", "test_eaf") if k in last]
        numbers = ", ".join(f"{k} {last[k]:.3f}" for k in shown if isinstance(last[k], (int, float)))
        note = (
            f"{self._about(cfg)}. {outcome}"
            + (f" Last: {numbers}." if numbers else "")
            + " Charts: plots/curves.png (per epoch); timings are the sys/ metrics."
        )
        self.store.set_tags(rid, {**(tags or {}), NOTE: note})
        try:
            fig = plots.trial_curves(self._curves(trial.trial_id, rid), self.name_of(trial))
            if fig is not None:
                self.store.log_figure(rid, fig, "plots/curves.png")
                plots.close(fig)
        except Exception as e:  # noqa: BLE001 - a figure must never fail the sweep
            print(f"stabray: could not plot trial {trial.trial_id}: {e}")

    def _curves(self, trial_id: str, rid: str) -> dict[str, list[tuple[int, float]]]:
        """CURVES and the val_departure_tok<k> as MLflow holds them: from memory for a trial this
        session logged from its first epoch, else read back."""
        if trial_id in self.fresh and trial_id in self.curves:
            return self.curves[trial_id]
        departures = sorted(k for k in self.store.metric_keys(rid) if is_departure_metric(k))
        return {k: self.store.history(rid, k) for k in (*CURVES, *departures)}

    def on_trial_error(self, iteration, trials, trial, **info):
        rid = self._run_id(trial)
        path = getattr(trial, "error_file", None)
        err = _read(path) if path else "trial failed (no error file)"
        self.store.set_tag(rid, "stabray.error", err[-TAG_CHARS:])
        self.store.log_text(rid, err, "error.txt")
        last_line = next((line for line in reversed(err.strip().splitlines()) if line.strip()), "error")
        self._close(trial, rid, error=last_line.strip()[:300])
        self.store.end(rid, "FAILED")
        self.ended.add(trial.trial_id)


def as_stored(v: float) -> float:
    """A metric value as MLflow's store gives it back: infinities become +-sys.float_info.max."""
    return math.copysign(sys.float_info.max, v) if math.isinf(v) else v


def checkpoint_uri(checkpoint) -> str:
    """A checkpoint's folder: a local path, or a URI (s3://bucket/...) when it lives in an object store."""
    kind = getattr(checkpoint.filesystem, "type_name", "local")
    return checkpoint.path if kind == "local" else f"{kind}://{checkpoint.path}"


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return traceback.format_exc()


def log_stability_table(store: Store, run_id: str, rows: list[dict[str, Any]]) -> None:
    """The eq. (4) table as JSON, CSV and a loss-gap/bound-vs-T plot."""
    import polars as pl

    from stabray.stability.plot import plot_bound_vs_T

    store.log_dict(run_id, rows, "stability/decomposition.json")  # full precision, what analysis/ reads
    store.log_text(run_id, rounded(pl.DataFrame(rows)).write_csv(), "stability/decomposition.csv")
    from stabray.tune.plots import close

    fig = plot_bound_vs_T(rows)
    store.log_figure(run_id, fig, "stability/bound_vs_T.png")
    close(fig)


def rounded(df, digits: int = 4):
    """Float columns to `digits` significant digits: a table to read, not 0.11024063080549240."""
    import polars as pl

    return df.with_columns(pl.col(c).round_sig_figs(digits) for c, t in df.schema.items() if t.is_float())
