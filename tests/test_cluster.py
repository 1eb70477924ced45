"""cluster.yaml and cluster.local.yaml validated offline with Ray's own autoscaler schema (misspelled
keys, bad node types); the local one mirrors the AWS one's node types, on the loopback."""

import copy
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def validate(cfg: dict) -> None:
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(copy.deepcopy(cfg)))


def test_cluster_config_validates():
    cfg = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    validate(cfg)
    types = cfg["available_node_types"]
    assert cfg["head_node_type"] in types
    assert any("stabray" in c and "pip install" in c for c in cfg["setup_commands"])
    # the MLflow server on the head binds to loopback unless edited
    head_cmds = " ".join(cfg["head_start_ray_commands"])
    assert "mlflow server" in head_cmds and "--host 127.0.0.1" in head_cmds
    # one EDIT line sets the storage; MLflow's artifacts and the documented driver command use it
    setup = [c for c in cfg["head_setup_commands"] if "STABRAY_STORAGE=" in c]
    assert len(setup) == 1 and "EDIT" in setup[0] and "s3://" in setup[0]
    assert '--artifacts-destination "$STABRAY_STORAGE/mlflow"' in head_cmds
    header = (ROOT / "cluster.yaml").read_text().split("cluster_name:")[0]
    assert '--storage "$STABRAY_STORAGE"' in header
    readme = (ROOT / "README.md").read_text()
    assert '--storage "$STABRAY_STORAGE" --tracking-uri http://127.0.0.1:5001' in readme


def test_local_cluster_mirrors_the_aws_one_on_the_loopback():
    """cluster.local.yaml: Ray's schema (its fake provider ships no defaults to fill in), the AWS
    config's GPU worker type (from zero, with a GPU), a head that runs no trials, every address local."""
    from ray.autoscaler._private.util import validate_config

    local = yaml.safe_load((ROOT / "cluster.local.yaml").read_text())
    aws = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    validate_config(copy.deepcopy(local))
    assert local["provider"]["type"] == "fake_multinode"
    assert local["provider"]["gcs_address"].startswith("127.0.0.1:")
    types = local["available_node_types"]
    assert set(types) - {local["head_node_type"]} == set(aws["available_node_types"]) - {aws["head_node_type"]}
    worker = types["gpu_worker"]
    assert worker["min_workers"] == 0 and worker["resources"]["GPU"] >= 1
    assert types[local["head_node_type"]]["resources"] == aws["available_node_types"]["head"]["resources"]


def test_schema_catches_misspelled_key():
    cfg = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    cfg["max_worker"] = cfg.pop("max_workers")
    from jsonschema import ValidationError

    with pytest.raises(ValidationError, match="max_worker"):
        validate(cfg)


def test_schema_catches_bad_head_type():
    cfg = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    cfg["head_node_type"] = "no_such_node"
    with pytest.raises(ValueError, match="head_node_type"):
        validate(cfg)
