"""Generic fused Triton kernels of the harness (method kernels live with their method: locks/method/kernels.py,
baselines/quest/kernels.py); the PyTorch code stays the oracle. docs/kernels.md says how every configuration is
compiled and checked ahead of time.

| kernel | entry point | PyTorch reference |
|---|---|---|
| split-K sparse decode | `sparse_decode(query, keys, values, indices, valid, scaling)` -> (out, lse) | `locks.core.reference.sparse_decode` |
| same over page ids | `paged_decode(query, keys, values, pages, scaling, page_valid, page_size, length)` | idem, pages expanded to tokens |
| FullKV decode (same kernel) | `full_decode(query, keys, values, scaling, length)` | idem over all tokens |
| static decode page list (one launch) | `static_pages(top, length, budget, page_size, sink, recent)` | `locks.core.paging.static_page_list` |
| top-k pages | `topk_pages`, `select_pages` (torch.topk; see topk.py) | `torch.topk` |
| coverage and coverage certificate of a static step (two launches), per row | `coverage_step(query, keys, length, scaling, lse_sel, sinks, coverage [B], certificate, diagnostics [B, 3, 2])` | `locks.core.attention.static_decode_step`'s reference ops |
| masked row gather from a host store | `gather_rows(src, rows, mask)` | `locks.core.host_rows.gather_missed_rows` (torch) |

`length` (paged / full decode, the static page lists, coverage, the static LOCKS / Quest kernels) may be a device
tensor: the kernels read it, so a CUDA graph captured over a preallocated cache replays at every length
(`locks/core/static_decode.py`). It holds one length for every row, or one per row ([B]: row b's), so that rows of
different lengths decode in one batch; coverage_step then adds to per-row counters. Kernels take tensors and
plain numbers only. They run on CUDA tensors, or on CPU tensors when TRITON_INTERPRET=1 was set before this package
was imported (tests/conftest.py sets it when CUDA is unavailable). Importing this package needs `triton`.
"""
from locks.kernels._common import poisoned
from locks.kernels.coverage import coverage_step
from locks.kernels.decode import decode_splits, full_decode, paged_decode, sparse_decode
from locks.kernels.gather import gather_rows
from locks.kernels.static_pages import static_pages
from locks.kernels.topk import select_pages, topk_pages

__all__ = ["coverage_step", "gather_rows", "static_pages", "topk_pages", "select_pages", "sparse_decode", "paged_decode", "full_decode",
           "decode_splits", "poisoned"]
