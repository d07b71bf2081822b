"""MagicPIG's static step in three Triton launches (baselines/magicpig/selector.py, docs/methods/magicpig.md): the
query codes, one split-K pass that samples, weights and attends, and the merge of the splits with the step's counts.

`_query_codes_kernel` (grid: row x query head): c_{h,t} = sum_{b<K} 2^b [q/|q| . R_j[:, t, b] > 0] under the row's
(K, L), -2 for the tables past L; the projections summed in fp64 from exact fp32 products, as the PyTorch rule
(the d axis in chunks of 16, 8 tables at a time: a small tile of registers).

`_sample_attend_kernel` (grid: row x KV head, splits of the slots): the G query heads of the KV head (padded to 16
rows; the logits and P V are tensor-core dots in 16 bits, P split into two 16-bit parts as in the decode kernels,
or IEEE fp32 dots for fp32 inputs) over its
split's slots below the length; per slot t (its codes first, its key and value only where some head attends it)
the collisions n_t = #{tables : c_{h,t} = code_t}, and with
m_t = [t in the middle], sampled_t = m_t [n_t >= 2],

    logit_t = q . k_t / sqrt(d) - ln(w_t + 1e-4) [sampled_t],   w_t = 1 - (1 - u)^L - L u (1 - u)^(L - 1),
    u = (1 - arccos(cos)/pi)^K,   cos = (q . k_t - q . a_j) / (|q| |k~_t|)

over the slots with (not m_t) or sampled_t, in the online softmax of flash decoding; it writes the split's
(m, l, acc), each head's sampled count and the KV head's union count. `_combine_kernel` (locks/kernels/decode.py)
merges the splits; `_count_kernel` (grid: row) folds the counts into the attended tokens per KV head and the
selector's sample counters.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from locks.kernels._common import check_device, empty, interpreted, launch, pow2
from locks.kernels.decode import _combine_kernel, decode_splits, device_length

__all__ = ["magicpig_static_attention"]

BITS = 16  # MAX_BITS (15) padded to a power of two


@triton.jit
def _acos(x):
    """arccos on [-1, 1]: sqrt(1 - |x|) p(|x|), Abramowitz & Stegun 4.4.46 (|error| <= 2e-8), pi - that for x < 0."""
    a = tl.abs(x)
    p = -0.0012624911 * a + 0.0066700901
    p = p * a - 0.0170881256
    p = p * a + 0.0308918810
    p = p * a - 0.0501743046
    p = p * a + 0.0889789874
    p = p * a - 0.2145988016
    p = p * a + 1.5707963050
    r = tl.sqrt(1.0 - a) * p
    return tl.where(x < 0, 3.141592653589793 - r, r)


@triton.jit(do_not_specialize=["Hq", "G", "T"])
def _query_codes_kernel(q_ptr, stride_qb, stride_qh, r_ptr, shape_ptr, out_ptr, Hq, G, D, T, MAXB,
                        BLOCK_D: tl.constexpr, CHUNK_D: tl.constexpr, BLOCK_T: tl.constexpr, BITS: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    b = bh // Hq
    j = (bh % Hq) // G
    q_row = q_ptr + b * stride_qb + (bh % Hq) * stride_qh
    dd = tl.arange(0, BLOCK_D)
    q = tl.load(q_row + dd, mask=dd < D, other=0.0).to(tl.float32)
    inv_norm = 1.0 / tl.sqrt(tl.sum(q * q, axis=0))
    bits = tl.load(shape_ptr + b * 2).to(tl.int32)
    tables = tl.load(shape_ptr + b * 2 + 1).to(tl.int32)
    bit = tl.arange(0, BITS)
    weight = tl.where(bit < bits, 1 << bit, 0)
    c = tl.arange(0, CHUNK_D)
    for t0 in range(0, T, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        tmask = t < T
        proj = tl.zeros([BLOCK_T, BITS], dtype=tl.float64)
        for d0 in range(0, D, CHUNK_D):
            dmask = d0 + c < D
            qc = tl.load(q_row + d0 + c, mask=dmask, other=0.0).to(tl.float32) * inv_norm
            R = tl.load(r_ptr + j * D * T * MAXB + (d0 + c)[:, None, None] * (T * MAXB) + t[None, :, None] * MAXB
                        + bit[None, None, :], mask=dmask[:, None, None] & tmask[None, :, None]
                        & (bit < MAXB)[None, None, :], other=0.0)
            proj += tl.sum(qc.to(tl.float64)[:, None, None] * R.to(tl.float64), axis=0)
        code = tl.sum(tl.where(proj > 0, weight[None, :], 0), axis=1)
        code = tl.where(t < tables, code, -2)
        tl.store(out_ptr + bh * T + t, code.to(tl.int16), mask=tmask)


@triton.jit(do_not_specialize=["Hkv", "G", "N", "T", "TPS", "NSPLIT"])
def _sample_attend_kernel(
    q_ptr, stride_qb, stride_qh,
    k_ptr, stride_kb, stride_kh, stride_kl,
    v_ptr, stride_vb, stride_vh, stride_vl,
    qc_ptr, c_ptr, stride_cb, stride_ch, stride_cl,
    n_ptr, stride_nb, stride_nh, a_ptr, stride_ab, stride_ah,
    mid_ptr, shape_ptr, len_ptr,
    acc_ptr, m_ptr, l_ptr, sampled_ptr, union_ptr,
    Hkv, G, D, N, T, TPS, NSPLIT, scaling,
    PER_ROW: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_T: tl.constexpr, F32: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)  # b * Hkv + j
    sp = tl.program_id(1)
    b = r // Hkv
    j = r % Hkv
    length = tl.load(len_ptr + (b if PER_ROW else 0)).to(tl.int32)
    g = tl.arange(0, BLOCK_G)
    gmask = g < G
    dd = tl.arange(0, BLOCK_D)
    dmask = dd < D
    heads = j * G + g
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + dd[None, :],
                mask=gmask[:, None] & dmask[None, :], other=0.0)
    q32 = q.to(tl.float32)
    q_norm = tl.where(gmask, tl.sqrt(tl.sum(q32 * q32, axis=1)), 1.0)  # (a padded head: no 0 / 0)
    mean = tl.load(a_ptr + b * stride_ab + j * stride_ah + dd, mask=dmask, other=0.0)
    q_mean = tl.sum(q32 * mean[None, :], axis=1)
    if F32:
        q = q32
    first = tl.load(mid_ptr + b * 2)
    last = tl.load(mid_ptr + b * 2 + 1)
    bits = tl.load(shape_ptr + b * 2)
    tables = tl.load(shape_ptr + b * 2 + 1)

    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    n_sampled = tl.zeros([BLOCK_G], dtype=tl.int32)
    n_union = tl.zeros([BLOCK_N], dtype=tl.int32)
    start0 = sp * TPS
    end = tl.minimum(start0 + TPS, length)
    for start in range(start0, end, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        ok = offs < end
        prompt = ok & (offs < N)
        hits = tl.zeros([BLOCK_G, BLOCK_N], dtype=tl.int32)
        for t0 in range(0, T, BLOCK_T):
            t = t0 + tl.arange(0, BLOCK_T)
            tmask = t < T
            codes = tl.load(c_ptr + b * stride_cb + j * stride_ch + offs.to(tl.int64)[:, None] * stride_cl + t[None, :],
                            mask=prompt[:, None] & tmask[None, :], other=-1)
            qcodes = tl.load(qc_ptr + (b * Hkv * G + heads)[:, None] * T + t[None, :],
                             mask=gmask[:, None] & tmask[None, :], other=-2)
            hits += tl.sum((codes[None, :, :] == qcodes[:, None, :]).to(tl.int32), axis=2)
        middle = prompt & (offs >= first) & (offs < last)
        sampled = middle[None, :] & (hits >= 2) & gmask[:, None]
        valid = ok[None, :] & gmask[:, None] & (sampled | (middle == 0)[None, :])
        read = tl.max(valid.to(tl.int32), axis=0) > 0  # the slots some head attends: only their K/V are loaded
        kt = tl.load(k_ptr + b * stride_kb + j * stride_kh + offs.to(tl.int64)[:, None] * stride_kl + dd[None, :],
                     mask=read[:, None] & dmask[None, :], other=0.0)
        if F32:
            s = tl.dot(q, tl.trans(kt.to(tl.float32)), input_precision="ieee")  # [BLOCK_G, BLOCK_N]
        else:  # 16-bit q and K: a tensor-core dot, fp32 accumulation (as the decode kernels)
            s = tl.dot(q, tl.trans(kt))
        norm = tl.load(n_ptr + b * stride_nb + j * stride_nh + offs, mask=prompt, other=1.0)
        cos = (s - q_mean[:, None]) / (q_norm[:, None] * norm[None, :])
        cos = tl.minimum(tl.maximum(cos, -1.0), 1.0)
        u = tl.exp(bits * tl.log(tl.maximum(1.0 - _acos(cos) / 3.141592653589793, 1e-30)))  # 0 at theta = pi
        miss = tl.log(tl.maximum(1.0 - u, 1e-30))  # (1 - u)^L = 0 at u = 1
        w = 1.0 - tl.exp(tables * miss) - tables * u * tl.exp((tables - 1.0) * miss)
        logit = tl.where(sampled, s * scaling - tl.log(w + 1e-4), s * scaling)
        logit = tl.where(valid, logit, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(logit, axis=1))
        safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - safe)
        p = tl.exp(logit - safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        vt = tl.load(v_ptr + b * stride_vb + j * stride_vh + offs.to(tl.int64)[:, None] * stride_vl + dd[None, :],
                     mask=read[:, None] & dmask[None, :], other=0.0)
        acc = acc * alpha[:, None]
        if F32:
            acc += tl.dot(p, vt.to(tl.float32), input_precision="ieee")
        else:  # P = P_hi + P_lo in 16 bits, two dots (as the decode kernels: P kept to ~2^-16)
            p_hi = p.to(vt.dtype)
            acc += tl.dot(p_hi, vt)
            acc += tl.dot((p - p_hi.to(tl.float32)).to(vt.dtype), vt)
        m_i = m_new
        n_sampled += tl.sum(sampled.to(tl.int32), axis=1)
        n_union += read.to(tl.int32)
    row = (r * NSPLIT + sp) * G + g
    tl.store(acc_ptr + row[:, None] * D + dd[None, :], acc, mask=gmask[:, None] & dmask[None, :])
    tl.store(m_ptr + row, m_i, mask=gmask)
    tl.store(l_ptr + row, l_i, mask=gmask)
    tl.store(sampled_ptr + row, n_sampled, mask=gmask)
    tl.store(union_ptr + r * NSPLIT + sp, tl.sum(n_union, axis=0))


@triton.jit(do_not_specialize=["Hkv", "G", "NSPLIT"])
def _count_kernel(sampled_ptr, union_ptr, attended_ptr, kept_ptr, Hkv, G, NSPLIT, BLOCK_S: tl.constexpr):
    """Per row: each KV head's union summed over the splits (fp64), and the query heads' sampled tokens into the
    counters (sum, heads, most)."""
    b = tl.program_id(0).to(tl.int64)
    s = tl.arange(0, BLOCK_S)
    smask = s < NSPLIT
    total = tl.zeros([], dtype=tl.float64)
    most = tl.load(kept_ptr + b * 3 + 2)
    for j in range(Hkv):
        r = b * Hkv + j
        union = tl.sum(tl.load(union_ptr + r * NSPLIT + s, mask=smask, other=0), axis=0)
        tl.store(attended_ptr + r, union.to(tl.float64))
        for g in range(G):
            head = tl.sum(tl.load(sampled_ptr + (r * NSPLIT + s) * G + g, mask=smask, other=0), axis=0)
            total += head.to(tl.float64)
            most = tl.maximum(most, head.to(tl.float64))
    tl.store(kept_ptr + b * 3, tl.load(kept_ptr + b * 3) + total)
    tl.store(kept_ptr + b * 3 + 1, tl.load(kept_ptr + b * 3 + 1) + (Hkv * G).to(tl.float64))
    tl.store(kept_ptr + b * 3 + 2, most)


def magicpig_static_attention(query: Tensor, keys: Tensor, values: Tensor, R: Tensor, codes: Tensor, norms: Tensor,
                              mean: Tensor, middle: Tensor, hash_shape: Tensor, sampled: Tensor, length: Tensor,
                              scaling: float) -> tuple[Tensor, Tensor, Tensor]:
    """query [B, Hq, d]; keys/values [B, Hkv, CAP, d] (the first `length` slots valid, [1] or [B]); the selector's
    state: R [Hkv, d, L, 15] fp32, codes [B, Hkv, n, L] int16, norms [B, Hkv, n] fp32, mean [B, Hkv, d] fp32,
    middle [B, 2] int64, hash_shape [B, 2] fp32, and its counters `sampled` [B, 3] fp64 (updated in place) ->
    (out [B, Hq, d], lse [B, Hq] fp32, attended tokens per KV head [B, Hkv] fp64). Oracle: the selector's
    PyTorch rule (`MagicPIGSelector._rule`) attended by `locks.core.reference.sparse_decode`."""
    check_device(_sample_attend_kernel, query, keys, values, R, codes, norms, mean, middle, hash_shape, sampled)
    B, Hq, d = query.shape
    Hkv, cap = keys.shape[1], keys.shape[2]
    G, n, T = Hq // Hkv, codes.shape[2], codes.shape[3]
    length, per_row = device_length(length, B)
    if query.stride(-1) != 1 or keys.stride(-1) != 1 or values.stride(-1) != 1 or codes.stride(-1) != 1:
        raise ValueError("magicpig_static_attention needs unit-stride rows")
    R, norms, mean = R.contiguous(), norms.contiguous(), mean.contiguous()
    dev = query.device
    query_codes = torch.empty(B, Hq, T, dtype=torch.int16, device=dev)
    launch(_query_codes_kernel, (B * Hq,), query, query.stride(0), query.stride(1), R, hash_shape, query_codes, Hq,
           G, d, T, R.shape[-1], BLOCK_D=pow2(d, 16), CHUNK_D=16, BLOCK_T=8, BITS=BITS, num_warps=4)
    block_n = 16
    ns, tps = decode_splits(B * Hkv, cap, block_n, dev)
    rows = B * Hkv * ns * G
    acc = empty(rows, d, dtype=torch.float32, device=dev)
    m, l = empty(rows, dtype=torch.float32, device=dev), empty(rows, dtype=torch.float32, device=dev)
    counts = torch.empty(rows, dtype=torch.int32, device=dev)
    union = torch.empty(B * Hkv * ns, dtype=torch.int32, device=dev)
    launch(_sample_attend_kernel, (B * Hkv, ns), query, query.stride(0), query.stride(1),
           keys, keys.stride(0), keys.stride(1), keys.stride(2), values, values.stride(0), values.stride(1),
           values.stride(2), query_codes, codes, codes.stride(0), codes.stride(1), codes.stride(2),
           norms, norms.stride(0), norms.stride(1), mean, mean.stride(0), mean.stride(1), middle, hash_shape, length,
           acc, m, l, counts, union, Hkv, G, d, n, T, tps, ns, float(scaling), PER_ROW=per_row,
           BLOCK_G=pow2(G, 16), BLOCK_N=block_n, BLOCK_D=pow2(d, 16), BLOCK_T=8,
           F32=not (query.dtype == keys.dtype == values.dtype in (torch.bfloat16, torch.float16)), num_warps=4)
    out_dtype = torch.float32 if interpreted(_combine_kernel) else query.dtype
    out = empty(B, Hq, d, dtype=out_dtype, device=dev)
    lse = empty(B, Hq, dtype=torch.float32, device=dev)
    launch(_combine_kernel, (B * Hq,), acc, m, l, out, lse, G, d, ns, BLOCK_S=32, BLOCK_D=pow2(d, 16), num_warps=4)
    attended = torch.empty(B, Hkv, dtype=torch.float64, device=dev)
    launch(_count_kernel, (B,), counts, union, attended, sampled, Hkv, G, ns, BLOCK_S=pow2(ns), num_warps=1)
    return out.to(query.dtype), lse, attended
