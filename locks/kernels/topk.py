"""Top-k page selection: torch.topk for now (no Triton kernel yet).

The issue asks for a Triton top-k only if torch.topk dominates the LOCKS step. That can only be measured on the GPU:
scripts/bench_decode.py times torch.topk on the aggregated scores [B, Hkv, P] (65,536 pages at 1M tokens) and
records its share of the fused LOCKS step (`topk` rows, field `share_of_locks_fused`). Decide from that run.

`select_pages` turns aggregated scores into the page list that `paged_decode` consumes: the k best candidate pages
(unsorted: attention does not depend on the order) followed by the forced pages (sink pages, recent pages, partial
page), all fixed-size, so the step stays CUDA-graph capturable.
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["topk_pages", "select_pages"]


def topk_pages(scores: Tensor, k: int) -> Tensor:
    """Indices [..., k] (int64) of the k largest scores along the last axis (order unspecified)."""
    return torch.topk(scores, k, dim=-1, sorted=False).indices


def select_pages(scores: Tensor, k: int, forced_pages: Tensor | None = None) -> Tensor:
    """[B, Hkv, k + F] page ids: top-k of `scores` [B, Hkv, P] (non-candidates must be -inf) then `forced_pages`
    [F] (int64, on the scores' device), shared by every batch row and KV head."""
    top = topk_pages(scores, k)
    if forced_pages is None or forced_pages.numel() == 0:
        return top
    return torch.cat([top, forced_pages.to(top.dtype).expand(*top.shape[:-1], forced_pages.numel())], dim=-1)
