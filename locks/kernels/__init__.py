"""Fused Triton kernels of the LOCKS harness (issue 6); the PyTorch code stays the oracle.

Entry points (same signatures and results as their PyTorch references, plus keyword-only tuning knobs):

| kernel | entry point | PyTorch reference |
|---|---|---|
| LOCKS page scoring (quantized summaries) | `locks_page_scores(q, s, scaling)` -> [B, Hq, P] | `locks.summaries.page_scores` |
| + GQA aggregation over the range [lo, hi) | `locks_aggregated_scores(q, s, scaling, group, mode, lo, hi)` -> [B, Hkv, P] | `locks.pages.aggregate_heads(page_scores(...), ...)` |
| Quest page bound | `quest_page_scores(q, kmax, kmin)` -> [B, Hq, P]; `quest_group_scores(..., reduce)` -> [B, Hkv, P] | `QuestSelector.page_bounds` (tests/test_kernels.py) |
| top-k pages | `topk_pages`, `select_pages` (torch.topk; see topk.py) | `torch.topk` |
| static decode page list (one launch) | `static_pages(top, length, budget, page_size, sink, recent)` | `locks.pages.static_page_list` |
| Quest min/max update at a device length | `quest_append(keys, kmax, kmin, length, page_size)` | `QuestSelector._append_static_reference` |
| split-K sparse decode | `sparse_decode(query, keys, values, sel, scaling)` -> (out, lse) | `locks.attention.sparse_decode` |
| same over page ids | `paged_decode(query, keys, values, pages, scaling, page_valid, page_size, length)` | idem, pages expanded to tokens |
| FullKV decode (same kernel) | `full_decode(query, keys, values, scaling, length)` | idem over all tokens |

`length` (paged / full decode) and the LOCKS candidate bounds may be device tensors: the kernels read them, so a CUDA
graph captured over a preallocated cache replays at every length (`locks/static_decode.py`).

Kernels run on CUDA tensors, or on CPU tensors when TRITON_INTERPRET=1 was set before this package was imported
(tests/conftest.py sets it when CUDA is unavailable). Importing this package needs `triton`.
"""
from locks.kernels._common import poisoned
from locks.kernels.decode import decode_splits, full_decode, paged_decode, sparse_decode
from locks.kernels.locks_score import LOCKS_AGGREGATIONS, locks_aggregated_scores, locks_page_scores
from locks.kernels.quest_score import quest_append, quest_group_scores, quest_page_scores
from locks.kernels.static_pages import static_pages
from locks.kernels.topk import select_pages, topk_pages

__all__ = [
    "locks_page_scores",
    "locks_aggregated_scores",
    "LOCKS_AGGREGATIONS",
    "quest_page_scores",
    "quest_group_scores",
    "quest_append",
    "static_pages",
    "topk_pages",
    "select_pages",
    "sparse_decode",
    "paged_decode",
    "full_decode",
    "decode_splits",
    "poisoned",
]
