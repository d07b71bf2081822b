"""Twilight's pruning in one Triton launch (baselines/twilight/selector.py `prune`, docs/methods/twilight.md).

`_twilight_prune_kernel` (grid: row and query head): over the head's candidates (its own set, or its KV head's),
in blocks of BLOCK_K,

    pass 1   K^_t = the candidate's key, per-token min/max quantized (locks/core/quantize.py, operation for
             operation in fp32), e_t = fl32(sum_c q_c K^_{t,c}) * scaling (the sum in fp64), -inf off the set;
             the running max M
    pass 2   Z = sum_t exp(e_t - M)                                   (fp64)
    pass 3   P_t = fl32(exp(e_t - M) / Z), written; P_0 = the weight of token 0 among the candidates
    then     kernel_compat: the bisection of `top_p_bisection` on P, BISECTION_STEPS passes, the mass in fp64;
             keep_t = P_t > low. exact: P only (the caller's `top_p_exact` ranks it).

Divisions are IEEE (div_rn), rounding half to even by adding and subtracting 1.5 * 2^23, a product kept apart from
the add after it (no fma), so that P and the kept set are the PyTorch rule's.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from locks.kernels._common import check_device, launch, pow2

__all__ = ["twilight_prune"]


@triton.jit
def _rint(x):
    """Round half to even, for 0 <= x < 2^22 (IEEE fp32 additions)."""
    return (x + 12582912.0) - 12582912.0


@triton.jit
def _kept(x):
    """x itself, as a value an add cannot be fused with (a select on it)."""
    return tl.where(x != x, 0.0, x)


@triton.jit(do_not_specialize=["Hq", "G", "K"])
def _twilight_prune_kernel(q_ptr, stride_qb, stride_qh, k_ptr, stride_kb, stride_kh, stride_kl,
                           tok_ptr, ok_ptr, stride_tb, stride_th, stride_tg, p_ptr, keep_ptr, top_p_ptr,
                           Hq, G, K, D, SCALING, LEVELS: tl.constexpr, PER_HEAD: tl.constexpr, KERNEL_COMPAT: tl.constexpr,
                           STEPS: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    b = bh // Hq
    h = bh % Hq
    kvh = h // G
    own = h % G if PER_HEAD else 0
    c = tl.arange(0, BLOCK_D)
    cmask = c < D
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + c, mask=cmask, other=0.0).to(tl.float32).to(tl.float64)
    tokens = tok_ptr + b * stride_tb + kvh * stride_th + own * stride_tg
    valid = ok_ptr + b * stride_tb + kvh * stride_th + own * stride_tg
    weights = p_ptr + bh * K
    keys = k_ptr + b * stride_kb + kvh * stride_kh
    big_m = tl.full([], float("-inf"), tl.float32)
    for k0 in range(0, K, BLOCK_K):  # pass 1: the estimates, and their max
        j = k0 + tl.arange(0, BLOCK_K)
        ok = (tl.load(valid + j, mask=j < K, other=0) != 0) & (j < K)
        t = tl.load(tokens + j, mask=ok, other=0).to(tl.int64)
        x = tl.load(keys + t[:, None] * stride_kl + c[None, :], mask=ok[:, None] & cmask[None, :],
                    other=0.0).to(tl.float32)
        low = tl.min(tl.where(cmask[None, :], x, float("inf")), axis=1)
        high = tl.max(tl.where(cmask[None, :], x, float("-inf")), axis=1)
        scale = tl.div_rn(tl.maximum(high - low, 1e-9), tl.full([BLOCK_K], LEVELS, tl.float32))
        code = tl.minimum(tl.maximum(_rint(tl.div_rn(x - low[:, None], scale[:, None])), 0.0), LEVELS)
        estimate = _kept(code * scale[:, None]) + low[:, None]
        e = tl.sum(q[None, :] * tl.where(cmask[None, :], estimate, 0.0).to(tl.float64), axis=1).to(tl.float32)
        e = tl.where(ok, e * SCALING, float("-inf"))
        tl.store(weights + j, e, mask=j < K)
        big_m = tl.maximum(big_m, tl.max(e, axis=0))
    z = tl.zeros([], dtype=tl.float64)
    for k0 in range(0, K, BLOCK_K):  # pass 2: Z
        j = k0 + tl.arange(0, BLOCK_K)
        e = tl.load(weights + j, mask=j < K, other=float("-inf"))
        z += tl.sum(tl.exp((e - big_m).to(tl.float64)), axis=0)
    first = tl.zeros([], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):  # pass 3: P, and token 0's weight
        j = k0 + tl.arange(0, BLOCK_K)
        e = tl.load(weights + j, mask=j < K, other=float("-inf"))
        p = (tl.exp((e - big_m).to(tl.float64)) / z).to(tl.float32)
        tl.store(weights + j, p, mask=j < K)
        t = tl.load(tokens + j, mask=j < K, other=1)
        first += tl.sum(tl.where((t == 0) & (j < K), p, 0.0), axis=0)
    if KERNEL_COMPAT:
        top_p = tl.load(top_p_ptr)
        lo = tl.zeros([], dtype=tl.float32)
        hi = first
        searching = lo == lo
        for _ in tl.static_range(STEPS):
            mid = (lo + hi) / 2
            mass = tl.zeros([], dtype=tl.float64)
            above = tl.full([], float("inf"), tl.float32)
            below = tl.full([], float("-inf"), tl.float32)
            for k0 in range(0, K, BLOCK_K):
                j = k0 + tl.arange(0, BLOCK_K)
                p = tl.load(weights + j, mask=j < K, other=0.0)
                mass += tl.sum(tl.where(p > mid, p, 0.0).to(tl.float64), axis=0)
                above = tl.minimum(above, tl.min(tl.where((p > lo) & (j < K), p, float("inf")), axis=0))
                below = tl.maximum(below, tl.max(tl.where((p <= hi) & (j < K), p, float("-inf")), axis=0))
            above = tl.minimum(above, hi)
            below = tl.maximum(below, lo)
            new_lo = tl.where(searching & (mass >= top_p), mid, lo)
            hi = tl.where(searching & (mass < top_p), tl.minimum(mid, below), hi)
            lo = new_lo
            searching = searching & (below - above > 1e-5)
        for k0 in range(0, K, BLOCK_K):
            j = k0 + tl.arange(0, BLOCK_K)
            p = tl.load(weights + j, mask=j < K, other=0.0)
            ok = tl.load(valid + j, mask=j < K, other=0) != 0
            tl.store(keep_ptr + bh * K + j, ((p > lo) & ok).to(tl.int8), mask=j < K)


def twilight_prune(query: Tensor, keys: Tensor, tokens: Tensor, valid: Tensor, scaling: float, top_p: Tensor,
                   bits: int, kernel_compat: bool, steps: int) -> tuple[Tensor | None, Tensor]:
    """query [B, Hq, d], keys [B, Hkv, C, d], tokens/valid [B, Hkv, Gs, K] (Gs 1 or G), top_p [1] fp64 on the
    device -> (keep [B, Hkv, G, K] bool, kernel_compat only, else None; P [B, Hkv, G, K] fp32, 0 off the set).
    Oracle: `TwilightSelector.prune`."""
    check_device(_twilight_prune_kernel, query, keys, tokens, valid)
    B, Hq, d = query.shape
    _, H, Gs, K = tokens.shape
    if query.stride(-1) != 1 or keys.stride(-1) != 1:
        raise ValueError("twilight_prune needs unit-stride query and key rows")
    tokens = tokens.contiguous()
    valid = valid.contiguous().view(torch.int8)
    P = torch.empty(B, H, Hq // H, K, dtype=torch.float32, device=query.device)
    keep = torch.empty(B, H, Hq // H, K, dtype=torch.bool, device=query.device)
    block_d = pow2(d, 16)
    block_k = max(16, min(128, 8192 // block_d))
    launch(_twilight_prune_kernel, (B * Hq,), query, query.stride(0), query.stride(1), keys, keys.stride(0),
           keys.stride(1), keys.stride(2), tokens, valid, tokens.stride(0), tokens.stride(1), tokens.stride(2), P,
           keep.view(torch.int8), top_p, Hq, Hq // H, K, d, scaling, LEVELS=2**bits - 1, PER_HEAD=Gs > 1,
           KERNEL_COMPAT=kernel_compat, STEPS=steps, BLOCK_K=block_k, BLOCK_D=block_d, num_warps=4)
    return (keep if kernel_compat else None), P
