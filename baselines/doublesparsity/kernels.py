"""DoubleSparsity's static selection in one Triton launch (baselines/doublesparsity/selector.py,
docs/methods/doublesparsity.md): the newest key's labels written into the label cache, every slot's label score and
its ranking key, around one torch.topk.

`_ds_keys_kernel` (grid: row and query head x blocks of slots): the query head's label q~ (its r channels,
quantized as the variant says), then for its block of slots t the labels k~_t (the program whose block holds the
newest slot L - 1 computes that label from the key and stores it first), and

    s_t = fl32(sum_c q~_c k~_{t,c}) / sqrt(r or d)            (the sum in fp64, as the PyTorch rule)
    key_t = (order-preserving bits of s_t) << 32 + (CAP - 1 - t),   s_t = -inf at t >= L

the ranking key of `locks.core.topk.top_units_lowest_first` (exact ties to the lower slot). The quantizers are the
selector's, operation for operation in fp32 (IEEE division, rounding half to even by adding and subtracting
1.5 * 2^23, products kept apart from the following add so that they are not contracted into an fma).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from locks.kernels._common import cdiv, check_device, launch, pow2
from locks.kernels.decode import device_length
from locks.kernels.rounding import kept, minmax_dequantize, rint

__all__ = ["ds_static_keys"]

QUANTIZERS = {"none": 0, "official": 1, "twilight": 2}


@triton.jit
def _quantize(x, mask, LEVELS: tl.constexpr, KIND: tl.constexpr):
    """The label quantizers over the masked entries of x: 1 = DoubleSparsity's pseudo_quantize, 2 = the per-token
    min/max quantizer (locks/core/quantize.py), 0 = none."""
    if KIND == 0:
        return x
    low = tl.min(tl.where(mask, x, float("inf")), axis=0)
    high = tl.max(tl.where(mask, x, float("-inf")), axis=0)
    if KIND == 1:  # round((x - low) s).clamp(0, levels) / s + low, s = levels / (high - low or 1)
        # (levels / t in PyTorch is reciprocal(t) * levels: Tensor.__rtruediv__)
        scale = kept(tl.div_rn(1.0, tl.where(high == low, 1.0, high - low))) * LEVELS
        code = tl.minimum(tl.maximum(rint(kept((x - low) * scale)), 0.0), LEVELS)
        return tl.div_rn(code, scale) + low
    return minmax_dequantize(x, low, high, LEVELS)


@triton.jit(do_not_specialize=["Hq", "G", "CAP"])
def _ds_keys_kernel(q_ptr, stride_qb, stride_qh, k_ptr, stride_kb, stride_kh, stride_kl, ch_ptr,
                    lab_ptr, stride_lb, stride_lh, stride_ll, len_ptr, out_ptr, Hq, G, CAP, R, SCALE,
                    LEVELS: tl.constexpr, QUERY: tl.constexpr, KEY: tl.constexpr, PER_ROW: tl.constexpr,
                    BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    b = bh // Hq
    h = bh % Hq
    if PER_ROW:
        len_ptr += b
    L = tl.load(len_ptr).to(tl.int64)
    c = tl.arange(0, BLOCK_R)
    cmask = c < R
    ch = tl.load(ch_ptr + h * R + c, mask=cmask, other=0).to(tl.int64)
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + ch, mask=cmask, other=0.0).to(tl.float32)
    q = _quantize(q, cmask, LEVELS, QUERY)
    labels = lab_ptr + b * stride_lb + h * stride_lh
    newest = L - 1
    if newest // BLOCK_T == block:  # the newest key's label, written before any slot of this block is read
        key = tl.load(k_ptr + b * stride_kb + (h // G) * stride_kh + newest * stride_kl + ch, mask=cmask,
                      other=0.0).to(tl.float32)
        tl.store(labels + newest * stride_ll + c, _quantize(key, cmask, LEVELS, KEY), mask=cmask)
        tl.debug_barrier()
    t = block * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = t < CAP
    lab = tl.load(labels + t.to(tl.int64)[:, None] * stride_ll + c[None, :], mask=tmask[:, None] & cmask[None, :],
                  other=0.0)
    s = tl.sum(q.to(tl.float64)[None, :] * lab.to(tl.float64), axis=1).to(tl.float32)
    s = tl.where(t < L, tl.div_rn(s, tl.full([], SCALE, tl.float32)), float("-inf")) + 0.0  # (-0.0 -> +0.0)
    bits = s.to(tl.int32, bitcast=True)
    ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64)
    tl.store(out_ptr + bh * CAP + t, (ordered << 32) + (CAP - 1 - t), mask=tmask)


def ds_static_keys(query: Tensor, keys: Tensor, channels: Tensor, labels: Tensor, length: Tensor, bits: int,
                   query_quantizer: str, key_quantizer: str, scale: float) -> Tensor:
    """query [B, Hq, d], keys [B, Hkv, CAP, d] (the newest at slot length - 1), channels [Hq, r] int64, labels
    [B, Hq, CAP, r] fp32 (the newest slot written in place), length [1] or [B] -> ranking keys [B, Hq, CAP] int64.
    Oracle: the torch branch of `DoubleSparsitySelector.select_static` (its labels, scores and int64 keys)."""
    check_device(_ds_keys_kernel, query, keys, channels, labels, length)
    B, Hq, d = query.shape
    H, cap = keys.shape[1], keys.shape[2]
    r = channels.shape[1]
    length, per_row = device_length(length, B)
    if query.stride(-1) != 1 or keys.stride(-1) != 1 or labels.stride(-1) != 1 or labels.dtype != torch.float32:
        raise ValueError("ds_static_keys needs unit-stride rows and fp32 labels")
    channels = channels.contiguous()
    out = torch.empty(B, Hq, cap, dtype=torch.int64, device=query.device)
    block_t = 128
    launch(_ds_keys_kernel, (B * Hq, cdiv(cap, block_t)), query, query.stride(0), query.stride(1), keys,
           keys.stride(0), keys.stride(1), keys.stride(2), channels, labels, labels.stride(0), labels.stride(1),
           labels.stride(2), length, out, Hq, Hq // H, cap, r, scale, LEVELS=2**bits - 1,
           QUERY=QUANTIZERS[query_quantizer], KEY=QUANTIZERS[key_quantizer], PER_ROW=per_row,
           BLOCK_R=pow2(r, 16), BLOCK_T=block_t, num_warps=4)
    return out
