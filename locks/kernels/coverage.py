"""A static decode step's coverage and coverage certificate, added to the step's device counters in two launches.

Oracle: the reference block of `locks.core.attention.static_decode_step` (dense lse by `dense_lse`, the certificate by
`locks.core.paging.CoverageCertificate`), which replaces ~60 small PyTorch ops per layer and step. Per query head g
of row b, with lse_sel the attended set's exact log-sum-exp and s_g the head's attention sink (if any):

    coverage     Cov_g  = exp(lse'(sel) - lse'(all tokens < L)),   lse' = logaddexp(lse, s_g)
    certificate  cert_g = exp(lse_sel - logaddexp(lse_sel, logsumexp_{j in O} (S_{g,j} + eta_{g,j})))
    plug-in      plug_g = the same with eta = 0
    sound_g      = cert_g <= Cov_g + tol

O: the candidate pages [S, L // n - R) not in the step's page list; S_{g,j} the page scores and eta_{g,j} = scaling *
||q_g|| * rho_j their error bound (LOCKS's quantized summaries, `locks.method.summaries.score_bound`).

Launch 1, grid (B * Hkv, splits): each program reads one split of a KV head's keys [t0, t0 + TPS) and the scores of
the pages in it, and writes per query head three partial log-sum-exps (m, l) pairs: all tokens, O with eta, O
without. Launch 2, grid (B,): row b's program combines the splits per head (`_merge_splits`, once per pair), forms
the four per-head values and adds their sums over the row's heads to the row's counters (coverage[b]: one fp64;
diagnostics[b]: the certificate's (sum, count) per name, each weighted by `L_b > budget`, no page being scored
before). Each program sums its Hkv heads in a fixed order, so the counters are deterministic. L is one length for
every row or row b's own (PER_ROW).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from locks.kernels._common import check_device, dot_in_f32, empty, interpreted, launch, pow2
from locks.kernels.decode import decode_splits, device_length

__all__ = ["coverage_step"]

@triton.jit
def _online(m, l, x):
    """One block of a running log-sum-exp per row: (m, l) with lse = m + log(l), x [rows, n] (-inf: absent)."""
    m_new = tl.maximum(m, tl.max(x, axis=1))
    safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    l = l * tl.exp(m - safe) + tl.sum(tl.exp(x - safe[:, None]), axis=1)
    return m_new, l


@triton.jit(do_not_specialize=["Hkv", "G", "D", "P", "KP", "S", "R", "TPS", "NSPLIT"])
def _coverage_split_kernel(
    q_ptr, stride_qb, stride_qh,
    k_ptr, stride_kb, stride_kh, stride_kl,
    len_ptr, s_ptr, stride_sb, stride_sh, rho_ptr, stride_rb, stride_rh, pages_ptr, valid_ptr, stride_pr, ws_ptr,
    Hkv, G, D, P, KP, S, R, TPS, NSPLIT, scaling,
    PAGE: tl.constexpr, CERT: tl.constexpr, HAS_RHO: tl.constexpr, F32: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_K: tl.constexpr, PER_ROW: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)  # b * Hkv + h
    sp = tl.program_id(1)
    b = r // Hkv
    h = r % Hkv
    if PER_ROW:
        len_ptr += b
    L = tl.load(len_ptr).to(tl.int32)
    g = tl.arange(0, BLOCK_G)
    gmask = g < G
    dd = tl.arange(0, BLOCK_D)
    dmask = dd < D
    q = tl.load(q_ptr + b * stride_qb + (h * G + g)[:, None] * stride_qh + dd[None, :],
                mask=gmask[:, None] & dmask[None, :], other=0.0)
    if F32:
        q = q.to(tl.float32)
    t0 = sp * TPS
    t1 = tl.minimum(t0 + TPS, L)

    m_all = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_all = tl.zeros([BLOCK_G], dtype=tl.float32)
    k_base = k_ptr + b * stride_kb + h * stride_kh
    for start in range(t0, t1, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        ok = offs < t1
        kt = tl.load(k_base + offs[:, None].to(tl.int64) * stride_kl + dd[None, :],
                     mask=ok[:, None] & dmask[None, :], other=0.0)
        if F32:
            x = tl.dot(q, tl.trans(kt.to(tl.float32)), input_precision="ieee") * scaling
        else:  # 16-bit operands: exact products, fp32 accumulation (locks/kernels/_common.py dot_in_f32)
            x = tl.dot(q, tl.trans(kt)) * scaling
        m_all, l_all = _online(m_all, l_all, tl.where(ok[None, :], x, float("-inf")))

    m_b = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_b = tl.zeros([BLOCK_G], dtype=tl.float32)
    m_p = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_p = tl.zeros([BLOCK_G], dtype=tl.float32)
    if CERT:
        qf = q.to(tl.float32)
        qnorm = tl.sqrt(tl.sum(qf * qf, axis=1))
        hi = tl.minimum(L // PAGE - R, P)  # candidates: [S, L // n - R), within the scored pages
        j_end = tl.minimum((t0 + TPS) // PAGE, hi)  # this split's pages (TPS is a multiple of the page size)
        for j0 in range(t0 // PAGE, j_end, BLOCK_P):
            j = j0 + tl.arange(0, BLOCK_P)
            chosen = tl.zeros([BLOCK_P], dtype=tl.int32)
            for k0 in range(0, KP, BLOCK_K):
                kk = k0 + tl.arange(0, BLOCK_K)
                kmask = kk < KP
                pg = tl.load(pages_ptr + r * stride_pr + kk, mask=kmask, other=-1).to(tl.int32)
                ok = tl.load(valid_ptr + r * stride_pr + kk, mask=kmask, other=0) != 0
                pg = tl.where(ok, pg, -1)
                chosen += tl.sum((pg[None, :] == j[:, None]).to(tl.int32), axis=1)
            outside = (j >= S) & (j < j_end) & (chosen == 0)
            sc = tl.load(s_ptr + b * stride_sb + (h * G + g)[:, None] * stride_sh + j[None, :],
                         mask=gmask[:, None] & outside[None, :], other=0.0).to(tl.float32)
            x_p = tl.where(outside[None, :], sc, float("-inf"))
            if HAS_RHO:
                rho = tl.load(rho_ptr + b * stride_rb + h * stride_rh + j, mask=outside, other=0.0).to(tl.float32)
                x_b = tl.where(outside[None, :], sc + scaling * qnorm[:, None] * rho[None, :], float("-inf"))
            else:
                x_b = x_p
            m_b, l_b = _online(m_b, l_b, x_b)
            m_p, l_p = _online(m_p, l_p, x_p)

    row = (r * NSPLIT + sp) * BLOCK_G + g
    tl.store(ws_ptr + row * 6 + 0, m_all, mask=gmask)
    tl.store(ws_ptr + row * 6 + 1, l_all, mask=gmask)
    tl.store(ws_ptr + row * 6 + 2, m_b, mask=gmask)
    tl.store(ws_ptr + row * 6 + 3, l_b, mask=gmask)
    tl.store(ws_ptr + row * 6 + 4, m_p, mask=gmask)
    tl.store(ws_ptr + row * 6 + 5, l_p, mask=gmask)


@triton.jit
def _logaddexp(a, b):
    mx = tl.maximum(a, b)
    safe = tl.where(mx == float("-inf"), 0.0, mx)
    return safe + tl.log(tl.exp(a - safe) + tl.exp(b - safe))


@triton.jit
def _merge_splits(ws_ptr, r, NSPLIT, g, gmask, PAIR: tl.constexpr, BLOCK_G: tl.constexpr):
    """The log-sum-exp of (m, l) pair PAIR over the NSPLIT splits of KV head r, per query head (-inf if empty)."""
    M = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    for sp in range(0, NSPLIT):
        row = (r * NSPLIT + sp) * BLOCK_G + g
        M = tl.maximum(M, tl.load(ws_ptr + row * 6 + 2 * PAIR, mask=gmask, other=float("-inf")))
    S = tl.where(M == float("-inf"), 0.0, M)
    L = tl.zeros([BLOCK_G], dtype=tl.float32)
    for sp in range(0, NSPLIT):
        row = (r * NSPLIT + sp) * BLOCK_G + g
        L += tl.load(ws_ptr + row * 6 + 2 * PAIR + 1, mask=gmask, other=0.0) * tl.exp(
            tl.load(ws_ptr + row * 6 + 2 * PAIR, mask=gmask, other=float("-inf")) - S)
    return tl.where(L > 0, S + tl.log(tl.where(L > 0, L, 1.0)), float("-inf"))


@triton.jit(do_not_specialize=["Hkv", "G", "NSPLIT", "budget"])
def _coverage_reduce_kernel(ws_ptr, lse_ptr, sinks_ptr, len_ptr, cov_ptr, stride_c, diag_ptr, stride_db, stride_dn,
                            stride_dk, Hkv, G, NSPLIT, budget, tol,
                            CERT: tl.constexpr, HAS_SINKS: tl.constexpr, PER_ROW: tl.constexpr,
                            BLOCK_G: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    if PER_ROW:
        len_ptr += b
    L = tl.load(len_ptr).to(tl.int32)
    g = tl.arange(0, BLOCK_G)
    gmask = g < G
    cov_sum = tl.zeros([BLOCK_G], dtype=tl.float64)
    cert_sum = tl.zeros([BLOCK_G], dtype=tl.float64)
    plug_sum = tl.zeros([BLOCK_G], dtype=tl.float64)
    sound_sum = tl.zeros([BLOCK_G], dtype=tl.float64)
    for h in range(0, Hkv):  # the row's KV heads in order: deterministic sums
        r = b * Hkv + h
        dense = _merge_splits(ws_ptr, r, NSPLIT, g, gmask, 0, BLOCK_G)
        sel = tl.load(lse_ptr + r * G + g, mask=gmask, other=0.0)
        sel_s = sel
        if HAS_SINKS:
            sink = tl.load(sinks_ptr + h * G + g, mask=gmask, other=0.0).to(tl.float32)
            dense = _logaddexp(dense, sink)
            sel_s = _logaddexp(sel, sink)
        cov = tl.exp(sel_s - dense)
        cov_sum += tl.where(gmask, cov, 0.0).to(tl.float64)
        if CERT:
            rest_b = _merge_splits(ws_ptr, r, NSPLIT, g, gmask, 1, BLOCK_G)
            rest_p = _merge_splits(ws_ptr, r, NSPLIT, g, gmask, 2, BLOCK_G)
            cert = tl.exp(sel - _logaddexp(sel, rest_b))
            plug = tl.exp(sel - _logaddexp(sel, rest_p))
            cert_sum += tl.where(gmask, cert, 0.0).to(tl.float64)
            plug_sum += tl.where(gmask, plug, 0.0).to(tl.float64)
            sound = cert.to(tl.float64) <= cov.to(tl.float64) + tol
            sound_sum += tl.where(gmask & sound, 1.0, 0.0).to(tl.float64)
    cov_ptr += b * stride_c
    tl.store(cov_ptr, tl.load(cov_ptr) + tl.sum(cov_sum, axis=0))
    if CERT:
        w = tl.where(L > budget, 1.0, 0.0).to(tl.float64)
        n = (Hkv * G) * w
        d = diag_ptr + b * stride_db
        tl.store(d, tl.load(d) + tl.sum(cert_sum, axis=0) * w)
        tl.store(d + stride_dk, tl.load(d + stride_dk) + n)
        d += stride_dn
        tl.store(d, tl.load(d) + tl.sum(plug_sum, axis=0) * w)
        tl.store(d + stride_dk, tl.load(d + stride_dk) + n)
        d += stride_dn
        tl.store(d, tl.load(d) + tl.sum(sound_sum, axis=0) * w)
        tl.store(d + stride_dk, tl.load(d + stride_dk) + n)


def coverage_step(query: Tensor, keys: Tensor, length: Tensor, scaling: float, lse_sel: Tensor,
                  sinks: Tensor | None, coverage: Tensor, certificate: dict | None = None,
                  diagnostics: Tensor | None = None, block_n: int | None = None,
                  num_splits: int | None = None) -> None:
    """Add each row's coverage summed over its Hq query heads to `coverage` ([B] fp64, any strides: e.g. one layer's
    row of a [layers, B] counter) and, with a `certificate` (scores [B, Hq, P], rho [B, Hkv, >= P] or None for exact
    scores, pages / valid [B, Hkv, Kp], sink_pages, recent_pages, page_size, budget, tol: the soundness tolerance),
    row b's (sum, count) of certificate, plug-in coverage and soundness, weighted by length[b] > budget, to
    diagnostics[b] ([B, 3, 2] fp64, any strides, those names in that order; [3, 2] when B = 1). query [B, Hq, d],
    keys the preallocated cache [B, Hkv, capacity, d] with `length` valid slots ([1]: every row; [B]: row b's),
    lse_sel [B, Hq] fp32 (the attended set's, sinks not included). num_splits: splits of the key pass (default: one
    wave of B * Hkv programs; a row's sums depend on it, not on the other rows)."""
    check_device(_coverage_split_kernel, query, keys, length, lse_sel, coverage)
    B, Hq, d = query.shape
    Hkv, C = keys.shape[1], keys.shape[2]
    G = Hq // Hkv
    dev = query.device
    length, per_row = device_length(length, B)
    if coverage.shape != (B,):
        raise ValueError(f"coverage must be [B] = [{B}] (got {tuple(coverage.shape)})")
    query = query if query.stride(-1) == 1 else query.contiguous()
    keys = keys if keys.stride(-1) == 1 else keys.contiguous()
    cert = certificate is not None
    page = certificate["page_size"] if cert else 16
    f32 = dot_in_f32(_coverage_split_kernel, query.dtype, keys.dtype) or query.dtype != keys.dtype
    # fp32 operands at d = 128 spill with 64-token tiles and 4 warps, as the decode kernel's do (kernels_compile.md)
    wide_f32 = f32 and d > 64 and not interpreted(_coverage_split_kernel)
    block_n = max(block_n or (32 if wide_f32 else 64), page)  # a split holds whole pages (page sizes: powers of 2)
    ns, tps = decode_splits(B * Hkv, C, block_n, dev, num_splits)
    block_g = pow2(G, 16)
    ws = empty(B * Hkv * ns * block_g, 6, dtype=torch.float32, device=dev)
    lse_sel = lse_sel.float().contiguous()
    if cert:
        diag = diagnostics.unsqueeze(0) if diagnostics.dim() == 2 and B == 1 else diagnostics
        if diag.shape != (B, 3, 2):
            raise ValueError(f"diagnostics must be [B, 3, 2] = [{B}, 3, 2] (got {tuple(diagnostics.shape)})")
        scores = certificate["scores"] if certificate["scores"].stride(-1) == 1 else certificate["scores"].contiguous()
        pages = certificate["pages"].reshape(B, Hkv, -1).contiguous()
        valid = certificate["valid"].reshape(B, Hkv, -1).contiguous().view(torch.uint8)
        rho = certificate["rho"]
        has_rho = rho is not None
        rho = rho if has_rho else scores
        P, KP = scores.shape[-1], pages.shape[-1]
        S, R, budget, tol = (certificate[k] for k in ("sink_pages", "recent_pages", "budget", "tol"))
        stride_s = (scores.stride(0), scores.stride(1))
        stride_r = (rho.stride(0), rho.stride(1)) if has_rho else (0, 0)
    else:  # absent tensors point at the workspace: their constexpr flag is off
        scores = rho = pages = valid = diag = ws
        has_rho, P, KP, S, R, budget, tol, stride_s, stride_r = False, 0, 0, 0, 0, 0, 0.0, (0, 0), (0, 0)
    launch(_coverage_split_kernel, (B * Hkv, ns),
           query, query.stride(0), query.stride(1), keys, keys.stride(0), keys.stride(1), keys.stride(2),
           length, scores, *stride_s, rho, *stride_r, pages, valid, KP, ws,
           Hkv, G, d, P, KP, S, R, tps, ns, float(scaling),
           PAGE=page, CERT=cert, HAS_RHO=has_rho, F32=f32, BLOCK_G=block_g, BLOCK_N=block_n,
           BLOCK_D=pow2(d, 16), BLOCK_P=32, BLOCK_K=32, PER_ROW=per_row, num_warps=8 if wide_f32 else 4)
    stride_d = (diag.stride(0), diag.stride(1), diag.stride(2)) if cert else (0, 0, 0)
    launch(_coverage_reduce_kernel, (B,), ws, lse_sel, sinks if sinks is not None else lse_sel, length,
           coverage, coverage.stride(0), diag, *stride_d, Hkv, G, ns, budget, float(tol), CERT=cert,
           HAS_SINKS=sinks is not None, PER_ROW=per_row, BLOCK_G=block_g, num_warps=1)
