"""transformers integration: the registered attention function against the stock SDPA model."""
import pytest
import torch
from transformers import AttentionInterface, AttentionMaskInterface, LlamaConfig, LlamaForCausalLM

from locks.core.attention import ATTENTION_NAME, register_attention
from locks.core.cache import SelectorCache
from locks.core.generation import generate
from locks.core.registry import MethodSpec
from locks.errors import ConfigError
from tests.helpers import TINY_LLAMA, greedy, stock_greedy, teacher_forced_logits


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY_LLAMA, attn_implementation="sdpa")).eval()
    return model




def test_attention_and_mask_registered_under_one_name():
    register_attention()
    assert ATTENTION_NAME in AttentionInterface._global_mapping
    assert ATTENTION_NAME in AttentionMaskInterface._global_mapping


def test_fullkv_token_identical_to_stock_sdpa_tiny(tiny):
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (1, 333), generator=torch.Generator().manual_seed(1))
    ref = stock_greedy(tiny, ids, 40)
    out, cache = greedy(tiny, ids, 40)
    assert torch.equal(out, ref)
    s = cache.stats.summary()
    assert s["decode_steps"] == 39 and s["bytes_read_per_step"] == s["full_bytes_per_step"]




@pytest.mark.parametrize("method,options", [("locks", {}), ("locks", {"quant": "none"}), ("oracle", {}),
                                            ("locks", {"budget_mode": "paper"})])
def test_selectors_with_budget_covering_context_match_fullkv(tiny, method, options):
    # Random-weight logits are nearly tied, so compare logits along the FullKV trajectory, not argmax tokens.
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (1, 300), generator=torch.Generator().manual_seed(2))
    ref_tokens = stock_greedy(tiny, ids, 30)
    ref = teacher_forced_logits(tiny, ids, ref_tokens, "fullkv", 4096)
    got = teacher_forced_logits(tiny, ids, ref_tokens, method, 4096, **options)
    assert torch.allclose(got, ref, atol=1e-5, rtol=0)


def test_sparse_budget_reads_fewer_bytes(tiny):
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (1, 600), generator=torch.Generator().manual_seed(3))
    out, cache = greedy(tiny, ids, 10, "locks", 128)
    s = cache.stats.summary()
    assert s["attended_tokens_per_step"] <= 128
    assert s["bytes_read_per_step"] < 0.5 * s["full_bytes_per_step"]
    assert 0 < s["coverage" if s["coverage"] is not None else "attended_tokens_per_step"]


def test_generate_decodes_one_sample_per_cache(tiny):
    """Several samples decode as rows of their own caches (generate_rows, tests/core/test_batch.py); one cache with
    two prompts is refused in one line that says so."""
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (2, 250), generator=torch.Generator().manual_seed(4))
    with pytest.raises(ConfigError, match="one sample per cache .*generate_rows"):
        greedy(tiny, ids, 12, "locks", 96)


def test_left_padding_raises_a_clear_error(tiny):
    tiny.set_attn_implementation(register_attention())
    cache = SelectorCache(tiny, MethodSpec("locks", 64))
    ids = torch.randint(1, 100, (2, 40))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    cache.phase = "prefill"
    tiny(input_ids=ids, attention_mask=mask, cache=cache, sparse_cache=cache)
    cache.phase = "decode"
    with pytest.raises(ConfigError, match="left padding"):
        tiny(input_ids=ids[:, :1], attention_mask=torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], 1),
             position_ids=torch.full((2, 1), 40), cache=cache, sparse_cache=cache)


TINY_GLM = dict(vocab_size=512, pad_token_id=0, eos_token_id=[1], hidden_size=64, intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                max_position_embeddings=4096)  # GLM RoPE: interleaved pairs on the first half of the head dim


@pytest.fixture(scope="module")
def tiny_glm():
    from transformers import GlmConfig, GlmForCausalLM

    torch.manual_seed(0)
    return GlmForCausalLM(GlmConfig(**TINY_GLM, attn_implementation="sdpa")).eval()


