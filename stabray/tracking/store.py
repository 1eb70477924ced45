"""A thin layer over `mlflow.MlflowClient`: one experiment per sweep, a parent run per sweep, a
child run per trial (tag `mlflow.parentRunId`), metrics sent with `log_batch` (one request per
result, not one per key), and trials read back as `stabray.record.TrialRecord`s.

The default store is a sqlite database at an absolute path (`<cwd>/mlflow.db`): MLflow resolves a
relative sqlite path against each process's working directory, and Ray workers run elsewhere.
"""

from __future__ import annotations

import json
import math
import os
import re
import ssl
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from stabray.errors import UserError, unwritable
from stabray.record import LAST_EPOCH_ONLY, TrialRecord, logged_name, record_name, trial_status

ROLE, SWEEP, TRIAL_ID = "stabray.role", "stabray.sweep", "stabray.trial_id"
PARENT = "mlflow.parentRunId"
CHECKPOINT = "stabray.checkpoint"  # tag: the trial's last checkpoint directory
TAG_CHARS = 4900  # the most characters of a tag value stabray keeps: under the 5,000 older MLflow servers take
STATUS = "stabray.status"  # tag: the trial's status when MLflow's own has no word for it (STOPPED)
STOPPED_AT = "stabray.stopped_at_epoch"  # tag: the epoch after which the trial was stopped early
STOPPED_BY = "stabray.stopped_by"  # tag: what stopped it early: asha, eaf_stop (the EAF rule) or stop_if
NOTE = "mlflow.note.content"  # tag: a run's description (Markdown), shown on its overview page
# tag: a trial's run whose trial Ray Tune lost (the driver died before Ray saved the trial; the resumed
# sweep ran another in its place): KILLED, kept for the record, not one of the sweep's trials
LOST = "stabray.lost"
# MLflow 3 opens an experiment without this tag in its GenAI view (traces, judges, prompts); this
# value opens it on its runs, as a model-training experiment.
EXPERIMENT_KIND, MODEL_TRAINING = "mlflow.experimentKind", "custom_model_development"
# A saved runs-table view (columns, sort) the UI loads from `<experiment URL>?viewStateShareKey=<key>`:
# MLflow reads it from the experiment tag `mlflow.sharedViewState.<key>`.
VIEW_KEY = "stabray"
VIEW_TAG = "mlflow.sharedViewState." + VIEW_KEY


def resolve_tracking_uri(flag: str | None = None, spec: str | None = None, cwd: str | Path | None = None) -> str:
    """--tracking-uri flag, else $MLFLOW_TRACKING_URI, else the spec's, else sqlite at ./mlflow.db."""
    uri = flag or os.environ.get("MLFLOW_TRACKING_URI") or spec
    if not uri:
        return "sqlite:///" + str((Path(cwd or os.getcwd()) / "mlflow.db").absolute())
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        rel = uri[len("sqlite:///") :]
        uri = "sqlite:///" + str((Path(cwd or os.getcwd()) / rel).absolute())
    elif "://" not in uri and not uri.startswith("file:") and uri not in ("databricks", "databricks-uc", "uc"):
        try:
            path = Path(uri).expanduser()
        except RuntimeError as e:  # ~name of a user this machine does not know
            raise UserError(f"tracking store {uri}: cannot expand the ~ ({e})") from None
        uri = "sqlite:///" + str((Path(cwd or os.getcwd()) / path).absolute())  # a bare path
    return uri


