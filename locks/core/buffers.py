"""Buffers that grow along one dimension as a sequence does: the K/V cache and every method's per-token or per-page
state (min/max per page or chunk, compacted token orders, factor rows, host stores).

Growth is geometric, so appending n tokens one at a time costs O(n) copies in all: a full buffer is replaced by one
of max(needed, factor * capacity, minimum) slots that holds the used ones."""
from __future__ import annotations

import torch
from torch import Tensor


def resized(buf: Tensor, used: int, capacity: int, *, dim: int = 2, zero: bool = False, pin: bool = False) -> Tensor:
    """A new buffer like `buf` with `capacity` slots along `dim` whose first `used` slots are buf's; the others are
    uninitialized, or zeros with `zero` (a static step reads them masked, so they must be finite). `pin`: page-locked
    host memory, where CUDA exists (a host store the device copies from asynchronously)."""
    shape = list(buf.shape)
    shape[dim] = capacity
    make = torch.zeros if zero else torch.empty
    new = make(shape, dtype=buf.dtype, device=buf.device, pin_memory=pin and torch.cuda.is_available())
    new.narrow(dim, 0, used).copy_(buf.narrow(dim, 0, used))
    return new


def grown(buf: Tensor, used: int, needed: int, *, dim: int = 2, factor: float = 2.0, minimum: int = 0,
          zero: bool = False, pin: bool = False) -> Tensor:
    """`buf` when it has `needed` slots along `dim`, else `resized` to max(needed, int(factor * capacity), minimum)."""
    capacity = buf.shape[dim]
    if needed <= capacity:
        return buf
    return resized(buf, used, max(needed, int(factor * capacity), minimum), dim=dim, zero=zero, pin=pin)
