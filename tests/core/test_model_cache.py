"""The embedded GGUF model is dequantized once and then loaded from model.cache_dir: the same weights, tokenizer and
logits, and the same tokenizer identity in the records (locks/core/models.py)."""
import time

import torch
from omegaconf import OmegaConf

from eval.ruler.generate import tokenizer_identity
from locks.core.models import load_model


def test_cached_checkpoint_equals_the_gguf(tmp_path):
    cfg = OmegaConf.create({"name": "smollm2_135m", "source": "gguf_package", "cache_dir": str(tmp_path)})
    start = time.perf_counter()
    gguf = load_model(cfg)  # dequantizes and writes the cache
    first = time.perf_counter() - start
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 1  # one checkpoint, no half-written copy left
    start = time.perf_counter()
    cached = load_model(cfg)
    second = time.perf_counter() - start
    a, b = gguf.model.state_dict(), cached.model.state_dict()
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    text = "The needle is 1234567. <|im_start|>user\nünïcödé<|im_end|>"
    assert gguf.tokenizer(text).input_ids == cached.tokenizer(text).input_ids
    assert tokenizer_identity(gguf.tokenizer) == tokenizer_identity(cached.tokenizer)
    assert gguf.eos_token_ids == cached.eos_token_ids and gguf.max_context == cached.max_context
    ids = gguf.tokenizer("The capital of France is", return_tensors="pt").input_ids
    for m in (gguf.model, cached.model):
        m.set_attn_implementation("sdpa")
    with torch.no_grad():
        assert torch.equal(gguf.model(ids).logits, cached.model(ids).logits)
    print(f"\nGGUF load {first:.1f} s, cached {second:.1f} s")
