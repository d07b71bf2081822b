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
"""
from __future__ import annotations

import contextlib

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from locks.core.cache import SelectorCache
from locks.errors import ConfigError


class _RowsLayer(CacheLayerMixin):
    """Layer `layer_idx` of every row: `update` writes row r's new K/V into row r's layer."""

    is_sliding = False

    def __init__(self, batch: "RowBatch", layer_idx: int):
        super().__init__()
        self.batch, self.layer_idx = batch, layer_idx
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:
        pass

    def update(self, key_states, value_states, *args, **kwargs):
        for r, row in enumerate(self.batch.rows):
            row.layers[self.layer_idx].update(key_states[r : r + 1], value_states[r : r + 1])
        return key_states, value_states  # each row's attention reads its own cache (RowBatch.row_kv)

    def get_seq_length(self) -> int:
        return max(row.layers[self.layer_idx].length for row in self.batch.rows)

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
        super().__init__(layers=[_RowsLayer(self, i) for i in range(len(rows[0].layers))])
        self.live = [True] * len(self.rows)  # static decode: False for a row that has finished
        self.phase = rows[0].phase

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
        for row, capacity in zip(self.rows, capacities):
            row.start_static(capacity)
            # a row that finishes before its first step keeps writing its first decode slot, never a prompt slot
            # (the prompt may be a prefill capture that other runs read)
            row.set_static_position(row.get_seq_length())
        self.phase = "decode_static"
        self.static_position = self.rows[0].static_position
        self.static_host_step = False

    def set_static_position(self, positions: list[int]) -> None:
        for row, live, position in zip(self.rows, self.live, positions):
            if live:
                row.set_static_position(position)
        self.static_host_step = any(row.static_host_step for row, live in zip(self.rows, self.live) if live)

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
