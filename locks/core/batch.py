"""Several samples in one decode step: a batch of rows, each row a SelectorCache of its own (docs/batching.md).

A row is exactly the cache the same sample has at batch 1: its K/V start at slot 0 and hold its own length, so its
pages, summaries, min/max, chunks and factors are those of batch 1 and no pad token exists anywhere. `RowBatch` is
the one transformers `Cache` the model sees for a step over all rows at once: the projections, MLPs, norms and the
LM head run batched, and each layer's `update` hands row r's new K/V to row r's own layer. The attention function
(`locks/core/attention.py`) then runs every row's selection and attention on that row's cache, with its own
positions and length, and the row's accounting goes to the row's own stats. So a row's prediction, steps, bytes,
coverage and diagnostics are what batch 1 records for its sample; only float rounding of the batched matrix
products can differ.

Rows finish at different steps. An eager step drops them (the batch shrinks); a static step (fixed shapes, one
capture per batch) keeps them in place, `live` False: their slot is no longer advanced, their host upkeep and
accounting stop, and whatever the step still computes for them is never read.

A static step over rows whose selectors all name their device state (`Selector.row_state`) has no row loop:
`stack_rows` builds one SelectorCache whose K/V, selector state, slot, length and counters are the rows' stacked
along the batch axis ([B] lengths, one per row), and gives each row's cache and selectors views of them. The model
then runs one step over that cache, so every kernel runs once for all rows; each row's host hooks (page summaries,
accounting) still run on its own cache and selectors, which read and write their rows of the stacked tensors.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses

import torch
from torch import Tensor
from transformers.cache_utils import Cache, CacheLayerMixin

from locks.core.cache import SelectorCache, SelectorLayer
from locks.core.selector import Selector
from locks.errors import ConfigError


class _RowsLayer(CacheLayerMixin):
    """Layer `layer_idx` of every row: `update` writes row r's new K/V into row r's layer. It holds the rows, not
    the RowBatch: no reference cycle keeps a finished batch's caches alive until the cycle collector runs."""

    is_sliding = False

    def __init__(self, rows: list[SelectorCache], layer_idx: int):
        super().__init__()
        self.rows, self.layer_idx = rows, layer_idx
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:
        pass

    def update(self, key_states, value_states, *args, **kwargs):
        for r, row in enumerate(self.rows):
            row.layers[self.layer_idx].update(key_states[r : r + 1], value_states[r : r + 1])
        return key_states, value_states  # each row's attention reads its own cache (RowBatch.row_kv)

    def get_seq_length(self) -> int:
        return max(row.layers[self.layer_idx].length for row in self.rows)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        # the mask transformers builds for the batch is not used: each row attends its own length
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return -1


class RowBatch(Cache):
    """The rows' SelectorCaches as one transformers Cache for a decode step over all of them."""

    def __init__(self, rows: list[SelectorCache]):
        if not rows:
            raise ValueError("a RowBatch needs at least one row")
        if len({len(row.layers) for row in rows}) != 1:
            raise ValueError("the rows of a batch must be caches of one model")
        self.rows = list(rows)
        super().__init__(layers=[_RowsLayer(self.rows, i) for i in range(len(rows[0].layers))])
        self.live = [True] * len(self.rows)  # static decode: False for a row that has finished
        self.phase = rows[0].phase
        self.stacked: SelectorCache | None = None  # static decode of stackable rows: the one cache a step runs on

    def __len__(self) -> int:
        return len(self.rows)

    def row_kv(self, r: int, layer_idx: int):
        """Row r's K/V as its own attention step reads them: the cached tokens (eager) or the whole preallocated
        buffer (static decode)."""
        layer = self.rows[r].layers[layer_idx]
        if self.rows[r].phase == "decode_static":
            return layer._k, layer._v
        return layer.keys, layer.values

    # ----- static decode, one capture per batch (locks/core/static_decode.py) -------------------------------------

    def start_static(self, capacities: list[int]) -> None:
        if len(capacities) != len(self.rows):
            raise ValueError(f"{len(capacities)} capacities for {len(self.rows)} rows")
        stack = len(self.rows) > 1 and all(layer.selector.row_state is not None
                                           for row in self.rows for layer in row.layers)
        shared_kv = _share_kv_buffers(self.rows, max(capacities)) if stack else None
        for row, capacity in zip(self.rows, capacities):
            row.start_static(max(capacities) if stack else capacity)  # stacked rows share one capacity
            # a row that finishes before its first step keeps writing its first decode slot, never a prompt slot
            # (the prompt may be a prefill capture that other runs read)
            row.set_static_position(row.get_seq_length())
        if stack:
            self.stacked = stack_rows(self.rows, shared_kv)
        self.phase = "decode_static"
        self.static_position = self.rows[0].static_position
        self.static_host_step = False

    def set_static_position(self, positions: list[int]) -> None:
        for row, live, position in zip(self.rows, self.live, positions):
            if live:
                row.set_static_position(position)
        host_rows = [r for r, (row, live) in enumerate(zip(self.rows, self.live)) if live and row.static_host_step]
        self.static_host_step = bool(host_rows)
        if self.stacked is not None:
            self.stacked.static_host_rows, self.stacked.static_host_step = host_rows, bool(host_rows)

    @property
    def step_cache(self) -> "Cache":
        """The cache a static step runs the model on: the stacked rows, or this RowBatch (a loop over its rows)."""
        return self if self.stacked is None else self.stacked

    def finish_static_step(self) -> None:
        for row, live in zip(self.rows, self.live):
            if live:
                row.finish_static_step()

    @contextlib.contextmanager
    def static_counters_kept(self):
        with contextlib.ExitStack() as stack:
            for row in self.rows:
                stack.enter_context(row.static_counters_kept())
            yield


