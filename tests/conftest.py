import os

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
