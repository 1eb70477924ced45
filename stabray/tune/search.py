"""An Optuna searcher whose study survives the loss of every local file.

The study the searcher asks and tells is an Optuna RDB study in a local sqlite file (`db`): that is
what optuna-dashboard (`stabray ui --optuna`) reads while the sweep runs. Ray Tune checkpoints the
searcher with its experiment state, in the run's storage (a local folder, or S3 on a cluster), and
`Tuner.restore` restores it from there. Ray's `OptunaSearch` would pickle only the sqlite connection
(its URL): a sweep resumed on a machine without that file would start a new, empty study, and one
whose folder is gone would not start at all. This searcher's checkpoint carries the study's trials
instead; on restore it uses the sqlite file when it holds at least as many trials, and rebuilds it from
the checkpoint otherwise.

Why Tune's searcher checkpoint and not an Optuna storage on the object store: S3 offers neither the
locks of an RDB nor the appends of Optuna's journal storage, and the checkpoint is saved together
with the trials' statuses it must agree with (a trial the checkpoint knows is running is the same
trial in the study).
"""

from __future__ import annotations

import os
import pickle
import warnings
from pathlib import Path
from typing import Any

from ray.tune.search import ConcurrencyLimiter
from ray.tune.search.optuna import OptunaSearch


def quiet_list_choices() -> None:
    """A list-valued choice (`long_sizes: {choice: [[5], [5, 6]]}`, `position_eval_stride: [3, [2, 3, 4]]`)
    makes Optuna warn that it expects scalars for persistent storage; its sqlite study stores such a choice
    and gives it back (tests/test_storage.py), so the warning is only noise on the sweep's console."""
    warnings.filterwarnings("ignore", message="Choices for a categorical distribution should be", category=UserWarning)


class DurableOptunaSearch(OptunaSearch):
    def __init__(self, db: str | Path, **kwargs: Any):
        quiet_list_choices()
        self._db = str(Path(db).absolute())
        super().__init__(storage=None, **kwargs)  # the sqlite storage is opened with the study

    # -- the live study: sqlite -------------------------------------------------------------
    def _open_storage(self):
        import optuna

        Path(self._db).parent.mkdir(parents=True, exist_ok=True)
        return optuna.storages.RDBStorage(f"sqlite:///{self._db}")

    def _setup_study(self, mode):
        self._storage = self._open_storage()
        super()._setup_study(mode)

    # -- the checkpoint: the study's trials, not its connection -----------------------------
    def _portable_state(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        study = state.pop("_ot_study", None)
        state.pop("_storage", None)
        state["_ot_trials"] = {tid: t.number for tid, t in self._ot_trials.items()}  # Tune trial -> Optuna number
        state["_snapshot"] = (
            None if study is None else {"directions": list(study.directions), "trials": study.get_trials(deepcopy=True)}
        )
        return state

    def _set_portable_state(self, state: dict[str, Any]) -> None:
        state = dict(state)
        snapshot, numbers = state.pop("_snapshot", None), state.pop("_ot_trials", {})
        self.__dict__.update(state)
        self._ot_trials, self._ot_study, self._storage = {}, None, None
        if snapshot is not None:
            self._storage = self._open_storage()
            self._ot_study = self._study_from(snapshot, numbers)

    def _study_from(self, snapshot: dict[str, Any], numbers: dict[str, int]):
        """The sqlite study when it holds at least the checkpoint's trials, else one rebuilt from them;
        `_ot_trials` mapped onto it. A trial the sqlite file has RUNNING but the checkpoint does not
        know (started after Tune's last experiment checkpoint, before the driver died) will never get a
        result: it is marked FAIL, which the sampler ignores."""
        import optuna
        from optuna.trial import TrialState

        name, storage = self._study_name, self._storage
        try:
            study = optuna.load_study(study_name=name, storage=storage, sampler=self._sampler)
        except KeyError:  # no such study in this file (a new file)
            study = None
        if study is not None and len(study.get_trials(deepcopy=False)) < len(snapshot["trials"]):
            optuna.delete_study(study_name=name, storage=storage)  # an older copy: the checkpoint is further along
            study = None
        if study is None:
            study = optuna.create_study(
                storage=storage,
                sampler=self._sampler,
                pruner=optuna.pruners.NopPruner(),
                study_name=name,
                directions=snapshot["directions"],
            )
            for frozen in snapshot["trials"]:
                storage.create_new_trial(study._study_id, template_trial=frozen)
        known = set(numbers.values())
        by_number = {}
        for t in study.get_trials(deepcopy=False):
            by_number[t.number] = t._trial_id
            if t.state == TrialState.RUNNING and t.number not in known:
                storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        self._ot_trials = {
            tid: optuna.trial.Trial(study, by_number[number]) for tid, number in numbers.items() if number in by_number
        }
        return study

    # Ray uploads the experiment state and this checkpoint one file after the other: a driver killed
    # in between restores a trial the checkpoint has not seen. Its results are left out of the study
    # (one observation fewer for the sampler) instead of a KeyError that would end the sweep.
    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if trial_id in self._ot_trials:
            super().on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if trial_id in self._ot_trials:
            super().on_trial_complete(trial_id, result, error)

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self._portable_state(), f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            self._set_portable_state(pickle.load(f))

    def __getstate__(self) -> dict[str, Any]:  # the Tuner's own pickle (tuner.pkl) holds the searcher too
        return self._portable_state()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._set_portable_state(state)


class DurableLimiter(ConcurrencyLimiter):
    """A ConcurrencyLimiter whose checkpoint also holds the trials it lets run. Ray's saves only the
    wrapped searcher: after `Tuner.restore` the trials that were running count for nothing, so their
    completion never reaches the searcher (Optuna would keep them RUNNING for good) and
    `max_concurrent` new trials start beside them."""

    def save(self, checkpoint_path: str) -> None:
        self.searcher.save(checkpoint_path)
        with open(checkpoint_path, "rb") as f:
            inner = f.read()
        with open(checkpoint_path, "wb") as f:
            pickle.dump({"live_trials": set(self.live_trials), "searcher": inner}, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            state = pickle.load(f)
        if not (isinstance(state, dict) and set(state) == {"live_trials", "searcher"}):
            self.searcher.restore(checkpoint_path)  # a plain searcher checkpoint
            return
        inner = f"{checkpoint_path}.searcher"
        with open(inner, "wb") as f:
            f.write(state["searcher"])
        try:
            self.searcher.restore(inner)
        finally:
            os.remove(inner)
        self.live_trials = set(state["live_trials"])
