import os

import pytest
import torch

if not torch.cuda.is_available():  # CPU: kernels run under the Triton interpreter (read when they are decorated)
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_SILENT", "true")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def greedy(model, ids, n, method="fullkv", budget=4096, **options):
    """Greedy decoding of `n` tokens through the sparse_kv attention with a fresh SelectorCache for `method`
    -> (generated ids, cache)."""
    from locks.attention import register_attention
    from locks.cache import SelectorCache
    from locks.generation import generate
    from locks.selector import MethodSpec

    model.set_attn_implementation(register_attention())
    cache = SelectorCache(model, MethodSpec(method, budget, options))
    return generate(model, cache, ids, n), cache

TINY_LLAMA = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=4096)


@pytest.fixture(scope="session")
def embedded():
    """The embedded SmolLM2-135M-Instruct (GGUF), loaded once per session with the sparse_kv attention."""
    from omegaconf import OmegaConf

    from locks.models import load_model

    return load_model(OmegaConf.create({"name": "smollm2_135m", "source": "gguf_package"}))


class WhitespaceTokenizer:
    """eval_fixtures.md §1.2 stub: text_to_tokens = str.split; a toy chat template."""

    name_or_path = "whitespace-stub"

    def tokenize(self, text):
        return text.split()

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=False):
        assert not tokenize and add_generation_prompt
        return "<user>\n" + messages[0]["content"] + "\n<assistant>\n"


@pytest.fixture(scope="module")
def tok():
    """The embedded model's tokenizer (GGUF), ~3 s to load."""
    import transformers

    from locks.embedded_model import smollm2_gguf_path

    p = smollm2_gguf_path()
    return transformers.AutoTokenizer.from_pretrained(p.parent, gguf_file=p.name)


@pytest.fixture(scope="module")
def ws():
    return WhitespaceTokenizer()

