"""Twilight's pruning in one Triton launch, and a static step's count in another (baselines/twilight/selector.py,
docs/methods/twilight.md).

`_twilight_prune_kernel` (grid: row and query head): over the head's candidates (its own set, or its KV head's: a
token list, or in a static step a page list, candidate j being page j // n's token j mod n, valid below the row's
device length), in blocks of BLOCK_K,

    pass 1   K^_t = the candidate's key, per-token min/max quantized (locks/core/quantize.py, operation for
             operation in fp32), e_t = fl32(sum_c q_c K^_{t,c}) * scaling (the sum in fp64), -inf off the set;
             the running max M
    pass 2   Z = sum_t exp(e_t - M)                                   (fp64)
    pass 3   P_t = fl32(exp(e_t - M) / Z), written; P_0 = the weight of token 0 among the candidates
    then     kernel_compat: the bisection of `top_p_bisection` on P, BISECTION_STEPS passes, the mass in fp64;
             keep_t = P_t > low. exact: P only (the caller's `top_p_exact` ranks it).

Divisions are IEEE (div_rn), rounding half to even by adding and subtracting 1.5 * 2^23, a product kept apart from
the add after it (no fma), so that P and the kept set are the PyTorch rule's.

`_twilight_count_kernel` (grid: row): the kept tokens summed over the query heads, the heads and the most one head
kept, added to the selector's counters; the valid candidates' 4-bit bytes; and each KV head's union of its heads'
kept tokens, |U_h| = #{kept t : bit t of the head's slot bitmap was clear when atomic_or set it}, the bits cleared
again after a barrier, so that the bitmaps are clear between steps.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from locks.kernels._common import check_device, launch, pow2
from locks.kernels.decode import device_length
from locks.kernels.rounding import minmax_dequantize

__all__ = ["twilight_prune", "twilight_count"]


@triton.jit
def _candidate(tok_ptr, ok_ptr, pv_ptr, j, K, L, PAGE: tl.constexpr, PAGE_VALID: tl.constexpr):
    """(token, valid) of candidates j: a token list with its validity, or (PAGE > 0) page j // PAGE's token
    j % PAGE, valid when the page is (PAGE_VALID) and the token is below the row's length L."""
    inside = j < K
    if PAGE > 0:
        page = tl.load(tok_ptr + j // PAGE, mask=inside, other=0).to(tl.int64)
        t = page * PAGE + j % PAGE
        ok = inside & (t < L)
        if PAGE_VALID:
            ok = ok & (tl.load(pv_ptr + j // PAGE, mask=inside, other=0) != 0)
    else:
        ok = inside & (tl.load(ok_ptr + j, mask=inside, other=0) != 0)
        t = tl.load(tok_ptr + j, mask=ok, other=0).to(tl.int64)
    return t, ok


@triton.jit(do_not_specialize=["Hq", "G", "K", "C"])
def _twilight_prune_kernel(q_ptr, stride_qb, stride_qh, k_ptr, stride_kb, stride_kh, stride_kl,
                           tok_ptr, ok_ptr, pv_ptr, stride_tb, stride_th, stride_tg, stride_vb, stride_vh, stride_vg,
                           len_ptr, p_ptr, keep_ptr, top_p_ptr, tok_out_ptr, ok_out_ptr, nvalid_ptr,
                           Hq, G, K, C, D, SCALING, LEVELS: tl.constexpr, PER_HEAD: tl.constexpr,
                           KERNEL_COMPAT: tl.constexpr, STEPS: tl.constexpr, PAGE: tl.constexpr,
                           PAGE_VALID: tl.constexpr, PER_ROW: tl.constexpr, BLOCK_K: tl.constexpr,
                           BLOCK_D: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    b = bh // Hq
    h = bh % Hq
    kvh = h // G
    own = h % G if PER_HEAD else 0
    c = tl.arange(0, BLOCK_D)
    cmask = c < D
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + c, mask=cmask, other=0.0).to(tl.float32).to(tl.float64)
    tokens = tok_ptr + b * stride_tb + kvh * stride_th + own * stride_tg
    valid = ok_ptr + b * stride_vb + kvh * stride_vh + own * stride_vg
    page_valid = pv_ptr + b * stride_vb + kvh * stride_vh + own * stride_vg
    L = 0
    if PAGE > 0:
        if PER_ROW:
            len_ptr += b
        L = tl.load(len_ptr).to(tl.int64)
    weights = p_ptr + bh * K
    keys = k_ptr + b * stride_kb + kvh * stride_kh
    big_m = tl.full([], float("-inf"), tl.float32)
    count = tl.zeros([], dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):  # pass 1: the estimates, and their max
        j = k0 + tl.arange(0, BLOCK_K)
        t, ok = _candidate(tokens, valid, page_valid, j, K, L, PAGE, PAGE_VALID)
        count += tl.sum(ok.to(tl.int32), axis=0)
        if PAGE > 0:  # the candidates as a token list, for the pruning's caller and the attention
            tl.store(tok_out_ptr + bh * K + j, tl.minimum(t, C - 1), mask=j < K)
            tl.store(ok_out_ptr + bh * K + j, ok.to(tl.int8), mask=j < K)
        x = tl.load(keys + t[:, None] * stride_kl + c[None, :], mask=ok[:, None] & cmask[None, :],
                    other=0.0).to(tl.float32)
        low = tl.min(tl.where(cmask[None, :], x, float("inf")), axis=1)
        high = tl.max(tl.where(cmask[None, :], x, float("-inf")), axis=1)
        estimate = minmax_dequantize(x, low[:, None], high[:, None], LEVELS)
        e = tl.sum(q[None, :] * tl.where(cmask[None, :], estimate, 0.0).to(tl.float64), axis=1).to(tl.float32)
        e = tl.where(ok, e * SCALING, float("-inf"))
        tl.store(weights + j, e, mask=j < K)
        big_m = tl.maximum(big_m, tl.max(e, axis=0))
    tl.store(nvalid_ptr + bh, count)
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
        t, ok = _candidate(tokens, valid, page_valid, j, K, L, PAGE, PAGE_VALID)
        first += tl.sum(tl.where((t == 0) & ok, p, 0.0), axis=0)
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
            t, ok = _candidate(tokens, valid, page_valid, j, K, L, PAGE, PAGE_VALID)
            tl.store(keep_ptr + bh * K + j, ((p > lo) & ok).to(tl.int8), mask=j < K)


@triton.jit(do_not_specialize=["Hkv", "G", "K", "W"])
def _twilight_count_kernel(keep_ptr, tok_ptr, stride_tb, stride_th, stride_tg, nvalid_ptr, seen_ptr, W, kept_ptr,
                           bytes_ptr, att_ptr, Hkv, G, K, TOKEN_BYTES, BLOCK_K: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    total = tl.zeros([], dtype=tl.int64)
    most = tl.zeros([], dtype=tl.int64)
    candidates = tl.zeros([], dtype=tl.int64)
    for h in range(Hkv):
        seen = seen_ptr + (b * Hkv + h) * W  # the KV head's bitmap of slots, all clear between steps
        union = tl.zeros([], dtype=tl.int64)
        for g in range(G):
            bh = (b * Hkv + h) * G + g
            tokens = tok_ptr + b * stride_tb + h * stride_th + g * stride_tg
            kept = tl.zeros([], dtype=tl.int64)
            for k0 in range(0, K, BLOCK_K):
                j = k0 + tl.arange(0, BLOCK_K)
                keep = tl.load(keep_ptr + bh * K + j, mask=j < K, other=0) != 0
                t = tl.load(tokens + j, mask=keep, other=0).to(tl.int32)
                bit = (tl.full([BLOCK_K], 1, tl.int32) << (t % 32))
                old = tl.atomic_or(seen + t // 32, bit, mask=keep)
                union += tl.sum((keep & ((old & bit) == 0)).to(tl.int64), axis=0)
                kept += tl.sum(keep.to(tl.int64), axis=0)
            total += kept
            most = tl.maximum(most, kept)
            candidates += tl.load(nvalid_ptr + bh).to(tl.int64)
        tl.debug_barrier()
        for g in range(G):  # clear what this head set
            tokens = tok_ptr + b * stride_tb + h * stride_th + g * stride_tg
            for k0 in range(0, K, BLOCK_K):
                j = k0 + tl.arange(0, BLOCK_K)
                keep = tl.load(keep_ptr + ((b * Hkv + h) * G + g) * K + j, mask=j < K, other=0) != 0
                t = tl.load(tokens + j, mask=keep, other=0).to(tl.int32)
                tl.store(seen + t // 32, tl.zeros([BLOCK_K], tl.int32), mask=keep)
        tl.debug_barrier()
        tl.store(att_ptr + b * Hkv + h, union.to(tl.float64))
    row = kept_ptr + b * 3
    tl.store(row, tl.load(row) + total.to(tl.float64))
    tl.store(row + 1, tl.load(row + 1) + (Hkv * G).to(tl.float64))
    tl.store(row + 2, tl.maximum(tl.load(row + 2), most.to(tl.float64)))
    out = bytes_ptr + b * 3
    tl.store(out, candidates.to(tl.float64) * TOKEN_BYTES)
    tl.store(out + 1, tl.zeros([], tl.float64))
    tl.store(out + 2, tl.zeros([], tl.float64))


def twilight_prune(query: Tensor, keys: Tensor, tokens: Tensor, valid: Tensor | None, scaling: float, top_p: Tensor,
                   bits: int, kernel_compat: bool, steps: int, *, length: Tensor | None = None, page_size: int = 0,
                   ) -> dict[str, Tensor | None]:
    """query [B, Hq, d], keys [B, Hkv, C, d], the candidates [B, Hkv, Gs, K] (Gs 1 or G): tokens with their `valid`,
    or (page_size > 0) pages of page_size tokens with their page validity (`valid`, or None: every page), truncated
    at the device `length` ([1] or [B]); top_p [1] fp64 on the device -> {"P": [B, Hkv, G, K'] fp32, 0 off the set
    (K' = K, or K * page_size); "keep": the same shape, bool, kernel_compat only, else None; "tokens", "valid": the
    candidates as tokens [B, Hkv, G, K'] int64 (clamped to the cache) and their validity, page lists only, else
    None; "candidates": [B, Hkv, G] int32 valid candidates per query head}. Oracle: `TwilightSelector.prune`."""
    check_device(_twilight_prune_kernel, query, keys, tokens)
    B, Hq, d = query.shape
    _, H, Gs, K = tokens.shape
    C = keys.shape[2]
    if query.stride(-1) != 1 or keys.stride(-1) != 1:
        raise ValueError("twilight_prune needs unit-stride query and key rows")
    G, n = Hq // H, max(page_size, 1)
    tokens = tokens.contiguous()
    valid = tokens if valid is None else valid.contiguous().view(torch.int8)
    per_row = False
    if page_size:
        length, per_row = device_length(length, B)
    width = K * n
    out = {"P": torch.empty(B, H, G, width, dtype=torch.float32, device=query.device),
           "keep": torch.empty(B, H, G, width, dtype=torch.bool, device=query.device) if kernel_compat else None,
           "tokens": torch.empty(B, H, G, width, dtype=torch.int64, device=query.device) if page_size else None,
           "valid": torch.empty(B, H, G, width, dtype=torch.bool, device=query.device) if page_size else None,
           "candidates": torch.empty(B, H, G, dtype=torch.int32, device=query.device)}
    scratch = out["P"]  # an unused output pointer where an output is not written
    block_d = pow2(d, 16)
    block_k = max(16, min(128, 8192 // block_d))
    launch(_twilight_prune_kernel, (B * Hq,), query, query.stride(0), query.stride(1), keys, keys.stride(0),
           keys.stride(1), keys.stride(2), tokens, valid, valid, tokens.stride(0), tokens.stride(1), tokens.stride(2),
           valid.stride(0), valid.stride(1), valid.stride(2), length if page_size else scratch, out["P"],
           scratch if out["keep"] is None else out["keep"].view(torch.int8), top_p,
           scratch if out["tokens"] is None else out["tokens"],
           scratch if out["valid"] is None else out["valid"].view(torch.int8), out["candidates"], Hq, G, width, C, d,
           scaling, LEVELS=2**bits - 1, PER_HEAD=Gs > 1, KERNEL_COMPAT=kernel_compat, STEPS=steps, PAGE=page_size,
           PAGE_VALID=page_size > 0 and valid is not tokens, PER_ROW=per_row, BLOCK_K=block_k, BLOCK_D=block_d,
           num_warps=4)
    return out


def twilight_count(keep: Tensor, tokens: Tensor, candidates: Tensor, seen: Tensor, kept: Tensor,
                   token_bytes: float) -> tuple[Tensor, Tensor]:
    """A static step's accounting in one launch (one program per row): keep [B, Hkv, G, K] bool of tokens [B, Hkv,
    Gs, K] (Gs 1 or G), candidates [B, Hkv, G] int32 (`twilight_prune`'s), seen [B, Hkv, W] int32 the slot bitmaps
    (all clear, and left clear), kept [B, 3] fp64 (kept tokens summed, query heads summed, the most one kept) updated
    -> (attended [B, Hkv] fp64, each KV head's union of its heads' kept tokens; device_bytes [B, 3] fp64, the valid
    candidates' `token_bytes` of 4-bit keys as metadata). Oracle: `TwilightSelector.count` and
    `locks.core.reference.attended_per_kv_head`."""
    check_device(_twilight_count_kernel, keep, tokens, candidates, seen, kept)
    B, H, G, K = keep.shape
    if seen.shape[:2] != (B, H) or seen.dtype != torch.int32 or not seen.is_contiguous():
        raise ValueError(f"twilight_count: seen must be contiguous int32 [B, Hkv, W] (got {tuple(seen.shape)})")
    tokens = tokens.contiguous()
    keep = keep.contiguous().view(torch.int8)
    attended = torch.empty(B, H, dtype=torch.float64, device=keep.device)
    device_bytes = torch.empty(B, 3, dtype=torch.float64, device=keep.device)
    launch(_twilight_count_kernel, (B,), keep, tokens, tokens.stride(0), tokens.stride(1),
           tokens.stride(2) if tokens.shape[2] > 1 else 0, candidates, seen, seen.shape[2], kept, device_bytes,
           attended, H, G, K, float(token_bytes), BLOCK_K=512, num_warps=4)
    return attended, device_bytes