def row_attention(attend, module, query, attention_mask, dropout, scaling, batch: RowBatch, **kwargs):
    """One layer's decode attention over a RowBatch: `attend` (the attention function) on each row's own cache,
    query and positions; the batch's mask is dropped (a row's own length, window and selector decide what it
    attends). -> (out [B, 1, Hq, d], None)."""
    if query.shape[2] != 1:
        raise ConfigError("a batch of rows decodes one token per row; prefill each row in its own cache")
    layer_idx = module.layer_idx
    positions = kwargs.pop("position_ids", None)
    outs = []
    for r, row in enumerate(batch.rows):
        keys, values = batch.row_kv(r, layer_idx)
        if positions is not None:
            kwargs["position_ids"] = positions[r : r + 1]
        out, _ = attend(module, query[r : r + 1], keys, values, None, dropout, scaling,
                        **{**kwargs, "sparse_cache": row})
        outs.append(out)
    return torch.cat(outs, dim=0), None


# ----- stacked rows: one static step over rows of different lengths, no loop -----------------------------------------

# SelectorCache's device counters with a row axis at dim 1 ([layers, B, ...]); its diagnostics have it at dim 0
ROW_COUNTERS = ("static_attended", "static_bytes", "static_coverage")


def _stacked(values: list, shared: dict | None = None):
    """The rows' values of one state attribute stacked along the batch axis: tensors concatenated (zero-padded where
    a row's buffer is shorter: preallocated slots a static step masks), dataclasses field by field, selectors (a
    wrapper's base) by their own `row_state`, and a host integer
    (a width that sizes the step's shapes, e.g. a top-k) as the rows' largest (each row masks past its own, which
    its row state names)."""
    first = values[0]
    if first is None:
        return None
    if isinstance(first, int):
        return max(values)
    if isinstance(first, Tensor):
        pinned = first.device.type == "cpu" and first.is_pinned()  # a host store stays pinned
        if not pinned and all(v.shape[1:] == first.shape[1:] for v in values):
            return torch.cat(values)  # nothing to pad: one copy, no zero-fill
        shape = [max(v.shape[i] for v in values) for i in range(first.dim())]
        out = torch.zeros(sum(v.shape[0] for v in values), *shape[1:], dtype=first.dtype, device=first.device,
                          pin_memory=pinned)
        start = 0
        for v in values:
            out[(slice(start, start + v.shape[0]), *(slice(0, n) for n in v.shape[1:]))] = v
            start += v.shape[0]
        return out
    if isinstance(first, Selector):  # a wrapper's base selector (Twilight's): stacked as its own row_state says
        return stack_selectors(values, shared)
    if dataclasses.is_dataclass(first):
        return dataclasses.replace(first, **{f.name: _stacked([getattr(v, f.name) for v in values])
                                             for f in dataclasses.fields(first) if isinstance(getattr(first, f.name), Tensor)})
    raise TypeError(f"row_state holds a {type(first).__name__}: only tensors and dataclasses of tensors stack")


def _row_view(stacked, r: int):
    """Row r's view of a stacked state value (writes through it land in the stacked tensors)."""
    if stacked is None:
        return None
    if isinstance(stacked, Tensor):
        return stacked[r : r + 1]
    return dataclasses.replace(stacked, **{f.name: _row_view(getattr(stacked, f.name), r)
                                           for f in dataclasses.fields(stacked)
                                           if isinstance(getattr(stacked, f.name), Tensor)})


