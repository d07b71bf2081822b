"""fp32 rounding in Triton that reproduces a PyTorch quantizer operation for operation (IEEE additions and
divisions, no fused multiply-add), shared by the kernels that quantize keys or labels (DoubleSparsity's labels,
Twilight's INT4 estimates; the PyTorch rule is locks/core/quantize.py)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def rint(x):
    """Round half to even, for 0 <= x < 2^22 (IEEE fp32 additions)."""
    return (x + 12582912.0) - 12582912.0


@triton.jit
def kept(x):
    """x itself, as a value an add cannot be fused with (a select on it)."""
    return tl.where(x != x, 0.0, x)


@triton.jit
def minmax_dequantize(x, low, high, LEVELS: tl.constexpr):
    """The per-token min/max quantizer, quantized and back, with low and high broadcast against x:

        s = max(high - low, 1e-9) / levels,   x^ = clamp(round((x - low) / s), 0, levels) s + low."""
    scale = tl.div_rn(tl.maximum(high - low, 1e-9), tl.full(high.shape, LEVELS, tl.float32))
    code = tl.minimum(tl.maximum(rint(tl.div_rn(x - low, scale)), 0.0), LEVELS)
    return kept(code * scale) + low
