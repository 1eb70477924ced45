import os
import re

import pytest
import torch

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ["RAY_ADDRESS"] = "local"  # tests never join a Ray cluster that happens to run on the machine
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture
def tiny_model():
    from stabray.data.tokenizer import build_tokenizer
    from stabray.models import ModelSpec, build_model

    tok = build_tokenizer(["a b c [ ] 0.5 |"])
    return build_model(ModelSpec(preset="tiny"), tok)


@pytest.fixture
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))


def tiny_llama(tok):
    """A one-layer, 32-wide Llama over a test tokenizer's vocabulary (tests build their own models)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
    )


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def s3(monkeypatch):
    """An S3 server (moto) on 127.0.0.1 with a fresh bucket. The AWS variables, set here and in `s3.env`
    for subprocesses, point boto3, pyarrow (Ray Tune's storage) and MLflow at it and nowhere else."""
    import uuid
    from types import SimpleNamespace

    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,  # boto3 and pyarrow
        "MLFLOW_S3_ENDPOINT_URL": endpoint,  # MLflow's S3 artifact store
        "AWS_EC2_METADATA_DISABLED": "true",  # no credential lookups outside this machine
        "NO_PROXY": "127.0.0.1,localhost",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    import boto3

    bucket = f"stabray-{uuid.uuid4().hex[:8]}"  # moto's state lives as long as the test process
    client = boto3.client("s3")
    client.create_bucket(Bucket=bucket)
    try:
        yield SimpleNamespace(endpoint=endpoint, bucket=bucket, env=env, client=client)
    finally:
        server.stop()


def scored_by_hand(examples, predictions) -> float:
    """The share of `predictions` (generated answers, in the examples' order) whose text after the
    last '|' is the example's final answer, token for token: the task's exact-match rule written out
    again, so a reported accuracy that counts other predictions, or pairs them with other examples,
    differs from it. Not independent of the rule itself; answers known to be right by construction
    are tests/test_trial.py::test_reported_accuracy_counts_the_answers_that_are_right."""

    def tokens(text: str) -> list[str]:  # decimals, integers, words, and each other mark on its own
        return re.findall(r"\d+\.\d+|\d+|[A-Za-z_]+|[^\s\w]", text)

    assert len(predictions) == len(examples)
    return sum(tokens(p.rsplit("|", 1)[-1]) == tokens(e.final) for e, p in zip(examples, predictions)) / len(examples)
