"""One dense prefill shared by several methods (docs/architecture.md, "Sweeps that prefill once").

Every method prefills densely; selectors act only at decode. So the prompt's K/V, the queries a selector reads,
the positions and the first generated token are the same for every method and budget. `capture_prefill` runs the
model's prefill once and keeps, per layer, what `Selector.prefill` is given: post-RoPE K/V, the trailing query
positions the group's selectors declared (`Selector.prefill_queries`) and the positions. It also keeps the last
position's logits. `replay_prefill` then builds a method's `SelectorCache` from that capture. The capture keeps each
layer's K/V in a buffer with room for the whole generation, and every run's cache takes that buffer over without a
copy: the prompt slots are only read (no selector writes into the cache; the cache writes only the slot of the token
it appends), and the slots after them are the run's decode slots. The runs of a group decode one after another, so
each one owns those slots while it decodes; it writes every slot before reading it, and a static step zeroes them
first (`SelectorLayer._grow`). No run copies the prompt, and the memory a group holds beyond one run's selector state
is the capture alone. Each layer's capture also carries the memo of `PrefillContext.shared`: the budget-independent
part of a selector's prefill (which methods share what: docs/architecture.md) runs once per sample for every run of
the group that asks for it, and each run gets its own copy.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
from torch import Tensor

from locks.core.cache import SelectorCache
from locks.core.chunked_prefill import prefill_prompt
from locks.core.selector import LayerInfo, PrefillContext, Selection, Selector


@dataclass
class LayerPrefill:
    key_buffer: Tensor  # [B, Hkv, L + max_new_tokens, d]: the post-RoPE prompt keys, then the runs' decode slots
    value_buffer: Tensor  # [B, Hkv, L + max_new_tokens, d]
    queries: Tensor  # [B, Hq, n, d] the last n prompt queries (n = the group's largest prefill_queries)
    positions: Tensor  # [B, L]
    sliding_window: int | None = None  # the layer's type as transformers ran it (None: full attention)
    scaling: float = 1.0  # the attention scale transformers passed
    memo: dict = field(default_factory=dict)  # PrefillContext.shared: budget-independent prefill work of the runs

    @property
    def keys(self) -> Tensor:  # [B, Hkv, L, d]
        return self.key_buffer[:, :, : self.positions.shape[-1]]

    @property
    def values(self) -> Tensor:
        return self.value_buffer[:, :, : self.positions.shape[-1]]


@dataclass
class PrefillCapture:
    """What one dense prefill leaves for the selectors: per layer K/V, trailing queries and positions, and the
    logits of the last prompt position."""

    layers: list[LayerPrefill]
    logits: Tensor  # [B, vocab] in the model's dtype
    prompt_len: int
    max_new_tokens: int
    query_positions: int | None  # trailing query positions kept per layer (None: all)

    @property
    def nbytes(self) -> int:
        """Bytes held: the captured tensors and what the runs' shared prefill work left in the memos."""
        return self.logits.nbytes + sum(tensor_bytes((la.key_buffer, la.value_buffer, la.queries, la.positions,
                                                       la.memo)) for la in self.layers)


