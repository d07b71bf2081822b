"""A finished sample leaves nothing behind (docs/memory.md, "Freed when a sample ends"): with Python's cycle
collector off, every cache and selector of a sample, and a group's prefill capture with its shared memo, is freed
as soon as the last reference to it goes, because nothing forms a reference cycle (the collector runs by object
count, not by bytes: a cycle would keep GiBs of K/V alive at long context). Every registered method, at batch 1
and 3, eager and static, from its own prefill and from a group's capture; and the heap's peak over ten samples is
the peak over one."""
import ctypes
import gc
import weakref

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from locks.core.attention import register_attention
from locks.core.cache import SelectorCache
from locks.core.generation import Row, generate, generate_rows
from locks.core.prefill import capture_prefill, query_positions_needed, replay_prefill
from locks.core.registry import MethodSpec, discover
from locks.core.selector import LayerInfo
from tests.helpers import TINY_LLAMA, default_method_options

TINY = {**TINY_LLAMA, "hidden_size": 192, "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 64,
        "num_hidden_layers": 3}
LENGTHS = (301, 320, 333)
INFO = LayerInfo(layer_idx=2, num_heads=TINY["num_attention_heads"], num_kv_heads=TINY["num_key_value_heads"],
                 head_dim=TINY["head_dim"], scaling=TINY["head_dim"] ** -0.5)


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**TINY, attn_implementation=register_attention())).eval()


@pytest.fixture
def no_cycle_collector():
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def spec(name: str) -> MethodSpec:
    return MethodSpec(name, 192 if name == "lrqk" else 128, dict(default_method_options(name) or {}))


def prompt(n: int) -> torch.Tensor:
    return torch.randint(0, TINY["vocab_size"], (1, n), generator=torch.Generator().manual_seed(n))


def watched(caches) -> list[weakref.ref]:
    return [weakref.ref(c) for c in caches] + [weakref.ref(layer.selector) for c in caches for layer in c.layers]


def static_modes(name: str) -> list[bool]:
    return [False] + ([True] if spec(name).build(INFO).static_decode_error() is None else [])


@pytest.mark.parametrize("name", sorted(discover()))
def test_a_finished_sample_frees_its_caches_and_selectors(tiny, name, no_cycle_collector):
    for static in static_modes(name):
        cache = SelectorCache(tiny, spec(name))
        generate(tiny, cache, prompt(LENGTHS[0]), 5, static_decode=static)
        refs = watched([cache])
        del cache
        assert not [r for r in refs if r() is not None], (name, static, "batch 1")

        rows = [Row(SelectorCache(tiny, spec(name)), prompt(n), 4 + i) for i, n in enumerate(LENGTHS)]
        generate_rows(tiny, rows, static_decode=static)
        refs = watched([r.cache for r in rows])
        del rows
        assert not [r for r in refs if r() is not None], (name, static, "batch 3")


@pytest.mark.parametrize("static", [False, True])
def test_a_group_frees_its_prefill_captures_and_memos(tiny, static, no_cycle_collector):
    """A grouped sweep's sample: one capture per prompt, replayed into every method's rows (the memos shared by
    their budget-independent prefill work), then dropped."""
    names = [n for n in sorted(discover()) if static in static_modes(n)]
    positions = query_positions_needed([spec(n).build(INFO) for n in names])
    captures = [capture_prefill(tiny, prompt(n), 5, positions) for n in LENGTHS]
    refs = [weakref.ref(t) for c in captures for layer in c.layers for t in (layer.key_buffer, layer.queries)]
    for name in names:
        rows = []
        for n, capture in zip(LENGTHS, captures):
            cache = SelectorCache(tiny, spec(name))
            rows.append(Row(cache, prompt(n), 5, (), 0, replay_prefill(cache, capture)))
        generate_rows(tiny, rows, static_decode=static)
        refs += watched([r.cache for r in rows])
        del rows, cache
    # what the runs' shared prefill work left in the memos (tensors and dataclasses of them)
    refs += [weakref.ref(v) for c in captures for layer in c.layers for v in layer.memo.values()
             if not isinstance(v, (tuple, list, dict))]
    assert any(c.layers[0].memo for c in captures)
    del captures, capture
    assert not [r for r in refs if r() is not None]


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


_LIBC = ctypes.CDLL("libc.so.6")  # glibc >= 2.33 (mallinfo2)
_LIBC.mallinfo2.restype = _MallInfo2


def heap_in_use() -> int:
    """Bytes the process's heap holds for live allocations: malloc's arenas in use plus its mmap'ed blocks (where
    tensors above the mmap threshold live); CPU tensors are malloc'ed, so this is what their live set costs."""
    info = _LIBC.mallinfo2()
    return info.uordblks + info.hblkhd


class HeapPeak:
    """The heap's high-water mark over a region, sampled as each decoder layer and each model forward ends (the
    prefill's transients and every step's K/V growth; mallinfo2 walks malloc's free lists, too slow to call after
    every op in a long-lived test process)."""

    def __init__(self, model):
        self.modules = [model, *model.model.layers]
        self.peak = heap_in_use()

    def sample(self, *_):
        self.peak = max(self.peak, heap_in_use())

    def __enter__(self):
        self.hooks = [m.register_forward_hook(self.sample) for m in self.modules]
        return self

    def __exit__(self, *exc):
        for hook in self.hooks:
            hook.remove()


@pytest.mark.parametrize("name", sorted(discover()))
def test_the_peak_over_ten_samples_is_the_peak_over_one(tiny, name, no_cycle_collector):
    """After a warm-up (lazily built tables), the heap's peak above where it started, over ten samples in a row
    (prompts of two lengths, alternating), is its peak over the first two, within 5 %: nothing a sample allocates
    outlives it (eager and static)."""
    def sample(i: int, static: bool) -> None:
        cache = SelectorCache(tiny, spec(name))
        generate(tiny, cache, prompt(LENGTHS[i % 2]), 4, static_decode=static)

    for static in static_modes(name):
        for i in range(2):
            sample(i, static)
        start = heap_in_use()
        with HeapPeak(tiny) as heap:
            for i in range(10):
                sample(i, static)
                heap.sample()
                if i == 1:
                    two = heap.peak - start
        ten = heap.peak - start
        assert ten == pytest.approx(two, rel=0.05), (name, static, two, ten)


@pytest.mark.parametrize("name", ["fullkv", "locks"])
def test_a_static_decode_keeps_no_view_of_its_replaced_buffers(tiny, name, no_cycle_collector):
    """start_static replaces a layer's K/V buffer with one of the generation's capacity: the prompt's old buffer is
    freed then, not held on through the layer's views of its cached tokens (twice the K/V for the whole decode)."""
    cache = SelectorCache(tiny, spec(name))
    generate(tiny, cache, prompt(LENGTHS[0]), 1)
    old = [weakref.ref(layer._k) for layer in cache.layers]
    cache.start_static(LENGTHS[0] + 600)  # beyond the prompt's buffer: every layer gets a new one
    assert all(ref() is None for ref in old)
    assert all(layer.keys.shape[2] == LENGTHS[0] and layer.keys.data_ptr() == layer._k.data_ptr()
               for layer in cache.layers)
