"""An autoscaling Ray cluster on this machine, from cluster.local.yaml (Ray's fake_multinode provider:
a real autoscaler whose "nodes" are local processes with the resources the config declares).

    python scripts/fake_cluster.py start            # prints the RAY_ADDRESS to export
    RAY_ADDRESS=127.0.0.1:6379 python -m stabray sweep dijkstra --set resources.gpu=1
    python scripts/fake_cluster.py status           # `ray status`: the nodes the autoscaler runs now
    python scripts/fake_cluster.py stop

Every address is 127.0.0.1 (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 makes Ray pick the loopback for the
nodes the autoscaler adds). The cluster keeps its files in its own temp dir (--temp-dir, default
/tmp/stabray-fake-cluster), so it never touches /tmp/ray or another Ray on the machine, and `stop`
ends exactly its processes (its process group, recorded in the temp dir), not every Ray on the machine
as `ray stop` would.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from stabray.errors import UserError, run_script

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "cluster.local.yaml"
DEFAULT_TEMP = "/tmp/stabray-fake-cluster"  # Ray's sockets live below it: keep it short (108-byte limit)


def ray_env(**extra: str) -> dict[str, str]:
    """The environment for the cluster's processes and for `ray status` / a driver joining it."""
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    env.pop("RAY_ADDRESS", None)  # the head starts its own cluster; a driver gets the address in `extra`
    return {**env, **extra}


def ray_bin() -> str:
    return str(Path(sys.executable).with_name("ray"))


def read_config(config: Path) -> dict:
    """The autoscaler config, or UserError naming what is wrong with the file."""
    try:
        cfg = yaml.safe_load(config.read_text())
    except OSError as e:
        raise UserError(f"--config {config}: cannot read it ({e.strerror or type(e).__name__})") from None
    except yaml.YAMLError as e:
        raise UserError(f"--config {config}: not valid YAML ({str(e).splitlines()[0]})") from None
    need = ("provider", "available_node_types", "head_node_type")
    if not isinstance(cfg, dict) or any(k not in cfg for k in need):
        raise UserError(f"--config {config}: not a Ray autoscaler config (needs {', '.join(need)})")
    return cfg


def start(port: int = 6379, temp_dir: str = DEFAULT_TEMP, config: Path = CONFIG, timeout_s: float = 300) -> str:
    """Start the head (which starts the autoscaler); returns the address to join. The config's
    `gcs_address` is rewritten to `port` in a copy kept in the temp dir."""
    tmp = Path(temp_dir)
    if (tmp / "pgid").exists():
        raise UserError(f"a fake cluster already runs from {tmp} (stop it first: fake_cluster.py stop)")
    if tmp.exists() and not tmp.is_dir():
        raise UserError(f"--temp-dir {tmp}: a file, not a directory")
    cfg = read_config(Path(config))  # before anything is created
    tmp.mkdir(parents=True, exist_ok=True)
    cfg["provider"]["gcs_address"] = f"127.0.0.1:{port}"
    cfg_file = tmp / "cluster.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg))
    head = cfg["available_node_types"][cfg["head_node_type"]]["resources"]
    cmd = [
        ray_bin(),
        "start",
        "--head",
        f"--autoscaling-config={cfg_file}",
        f"--port={port}",
        "--node-ip-address=127.0.0.1",
        f"--num-cpus={int(head.get('CPU', 0))}",
        f"--num-gpus={int(head.get('GPU', 0))}",
        f"--temp-dir={tmp}",
        "--object-store-memory=200000000",  # as the workers (Ray: 30% of the memory per node)
        "--include-dashboard=false",
        "--disable-usage-stats",
    ]
    with tempfile.TemporaryFile("w+") as log:
        # A new session: the head's processes and every node the autoscaler starts share its group.
        proc = subprocess.Popen(
            cmd, env=ray_env(RAY_FAKE_CLUSTER="1"), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        (tmp / "pgid").write_text(str(proc.pid))
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
        if rc != 0:
            log.seek(0)
            stop(temp_dir)
            raise SystemExit(f"ray start failed ({rc}):\n{log.read()[-3000:]}")
    return f"127.0.0.1:{port}"


def status(address: str, timeout_s: float = 120) -> str:
    """`ray status` of the cluster (its "Active:" lines list the nodes by type)."""
    try:
        cmd = [ray_bin(), "status", "--address", address]
        res = subprocess.run(cmd, env=ray_env(), capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"no answer from a Ray cluster at {address} within {timeout_s:.0f} s (started?)") from None
    return res.stdout if res.returncode == 0 else res.stdout + res.stderr


def active_nodes(status_text: str) -> dict[str, int]:
    """{node type: count} from the "Active:" block of `ray status`."""
    counts, inside = {}, False
    for line in status_text.splitlines():
        if line.strip() == "Active:":
            inside = True
            continue
        if inside:
            parts = line.split()
            if len(parts) != 2 or not parts[0].isdigit():
                break
            counts[parts[1]] = int(parts[0])
    return counts


def processes(temp_dir: str = DEFAULT_TEMP) -> list[int]:
    """PIDs of the cluster's process group."""
    try:
        pgid = int((Path(temp_dir) / "pgid").read_text())
    except (OSError, ValueError):
        return []
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if os.getpgid(int(p.name)) == pgid:
                    out.append(int(p.name))
            except OSError:
                pass  # ended meanwhile
    return out


def stop(temp_dir: str = DEFAULT_TEMP, grace_s: float = 15) -> None:
    """SIGTERM to the cluster's process group, SIGKILL to what is left after `grace_s`, then its temp dir.
    A folder that holds no cluster (no `pgid` file written by `start`) is left alone: UserError."""
    tmp = Path(temp_dir)
    if not tmp.exists():
        raise UserError(f"--temp-dir {tmp}: no such folder; no fake cluster to stop")
    if not (tmp / "pgid").is_file():
        raise UserError(f"--temp-dir {tmp}: not a fake cluster's folder (no pgid file); nothing stopped or removed")
    try:
        pgid = int((tmp / "pgid").read_text())
    except (OSError, ValueError):
        pgid = None
    if pgid is not None:
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.time() + wait
            while time.time() < deadline and processes(temp_dir):
                time.sleep(0.5)
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("action", choices=["start", "status", "stop"])
    p.add_argument("--port", type=int, default=6379, help="the head's port (default 6379)")
    p.add_argument("--temp-dir", default=DEFAULT_TEMP, help=f"the cluster's Ray temp dir (default {DEFAULT_TEMP})")
    p.add_argument("--config", default=str(CONFIG), help="autoscaler config (default cluster.local.yaml)")
    args = p.parse_args(argv)
    if args.action == "start":
        address = start(args.port, args.temp_dir, Path(args.config))
        print(f"started; join it with:\n  export RAY_ADDRESS={address} RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0")
    elif args.action == "status":
        print(status(f"127.0.0.1:{args.port}"))
    else:
        stop(args.temp_dir)
        print("stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_script(main))
