"""The page list of one static (CUDA-graph) decode step of a page selector, assembled on the device in one launch.

Oracle: `locks.core.paging.static_page_list` (same arguments, same result). Inputs: the top-Kt candidate pages per KV head
(torch.topk of the aggregated scores, best first), the device length L (one for every row, or row b's own: PER_ROW),
and the fair-mode layout of `PageSelector`:
S sink pages, R recent pages, page size N, budget B with Kt = B // N - S - R. Output per KV head, Kt + S + R + 1
page ids (int32) and their validity (uint8):
    slots [0, Kt)          the top pages; slot j valid iff j < k = (B - t) // N - S - R  (t = L mod N: the partial
                           page's t tokens leave room for one page less when B mod N < t)
    slots [Kt, Kt + S)     the sink pages 0 .. S - 1
    next R slots           the recent pages L // N - 1, L // N - 2, ...
    last slot              the partial page L // N (its tokens at or past L are masked by the decode's length)
and while L <= B (everything fits) simply the pages 0 .. Kt + S + R, all valid. Replaces ~25 small PyTorch ops per
layer and step (index arithmetic, concatenations, masks) with one launch of one program per KV head.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from locks.kernels._common import check_device, launch, pow2
from locks.kernels.decode import device_length

__all__ = ["static_pages"]


@triton.jit(do_not_specialize=["H", "KT", "TOTAL", "budget", "S", "R"])
def _static_pages_kernel(top_ptr, len_ptr, pages_ptr, valid_ptr, H, KT, TOTAL, budget, S, R, N: tl.constexpr,
                         PER_ROW: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)  # b * Hkv + h
    if PER_ROW:
        len_ptr += r // H
    L = tl.load(len_ptr).to(tl.int32)
    full = L // N
    k = (budget - (L - full * N)) // N - S - R
    j = tl.arange(0, BLOCK)
    top = tl.load(top_ptr + r * KT + j, mask=j < KT, other=0).to(tl.int32)
    page = tl.where(j < KT, top,
                    tl.where(j < KT + S, j - KT,
                             tl.where(j < KT + S + R, full - 1 - (j - KT - S), full)))
    valid = (j >= KT) | (j < k)
    fits = L <= budget
    page = tl.where(fits, j, page)
    valid = valid | fits
    out = j < TOTAL
    tl.store(pages_ptr + r * TOTAL + j, page, mask=out)
    tl.store(valid_ptr + r * TOTAL + j, valid.to(tl.uint8), mask=out)


def static_pages(top: Tensor, length: Tensor, budget: int, page_size: int, sink_pages: int,
                 recent_pages: int) -> tuple[Tensor, Tensor]:
    """top [B, Hkv, Kt] page ids (int64/int32), length [1] (every row) or [B] (row b's) int -> (pages
    [B, Hkv, Kt+S+R+1] int32, valid bool)."""
    check_device(_static_pages_kernel, top, length)
    B, H, KT = top.shape
    length, per_row = device_length(length, B)
    total = KT + sink_pages + recent_pages + 1
    top = top.contiguous()
    pages = torch.empty(B, H, total, dtype=torch.int32, device=top.device)
    valid = torch.empty(B, H, total, dtype=torch.uint8, device=top.device)
    launch(_static_pages_kernel, (B * H,), top, length, pages, valid, H, KT, total, int(budget),
           int(sink_pages), int(recent_pages), N=page_size, PER_ROW=per_row, BLOCK=pow2(total, 16), num_warps=1)
    return pages, valid.view(torch.bool)
