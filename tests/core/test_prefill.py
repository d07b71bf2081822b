"""One dense prefill for several methods (locks/core/prefill.py): a replayed capture decodes what a prefill of its
own decodes, every run reads the capture's K/V buffers without a copy and leaves the prompt in them unchanged, and
PrefillContext.shared computes a budget-independent part of a selector's prefill once per sample for a group's runs,
each run getting its own copy."""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from locks.core.attention import register_attention
from locks.core.cache import SelectorCache
from locks.core.generation import generate
from locks.core.prefill import capture_prefill, query_positions_needed, replay_prefill
from locks.core.registry import MethodSpec, discover
from locks.core.selector import PrefillContext
from tests.helpers import TINY_LLAMA, default_method_options

SHARING = ("locks", "shadowkv", "lrqk", "rocketkv")  # the methods whose prefill asks PrefillContext.shared


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY_LLAMA, attn_implementation="sdpa")).eval()
    model.set_attn_implementation(register_attention())
    return model


def context(memo):
    k = torch.zeros(1, 1, 4, 2)
    return PrefillContext(keys=k, values=k, queries=k, positions=torch.arange(4)[None], pre_rope_keys=lambda: k,
                          memo=memo)


def test_shared_runs_the_computation_once_and_hands_out_copies():
    calls = []

    def compute():
        calls.append(1)
        return {"u": torch.arange(3.0)}, 7

    alone = context(None)
    assert alone.shared(("x",), compute)[1] == 7 and alone.shared(("x",), compute)[1] == 7
    assert len(calls) == 2  # a run of its own keeps nothing
    calls.clear()
    memo = {}
    first, second = context(memo).shared(("x",), compute), context(memo).shared(("x",), compute)
    assert len(calls) == 1 and torch.equal(first[0]["u"], second[0]["u"])
    first[0]["u"].add_(100)  # one run updates its state in place: the next one still gets the original
    assert torch.equal(context(memo).shared(("x",), compute)[0]["u"], torch.arange(3.0))
    context(memo).shared(("y",), compute)  # another key is another computation
    assert len(calls) == 2


def decode(model, ids, name, budget, capture=None, static=False):
    """-> (generated ids, the sample's stats summary, the cache)."""
    cache = SelectorCache(model, MethodSpec(name, budget, default_method_options(name) or {}), measure_coverage=True)
    logits = None if capture is None else replay_prefill(cache, capture)
    out = generate(model, cache, ids, 8, prefill_logits=logits, static_decode=static)
    return out, cache.stats.summary(), cache


def prompt(length=700, seed=3):
    return torch.randint(0, TINY_LLAMA["vocab_size"], (1, length), generator=torch.Generator().manual_seed(seed))


def test_runs_take_the_captured_buffers_over_and_leave_the_prompt_unchanged(tiny):
    """Every method decodes from the capture's own K/V buffers (no copy of the prompt), and after all of them the
    prompt slots hold what the prefill wrote: no selector writes into the cache it reads."""
    ids = prompt()
    capture = capture_prefill(tiny, ids, 8, None)
    prompt_kv = [(la.keys.clone(), la.values.clone()) for la in capture.layers]
    assert all(la.key_buffer.shape[2] >= ids.shape[1] + 8 for la in capture.layers)  # room for the generation
    for name in sorted(discover()):
        cache = decode(tiny, ids, name, 128, capture)[2]
        for layer, la in zip(cache.layers, capture.layers):
            assert layer._k is la.key_buffer and layer._v is la.value_buffer, name
        for la, (k, v) in zip(capture.layers, prompt_kv):
            assert torch.equal(la.keys, k) and torch.equal(la.values, v), name


@pytest.mark.parametrize("name", ["fullkv", "locks", "quest"])
def test_static_decode_from_a_capture_whose_decode_slots_hold_garbage(tiny, name):
    """A static step reads the slots after the cached tokens (masked), so they must be finite: taking a buffer over
    that already has the step's capacity (a capture's, after another run, or never written) zeroes them. NaN there
    would turn every masked product into NaN."""
    ids = prompt()
    capture = capture_prefill(tiny, ids, 8, None)
    with torch.inference_mode():
        for la in capture.layers:
            la.key_buffer[:, :, ids.shape[1]:] = float("nan")
            la.value_buffer[:, :, ids.shape[1]:] = float("nan")
    want = decode(tiny, ids, name, 128, static=True)
    got = decode(tiny, ids, name, 128, capture, static=True)
    assert torch.equal(got[0], want[0]) and got[1] == want[1]


@pytest.mark.parametrize("name", SHARING)
def test_budgets_of_one_method_replayed_from_one_capture_match_prefills_of_their_own(tiny, name, monkeypatch):
    ids = prompt()
    budgets = (128, 256)
    specs = [MethodSpec(name, b, default_method_options(name) or {}) for b in budgets]
    from locks.core.selector import LayerInfo

    info = LayerInfo(0, TINY_LLAMA["num_attention_heads"], TINY_LLAMA["num_key_value_heads"], 16, 0.25)
    capture = capture_prefill(tiny, ids, 8, query_positions_needed([s.build(info) for s in specs]))
    computed = []
    shared = PrefillContext.shared

    def counting(self, key, compute):
        return shared(self, key, lambda: computed.append(key) or compute())

    monkeypatch.setattr(PrefillContext, "shared", counting)
    for budget in budgets:
        want = decode(tiny, ids, name, budget)
        got = decode(tiny, ids, name, budget, capture)
        assert torch.equal(got[0], want[0]) and got[1] == want[1], (name, budget)
    layers = TINY_LLAMA["num_hidden_layers"]
    # the separate runs compute theirs (no memo); of the replayed runs only the first computes, once per layer
    assert computed and all(computed.count(key) == len(budgets) * layers + layers for key in set(computed))
    assert all(la.memo for la in capture.layers)


@pytest.mark.parametrize("family", ["gemma3", "gpt_oss"])
def test_a_capture_of_a_hybrid_model_replays_every_method_as_its_own_prefill(family):
    """Sliding-window layers: the capture keeps each layer's type and no queries of the sliding ones; every method
    replayed from it decodes and accounts what a prefill of its own does."""
    from tests.helpers import hybrid_model

    model = hybrid_model(family)
    model.set_attn_implementation(register_attention())
    ids = torch.randint(0, model.config.vocab_size, (1, 300), generator=torch.Generator().manual_seed(5))
    capture = capture_prefill(model, ids, 8, query_positions_needed(
        [MethodSpec(n, 128, default_method_options(n) or {}).build(_info(model)) for n in sorted(discover())]))
    windows = [la.sliding_window for la in capture.layers]
    assert windows == [16 if t == "sliding_attention" else None for t in model.config.layer_types]
    assert all(la.queries.shape[2] == 0 for la in capture.layers if la.sliding_window is not None)
    for name in sorted(discover()):
        want = decode(model, ids, name, 128)
        got = decode(model, ids, name, 128, capture)
        assert torch.equal(got[0], want[0]), name
        assert got[1] == want[1], name


def _info(model):
    from locks.core.selector import LayerInfo

    c = model.config
    return LayerInfo(0, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.head_dim ** -0.5)