def stack_selectors(selectors: list, shared: dict | None = None):
    """One selector over the rows' selectors of a layer (each naming its `row_state`): a copy of the first whose
    row-state values are the rows' stacked along the batch axis; each row's selector then holds its row's view of
    them, so writes through either land in the same tensors. `shared` (kept across the layers of one stack) stacks
    state the rows' layers share (ShadowKV's RoPE tables) once."""
    shared = {} if shared is None else shared
    stacked = copy.copy(selectors[0])
    for name in stacked.row_state:
        parts = [getattr(s, name, None) for s in selectors]
        key = tuple(id(v) for v in parts)
        if key not in shared or not isinstance(parts[0], Tensor):
            shared[key] = (_stacked(parts, shared), parts)  # (the parts are kept so that their ids stay theirs)
        value = shared[key][0]
        setattr(stacked, name, value)
        for r, s in enumerate(selectors):
            if hasattr(s, name) and not isinstance(value, (int, Selector)):  # a row keeps its own width, base
                setattr(s, name, _row_view(value, r))
    return stacked


def _share_kv_buffers(rows: list[SelectorCache], capacity: int) -> list[tuple[Tensor, Tensor]]:
    """Before rows that will be stacked start static decoding: per layer, one K and one V buffer [B, Hkv, capacity,
    d] holding every row's cached tokens, each row's layer holding its row of them. The rows' `start_static` then
    finds their buffers at capacity (it zeroes only the slots past their length) and `stack_rows` takes these
    buffers as they are: the prompt's K/V is copied once, not into a row buffer and then into the stack."""
    shared = []
    for i in range(len(rows[0].layers)):
        row_layers = [row.layers[i] for row in rows]
        first = row_layers[0]._k
        shape = (len(rows), first.shape[1], capacity, first.shape[3])
        keys, values = (torch.empty(shape, dtype=first.dtype, device=first.device) for _ in range(2))
        for r, layer in enumerate(row_layers):
            keys[r : r + 1, :, : layer.length].copy_(layer.keys)
            values[r : r + 1, :, : layer.length].copy_(layer.values)
            layer.hold(keys[r : r + 1], values[r : r + 1])
        shared.append((keys, values))
    return shared


def stack_rows(rows: list[SelectorCache], kv: list[tuple[Tensor, Tensor]] | None = None) -> SelectorCache:
    """One SelectorCache over rows that each started static decoding with the same capacity, every selector naming
    its `row_state`: K/V, selector state, slot and length ([B], row b's) and device counters stacked along the batch
    axis; each row's cache, layers and selectors then hold views of them (row b of every stacked tensor), so its
    host hooks and accounting work on it as before, and a step over the stacked cache is every row's step. `kv`: per
    layer, the (K, V) buffers whose rows the rows' layers already hold (`_share_kv_buffers`), else they are
    concatenated."""
    if any(row.layers[0]._k.shape[0] != 1 for row in rows):
        raise ValueError("stacked rows must each hold one sequence")
    stacked = copy.copy(rows[0])
    B = len(rows)
    stacked.static_position = torch.cat([row.static_position for row in rows])
    stacked.static_length = torch.cat([row.static_length for row in rows])
    for name in ROW_COUNTERS:
        setattr(stacked, name, torch.cat([getattr(row, name) for row in rows], dim=1))
    stacked.static_diagnostics = [torch.cat(c) for c in zip(*(row.static_diagnostics for row in rows))]
    for r, row in enumerate(rows):
        row.static_position, row.static_length = stacked.static_position[r : r + 1], stacked.static_length[r : r + 1]
        for name in ROW_COUNTERS:
            setattr(row, name, getattr(stacked, name)[:, r : r + 1])
        row.static_diagnostics = [c[r : r + 1] for c in stacked.static_diagnostics]
    layers, shared = [], {}
    for i in range(len(rows[0].layers)):
        row_layers = [row.layers[i] for row in rows]
        layer = SelectorLayer(stack_selectors([lay.selector for lay in row_layers], shared))
        layer.device = row_layers[0].device
        layer.length = max(lay.length for lay in row_layers)
        if kv is not None and any(lay._k.data_ptr() != kv[i][0][r].data_ptr() for r, lay in enumerate(row_layers)):
            raise ValueError("a row's layer no longer holds its row of the shared K/V buffers")
        layer.hold(*(kv[i] if kv is not None else
                     (torch.cat([lay._k for lay in row_layers]), torch.cat([lay._v for lay in row_layers]))))
        layer.is_initialized = True
        layer.static_position = stacked.static_position
        layer.static_rows = torch.arange(B, device=layer._k.device)  # the row index of each slot write
        layers.append(layer)
        # each row's layer views the stacked K/V at once, so its own buffers are freed layer by layer: the stack
        # costs one layer's K/V above the rows', not a second copy of all of them
        for r, row_layer in enumerate(row_layers):
            row_layer.hold(layer._k[r : r + 1], layer._v[r : r + 1])
            row_layer.static_position = rows[r].static_position
    stacked.layers = layers
    stacked.row_caches, stacked.static_host_rows, stacked.static_host_step = list(rows), [], False
    stacked.stats = None  # each row accounts into its own cache's stats
    return stacked