def sqlite_path(uri: str) -> Path | None:
    """The database file of a sqlite tracking URI (None for any other store)."""
    return Path(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else None


def artifact_location(uri: str, experiment: str) -> str | None:
    """Where a new experiment keeps its artifacts: for a sqlite store, `mlruns/<experiment>` beside the
    database file (MLflow's own default is `./mlruns` under the working directory of whichever process
    creates the experiment, so a sweep run from elsewhere, or a test, would scatter them); for other
    stores their server's default (None)."""
    db = sqlite_path(uri)
    if db is None:
        return None
    folder = re.sub(r"[^A-Za-z0-9._-]+", "_", experiment)
    root = db.absolute().parent / "mlruns"  # a relative sqlite path is relative to this process, as in MLflow
    return (root / (folder if folder.strip(".") else "_")).as_uri()  # never "" "." or ".."


SQLITE_HEADER = b"SQLite format 3\x00"
REACH_TIMEOUT_S = 3.0  # how long a tracking server may take to answer before we call it unreachable


# The URI schemes MLflow 3 opens a tracking store for (its built-in stores; a database URI may name its
# driver, `postgresql+psycopg2://`), and those that installed plugins add (entry points
# `mlflow.tracking_store`, MLflow's documented plugin mechanism).
MLFLOW_SCHEMES = (
    *("sqlite", "http", "https", "file", "postgresql", "mysql", "mssql"),
    *("databricks", "databricks-uc", "uc"),
)


# The pip package of each database driver module SQLAlchemy imports for MLflow's database stores
# (the dialects' defaults, and the drivers a URI like postgresql+psycopg:// names).
DRIVER_PACKAGES = {
    "MySQLdb": "mysqlclient",
    "pymysql": "pymysql",
    "psycopg2": "psycopg2-binary",
    "psycopg": "psycopg[binary]",
    "pyodbc": "pyodbc",
    "pymssql": "pymssql",
}


def store_schemes() -> set[str]:
    from importlib.metadata import entry_points

    return set(MLFLOW_SCHEMES) | {ep.name for ep in entry_points(group="mlflow.tracking_store")}


def check_scheme(uri: str) -> None:
    """A tracking URI whose scheme MLflow has no store for: one line naming it and the ones it has."""
    head = uri.split("://", 1)[0] if "://" in uri else uri.split(":", 1)[0]  # file:/path has no //
    scheme = head.split("+", 1)[0].lower()
    if scheme not in store_schemes():
        raise UserError(
            f"tracking store {uri}: MLflow has no store for {scheme!r} URIs (it has sqlite:///<file>, "
            "http(s)://<host>:<port>, postgresql://, mysql://, mssql://, file:, databricks; a bare path is a "
            "sqlite database)"
        )


def check_store(uri: str, *, create: bool, write: bool = False) -> None:
    """Fail fast, creating nothing, when a tracking store cannot be used: a URI scheme MLflow has no
    store for; a sqlite path that is a folder, not a database, or (`create=False`) missing, or to be
    created in a folder that does not exist or takes no new files; (`write=True`, a sweep) an existing
    database in a folder that takes no new files (a read-only mount: SQLite writes its journal beside
    the database, so the first write would fail after Ray started); an HTTP(S) server that does not
    answer within REACH_TIMEOUT_S (MLflow itself retries for minutes). Without `write`, a database
    that exists is only read where it is (`stabray ui` can browse one on a read-only mount)."""
    check_scheme(uri)
    if uri.lower().startswith("sqlite:"):
        memory = uri.rstrip("/").lower() == "sqlite:" or ":memory:" in uri
        if memory or not uri.startswith("sqlite:///"):
            raise UserError(
                f"tracking store {uri}: "
                + ("an in-memory database, lost when the process ends" if memory else "not sqlite:/// and a path")
                + "; give a database file: sqlite:///relative.db, sqlite:////absolute/mlflow.db, or a bare path"
            )
    db = sqlite_path(uri)
    if db is not None:
        if db.is_dir():
            raise UserError(f"tracking store {uri}: a directory, not an MLflow database file")
        if db.exists():
            with open(db, "rb") as f:
                head = f.read(len(SQLITE_HEADER))
            if head and head != SQLITE_HEADER:  # an empty file is an empty database
                raise UserError(f"tracking store {uri}: not an SQLite database (a damaged or another file)")
            if not head and not create:  # reading it would write MLflow's tables into it
                raise UserError(f"no MLflow store at {db} (an empty file; run a sweep first, or pass --tracking-uri)")
            if write and (why := unwritable(db.parent)):
                raise UserError(f"tracking store {uri}: a sweep writes to it, but {why}")
        elif not create:
            raise UserError(f"no MLflow store at {db} (run a sweep first, or pass --tracking-uri)")
        elif not db.parent.is_dir():
            raise UserError(f"tracking store {uri}: the directory {db.parent} does not exist")
        elif why := unwritable(db.parent):  # a database to create
            raise UserError(f"tracking store {uri}: {why}")
        return
    if uri.startswith(("http://", "https://")):
        import urllib.error
        import urllib.request

        try:
            urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=REACH_TIMEOUT_S).close()
        except urllib.error.HTTPError:
            return  # it answered (a server without /health, or one that wants a login): reachable
        except (OSError, ValueError) as e:  # URLError, refused, timed out, a malformed URL
            reason = getattr(e, "reason", e)
            if isinstance(reason, ssl.SSLError):
                return  # it answered TLS; whether MLflow accepts its certificate is MLflow's setting
            raise UserError(
                f"cannot reach the MLflow tracking server at {uri} ({reason}); start it (python -m stabray ui "
                "--port PORT) or pass another --tracking-uri (default: sqlite ./mlflow.db)"
            ) from None


