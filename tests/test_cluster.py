"""cluster.yaml validated offline with Ray's own autoscaler schema (misspelled keys, bad node types)."""

import copy
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CLUSTER_FILES = sorted(ROOT.glob("cluster*.yaml"))


def validate(cfg: dict) -> None:
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(copy.deepcopy(cfg)))


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=lambda p: p.name)
def test_cluster_config_validates(path):
    cfg = yaml.safe_load(path.read_text())
    validate(cfg)
    types = cfg["available_node_types"]
    assert cfg["head_node_type"] in types
    assert any("stabray" in c and "pip install" in c for c in cfg["setup_commands"])
    # the MLflow server on the head binds to loopback unless edited
    head_cmds = " ".join(cfg["head_start_ray_commands"])
    assert "mlflow server" in head_cmds and "--host 127.0.0.1" in head_cmds


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
