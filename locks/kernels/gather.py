"""Rows of a (host-resident) store gathered into device memory, only where a mask says: one launch, fixed shapes.

Oracle: `locks.core.host_rows.gather_missed_rows` with backend "torch" (same arguments, same result). Offloading
methods (ShadowKV's values, LRQK's cold K/V rows) keep their store in pinned host memory; inside a CUDA graph the
rows a step misses cannot be gathered on the host (their ids live on the device). This kernel reads the store
through its device-side address (`locks.core.host_rows.device_view`): a masked-off row issues no load, so only the
missed rows cross PCIe, while the launch has the same grid at every step.

    out[b, h, j, :] = src[b, h, rows[b, h, j], :]  if mask[b, h, j]  else 0
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from locks.kernels._common import check_device, empty, launch, pow2

__all__ = ["gather_rows"]


@triton.jit(do_not_specialize=["R", "M", "W"])
def _gather_rows_kernel(src_ptr, rows_ptr, mask_ptr, out_ptr, R, M, W, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)  # (b * H + h) * M + j
    head = pid // M
    row = tl.load(rows_ptr + pid)
    read = tl.load(mask_ptr + pid).to(tl.int32) * W  # columns to load: all of them for a missed row, none otherwise
    for start in range(0, W, BLOCK):
        c = start + tl.arange(0, BLOCK)
        x = tl.load(src_ptr + (head * R + row) * W + c, mask=c < read, other=0.0)
        tl.store(out_ptr + pid * W + c, x, mask=c < W)


def gather_rows(src: Tensor, rows: Tensor, mask: Tensor) -> Tensor:
    """src [B, H, R, W] (contiguous), rows [B, H, M] int64, mask [B, H, M] bool -> [B, H, M, W] in src's dtype."""
    check_device(_gather_rows_kernel, rows, mask)
    B, H, R, W = src.shape
    M = rows.shape[-1]
    out = empty(B, H, M, W, dtype=src.dtype, device=rows.device)
    if out.numel():
        launch(_gather_rows_kernel, (B * H * M,), src, rows.contiguous(), mask.contiguous().view(torch.uint8), out,
               R, M, W, BLOCK=min(pow2(W, 16), 1024), num_warps=4)
    return out
