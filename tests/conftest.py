"""Test environment (set before anything imports the kernels) and the session fixtures; shared helpers are in
tests/helpers.py. Tests are grouped by layer: core/, methods/, eval/, e2e/."""
import os

import torch

if not torch.cuda.is_available():  # CPU: kernels run under the Triton interpreter (read when they are decorated)
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_SILENT", "true")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

import pytest  # noqa: E402

from tests.helpers import WhitespaceTokenizer  # noqa: E402


@pytest.fixture(scope="session")
def embedded():
    """The embedded SmolLM2-135M-Instruct (GGUF), loaded once per session with the sparse_kv attention."""
    from omegaconf import OmegaConf

    from locks.core.models import load_model

    return load_model(OmegaConf.create({"name": "smollm2_135m", "source": "gguf_package"}))


@pytest.fixture(scope="module")
def tok():
    """The embedded model's tokenizer (GGUF), ~3 s to load."""
    import transformers

    from locks.core.embedded_model import smollm2_gguf_path

    p = smollm2_gguf_path()
    return transformers.AutoTokenizer.from_pretrained(p.parent, gguf_file=p.name)


@pytest.fixture(scope="module")
def ws():
    return WhitespaceTokenizer()
