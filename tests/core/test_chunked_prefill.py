"""Chunked prefill (locks/core/chunked_prefill.py): a prompt fed in chunks leaves the cache, every selector's
state and the whole generation as one forward does. Float64 models, so any difference beyond rounding is real:
every registered method generates the same tokens with the same per-sample record, and a group's prefill capture
keeps the same K/V and queries. A chunk size that is not a positive integer stops the run with one line."""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from locks.core.attention import register_attention
from locks.core.cache import SelectorCache
from locks.core.chunked_prefill import check_chunk_size, prefill_prompt
from locks.core.generation import generate
from locks.core.prefill import capture_prefill
from locks.core.registry import MethodSpec, discover
from locks.errors import ConfigError
from tests.helpers import TINY_LLAMA, default_method_options, hybrid_model

TINY = {**TINY_LLAMA, "hidden_size": 192, "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 64,
        "num_hidden_layers": 3}
PROMPT = 301  # chunks of 64: four full ones and a last of 45 tokens


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**TINY, attn_implementation=register_attention())).eval().double()


def prompt(n=PROMPT, vocab=TINY["vocab_size"]):
    return torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(n))


def decode(model, name, chunk, ids, n=8, budget=128):
    options = dict(default_method_options(name) or {})
    cache = SelectorCache(model, MethodSpec(name, 192 if name == "lrqk" else budget, options), measure_coverage=True)
    tokens = generate(model, cache, ids, n, prefill_chunk_size=chunk)[0].tolist()
    return tokens, cache


def assert_same(a: SelectorCache, b: SelectorCache, where: str) -> None:
    for la, lb in zip(a.layers, b.layers):  # the prompt's K/V and what the decode appended
        assert torch.allclose(la.keys, lb.keys, rtol=1e-9, atol=1e-12), where
        assert torch.allclose(la.values, lb.values, rtol=1e-9, atol=1e-12), where
        assert la.prompt_queries is None and lb.prompt_queries is None, where  # nothing kept past the prefill
    sa, sb = a.stats.summary(), b.stats.summary()
    for key in ("decode_steps", "attended_tokens_per_step", "forced_tokens_per_step", "bytes_read_per_step",
                "coverage"):
        assert sa[key] == pytest.approx(sb[key], rel=1e-9), (where, key)
    assert a.extra_metrics() == pytest.approx(b.extra_metrics(), rel=1e-9), where


@pytest.mark.parametrize("name", sorted(discover()))
def test_every_method_decodes_a_chunked_prefill_as_one_forward(tiny, name):
    ids = prompt()
    whole, whole_cache = decode(tiny, name, None, ids)
    chunked, chunked_cache = decode(tiny, name, 64, ids)
    assert chunked == whole, name
    assert_same(whole_cache, chunked_cache, name)


def test_chunks_give_the_last_logits_and_a_chunk_larger_than_the_prompt_is_one_forward(tiny):
    ids = prompt()
    logits = {}
    forwards = []
    hook = tiny.model.register_forward_hook(lambda m, args, kwargs, out: forwards.append(kwargs["input_ids"].shape[1]),
                                            with_kwargs=True)
    try:
        for chunk in (None, 64, 300, 301, 4096):
            forwards.clear()
            cache = SelectorCache(tiny, MethodSpec("fullkv", 128, {}))
            logits[chunk] = prefill_prompt(tiny, cache, ids, chunk)
            assert cache.get_seq_length() == PROMPT and cache.prefill_last
            assert forwards == ([64] * 4 + [45] if chunk == 64 else [300, 1] if chunk == 300 else [PROMPT]), chunk
    finally:
        hook.remove()
    for chunk in (64, 300):
        assert torch.allclose(logits[chunk], logits[None], rtol=1e-9, atol=1e-10), chunk
    assert torch.equal(logits[301], logits[None]) and torch.equal(logits[4096], logits[None])


@pytest.mark.parametrize("family", ["gemma3", "gpt_oss"])
def test_hybrid_models_prefill_in_chunks_across_their_windows(family):
    """Sliding windows of 16 and chunks of 24: a chunk's queries attend the window reaching into the previous
    chunk (Gemma 3's masks; GPT-OSS's sinks, float32 there: logits within 1e-5)."""
    model = hybrid_model(family) if family == "gpt_oss" else hybrid_model(family).double()
    model.set_attn_implementation(register_attention())
    ids = prompt(70, model.config.vocab_size)
    outs = {}
    for chunk in (None, 24):
        cache = SelectorCache(model, MethodSpec("locks", 32, {}))
        outs[chunk] = (generate(model, cache, ids, 6, prefill_chunk_size=chunk)[0].tolist(), cache)
    assert outs[24][0] == outs[None][0], family
    tol = 1e-5 if family == "gpt_oss" else 1e-9
    for a, b in zip(outs[None][1].layers, outs[24][1].layers):
        assert torch.allclose(a.keys, b.keys, rtol=tol, atol=1e-6), family


def test_a_chunked_capture_keeps_what_one_forward_keeps(tiny):
    """A group's prefill capture (the queries of the last `window` positions, or all of them)."""
    ids = prompt()
    for positions in (32, None):
        whole = capture_prefill(tiny, ids, 8, positions)
        chunked = capture_prefill(tiny, ids, 8, positions, chunk_size=64)
        assert torch.allclose(chunked.logits, whole.logits, rtol=1e-9, atol=1e-10)
        for a, b in zip(whole.layers, chunked.layers):
            assert a.queries.shape == b.queries.shape == (1, TINY["num_attention_heads"], positions or PROMPT, 64)
            assert torch.allclose(a.queries, b.queries, rtol=1e-9, atol=1e-12)
            assert torch.allclose(a.key_buffer[:, :, :PROMPT], b.key_buffer[:, :, :PROMPT], rtol=1e-9, atol=1e-12)
            assert torch.equal(a.positions, b.positions)


@pytest.mark.parametrize("bad", [0, -8, 1.5, True, "auto"])
def test_a_bad_chunk_size_is_one_line(bad):
    with pytest.raises(ConfigError, match="prefill_chunk_size must be null"):
        check_chunk_size(bad)
    assert check_chunk_size(None) is None and check_chunk_size(512) == 512