def _client(uri: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


MAX_EXPERIMENT_NAME = 500  # MLflow refuses a longer experiment name (the length of its `name` column)


def check_name(experiment: str) -> None:
    if len(experiment) > MAX_EXPERIMENT_NAME:
        raise UserError(
            f"MLflow experiment name {experiment[:40]}... has {len(experiment)} characters; MLflow takes at most "
            f"{MAX_EXPERIMENT_NAME} (mlflow.experiment, or the spec's name)"
        )


def _lookup(uri: str, experiment: str):
    """(client, the experiment named so or None), or one UserError saying why the store cannot be read: a
    damaged database, a server that refuses us, a database driver not installed, an experiment of that
    name that is deleted (MLflow keeps a deleted one's name: a new one cannot take it, and logging to it
    fails)."""
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError

    try:
        client = _client(uri)
        exp = client.get_experiment_by_name(experiment)
    except (MlflowException, SQLAlchemyError) as e:  # a damaged database, a server that refuses us
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"cannot open the MLflow store {uri}: {first}") from None
    except ImportError as e:  # postgresql:// or mysql:// without its database driver installed
        if "://" not in uri or uri.split("://", 1)[0].startswith(("http", "file", "sqlite")):
            raise
        package = DRIVER_PACKAGES.get(e.name or "", e.name)
        raise UserError(
            f"cannot open the MLflow store {uri}: its database driver is not installed "
            f"(SQLAlchemy found no module {e.name!r}; pip install {package})"
        ) from None
    if exp is not None and exp.lifecycle_stage == "deleted":
        raise UserError(
            f"MLflow experiment {experiment!r} at {uri} is deleted (id {exp.experiment_id}): restore it "
            f"(MLFLOW_TRACKING_URI={uri} mlflow experiments restore --experiment-id {exp.experiment_id}), or "
            "use another name (--set mlflow.experiment=NAME for a sweep, --experiment for report)"
        )
    return client, exp


def check_experiment(uri: str, experiment: str) -> None:
    """What `Store(uri, experiment)` would refuse, asked before Ray starts and creating nothing: a name MLflow
    refuses, or a store that is there but cannot be read, or whose experiment of that name is deleted
    (`_lookup`). A sqlite database still to be created (missing, or an empty file) has nothing more to
    ask; `check_store` comes first."""
    check_name(experiment)
    db = sqlite_path(uri)
    if db is not None and (not db.exists() or db.stat().st_size == 0):
        return
    _lookup(uri, experiment)


def numeric_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The numeric values, NaN and infinities included: a metric that became NaN is a result (the
    estimator or the training diverged), and dropping it would read as "not measured". MLflow keeps
    NaN and stores +-inf as +-1.8e308, which `trial_records` reads back as +-inf."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _inf(v: float) -> float:
    return math.copysign(math.inf, v) if abs(v) >= sys.float_info.max else v


