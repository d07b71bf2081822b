"""A sliding-window layer's attention (docs/architecture.md, layer types): the last W tokens, exactly what stock
transformers attends there (its mask admits key j for query i when i - W < j <= i). No method is asked on such a
layer: this is the layer's selector in every run, so a hybrid model's sliding layers decode the same way for every
method, and the method's own state (summaries, min/max, factors) exists on full-attention layers only.

The cache keeps the whole K/V of a sliding layer, as of a full one (one buffer layout for every layer, shared by a
group's prefill capture); what a step reads, and what the bytes model counts for FullKV and for every method, is
the window: min(L, W) tokens.
"""
from __future__ import annotations

import torch
from torch import Tensor

from locks.core.selector import LayerInfo, Selection, Selector, row_length


class SlidingWindow(Selector):
    """The last `info.sliding_window` tokens of the cache (never registered as a method)."""

    name = "sliding_window"
    uses_budget = False
    row_state = ()

    def __init__(self, info: LayerInfo):
        if not info.sliding_window or info.sliding_window <= 0:
            raise ValueError(f"layer {info.layer_idx}: a sliding window needs a positive width "
                             f"(got {info.sliding_window})")
        super().__init__(info, budget=info.sliding_window)
        self.window = int(info.sliding_window)

    def select(self, query: Tensor, keys: Tensor, values: Tensor) -> Selection:
        L = keys.shape[2]
        B, H = keys.shape[:2]
        n = min(L, self.window)
        idx = torch.arange(L - n, L, device=keys.device).expand(B, H, 1, n)
        return Selection(indices=idx, valid=torch.ones_like(idx, dtype=torch.bool), attended_on_host=True)

    def static_decode_error(self) -> str | None:
        return None

    def select_static(self, query: Tensor, keys: Tensor, values: Tensor, length: Tensor) -> Selection:
        """The W slots before `length` (fixed shape W; those before slot 0 masked)."""
        B, H = keys.shape[:2]
        slots = row_length(length, 4) - self.window + torch.arange(self.window, device=keys.device)
        idx = slots.clamp(min=0).expand(B, H, 1, self.window)
        return Selection(indices=idx, valid=(slots >= 0).expand(B, H, 1, self.window), attended_on_host=True)

    def static_step_cost(self, length: int) -> tuple[float, float, float | None]:
        return 0.0, 0.0, float(min(length, self.window))
