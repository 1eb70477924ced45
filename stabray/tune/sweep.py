"""`python -m stabray sweep`: Optuna inside Ray Tune over a spec's search space (one objective, or
several with a multi-objective sampler), ASHA, EAF-aware early stopping or search.stop_if rules, a concurrency limit,
every trial tracked in MLflow (parent run per sweep, child per trial)."""

from __future__ import annotations

import copy
import json
import os
import socket
import threading
from pathlib import Path
from typing import Any

import ray
from ray import tune

from stabray.config import SweepSpec, set_path
from stabray.errors import UserError
from stabray.record import BUNDLE, run_folder
from stabray.spec import check_spec, space_path
from stabray.tasks import TASKS
from stabray.tracking import Store, check_experiment, check_store, resolve_tracking_uri
from stabray.tune import ray_state
from stabray.tune.callbacks import MLflowTuneCallback
from stabray.tune.console import SweepConsole
from stabray.tune.interrupt import GracefulStop
from stabray.tune.stop_rules import stoppers
from stabray.tune.storage import INFO_FILE, Storage, open_storage
from stabray.tune.trainable import trainable


def ray_space(spec: SweepSpec) -> dict[str, Any]:
    """The trial config with Ray search domains at the searched paths."""
    space = spec.trial_base()
    for key, dist in spec.search.space.items():
        kind = dist.kind()
        v = getattr(dist, kind)
        if spec.search.searcher == "grid":  # every combination of the choices, num_samples times each
            set_path(space, space_path(key), tune.grid_search(list(v)))
            continue
        if kind == "choice":
            domain = tune.choice(list(v))
        elif kind == "loguniform":
            domain = tune.loguniform(*v)
        elif kind == "uniform":
            domain = tune.uniform(*v)
        else:  # randint: both ends included (Ray's upper end is exclusive)
            domain = tune.randint(v[0], v[1] + 1)
        set_path(space, space_path(key), domain)
    return space


def trial_name(trial) -> str:
    """Short trial names (Ray's default puts the whole config into the directory name)."""
    return f"trial_{trial.trial_id}"


def quiet_logs(verbose: bool) -> None:
    """Unless verbose: no Optuna study lines, no MLflow database-migration lines, and no TensorBoard
    logger (its only output here is a warning about the eq. (4) table; the JSON and CSV loggers,
    which `analysis` reads, are added explicitly by `ray_loggers`)."""
    import logging

    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"
    global _SET_OUTPUT
    if verbose:
        if _SET_OUTPUT:  # give Ray back its default output engine
            os.environ.pop("RAY_AIR_NEW_OUTPUT", None)
            _SET_OUTPUT = False
        return
    # Ray's new output engine prints an experiment box at verbose=0; the classic one prints nothing.
    _SET_OUTPUT = os.environ.get("RAY_AIR_NEW_OUTPUT") != "0"
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    # Ray warns when a result takes over 0.5 s on the driver: our callbacks log a trial's last result
    # (the eq. (4) table, its plots) in about a second, once per trial. Warn past 5 s instead.
    from ray.tune.utils.util import warn_if_slow

    warn_if_slow.DEFAULT_THRESHOLD = max(warn_if_slow.DEFAULT_THRESHOLD, 5.0)
    # MLflow configures its "mlflow" logger when imported: quiet its children (sqlite migrations)
    for name in ("mlflow.store", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)


_SET_OUTPUT = False


def ray_loggers() -> list:
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    return [JsonLoggerCallback(), CSVLoggerCallback()]