class Store:
    """Runs of one experiment in one tracking store. `Store(uri, name)` creates the experiment
    when missing (a sweep); `Store.existing(uri, name)` only reads one that is there."""

    def __init__(self, tracking_uri: str, experiment: str, *, create: bool = True):
        self.uri, self.experiment = tracking_uri, experiment
        check_name(experiment)
        check_store(tracking_uri, create=create)
        self.client, exp = _lookup(tracking_uri, experiment)
        if exp is None and not create:
            names = [e.name for e in self.client.search_experiments()]
            raise UserError(f"no MLflow experiment {experiment!r} at {tracking_uri}; available: {names}")
        if exp is None:
            self.experiment_id = self.client.create_experiment(
                experiment,
                artifact_location=artifact_location(tracking_uri, experiment),
                tags={EXPERIMENT_KIND: MODEL_TRAINING},
            )
        else:
            self.experiment_id = exp.experiment_id
            if create and EXPERIMENT_KIND not in exp.tags:  # a store made before the tag existed
                self.client.set_experiment_tag(self.experiment_id, EXPERIMENT_KIND, MODEL_TRAINING)

    @classmethod
    def existing(cls, tracking_uri: str | None, experiment: str) -> Store:
        """An experiment to read (analysis, report): never creates a store or an experiment."""
        return cls(resolve_tracking_uri(tracking_uri), experiment, create=False)

    # -- writing ----------------------------------------------------------------------------
    def start_parent(
        self,
        sweep: str,
        run_name: str,
        spec: dict[str, Any],
        params: dict[str, Any] | None = None,
        description: str = "",
    ) -> str:
        tags = {ROLE: "sweep", SWEEP: sweep, **({NOTE: description} if description else {})}
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags=tags)
        self.client.log_dict(run.info.run_id, spec, "sweep_spec.json")
        if params:
            self.log_params(run.info.run_id, params)
        return run.info.run_id

    def set_runs_view(self, columns: list[str], order_by: str | None = None, ascending: bool = False) -> str:
        """Save the runs-table view a sweep is best read in: `columns` are `params.<name>`,
        `metrics.<name>` or `tags.<name>`, shown beside the run name; `order_by` one of them, best
        first (`ascending` for a metric minimized). Returns the share key (the UI URL's
        `viewStateShareKey`)."""

        def key(col: str) -> str:
            kind, name = col.split(".", 1)
            return f"{kind}.`{logged_name(name) if kind == 'metrics' else name}`"

        keys = [key(c) for c in columns]
        state: dict[str, Any] = {"selectedColumns": keys, "columnOrder": keys, "searchFilter": ""}
        if order_by:
            state |= {"orderByKey": key(order_by), "orderByAsc": ascending}
        self.client.set_experiment_tag(self.experiment_id, VIEW_TAG, json.dumps(state))
        return VIEW_KEY

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        """Params (values as text, at most 6000 characters); a param already logged with the same
        value is fine, another value is an MLflow error."""
        from mlflow.entities import Param

        ps = [Param(k, str(v)[:6000]) for k, v in params.items() if v is not None]
        if ps:
            self.client.log_batch(run_id, params=ps)

    def set_description(self, run_id: str, text: str) -> None:
        """The run's description (Markdown), shown on its page."""
        self.client.set_tag(run_id, NOTE, text)

    def start_group(self, parent_id: str, method: str) -> str:
        """A run that groups one method's trials inside a multi-method sweep."""
        tags = {PARENT: parent_id, ROLE: "method", "stabray.method": method, NOTE: f"The {method} trials of the sweep."}
        run = self.client.create_run(self.experiment_id, run_name=method, tags=tags)
        return run.info.run_id

    def start_child(
        self,
        parent_id: str,
        trial_id: str,
        run_name: str,
        params: dict[str, Any],
        tags: dict[str, str],
        config: dict[str, Any],
    ) -> str:
        run = self.client.create_run(
            self.experiment_id, run_name=run_name, tags={PARENT: parent_id, ROLE: "trial", TRIAL_ID: trial_id, **tags}
        )
        rid = run.info.run_id
        self.log_params(rid, params)
        self.client.log_dict(rid, config, "trial_config.json")
        return rid

    def log_metrics(self, run_id: str, metrics: dict[str, Any], step: int) -> int:
        """Metrics declared in `stabray.record` under their logged names (system ones as `sys/...`)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        ms = [Metric(logged_name(k), v, now, int(step)) for k, v in numeric_metrics(metrics).items()]
        if ms:
            self.client.log_batch(run_id, metrics=ms)
        return len(ms)

    def log_dict(self, run_id: str, obj: Any, path: str) -> None:
        self.client.log_dict(run_id, obj, path)

    def log_text(self, run_id: str, text: str, path: str) -> None:
        self.client.log_text(run_id, text, path)

    def log_figure(self, run_id: str, fig, path: str) -> None:
        self.client.log_figure(run_id, fig, path)

    def log_artifacts(self, run_id: str, local_dir: str | Path, artifact_path: str | None = None) -> None:
        """Upload a folder's files to a run (stability tables, reports)."""
        self.client.log_artifacts(run_id, str(local_dir), artifact_path)

    def set_tag(self, run_id: str, key: str, value: str) -> None:
        self.client.set_tag(run_id, key, value)

    def tags(self, run_id: str) -> dict[str, str]:
        return self.client.get_run(run_id).data.tags

    def set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        """Several tags in one request (`set_tag` per key is one database transaction each)."""
        from mlflow.entities import RunTag

        if tags:
            self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def end(self, run_id: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(run_id, status=status)

    def status(self, run_id: str) -> str:
        return self.client.get_run(run_id).info.status

    def params(self, run_id: str) -> dict[str, str]:
        """A run's logged params (strings, as MLflow stores them)."""
        return dict(self.client.get_run(run_id).data.params)

    def reopen(self, run_id: str) -> None:
        """A run ended KILLED (an interrupted sweep) or FAILED (a sweep whose driver crashed) that
        `--resume` continues: RUNNING again."""
        if self.status(run_id) in ("KILLED", "FAILED"):
            self.client.update_run(run_id, status="RUNNING")

    def kill_running(self, run_ids: set[str]) -> list[str]:
        """End as KILLED the given runs (a sweep's parent and method groups) and every still-RUNNING
        run under them (its trials): the status of an interrupted sweep. Returns the runs killed."""
        killed = []
        for run in self.all_runs("attributes.status = 'RUNNING'"):
            if run.info.run_id in run_ids or run.data.tags.get(PARENT) in run_ids:
                self.end(run.info.run_id, "KILLED")
                killed.append(run.info.run_id)
        return killed

    def start_run(self, run_name: str, tags: dict[str, str], params: dict[str, Any] | None = None) -> str:
        """A run that is neither a sweep nor a trial (e.g. a study that reads several sweeps)."""
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags=tags)
        if params:
            self.log_params(run.info.run_id, params)
        return run.info.run_id

    # -- reading ----------------------------------------------------------------------------
    def sweeps(self) -> list[dict[str, Any]]:
        """Every sweep (parent run) of the experiment, oldest first: `run_id`, `sweep` (its spec's
        name; a rerun's parent is named after the rerun), `status` (MLflow's), `start_time` (ms),
        `groups` (its per-method group runs), `trials` (its trial runs, through the groups too) and
        `running` (how many of them are still RUNNING)."""
        runs = self.all_runs()
        sweeps = {
            r.info.run_id: {
                "run_id": r.info.run_id,
                "sweep": r.data.tags.get(SWEEP, ""),
                "status": r.info.status,
                "start_time": r.info.start_time or 0,
                "groups": [],
                "trials": 0,
                "running": 0,
            }
            for r in runs
            if r.data.tags.get(ROLE) == "sweep"
        }
        owner = {}  # group run id -> its sweep's parent run id
        for r in runs:
            if r.data.tags.get(ROLE) == "method" and r.data.tags.get(PARENT) in sweeps:
                sweeps[r.data.tags[PARENT]]["groups"].append(r.info.run_id)
                owner[r.info.run_id] = r.data.tags[PARENT]
        for r in runs:
            tags = r.data.tags
            if tags.get(ROLE) != "trial" or tags.get(LOST):
                continue
            parent = owner.get(tags.get(PARENT), tags.get(PARENT))
            if parent in sweeps:
                sweeps[parent]["trials"] += 1
                sweeps[parent]["running"] += r.info.status == "RUNNING"
        return sorted(sweeps.values(), key=lambda s: s["start_time"])

    def find_child(self, parent_id: str, trial_id: str) -> str | None:
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=(f"tags.`{PARENT}` = '{parent_id}' and tags.`{TRIAL_ID}` = '{trial_id}'"),
            max_results=1,
        )
        return runs[0].info.run_id if runs else None

    def running_children(self, parent_id: str) -> dict[str, str]:
        """{run id: trial id} of the parent's trial runs still RUNNING."""
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{PARENT}` = '{parent_id}' and attributes.status = 'RUNNING'",
            max_results=1000,
        )
        return {r.info.run_id: r.data.tags.get(TRIAL_ID, "") for r in runs if r.data.tags.get(ROLE) == "trial"}

    def trial_children(self, parent_id: str) -> dict[str, str]:
        """{run id: trial id} of all the parent's trial runs not yet marked lost, whatever their status."""
        runs = self.client.search_runs(
            [self.experiment_id], filter_string=f"tags.`{PARENT}` = '{parent_id}'", max_results=1000
        )
        return {
            r.info.run_id: r.data.tags.get(TRIAL_ID, "")
            for r in runs
            if r.data.tags.get(ROLE) == "trial" and not r.data.tags.get(LOST)
        }

    def mark_lost(self, run_id: str, why: str | None = None) -> None:
        """Mark a trial's run whose trial Ray Tune no longer knows (see LOST) and end it KILLED if it
        is still RUNNING (a run that ended keeps its status). `why`: the reason its description gives,
        by default that the driver stopped before Ray Tune saved the trial."""
        run = self.client.get_run(run_id)
        self.client.set_tag(run_id, LOST, "true")
        why = why or (
            "the sweep's driver stopped before Ray Tune saved this trial, so the resumed sweep ran another "
            "trial in its place"
        )
        self.set_description(run_id, f"**Lost**: {why}. Kept for the record; not one of the sweep's trials.")
        if not run.info.run_name.endswith(" (lost)"):
            self.client.update_run(run_id, name=f"{run.info.run_name} (lost)")
        if run.info.status == "RUNNING":
            self.end(run_id, "KILLED")

    def last_step(self, run_id: str, key: str) -> int:
        """The largest step logged for a metric (0 when none)."""
        hist = self.client.get_metric_history(run_id, logged_name(key))
        return max((m.step for m in hist), default=0)

    def metric_keys(self, run_id: str) -> list[str]:
        """The declared names of every metric a run has logged (sys/ prefix taken off)."""
        return [record_name(k) for k in self.client.get_run(run_id).data.metrics]

    def history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        """(step, value) of every value logged for a metric, by step."""
        return sorted((m.step, m.value) for m in self.client.get_metric_history(run_id, logged_name(key)))

    def all_runs(self, filter_string: str = "") -> list:
        runs, token = [], None
        while True:
            page = self.client.search_runs(
                [self.experiment_id], filter_string=filter_string, max_results=1000, page_token=token
            )
            runs.extend(page)
            token = page.token
            if not token:
                return runs

    def download_json(self, run_id: str, path: str) -> Any | None:
        """An artifact parsed as JSON, or None when the run has no such artifact."""
        parent = str(Path(path).parent) if "/" in path else None
        try:
            names = {a.path for a in self.client.list_artifacts(run_id, parent)}
            if path not in names:
                return None
            # MLflow draws a progress bar per download; a report reads one small JSON per trial,
            # and a screen of bars would bury its output (set the variable to "true" to see them)
            os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
            with tempfile.TemporaryDirectory() as tmp:
                local = self.client.download_artifacts(run_id, path, tmp)
                return json.loads(Path(local).read_text())
        except Exception as e:  # noqa: BLE001 - an unreadable artifact is missing data, not a crash
            print(f"warning: run {run_id}: could not read {path}: {e}")
            return None

    def trial_records(
        self, *, stability: bool = True, parents: set[str] | None = None
    ) -> tuple[list[TrialRecord], str | None]:
        """Every trial (child run) of the experiment, or only the children of `parents` (one
        sweep's parent and method-group runs), and the sweep's parent run id (the oldest parent when
        there are several, e.g. after a rerun). `stability=False` skips the eq. (4) tables
        (artifacts: one download per trial)."""
        from stabray.progress import counted

        parent_id, parent_start, records = None, 0, []
        runs = self.all_runs()
        with counted(f"reading {self.experiment!r} from MLflow", len(runs)) as progress:
            for run in runs:
                progress.advance()
                tags = run.data.tags
                role = tags.get(ROLE)
                if role == "sweep":
                    if parent_id is None or run.info.start_time < parent_start:
                        parent_id, parent_start = run.info.run_id, run.info.start_time
                    continue
                if role == "method" or (role != "trial" and PARENT not in tags):
                    continue  # a multi-method sweep's per-method group run holds no trial
                if parents is not None and tags.get(PARENT) not in parents:
                    continue
                if tags.get(LOST):  # a trial Ray Tune lost and replaced: not one of the sweep's trials
                    continue
                rid = run.info.run_id
                params = dict(run.data.params)
                for key in ("task", "method"):  # the tags name them too, should a param be missing
                    if key not in params and tags.get(f"stabray.{key}"):
                        params[key] = tags[f"stabray.{key}"]
                metrics = {record_name(k): _inf(v) for k, v in run.data.metrics.items()}
                history = [(m.step, m.value) for m in self.client.get_metric_history(rid, "val_acc")]
                for key in LAST_EPOCH_ONLY:  # logged at an earlier epoch than the last: not the trial's
                    if key in metrics and history:
                        steps = [m.step for m in self.client.get_metric_history(rid, logged_name(key))]
                        if max(steps, default=-1) < max(step for step, _ in history):
                            del metrics[key]
                status = tags.get(STATUS) or run.info.status  # MLflow's, unless the tag says STOPPED
                records.append(
                    TrialRecord(
                        trial_id=tags.get(TRIAL_ID) or rid,
                        params=params,
                        metrics=metrics,
                        val_history=history,
                        status=status,
                        run_id=rid,
                        name=run.info.run_name,
                        stopped_by=tags.get(STOPPED_BY),
                        decomposition=self.download_json(rid, "stability/decomposition.json") if stability else None,
                    )
                )
        return records, parent_id


def ended_status(last_result: dict[str, Any], error: bool) -> tuple[str, dict[str, str]]:
    """(MLflow run status, tags) for a trial that ended: an ASHA-stopped trial is FINISHED in
    MLflow (which has no word for it) with tags `stabray.status` = STOPPED and the epoch."""
    status = trial_status(failed=error, done=True, has_final="test_acc" in last_result)
    if status == "STOPPED":
        epoch = last_result.get("epoch") or last_result.get("training_iteration")
        return "FINISHED", {STATUS: "STOPPED", STOPPED_AT: str(int(epoch or 0))}
    return status, {}


def experiment_links(tracking_uri: str, base_url: str) -> list[tuple[str, str]]:
    """(experiment name, URL of its runs table) for each experiment with runs in the store, newest
    first. The URL opens MLflow 3's model-training view (not the GenAI one, its default) and, for a
    sweep, the saved view of its columns (searched params, accuracy, EAF, status)."""
    client = _client(tracking_uri)
    out = []
    for exp in client.search_experiments(order_by=["creation_time DESC"]):
        if exp.name == "Default" and not client.search_runs([exp.experiment_id], max_results=1):
            continue
        query = "workflowType=machine_learning" + (f"&viewStateShareKey={VIEW_KEY}" if VIEW_TAG in exp.tags else "")
        out.append((exp.name, f"{base_url}/#/experiments/{exp.experiment_id}/runs?{query}"))
    return out


def _get_run(run_id: str, tracking_uri: str | None):
    uri = resolve_tracking_uri(tracking_uri)
    db = sqlite_path(uri)
    if db is not None and not db.exists():
        raise UserError(f"{run_id!r} is not a directory, and there is no MLflow store at {db} to look it up in")
    check_store(uri, create=False)
    client = _client(uri)
    try:
        return client.get_run(run_id)
    except Exception as e:  # noqa: BLE001 - MLflow raises its own exception types per backend
        raise UserError(f"no MLflow run {run_id!r} at {uri}: {e}") from None


def run_data(run_id: str, tracking_uri: str | None = None) -> tuple[dict[str, float], dict[str, str], dict[str, str]]:
    """(latest value of every metric, params, tags) of one run, by id."""
    run = _get_run(run_id, tracking_uri)
    return {record_name(k): v for k, v in run.data.metrics.items()}, dict(run.data.params), dict(run.data.tags)


def log_artifacts(run_id: str, local_dir: str | Path, artifact_path: str | None, tracking_uri: str | None) -> None:
    """Upload a folder's files to a run given by id (the `stability` command's tables)."""
    run = _get_run(run_id, tracking_uri)
    _client(resolve_tracking_uri(tracking_uri)).log_artifacts(run.info.run_id, str(local_dir), artifact_path)


def checkpoint_dir_of(run_id: str, tracking_uri: str | None = None) -> str:
    """The last checkpoint directory a trial's run recorded (the `stability` command's input)."""
    run = _get_run(run_id, tracking_uri)
    path = run.data.tags.get(CHECKPOINT)
    if not path:
        raise UserError(f"run {run_id} recorded no checkpoint (tag {CHECKPOINT}); is it a stabray trial?")
    if "://" in path:  # in an object store (a sweep with storage s3://...)
        raise UserError(
            f"run {run_id}'s checkpoint is {path}; copy it here (aws s3 cp --recursive {path} DIR), then pass DIR"
        )
    if not Path(path).exists():
        raise UserError(
            f"run {run_id}'s checkpoint {path} is not on this machine (copy it here, then pass the directory)"
        )
    return path
