import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_SILENT", "true")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

TINY_LLAMA = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=4096)


@pytest.fixture(scope="session")
def embedded():
    """The embedded SmolLM2-135M-Instruct (GGUF), loaded once per session with the sparse_kv attention."""
    from omegaconf import OmegaConf

    from locks.models import load_model

    return load_model(OmegaConf.create({"name": "smollm2_135m", "source": "gguf_package"}))