def host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of a Ray address (host:port, :port for this machine, or ray://host:port), or None
    when it has no port."""
    host, sep, port = address.split("://", 1)[-1].rpartition(":")
    return (host or "127.0.0.1", int(port)) if sep and port.isdigit() else None


def unreachable(address: str, timeout_s: float = 3.0) -> str | None:
    """Why nothing accepts a connection at a Ray address (host:port or ray://host:port), or None
    when something does (or the address is not host:port, which Ray itself then judges)."""
    hp = host_port(address)
    if hp is None:
        return None
    try:
        socket.create_connection(hp, timeout=timeout_s).close()
        return None
    except OSError as e:
        return e.strerror or str(e) or type(e).__name__


def running_ray(auto: bool = False) -> tuple[str | None, str]:
    """(the address of the Ray cluster to join, where it was found), or (None, "") for none: the
    cluster the last `ray start` (or `ray up`) recorded in `ray_current_cluster` under Ray's temp dir
    ($RAY_TMPDIR/ray, else /tmp/ray), as `ray.init()` finds it. With `auto` (RAY_ADDRESS=auto), also
    any Ray process running on this machine, as `ray.init(address="auto")` does: that includes
    another user's private `ray.init()` instance, so stabray does not look for those by default."""
    from ray._common.utils import get_ray_address_file
    from ray._private import services

    try:
        found = services.get_ray_address_from_environment("auto" if auto else None, None)
    except ConnectionError:  # auto: nothing recorded, nothing running
        return None, ""
    if found is None:
        return None, ""
    if services.find_bootstrap_address(None) == found:
        return found, get_ray_address_file(None)
    return found, "a running Ray process"


def ray_env() -> None:
    """The environment stabray gives Ray and Tune (each only where the user has not set it): no auth
    token for a local instance, no warning for Tune's forced experiment-state saves (one per
    checkpoint, by design: `--resume` relies on them), and Ray's log monitor (a process of a Ray
    instance started from this process) looking for new worker log files every 0.5 s rather than 10
    times a second (its globbing was the busiest of Ray's own processes in a sweep, ~1% of a core).
    Code that starts Ray itself before a sweep (tests, benchmarks) calls this first."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    os.environ.setdefault("RAY_LOG_MONITOR_MANY_FILES_THRESHOLD", "0")


def ray_target(address: str | None = None) -> tuple[str | None, str]:
    """Where `init_ray(address)` would go, checked without starting or joining anything: (the address
    for `ray.init`: "local" for a fresh local instance, None to start one, else the cluster to join;
    a short description). An address that is not one, or that nothing answers at (given, or recorded
    by a Ray instance that has since stopped), is a UserError within seconds: Ray itself retries a
    dead address for minutes. `sweep --dry-run` calls this too."""
    addr = address or os.environ.get("RAY_ADDRESS")
    if addr == "local":  # always a fresh local instance (tests, benchmarks: never join another's)
        return "local", "started a local Ray instance"
    if addr and addr != "auto":
        given = "--address" if address else "RAY_ADDRESS"
        check_address_form(addr, given)
        why = unreachable(addr)
        if why:
            raise UserError(
                f"no Ray cluster answers at {addr} ({given}; {why}); start it, or run on a fresh local "
                "instance with --address local"
            )
        return addr, f"joined Ray cluster at {addr}"
    found, source = running_ray(auto=addr == "auto")
    if found is None:
        return None, "started a local Ray instance"
    why = unreachable(found)
    if why:
        remove = f", or delete {source}" if os.path.isabs(source) else ""
        raise UserError(
            f"{source} names the Ray cluster {found}, but nothing answers there ({why}): a Ray instance that "
            f"stopped left it behind; start a fresh local instance with --address local{remove}"
        )
    return found, f"joined the running Ray cluster at {found}"


def check_address_form(addr: str, given: str = "--address") -> None:
    """A UserError unless `addr` is host:port, :port or ray://host[:port] (local and auto are the caller's);
    a ray:// address also needs Ray Client's packages (`ray[client]`: grpcio), which `ray.init` asks for only
    after the sweep has made its store and folders."""
    if addr.startswith("ray://"):
        if not addr[len("ray://") :].split(":", 1)[0]:
            raise UserError(f"{given} {addr}: no host; give ray://host:port (Ray Client's port, 10001 by default)")
        import importlib.util

        if importlib.util.find_spec("grpc") is None:
            raise UserError(
                f"{given} {addr}: a ray:// address connects through Ray Client, which needs the grpcio package: "
                "pip install 'ray[client]' (or join the cluster from its head with host:port, or with auto there)"
            )
        return
    if host_port(addr) is None:
        raise UserError(
            f"{given} {addr}: not a Ray address; give host:port (e.g. 10.0.0.1:6379), ray://host:port, "
            "auto (a cluster on this machine) or local (a fresh local instance)"
        )


def check_joined(address: str | None) -> None:
    """With Ray already initialised in this process (a pipeline that called ray.init, or an earlier
    sweep in it), an explicit address must name that cluster: a malformed one, or one whose host or
    port differs (any name of this machine counts as its host), is refused rather than silently
    ignored. local and auto, or none, use the joined cluster."""
    if address in (None, "local", "auto"):
        return
    check_address_form(address)
    if address.startswith("ray://"):
        return  # a client connection: the cluster's own address is not known to compare with
    current = ray.get_runtime_context().gcs_address
    here, there = host_port(current), host_port(address)
    if here is None or there is None:
        return
    this_machine = {"127.0.0.1", "localhost", "0.0.0.0", ray.util.get_node_ip_address()}

    def where(hp: tuple[str, int]) -> tuple[str, int]:
        return ("this machine" if hp[0] in this_machine else hp[0], hp[1])

    if where(here) != where(there):
        raise UserError(
            f"--address {address}: this process already joined the Ray cluster at {current}; call "
            "ray.shutdown() first to join another, or leave --address out to use the joined one"
        )


def check_address(address: str | None) -> None:
    """What `init_ray(address)` would refuse, refused now, without starting or joining anything."""
    if ray.is_initialized():
        check_joined(address)
    else:
        ray_target(address)


def init_ray(address: str | None = None, verbose: bool = False) -> str:
    """Join a cluster (--address, RAY_ADDRESS, or the one `ray start` / `ray up` recorded on this
    machine) or start a local one, as `ray_target` decides and checks. Returns a short description.
    Unless verbose, the trials' own output (Ray's checkpoint lines, warnings) is not forwarded to
    this console: it stays in each trial's directory."""
    if ray.is_initialized():
        check_joined(address)
        return "already initialised"
    ray_env()
    target, how = ray_target(address)
    if target == "local":
        os.environ.pop("RAY_ADDRESS", None)
    ray.init(address=target, include_dashboard=False, log_to_driver=verbose, configure_logging=False)
    return how


def autoscaling() -> bool:
    """Whether an autoscaler with a config manages the joined cluster (`ray up`, `ray start
    --autoscaling-config`). Every Ray head runs a monitor that publishes a status in the cluster's
    key-value store (Ray has no public API for it); without a config it is read-only and names each
    node's type `node_<node id>`, with one it uses the config's node types."""
    import json

    try:
        from ray.experimental.internal_kv import _internal_kv_get

        status = json.loads(_internal_kv_get("__autoscaling_status") or "null") or {}
        mapping = (status.get("autoscaler_report") or {}).get("node_type_mapping") or {}
        return any(kind != f"node_{node}" for node, kind in mapping.items())
    except Exception:  # noqa: BLE001 - a private API: when it moves, behave as without an autoscaler
        return False


def local_resources() -> dict[str, float]:
    """The CPUs and GPUs a Ray instance started on this machine would have, counted as Ray counts
    them (CPUs within the process's cgroup limit; NVIDIA GPUs, only those CUDA_VISIBLE_DEVICES
    shows). Ray's counting is a private API: where it has moved, os.cpu_count() and torch's GPUs."""
    try:
        from ray._private import accelerators
        from ray._private.utils import get_num_cpus

        gpus = accelerators.get_accelerator_manager_for_resource("GPU")
        n_gpu = gpus.get_current_node_num_accelerators()
        visible = gpus.get_current_process_visible_accelerator_ids()
        if visible is not None:
            n_gpu = min(n_gpu, len(visible))
        return {"CPU": float(get_num_cpus()), "GPU": float(n_gpu)}
    except Exception:  # noqa: BLE001 - a private API: when it moves, count as torch and os do
        import torch

        return {"CPU": float(os.cpu_count() or 1), "GPU": float(torch.cuda.device_count())}


def check_local_resources(spec: SweepSpec, address: str | None) -> None:
    """Before Ray starts: when the sweep would start a Ray instance on this machine, a trial asking
    for more CPUs or GPUs than the machine has is refused now, as `check_resources` would refuse it
    once Ray has started (`sweep --dry-run` checks it too). A cluster's resources are only known
    once Ray joins it."""
    if not local_trials(address):
        return
    have = local_resources()
    if address:  # local_trials: "local", or nothing given and no cluster recorded here
        why = "--address local"
    elif os.environ.get("RAY_ADDRESS"):
        why = "RAY_ADDRESS=local"
    else:
        why = "no --address, RAY_ADDRESS or running cluster"
    for key, want in (("CPU", spec.resources.cpu), ("GPU", spec.resources.gpu)):
        if want > have[key]:
            raise UserError(
                f"resources.{key.lower()}: each trial asks for {want:g} {key}, but this machine has {have[key]:g} "
                f"and the sweep would start Ray here ({why}); lower the request or join a cluster with --address"
            )


def check_resources(spec: SweepSpec) -> None:
    """Fail fast when one trial asks for more than the whole cluster has (it would wait forever),
    unless an autoscaler runs the cluster: it starts the nodes the trials ask for (GPU workers from
    zero), so what the cluster has at the start says nothing."""
    total, later = ray.cluster_resources(), []
    for key, want in (("CPU", spec.resources.cpu), ("GPU", spec.resources.gpu)):
        have = total.get(key, 0.0)
        if want > have:
            if autoscaling():
                later.append(f"{want:g} {key} (the cluster has {have:g} now)")
                continue
            raise UserError(
                f"resources.{key.lower()}: each trial asks for {want:g} {key}, but the Ray cluster "
                f"has {have:g} in all; lower the request or add nodes"
            )
    if later:
        print(f"stabray: each trial asks for {', '.join(later)}; the autoscaler adds nodes for the trials", flush=True)


def checkpoints_to_keep(storage: Storage) -> int | None:
    """Checkpoints kept per trial: the last one on a local disk; every epoch's in an object store.
    Ray deletes a trial's older checkpoint as soon as it registers a newer one, before the experiment
    state that points to the newer one is uploaded: a driver killed in between (seconds on S3) leaves a
    state whose checkpoint is gone, and the resumed trial fails ("does not exist on storage anymore").
    A checkpoint holds what trains (LoRA adapters for a pretrained model) and the optimizer state."""
    return None if storage.remote else 1


def make_tuner(
    spec: SweepSpec,
    storage: Storage,
    run: str,
    callback: MLflowTuneCallback,
    resume: bool,
    console: SweepConsole | None = None,
    verbose: bool = False,
    param_space: dict[str, Any] | None = None,
):
    """A Tuner writing to `<storage>/<run>` (`run`: the run's folder, or `<run folder>/<method>`), or
    the one restored from there. `param_space`: the trials' space (default: `ray_space(spec)`)."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    s = spec.search
    train_fn = tune.with_resources(trainable, {"cpu": spec.resources.cpu, "gpu": spec.resources.gpu})
    stopper = callback.stopper if callback is not None else None
    if resume:
        return tune.Tuner.restore(storage.run_uri(run), trainable=train_fn, resume_unfinished=True, resume_errored=True)
    if s.searcher == "grid":
        searcher = None
    elif s.searcher == "optuna":
        import optuna

        from stabray.tune.search import DurableLimiter, DurableOptunaSearch

        if not verbose:  # "A new study created in RDB ..."
            optuna.logging.set_verbosity(optuna.logging.WARNING)

        # The live study is a sqlite file (beside the Ray results when they are local); Ray Tune's
        # searcher checkpoint carries its trials into the storage, so a resumed sweep continues it.
        metrics, modes = zip(*s.objectives())
        searcher = DurableOptunaSearch(
            db=storage.local_dir(run) / "optuna.db",
            metric=list(metrics) if s.multi else s.metric,  # lists: one Optuna direction per objective
            mode=list(modes) if s.multi else s.mode,
            sampler=optuna_sampler(spec),
            study_name=run.rsplit("/", 1)[-1],
        )
        searcher = DurableLimiter(searcher, max_concurrent=s.max_concurrent)
    else:
        searcher = None
    scheduler = (
        ASHAScheduler(
            time_attr="training_iteration",
            max_t=spec.train.epochs,
            grace_period=min(s.grace_period, spec.train.epochs),
            reduction_factor=s.reduction_factor,
        )
        if s.scheduler == "asha"
        else FIFOScheduler()
    )
    return tune.Tuner(
        train_fn,
        param_space=ray_space(spec) if param_space is None else param_space,
        tune_config=tune.TuneConfig(
            # several objectives: the searcher holds the lists (Tune would overwrite them with one metric)
            metric=None if s.multi else s.metric,
            mode=None if s.multi else s.mode,
            search_alg=searcher,
            scheduler=scheduler,
            num_samples=s.num_samples if param_space is None else 1,  # a given space lists every trial
            trial_name_creator=trial_name,
            reuse_actors=True,  # no process start + torch import per trial
            trial_dirname_creator=trial_name,
            max_concurrent_trials=s.max_concurrent if searcher is None else None,
        ),
        run_config=tune.RunConfig(
            name=run.rsplit("/", 1)[-1],
            storage_path=storage.run_uri(run).rsplit("/", 1)[0],
            callbacks=[c for c in (callback, console) if c is not None] + ray_loggers(),
            stop=stopper,
            checkpoint_config=tune.CheckpointConfig(num_to_keep=checkpoints_to_keep(storage)),
            failure_config=tune.FailureConfig(max_failures=s.max_failures),
            verbose=1 if verbose else 0,  # 0: our console view instead of Ray's status tables
            log_to_file=not verbose,  # each trial's stdout/stderr into files, copied into its directory:
            sync_config=tune.SyncConfig(sync_artifacts=True),
        ),
    )


def optuna_sampler(spec: SweepSpec):
    """The spec's Optuna sampler, seeded with the sweep's seed: TPE for one objective and NSGA-II for
    several unless search.sampler says otherwise. NSGA-II's generation is max(2, min(50, num_samples // 4))
    trials, so a 16-trial sweep sees four generations instead of one random one (Optuna's default is 50)."""
    import optuna

    s = spec.search
    kind = s.sampler or ("nsga2" if s.multi else "tpe")
    if kind == "nsga2":
        return optuna.samplers.NSGAIISampler(population_size=nsga2_population(s.num_samples), seed=spec.seed)
    return optuna.samplers.TPESampler(seed=spec.seed)


def nsga2_population(num_samples: int) -> int:
    return max(2, min(50, num_samples // 4))


class CombinedGrid:
    """The ResultGrids of a multi-method sweep, iterated as one."""

    def __init__(self, grids):
        self.grids = list(grids)

    def __iter__(self):
        for g in self.grids:
            yield from g

    def __len__(self):
        return sum(len(g) for g in self.grids)

    @property
    def num_terminated(self):
        return sum(g.num_terminated for g in self.grids)

    @property
    def num_errors(self):
        return sum(g.num_errors for g in self.grids)


def run_sweep(
    spec: SweepSpec,
    spec_path: str | Path,
    *,
    tracking_uri: str | None = None,
    storage: str | None = None,
    resume: bool = False,
    address: str | None = None,
    verbose: bool = False,
):
    """Run (or resume) a sweep. `verbose`: Ray's own status output instead of stabray's console view.
    Returns (results, info): results is a ResultGrid (a CombinedGrid for
    a multi-method sweep, one Optuna study and one MLflow group run per method, run one after the
    other), info holds the tracking URI, experiment, parent run id, results directory, completeness
    and, after SIGINT / SIGTERM, `interrupted` (the signal's name)."""
    check_spec(spec, spec_path)  # a SweepSpec built in Python, not read by load_spec: the same rules
    check_address(address)  # a malformed, dead or stale address: before any folder or store is made
    uri = resolve_tracking_uri(tracking_uri, spec.mlflow.tracking_uri)
    experiment = spec.mlflow.experiment or spec.name
    # a file where a folder should be, a missing or unreachable bucket: before anything starts
    results = open_storage(storage or spec.storage, "--storage" if storage else "storage")
    if resume:
        run, saved = resumed_run(results, spec.name)
        uri, experiment = saved["tracking_uri"], saved["experiment"]
    else:
        run = run_folder(spec.name)
    quiet_logs(verbose)
    # Everything that can fail does so before anything is created: no store, no results folder.
    check_store(uri, create=True, write=True)  # a server that does not answer, a damaged database: before Ray starts
    check_experiment(uri, experiment)  # a deleted experiment, a store that cannot be read: before Ray starts
    with GracefulStop() as stop:
        try:
            return _run(
                spec, spec_path, results, run, uri, experiment, saved if resume else None, address, verbose, stop
            )
        except KeyboardInterrupt:  # a second signal, or one before Ray Tune ran
            ray.shutdown()
            raise


def resumed_run(results: Storage, name: str) -> tuple[str, dict[str, Any]]:
    """The run `--resume` continues: the latest run folder of sweep `name` in the storage (found in the
    storage alone; on S3 no local file is needed) and its checked INFO_FILE. `sweep --resume --dry-run`
    asks the same, so a missing or damaged record is reported by the dry run too."""
    run = results.latest_run(name)
    if run is None or not results.exists(f"{run}/{INFO_FILE}"):
        raise UserError(f"--resume: no earlier sweep {name!r} under {results.uri}")
    return run, read_saved(results, run)


def read_saved(results: Storage, run: str) -> dict[str, Any]:
    """The run's INFO_FILE (its MLflow store, experiment, parent and method runs), checked: a file that is
    damaged or not stabray's is one error naming it, before Ray starts, with the run's results untouched."""
    path = f"{results.uri.rstrip('/')}/{run}/{INFO_FILE}"
    try:
        saved = results.read_json(f"{run}/{INFO_FILE}")
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise UserError(f"--resume: {path} is damaged (not JSON: {e}); the run cannot be continued") from None
    wanted = {"tracking_uri": str, "experiment": str, "parent_run_id": str, "groups": dict}
    bad = [k for k, t in wanted.items() if not isinstance(saved, dict) or not isinstance(saved.get(k), t)]
    if not bad and not all(isinstance(k, str) and isinstance(v, str) for k, v in saved["groups"].items()):
        bad = ["groups"]
    if bad:
        raise UserError(
            f"--resume: {path} is not a stabray sweep record (missing or wrong: {', '.join(bad)}); "
            "the run cannot be continued"
        )
    return saved


def local_trials(address: str | None) -> bool:
    """Whether `init_ray(address)` is about to start a Ray instance on this machine (its trials then
    share this machine's dataset cache), asked before it does."""
    if ray.is_initialized():  # already started: nothing to overlap with
        return False
    addr = address or os.environ.get("RAY_ADDRESS")
    return addr == "local" or (not addr and running_ray()[0] is None)


def eaf_searched(spec: SweepSpec, searched: set[str]) -> str | None:
    """The spec field that searches on or stops by `val_eaf` (an objective or a search.stop_if rule),
    when the trials' validation split and eval.eaf_examples are the spec's own (not searched), else
    None."""
    s = spec.search
    if "eval" in searched:
        return None
    for i, (metric, _) in enumerate(s.objectives()):
        if metric == "val_eaf":
            return f"search.metrics.{i}" if s.multi else "search.metric"
    return next((f"search.stop_if.{i}.metric" for i, r in enumerate(s.stop_if) if r.metric == "val_eaf"), None)


def empty_eaf_draw(field: str, val: list, n: int, method) -> UserError | None:
    """Why a search on `val_eaf` (`field`) cannot get a value, or None: the per-epoch EAF is measured
    on the method's gold chain (`Method.eval_steps`) of the first eval.eaf_examples = n validation
    examples, and where none of them has an intermediate step (small Dijkstra graphs: about half
    answer without one) its sum over steps is empty, which a trial leaves unlogged rather than report
    as a measured 0. The validation split is the same for every trial of the sweep, so each would
    stop at its first result (Ray's strict metric check), or a stop rule on it would never act. A
    method with latent thoughts (Coconut) is not judged here: its latent slots are steps too. The
    spec's own method stands for every trial even when its parameters are searched: whether an
    example's gold chain has a step does not depend on them (compression keeps at least one step of
    a chain that has any: Algorithm 1, MTP)."""
    if method.latent_thoughts or any(method.eval_steps(e) for e in val[:n]):
        return None
    first = next((i for i, e in enumerate(val) if method.eval_steps(e)), None)
    fix = (
        f"raise eval.eaf_examples to {first + 1} or more (validation example {first + 1} is the first with a step)"
        if first is not None
        else "no validation example has a step; search on val_acc"
    )
    return UserError(
        f"{field}: val_eaf is measured on the first {n} validation examples (eval.eaf_examples), and none of "
        f"them has an intermediate step, so the EAF is an empty sum that no trial logs; {fix}"
    )


def prewarm(spec: SweepSpec, data: bool) -> threading.Thread:
    """Work the driver does anyway, in a thread while Ray starts (`ray.init` mostly waits for Ray's
    processes): with `data` (the trials run on this machine), the trials' dataset generated and cached
    once here when it is not cached yet, rather than by the first trials side by side; then the
    imports for closing trials (figures, tables; Optuna's). A dataset the task cannot give (more
    examples asked for than it has distinct questions), or a search on the per-epoch EAF whose
    measured validation examples all answer without a step (`empty_eaf_draw`), or a first fresh
    training split (task.resample_train) with tokens the trials' tokenizer lacks (`first_fresh_problem`;
    with `data` only: on a cluster each trial meets that check before it trains), is kept as the
    thread's `problem`, which the driver raises before it opens any MLflow run or starts a trial; any
    other failure is left for the trials to meet and report. Without `data` (the trials run on a
    cluster) the EAF check draws the validation split alone (`validation_split`: cheap, not cached)."""

    def work():
        try:
            searched = {space_path(k).split(".", 1)[0] for k in spec.search.space}
            if "task" not in searched and TASKS.get(spec.task.name).runner == "text":
                from stabray.config import parse_trial_config
                from stabray.methods import get_method
                from stabray.train.run import first_fresh_problem, read_splits, splits_cached, validation_split

                trial = parse_trial_config(spec.trial_base())
                eaf = eaf_searched(spec, searched)
                # fresh training splits the trials' tokenizer cannot read (here only where the trials'
                # data is on this machine; on a cluster each trial meets the check before it trains)
                vocab = data and "model.numbers" not in {space_path(k) for k in spec.search.space}
                try:  # a UserError here: every trial would fail the same way
                    if data and (eaf or vocab or not splits_cached(trial)):  # a cached one the trials read
                        splits = read_splits(trial)
                        val = splits["val"]
                        if vocab and (problem := first_fresh_problem(trial, splits)) is not None:
                            t.problem = problem
                            return
                    elif eaf:  # the trials' machines hold their data: the validation split alone, here
                        val = validation_split(trial)
                except UserError as e:
                    t.problem = e
                    return
                if eaf:
                    method = get_method(trial.method.name, **trial.method.params)
                    t.problem = empty_eaf_draw(eaf, val, trial.eval.eaf_examples, method)
                    if t.problem is not None:
                        return
            if spec.search.searcher == "optuna":
                import optuna  # noqa: F401
            import polars  # noqa: F401

            import stabray.stability.plot  # noqa: F401
            from stabray.tune import plots

            plots._plt()
        except Exception:  # noqa: BLE001 - only a head start: each trial does this again and reports
            pass

    t = threading.Thread(target=work, name="stabray-prewarm", daemon=True)
    t.problem = None
    t.start()
    return t


def _run(spec, spec_path, results, run, uri, experiment, saved, address, verbose, stop):
    resume = saved is not None
    check_local_resources(spec, address)
    warm = prewarm(spec, data=local_trials(address))
    how = init_ray(address, verbose)
    stop.install()
    check_resources(spec)
    warm.join()  # the trials read the dataset it caches: not generated twice side by side
    if getattr(warm, "problem", None) is not None:  # before any MLflow run or trial exists
        raise warm.problem
    store = Store(uri, experiment)
    info_file = f"{run}/{INFO_FILE}"
    run_dir = results.run_uri(run)
    if resume:
        for run_id in (saved["parent_run_id"], *saved["groups"].values()):
            store.reopen(run_id)  # KILLED by the interrupt that --resume now continues
    else:
        from stabray.tune.summary import sweep_description, sweep_params, view_columns, view_order

        saved = {
            "parent_run_id": store.start_parent(
                spec.name, run, spec.model_dump(), sweep_params(spec), sweep_description(spec)
            ),
            "tracking_uri": uri,
            "experiment": experiment,
            "spec": str(spec_path),
            "groups": {},
        }
        try:
            results.write_json(info_file, saved)
            order_by, ascending = view_order(spec)
            store.set_runs_view(view_columns(spec), order_by=order_by, ascending=ascending)
        except Exception:
            end_failed(store, saved)
            raise
    parent = saved["parent_run_id"]
    info = {
        "tracking_uri": uri,
        "experiment": experiment,
        "parent_run_id": parent,
        "run_dir": run_dir,
        "ray": how,
        "complete": True,
        "groups": saved["groups"],  # method -> MLflow group run (multi-method sweeps)
    }
    print(f"stabray: {how}\n  results:  {run_dir}\n  MLflow:   {uri} (experiment {experiment!r})", flush=True)
    try:
        grids = _fit_all(spec, results, run, uri, experiment, saved, info_file, store, resume, verbose, stop, info)
    except KeyboardInterrupt:  # a second signal: Ray Tune may not have saved its state
        store.kill_running({parent, *saved["groups"].values()})
        raise
    except Exception:  # the driver failed (a bug, a lost cluster): the runs say so, not RUNNING forever
        end_failed(store, saved)
        raise
    if stop.signal is not None:
        # The parent, its method groups and the trials that were running: KILLED, which --resume continues.
        store.kill_running({parent, *saved["groups"].values()})
        info["interrupted"] = stop.name
        ray.shutdown()
    elif info["complete"]:
        store.end(parent, "FINISHED")
    return (CombinedGrid(grids) if spec.methods else grids[0] if grids else None), info


def end_failed(store: Store, saved: dict[str, Any]) -> None:
    """After the driver failed: the sweep's parent and method groups end FAILED, the trials that were
    running KILLED (as after an interrupt: `--resume` continues them, or marks them lost if Ray Tune
    never saved them). Best effort: the driver's own error, not one from a store that is also gone,
    is what the user sees."""
    import contextlib

    sweep_runs = {saved["parent_run_id"], *saved["groups"].values()}
    with contextlib.suppress(Exception):
        store.kill_running(sweep_runs)
        for run_id in sweep_runs:
            store.end(run_id, "FAILED")


def one_tuner(subs: list) -> bool:
    """Whether a multi-method sweep runs as one Tuner: every method a plain grid (no searcher state,
    FIFO, no EAF or stop_if rule: the one Tuner is given no stopper), so no trial's fate depends on the
    other trials of its method. Its slots then never wait for a method's last trials to end before
    the next method starts (3 seeds at 2 at a time: one Tuner per method runs each method in 2 rounds,
    one slot idle in the second). Searched or early-stopped methods keep one Tuner each: their
    searcher or rung compares only that method's trials."""
    return len(subs) > 1 and all(
        s.search.searcher == "grid" and s.search.scheduler == "fifo" and stoppers(s.search) is None for _, s in subs
    )


def grid_configs(sub: SweepSpec) -> list[dict[str, Any]]:
    """The trial configs of a grid spec, in order: every combination of its choices, num_samples
    times each (what `ray_space` asks Ray Tune to expand)."""
    import itertools

    keys = [space_path(k) for k in sub.search.space]
    choices = [list(d.choice or [None]) for d in sub.search.space.values()]
    out = []
    for values in itertools.product(*choices):
        cfg = sub.trial_base()
        for k, v in zip(keys, values):
            set_path(cfg, k, copy.deepcopy(v))
        out.extend(copy.deepcopy(cfg) for _ in range(sub.search.num_samples))
    return out


def _unrestorable(results: Storage, run: str) -> str | None:
    """None when Ray Tune can restore `run` (a run folder, or a method's inside it). Otherwise its
    saved state is damaged (see `stabray.tune.ray_state`): it is moved aside, the user is told, and
    the reason is returned for the MLflow runs of the trials that will not be resumed."""
    why = ray_state.damage(results, run)
    if why is None:
        return None
    aside = ray_state.set_aside(results, run)
    print(
        f"stabray: Ray Tune's saved state of {run} cannot be read: {why}. Most likely the driver was "
        f"killed while saving it. Its trials start again; the damaged state is kept in {aside}, and the "
        "MLflow runs of the interrupted trials are kept, marked lost.",
        flush=True,
    )
    return (
        f"Ray Tune could not read the sweep's saved state when it was resumed ({why}), so the sweep "
        "started its trials again"
    )


def _fit_all(spec, results, run, uri, experiment, saved, info_file, store, resume, verbose, stop, info) -> list:
    """Tuner.fit() per method (one for a one-method sweep) until all ran or a signal came; a sweep
    of grid methods (`one_tuner`) runs all its methods' trials in one Tuner."""
    from stabray.spec import method_specs

    parent = saved["parent_run_id"]
    subs = method_specs(spec)
    if saved.get("one_tuner", not resume and one_tuner(subs)):
        return _fit_one_tuner(
            spec, subs, results, run, uri, experiment, saved, info_file, store, resume, verbose, stop, info
        )
    grids = []
    for label, sub in subs:
        sub_run = run if label is None else f"{run}/{label}"
        group = parent
        if label is not None:  # MLflow groups a multi-method sweep's trials under one run per method
            group = saved["groups"].get(label)
            if group is None:
                group = saved["groups"][label] = store.start_group(parent, label)
                results.write_json(info_file, saved)
            print(f"stabray: method {label} ({sub.search.n_trials} trials)", flush=True)
        saved_tuner = resume and results.exists(f"{sub_run}/tuner.pkl")
        restart = _unrestorable(results, sub_run) if saved_tuner else None  # set aside when damaged
        if saved_tuner and restart is None:
            # The MLflow callback comes back from Ray's experiment pickle with its {trial: run} state.
            tuner = make_tuner(sub, results, sub_run, None, resume=True)
        else:
            searched = [space_path(k) for k in sub.search.space]
            stopper = stoppers(sub.search)
            cb = MLflowTuneCallback(uri, experiment, group, searched, stopper=stopper, restarted=restart)
            title = f"{sub.name}" + (f" [{label}]" if label else "")
            console = (
                None
                if verbose
                else SweepConsole(
                    title,
                    sub.search.n_trials,
                    sub.train.epochs,
                    searched,
                    cb.name_of,
                    stopped_by=cb.stopped_by,
                )
            )
            tuner = make_tuner(sub, results, sub_run, cb, resume=False, console=console, verbose=verbose)
        with stop.in_fit():
            grid = tuner.fit()
        grids.append(grid)
        done = grid.num_terminated + grid.num_errors >= sub.search.n_trials
        if stop.signal is not None or not done:
            info["complete"] = False
            break  # interrupted: stop here, --resume continues
        if label is not None:
            store.end(group, "FINISHED")
    return grids


def _fit_one_tuner(spec, subs, results, run, uri, experiment, saved, info_file, store, resume, verbose, stop, info):
    parent = saved["parent_run_id"]
    if not saved.get("one_tuner"):
        saved["one_tuner"] = True  # --resume restores this layout: one Tuner in the run's folder
        results.write_json(info_file, saved)
    methods = {}
    for label, sub in subs:
        if label not in saved["groups"]:  # MLflow groups the trials under one run per method
            saved["groups"][label] = store.start_group(parent, label)
            results.write_json(info_file, saved)
        methods[label] = (saved["groups"][label], [space_path(k) for k in sub.search.space])
    configs = [c for _, sub in subs for c in grid_configs(sub)]
    print(
        "stabray: methods "
        + ", ".join(f"{label} ({sub.search.n_trials})" for label, sub in subs)
        + f": {len(configs)} trials, {spec.search.max_concurrent} at a time",
        flush=True,
    )
    saved_tuner = resume and results.exists(f"{run}/tuner.pkl")
    restart = _unrestorable(results, run) if saved_tuner else None  # set aside when damaged
    if saved_tuner and restart is None:
        tuner = make_tuner(spec, results, run, None, resume=True)
    else:
        cb = MLflowTuneCallback(uri, experiment, parent, methods=methods, restarted=restart)
        console = (
            None
            if verbose
            else SweepConsole(spec.name, len(configs), spec.train.epochs, namer=cb.name_of, stopped_by=cb.stopped_by)
        )
        tuner = make_tuner(
            spec,
            results,
            run,
            cb,
            resume=False,
            console=console,
            verbose=verbose,
            param_space={BUNDLE: tune.grid_search(configs)},
        )
    with stop.in_fit():
        grid = tuner.fit()
    if stop.signal is not None or grid.num_terminated + grid.num_errors < len(configs):
        info["complete"] = False  # interrupted: --resume continues
    else:
        for group, _ in methods.values():
            store.end(group, "FINISHED")
    return [grid]


def run_configs(
    configs: list[dict[str, Any]],
    experiment: str,
    tracking_uri: str | None = None,
    storage: str | None = None,
    cpu: float = 1.0,
    gpu: float = 0.0,
    name: str = "rerun",
    address: str | None = None,
):
    """Run fixed trial configs (e.g. a selected configuration with several seeds) as one Ray Tune
    run, logged to `experiment` under a new parent run; `address` as `run_sweep`'s. Each config (a
    dict in `TrialConfig`'s layout, or a TrialConfig) is checked as `make_run` checks it before Ray
    starts or any run is made; the parent run ends FAILED when a trial failed."""
    client = (address or os.environ.get("RAY_ADDRESS") or "").startswith("ray://")
    trials = checked_configs(configs, local_paths=not client)  # through Ray Client the trials run elsewhere
    uri = resolve_tracking_uri(tracking_uri)
    quiet_logs(False)
    check_address(address)  # before the store is made, as run_sweep
    results = open_storage(storage)
    check_store(uri, create=True, write=True)
    store = Store(uri, experiment)
    init_ray(address)
    run = run_folder(name)
    parent = store.start_parent(name, run, {"configs": trials})
    cb = MLflowTuneCallback(uri, experiment, parent)
    epochs = max(c["train"]["epochs"] for c in trials)
    console = SweepConsole(f"{experiment} {name}", len(trials), epochs, namer=cb.name_of)
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": cpu, "gpu": gpu}),
        param_space={BUNDLE: tune.grid_search(trials)},
        tune_config=tune.TuneConfig(trial_name_creator=trial_name, trial_dirname_creator=trial_name, reuse_actors=True),
        run_config=tune.RunConfig(
            name=run,
            storage_path=results.uri,
            callbacks=[cb, console, *ray_loggers()],
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
            verbose=0,
            log_to_file=True,
            sync_config=tune.SyncConfig(sync_artifacts=True),
        ),
    )
    try:
        grid = tuner.fit()
    except BaseException:
        store.end(parent, "FAILED")
        raise
    store.end(parent, "FAILED" if grid.errors else "FINISHED")
    return grid


def checked_configs(configs: Any, local_paths: bool = True) -> list[dict[str, Any]]:
    """`run_configs`' trial configs, each validated (`parse_trial_config`, then `run_problem`) and
    written out whole (the default method included), or a UserError naming the config at fault."""
    from stabray.config import TrialConfig, parse_trial_config
    from stabray.spec import problem_text, run_problem

    if isinstance(configs, dict | TrialConfig) or not isinstance(configs, list | tuple) or not configs:
        raise UserError(
            f"run_configs: configs must be a non-empty list of trial configs (dicts in TrialConfig's layout), "
            f"got {type(configs).__name__}{' (empty)' if isinstance(configs, list | tuple) else ''}"
        )
    out = []
    for i, c in enumerate(configs):
        if not isinstance(c, dict | TrialConfig):
            raise UserError(f"run_configs: config {i} is a {type(c).__name__}, not a dict")
        try:
            cfg = c if isinstance(c, TrialConfig) else parse_trial_config(c)
        except UserError as e:
            raise UserError(f"run_configs: config {i}: {e}") from None
        if problem := run_problem(cfg, local_paths):
            raise UserError(f"run_configs: config {i}: {problem_text(problem)}")
        try:  # plain JSON values (numpy scalars in params, as a search gives them, become Python numbers)
            out.append(json.loads(json.dumps(cfg.model_dump(), default=_plain)))
        except TypeError as e:
            raise UserError(f"run_configs: config {i}: {e}") from None
    return out


def _plain(value: Any) -> Any:
    """A numpy scalar or array as the Python number or list it holds; anything else is not JSON."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"a value of type {type(value).__name__} is not a plain number, string or list: {value!r}")
