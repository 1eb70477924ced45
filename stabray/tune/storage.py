"""Where a sweep's results live: a local folder or an object store (`s3://bucket/prefix`).

Ray Tune writes the trials' results and checkpoints, and its experiment state (the trials' statuses,
the searcher's and the callbacks' state), under `<storage>/<run name>/`; stabray adds
`stabray_sweep.json` (the MLflow parent run, the tracking URI). On S3 this is all `--resume` needs:
it lists the storage for the newest run of the sweep and restores it from there, so a driver whose
disk is gone (a replaced head node, a deleted working directory) continues the sweep.

Object stores go through pyarrow's filesystems, as Ray Tune's own storage does: credentials and the
endpoint come from the usual environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
`AWS_ENDPOINT_URL` for an S3-compatible server such as MinIO, an instance profile on EC2).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stabray.errors import UserError, unwritable
from stabray.record import is_run_folder

DEFAULT = "stabray_runs"
INFO_FILE = "stabray_sweep.json"  # beside Ray's experiment state: the MLflow parent run and store


def is_remote(location: str) -> bool:
    """An object-store URI (s3://, gs://, ...) rather than a local folder."""
    return "://" in location and not location.startswith("file://")


@dataclass
class Storage:
    """A results location: `uri` is what Ray Tune gets as `storage_path` (an absolute folder or an
    `s3://bucket/prefix` URI), `fs` and `path` the same place as a pyarrow filesystem and a path in it."""

    uri: str
    fs: Any  # pyarrow.fs.FileSystem
    path: str

    @property
    def remote(self) -> bool:
        return is_remote(self.uri)

    def run_uri(self, run: str) -> str:
        """A run's folder (or a method's folder inside it, `run/label`) as Ray Tune's restore takes it."""
        return f"{self.uri.rstrip('/')}/{run}"

    def _fs_path(self, rel: str) -> str:
        return f"{self.path.rstrip('/')}/{rel}"

    def exists(self, rel: str) -> bool:
        import pyarrow.fs as pafs

        return self.fs.get_file_info(self._fs_path(rel)).type != pafs.FileType.NotFound

    def read_json(self, rel: str) -> Any:
        with self.fs.open_input_stream(self._fs_path(rel)) as f:
            return json.loads(f.read().decode())

    def read_bytes(self, rel: str) -> bytes:
        with self.fs.open_input_stream(self._fs_path(rel)) as f:
            return f.read()

    def files(self, rel: str) -> list[str]:
        """The names of the files (not folders) directly in folder `rel`."""
        import pyarrow.fs as pafs

        infos = self.fs.get_file_info(pafs.FileSelector(self._fs_path(rel), allow_not_found=True, recursive=False))
        return sorted(i.base_name for i in infos if i.type == pafs.FileType.File)

    def move(self, src: str, dst: str) -> None:
        """Move a file within the storage (an object store copies it, then deletes the original)."""
        self.fs.create_dir(self._fs_path(dst).rsplit("/", 1)[0], recursive=True)
        self.fs.move(self._fs_path(src), self._fs_path(dst))

    def write_json(self, rel: str, obj: Any) -> None:
        """Written whole: a local file by rename, an S3 object by one PUT (never half a file)."""
        data = json.dumps(obj).encode()
        if not self.remote:
            target = Path(self._fs_path(rel))
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, target)
            return
        with self.fs.open_output_stream(self._fs_path(rel)) as f:
            f.write(data)

    def runs(self, name: str) -> list[str]:
        """The run folders of sweep `name` (`<name>-<yyyymmdd-hhmmss>`), oldest first."""
        import pyarrow.fs as pafs

        infos = self.fs.get_file_info(pafs.FileSelector(self.path, allow_not_found=True, recursive=False))
        names = [i.base_name for i in infos if i.type == pafs.FileType.Directory]
        return sorted(n for n in names if is_run_folder(n, name))

    def latest_run(self, name: str) -> str | None:
        found = self.runs(name)
        return found[-1] if found else None

    def local_dir(self, run: str) -> Path:
        """A local folder for what must be a plain file on this machine (the Optuna study's sqlite
        working copy, which optuna-dashboard reads): the run folder itself for local storage, else
        `./stabray_runs/<run>` (the durable copy of the study then lives in the storage, in Ray
        Tune's searcher checkpoint)."""
        if not self.remote:
            return Path(self._fs_path(run))
        return Path(DEFAULT).absolute() / run


def open_storage(location: str | None, label: str = "storage") -> Storage:
    """The storage for `--storage` / the spec's `storage` (default ./stabray_runs), checked before Ray
    starts: a local path must be a folder (or not exist yet); a bucket must exist and answer. `label`
    names where the location came from in errors."""
    import pyarrow.fs as pafs

    location = location or DEFAULT
    if not is_remote(location):
        try:
            root = Path(location.removeprefix("file://")).expanduser().absolute()
        except RuntimeError as e:  # ~name of a user this machine does not know
            raise UserError(f"{label} {location}: cannot expand the ~ ({e})") from None
        if root.exists() and not root.is_dir():
            raise UserError(f"{label} {root}: a file, not a directory")
        above = next((p for p in root.parents if p.exists()), None)
        if above is not None and not above.is_dir():
            raise UserError(f"{label} {root}: {above} is a file, not a directory")
        if why := unwritable(root):
            raise UserError(f"{label} {root}: {why}")
        return Storage(str(root), pafs.LocalFileSystem(), str(root))
    uri = location.rstrip("/")
    try:
        fs, path = pafs.FileSystem.from_uri(uri)
    except (ValueError, OSError) as e:  # an unknown scheme, a malformed URI, a missing region
        raise UserError(f"{label} {location}: {_first_line(e)}") from None
    bucket = path.split("/", 1)[0]
    if not bucket:
        raise UserError(f"{label} {location}: no bucket in the URI (s3://BUCKET/prefix)")
    try:
        info = _answer_within(lambda: fs.get_file_info(bucket), REACH_S)
    except TimeoutError:  # e.g. gs:// on a machine without Google credentials asks a metadata server
        raise UserError(  # that is not there, and pyarrow waits on it without end (Ctrl-C included)
            f"{label} {location}: the bucket {bucket!r} did not answer within {REACH_S:g} s (its credentials "
            "lookup or the network); check both, or give a local folder"
        ) from None
    except OSError as e:  # no credentials, access denied, the endpoint does not answer
        raise UserError(f"{label} {location}: cannot reach the bucket {bucket!r}: {_first_line(e)}") from None
    if info.type == pafs.FileType.NotFound:
        raise UserError(f"{label} {location}: there is no bucket {bucket!r} (create it, or fix the URI)")
    return Storage(uri, fs, path)


REACH_S = 30.0  # how long a bucket may take to answer the first request before it counts as unreachable


def _answer_within(call, seconds: float):
    """call() in a daemon thread: its result, its exception, or TimeoutError after `seconds` (the thread
    is left behind: a native call that hangs cannot be cancelled, and a daemon thread does not hold up
    the exit)."""
    import threading

    box: dict = {}

    def work():
        try:
            box["value"] = call()
        except BaseException as e:  # noqa: BLE001 - handed to the caller as raised
            box["error"] = e

    t = threading.Thread(target=work, name="stabray-storage-probe", daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise TimeoutError(f"no answer within {seconds:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