def tensor_bytes(obj, seen: set | None = None) -> int:
    """Bytes of the distinct tensors in a nest of tuples, lists, dicts and objects (each storage counted once)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, Tensor):
        key = ("storage", obj.untyped_storage().data_ptr(), obj.untyped_storage().nbytes())
        if key in seen:
            return 0
        seen.add(key)
        return obj.untyped_storage().nbytes()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (tuple, list)):
        return sum(tensor_bytes(v, seen) for v in obj)
    return sum(tensor_bytes(v, seen) for v in vars(obj).values()) if hasattr(obj, "__dict__") else 0


class _Recorder(Selector):
    """Keeps its layer's prefill queries and positions (the capture's selector; never registered)."""

    name = "prefill_capture"
    uses_budget = False

    def __init__(self, info: LayerInfo, query_positions: int | None):
        super().__init__(info, budget=1)
        self.query_positions = query_positions
        self.queries: Tensor | None = None
        self.positions: Tensor | None = None

    def prefill_queries(self) -> int | None:
        return self.query_positions

    def prefill(self, ctx: PrefillContext) -> None:
        L = ctx.queries.shape[2]
        n = L if self.query_positions is None else min(L, self.query_positions)
        self.queries, self.positions = ctx.queries[:, :, L - n:].clone(), ctx.positions.clone()

    def select(self, query, keys, values) -> Selection:
        return Selection.all_tokens()


class _RecordingSpec:
    """What SelectorCache needs of a method: a backend and one selector per layer."""

    backend = "torch"

    def __init__(self, query_positions: int | None):
        self.query_positions = query_positions

    def for_model(self, model) -> "_RecordingSpec":
        return self

    def build(self, info: LayerInfo) -> Selector:
        return _Recorder(info, self.query_positions)


def query_positions_needed(selectors: list[Selector]) -> int | None:
    """The most trailing prompt query positions any of these selectors reads at prefill (None: all of them)."""
    needs = [s.prefill_queries() for s in selectors]
    return None if any(n is None for n in needs) else max(needs, default=0)


@torch.inference_mode()
def capture_prefill(model, input_ids: Tensor, max_new_tokens: int, query_positions: int | None,
                    chunk_size: int | None = None) -> PrefillCapture:
    """Run the dense prefill of `input_ids` [B, L] once (in chunks of `chunk_size` tokens, locks/core/
    chunked_prefill.py) and keep what every selector's prefill is given (the K/V in the recording cache's own
    buffers, which hold the prompt and room for the generation)."""
    cache = SelectorCache(model, _RecordingSpec(query_positions), window_layers=False)
    cache.max_new_tokens = int(max_new_tokens)
    last = prefill_prompt(model, cache, input_ids, chunk_size)
    layers = [LayerPrefill(layer._k, layer._v,
                           # a sliding layer's selector reads no query: it is the same window in every run
                           layer.selector.queries if info.sliding_window is None else layer.selector.queries[:, :, :0],
                           layer.selector.positions, info.sliding_window, info.scaling)
              for layer, info in zip(cache.layers, cache.infos)]
    return PrefillCapture(layers, last.clone(), int(input_ids.shape[1]), int(max_new_tokens),
                          query_positions)


@torch.inference_mode()
def replay_prefill(cache: SelectorCache, capture: PrefillCapture) -> Tensor:
    """Bring `cache` (a fresh SelectorCache of some method) to the state a prefill of the captured prompt leaves:
    every layer's K/V in the capture's buffer (the prompt, then room for the generation; taken over, not copied),
    every selector's prefill run on the captured context. Returns the last prompt position's logits [B, vocab].
    The caller decodes this cache to its end before it replays the capture into another one."""
    cache.phase = "prefill"
    cache.max_new_tokens = capture.max_new_tokens
    for i, captured in enumerate(capture.layers):
        _replay_layer(cache, i, captured, capture)
    return capture.logits


def _replay_layer(cache: SelectorCache, i: int, captured: LayerPrefill, capture: PrefillCapture) -> None:
    """Layer i of `replay_prefill` (a function of its own: what it reads is released when it returns, so a capture
    whose layers are made one at a time holds one layer's queries at a time)."""
    cache.configure_layer(i, captured.sliding_window, captured.scaling)
    layer = cache.layers[i]
    keys, values = layer.adopt(captured.key_buffer, captured.value_buffer, capture.prompt_len)
    needed = layer.selector.prefill_queries()
    queries = captured.queries
    if needed is not None and needed < queries.shape[2]:
        queries = queries[:, :, queries.shape[2] - needed:]
    if needed is None and capture.query_positions is not None:
        raise ValueError(f"{layer.selector.name} reads every prompt query at prefill, but the capture kept "
                         f"only the last {capture.query_positions}")
    k, v, positions = keys.detach(), values.detach(), captured.positions
    layer.selector.prefill(PrefillContext(
        keys=k, values=v, queries=queries, positions=positions,
        pre_rope_keys=lambda k=k, positions=positions, i=i: cache.rotation.unrotate(k, positions, i),
        max_new_tokens=cache.max_new_tokens, max_length=cache.max_length,
        rotate=functools.partial(cache.rotation.rotate, layer_idx=i), rotation=cache.rotation,
        memo=captured.memo))