@pytest.mark.parametrize("model_name", ["tiny", "tiny_glm"])
def test_pre_rope_keys_equal_the_key_projection(model_name, request):
    model = request.getfixturevalue(model_name)
    captured = {}
    hook = model.model.layers[1].self_attn.k_proj.register_forward_hook(lambda m, i, o: captured.setdefault("k", o))
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (1, 120))
    _, cache = greedy(model, ids, 1)
    hook.remove()
    H, d = TINY_LLAMA["num_key_value_heads"], TINY_LLAMA["head_dim"]
    k_pre = captured["k"].view(1, 120, H, d).transpose(1, 2)
    unrotated = cache.rotation.unrotate(cache.layers[1].keys, torch.arange(120)[None])
    assert torch.allclose(unrotated, k_pre, atol=1e-5)
    # cache.rotation.rotate re-applies the layer's RoPE: rotating the projection reproduces the cached keys
    assert torch.allclose(cache.rotation.rotate(k_pre, torch.arange(120)[None]), cache.layers[1].keys, atol=1e-5)
    if model_name == "tiny_glm":  # only the first half of each head is rotated, in interleaved pairs
        assert torch.equal(cache.layers[1].keys[..., d // 2 :], k_pre[..., d // 2 :])
        assert not torch.allclose(cache.layers[1].keys[..., : d // 2], k_pre[..., : d // 2], atol=1e-3)


def test_shadowkv_runs_on_glm(tiny_glm):
    """ShadowKV (pre-RoPE SVD, re-rotated reconstructed keys) on GLM's RoPE layout: with every token in budget it
    reproduces FullKV's greedy tokens; at a small budget it decodes."""
    ids = torch.randint(0, TINY_GLM["vocab_size"], (1, 300), generator=torch.Generator().manual_seed(3))
    full, _ = greedy(tiny_glm, ids, 8)
    everything, _ = greedy(tiny_glm, ids, 8, method="shadowkv", budget=4096)
    assert torch.equal(everything, full)
    small, cache = greedy(tiny_glm, ids, 8, method="shadowkv", budget=128)
    assert small.shape == (1, 8) and cache.stats.summary()["attended_tokens_per_step"] <= 128


def test_embedded_model_fullkv_token_identical_to_stock_sdpa(embedded):
    tok, model = embedded.tokenizer, embedded.model
    text = tok.apply_chat_template([{"role": "user", "content": "Summarize: " + "The grass is green. " * 60}],
                                   add_generation_prompt=True, tokenize=False)
    ids = tok(text, add_special_tokens=False, return_tensors="pt").input_ids
    ref = stock_greedy(model, ids, 16)
    out, _ = greedy(model, ids, 16)
    model.set_attn_implementation(ATTENTION_NAME)
    assert torch.equal(out, ref)


def test_nan_keys_raise_a_clear_error():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY_LLAMA, attn_implementation="sdpa")).eval()
    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.weight[0, 0] = float("nan")
    with pytest.raises(ConfigError, match="NaN or inf"):
        greedy(model, torch.randint(0, 100, (1, 20)), 2, "locks", 64)


@pytest.mark.parametrize("method,options", [("locks", {}), ("quest", {"dense_layers": 0}),
                                            ("quest", {"dense_layers": 0, "gqa": "group"}), ("oracle", {})])
def test_triton_backend_matches_torch_backend(tiny, method, options):
    """method.backend=triton (fused kernels, here under the Triton interpreter) reproduces the torch reference path
    through the whole model: same greedy tokens, same attended tokens, logits within float tolerance."""
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (1, 300), generator=torch.Generator().manual_seed(4))
    tiny.set_attn_implementation(register_attention())
    results = {}
    for backend in ("torch", "triton"):
        cache = SelectorCache(tiny, MethodSpec(method, 128, options, backend=backend))
        assert cache.backend == backend and cache.infos[0].backend == backend
        results[backend] = (generate(tiny, cache, ids, 6), cache.stats.summary())
    assert torch.equal(results["torch"][0], results["triton"][0])
    assert results["torch"][1]["attended_tokens_per_step"] == results["triton"][1]["attended_tokens_per_step"]


def test_backend_resolution_and_errors():
    from locks.core.selector import resolve_backend

    assert resolve_backend("auto", "cpu") == "torch" and resolve_backend("torch", "cpu") == "torch"
    with pytest.raises(ConfigError, match="method.backend must be one of"):
        resolve_backend("cuda", "cpu")


def test_flash_attn_prefill_path_matches_sdpa(tiny, monkeypatch):
    """The optional flash-attn prefill (CUDA only) is plumbed right: with a stand-in `flash_attn_func` (same
    contract: [B, L, H, d] inputs, GQA-native, causal) the model produces the same logits as through SDPA."""
    import sys
    import types

    import torch.nn.functional as F

    calls = []

    def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False):
        calls.append(q.shape)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal,
                                             scale=softmax_scale, enable_gqa=True)
        return out.transpose(1, 2)

    monkeypatch.setitem(sys.modules, "flash_attn", types.SimpleNamespace(flash_attn_func=flash_attn_func))
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (1, 77), generator=torch.Generator().manual_seed(8))
    tiny.set_attn_implementation(register_attention())
    logits = {}
    for backend in ("sdpa", "flash_attn"):
        cache = SelectorCache(tiny, MethodSpec("fullkv", 64))
        cache.prefill_backend = backend
        with torch.no_grad():
            logits[backend] = tiny(input_ids=ids, cache=cache, sparse_cache=cache, use_cache=True).logits
    assert len(calls) == TINY_LLAMA["num_hidden_layers"]
    assert torch.allclose(logits["sdpa"], logits["flash_attn"], atol=1e-5)
    from locks.core.cache import prefill_backend

    assert prefill_backend("cpu", torch.float32) == "sdpa"


