"""Per-row asymmetric min/max quantization, dequantized: the per-token 4-bit keys of Twilight's weight estimate, and
the key labels of its DoubleSparsity base (docs/methods/twilight.md).

    x^ = clamp(round((x - min) / s), 0, 2^b - 1) s + min,   s = max(max - min, 1e-9) / (2^b - 1)   (over the last axis)
"""
from __future__ import annotations

import torch
from torch import Tensor


def min_max_quantize(x: Tensor, bits: int) -> Tensor:
    levels = 2**bits - 1
    low = x.amin(-1, keepdim=True)
    scale = (x.amax(-1, keepdim=True) - low).clamp(min=1e-9) / levels
    return torch.clamp(torch.round((x - low) / scale), 0, levels) * scale + low