def test_a_flash_attn_that_does_not_load_falls_back_to_sdpa_at_once(monkeypatch):
    """A flash-attn wheel built for another torch is found (find_spec) but its kernel does not import: the backend
    is chosen by importing it, so such a wheel means SDPA with one warning, not a failure at the first prefill."""
    import importlib.machinery
    import sys
    import types

    from locks.core import cache as cache_module
    from locks.core.cache import flash_attn_fails, prefill_backend

    broken = types.ModuleType("flash_attn")  # no flash_attn_func: `from flash_attn import ...` raises ImportError
    broken.__spec__ = importlib.machinery.ModuleSpec("flash_attn", None)
    monkeypatch.setitem(sys.modules, "flash_attn", broken)
    with pytest.warns(UserWarning, match="flash-attn is installed but does not load"):
        assert prefill_backend("cuda", torch.bfloat16) == "sdpa"
    broken.flash_attn_func = lambda *args, **kwargs: None
    monkeypatch.setattr(cache_module, "flash_attn_fails", lambda func, device: flash_attn_fails(func, "cpu"))
    assert prefill_backend("cuda", torch.bfloat16) == "flash_attn"
    assert prefill_backend("cuda", torch.float32) == "sdpa"


def test_a_flash_attn_whose_kernel_fails_falls_back_to_sdpa_at_once(monkeypatch):
    """A flash-attn that imports but whose kernel fails (built for another GPU) is tried once on a tiny call, so it
    also means SDPA with one warning; the tiny call is flash_attn_func(q, q, q) on the model's device."""
    import importlib.machinery
    import sys
    import types

    from locks.core import cache as cache_module
    from locks.core.cache import flash_attn_fails, prefill_backend

    calls = []

    def no_kernel(q, k, v):
        calls.append((tuple(q.shape), q.dtype))
        raise RuntimeError("CUDA error: no kernel image is available for execution on the device")

    module = types.ModuleType("flash_attn")
    module.__spec__ = importlib.machinery.ModuleSpec("flash_attn", None)
    module.flash_attn_func = no_kernel
    monkeypatch.setitem(sys.modules, "flash_attn", module)
    monkeypatch.setattr(cache_module, "flash_attn_fails", lambda func, device: flash_attn_fails(func, "cpu"))
    with pytest.warns(UserWarning, match="flash-attn loads but a tiny call fails on cuda .*no kernel image"):
        assert prefill_backend("cuda", torch.bfloat16) == "sdpa"
    assert calls == [((1, 1, 1, 64), torch.bfloat16)]
    assert flash_attn_fails(lambda q, k, v: q, "cpu") is None


def test_pre_rope_keys_refuse_models_with_another_rotary_layout(tiny):
    cache = SelectorCache(tiny, MethodSpec("fullkv", 64))
    cache.rotation.model_type = "gpt_neox"
    with pytest.raises(ConfigError, match="RoPE layouts"):
        cache.rotation.unrotate(torch.randn(1, 2, 3, 16), torch.arange(3)[None])
