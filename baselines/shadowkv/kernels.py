"""ShadowKV's static decode step in two Triton launches around one torch.topk (baselines/shadowkv/selector.py,
docs/methods/shadowkv.md). Programs run per (row, KV head), or per block of one; each row's layout comes from its
device parameters [B, 6] = (prompt P, local window W, outlier chunks O, candidates, effective rank r, chunks) and
its length from the device length, so rows of different lengths and layouts run in one launch (PER_ROW: length
[B], row b's).

`_shadow_scores_kernel`: the landmark score of every candidate chunk c of KV head h, in fp32,

    a_{g,c} = softmax_c(q_g . landmark_{h,c} * scale),   score_{h,c} = max_g a_{g,c},

-inf past the row's candidates (a stacked row padded with candidates it does not have).

`_shadow_gather_kernel`: the step's plan at the row's length L (G = L - P generated tokens, C tokens per chunk,
budget b):

    paper:  start = P - W,  n_sel = min(b // C, candidates)
    fair:   room = b - C O;  start, n_sel = (L - room, 0) if W + G > room else (P - W, min((room - W - G) // C,
            candidates))

and the keys and values the step attends, compacted into count = C O + C n_sel + (L - start) slots: the outlier
chunks' tokens (from the cache), the n_sel best chunks (topk's order), and the exact tail [start, L) (from the
cache). A selected chunk's keys are rebuilt from the factors and rotated at their positions,

    k = rope(U[t] (S V_h)) = bf16(U[t] SV_h) * cos_t + bf16(U[t] rot(SV_h)) * sin_t

(rot the layer's quarter turn of each rotated channel pair, applied to SV's columns at prefill: rot(U SV) =
U rot(SV) exactly, as a permutation and sign of the same sums; cos = 1, sin = 0 on channels RoPE passes through).
Its values come from the temporal buffer where the chunk was selected at the previous step (a hit) and from the host
store otherwise (a miss); with offload_values=false from the cache. The temporal buffer is two slots per row
(ping-pong by the parity of L: the step reads slot (L + 1) % 2 and writes slot L % 2), so no program reads what
another writes. Program (b, h = 0, block 0) also writes the row's step bytes (fp64, module docstring of
baselines/shadowkv/selector.py: the rebuilt keys' U rows and S V_h, their write, their values over PCIe) and adds the row's
hit rate (hits / selected over its KV heads) to its running sum, when the step selects.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from locks.kernels._common import cdiv, check_device, dot_in_f32, launch, pow2
from locks.kernels.decode import device_length

__all__ = ["shadow_scores", "shadow_gather", "PARAMS"]

PARAMS = ("prompt", "window", "outliers", "candidates", "rank", "chunks")
_NP = tl.constexpr(len(PARAMS))


def _check_params(params: Tensor, B: int) -> None:
    if params.shape != (B, len(PARAMS)) or params.dtype != torch.int64 or not params.is_contiguous():
        raise ValueError(f"ShadowKV's static parameters must be a contiguous int64 [B = {B}, {len(PARAMS)}] tensor "
                         f"{PARAMS} (got {tuple(params.shape)}, {params.dtype})")


@triton.jit
def _logits(q, lm, F32: tl.constexpr):
    """q [G, d] . lm [C, d]^T in fp32: exact products of 16-bit operands, IEEE fp32 otherwise."""
    if F32:
        return tl.dot(q.to(tl.float32), tl.trans(lm.to(tl.float32)), input_precision="ieee")
    return tl.dot(q, tl.trans(lm))


@triton.jit(do_not_specialize=["Hkv", "G", "NC"])
def _shadow_scores_kernel(q_ptr, stride_qb, stride_qh, lm_ptr, stride_lb, stride_lh, stride_lc, prm_ptr, out_ptr,
                          Hkv, G, D, NC, scale,
                          F32: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    b = bh // Hkv
    h = bh % Hkv
    nc = tl.load(prm_ptr + b * _NP + 3)
    g = tl.arange(0, BLOCK_G)
    gmask = g < G
    dd = tl.arange(0, BLOCK_D)
    dmask = dd < D
    q = tl.load(q_ptr + b * stride_qb + (h * G + g)[:, None] * stride_qh + dd[None, :],
                mask=gmask[:, None] & dmask[None, :], other=0.0)
    lm_row = lm_ptr + b * stride_lb + h * stride_lh
    m = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    s = tl.zeros([BLOCK_G], dtype=tl.float32)
    for c0 in range(0, NC, BLOCK_C):  # online softmax normalizer per query head
        c = c0 + tl.arange(0, BLOCK_C)
        cmask = c < nc
        lm = tl.load(lm_row + c.to(tl.int64)[:, None] * stride_lc + dd[None, :], mask=cmask[:, None] & dmask[None, :],
                     other=0.0)
        x = tl.where(cmask[None, :], _logits(q, lm, F32) * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=1))
        m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)
        s = s * tl.exp(m - m_safe) + tl.sum(tl.exp(x - m_safe[:, None]), axis=1)
        m = m_new
    m = tl.where(m > float("-inf"), m, 0.0)
    s = tl.where(s > 0, s, 1.0)
    for c0 in range(0, NC, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        cmask = c < nc
        lm = tl.load(lm_row + c.to(tl.int64)[:, None] * stride_lc + dd[None, :], mask=cmask[:, None] & dmask[None, :],
                     other=0.0)
        x = _logits(q, lm, F32) * scale
        a = tl.where(gmask[:, None], tl.exp(x - m[:, None]) / s[:, None], float("-inf"))
        tl.store(out_ptr + bh * NC + c, tl.where(cmask, tl.max(a, axis=0), float("-inf")), mask=c < NC)


def shadow_scores(query: Tensor, landmarks: Tensor, params: Tensor, scale: float) -> Tensor:
    """[B, Hkv, NC] fp32: each candidate chunk's landmark score (module docstring), -inf past the row's candidates;
    query [B, Hq, d], landmarks [B, Hkv, NC, d]. Oracle: `ShadowKVSelector._scores`."""
    check_device(_shadow_scores_kernel, query, landmarks, params)
    B, Hq, d = query.shape
    _, H, NC, _ = landmarks.shape
    _check_params(params, B)
    if query.stride(-1) != 1:
        query = query.contiguous()
    if landmarks.stride(-1) != 1:
        landmarks = landmarks.contiguous()
    out = torch.empty(B, H, NC, dtype=torch.float32, device=query.device)
    f32 = dot_in_f32(_shadow_scores_kernel, query.dtype, landmarks.dtype)
    launch(_shadow_scores_kernel, (B * H,), query, query.stride(0), query.stride(1), landmarks, landmarks.stride(0),
           landmarks.stride(1), landmarks.stride(2), params, out, H, Hq // H, d, NC, float(scale),
           F32=f32, BLOCK_G=pow2(Hq // H, 16), BLOCK_C=16 if f32 else 32, BLOCK_D=pow2(d, 16),
           num_warps=8 if f32 else 4)
    return out


@triton.jit
def _plan(L, P, W, O, nc, C, BUDGET, PAPER: tl.constexpr):
    """(start of the exact tail, n_sel) of a row at length L (module docstring)."""
    if PAPER:
        start = P - W
        n_sel = tl.minimum(BUDGET // C, nc)
    else:
        room = BUDGET - C * O
        over = W + (L - P) > room
        start = tl.where(over, L - room, P - W)
        n_sel = tl.where(over, 0, tl.minimum((room - W - (L - P)) // C, nc))
    return start, n_sel


@triton.jit(do_not_specialize=["Hkv", "NT", "C", "BUDGET"])
def _shadow_gather_kernel(
    k_ptr, v_ptr, stride_kb, stride_kh, stride_kl,
    top_ptr, cand_ptr, stride_cb, stride_ch, out_ptr, stride_ob, stride_oh,
    u_ptr, stride_ub, stride_ul, sv_ptr, svr_ptr, stride_sb, stride_sh, stride_sr,
    cos_ptr, sin_ptr, stride_rb, stride_rl,
    bufc_ptr, stride_bcb, stride_bcp, stride_bch, bufv_ptr, stride_bvb, stride_bvp, stride_bvh, stride_bvj,
    host_ptr, stride_hb, stride_hh, stride_hc,
    kout_ptr, vout_ptr, stride_xb, stride_xh, count_ptr, bytes_ptr, hits_ptr,
    prm_ptr, len_ptr, Hkv, NT, C, BUDGET, D, ELEM,
    PAPER: tl.constexpr, RANKED: tl.constexpr, OFFLOAD: tl.constexpr, ROPE: tl.constexpr, F32: tl.constexpr, PER_ROW: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr,
):
    bh = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    b = bh // Hkv
    h = bh % Hkv
    if PER_ROW:
        len_ptr += b
    L = tl.load(len_ptr).to(tl.int64)
    P = tl.load(prm_ptr + b * _NP).to(tl.int64)
    W = tl.load(prm_ptr + b * _NP + 1).to(tl.int64)
    O = tl.load(prm_ptr + b * _NP + 2).to(tl.int64)
    nc = tl.load(prm_ptr + b * _NP + 3).to(tl.int64)
    R = tl.load(prm_ptr + b * _NP + 4).to(tl.int64)
    start, n_sel = _plan(L, P, W, O, nc, C, BUDGET, PAPER)
    n_out = C * O
    n_chosen = C * n_sel
    count = n_out + n_chosen + (L - start)
    rd = (L + 1) % 2  # the temporal buffer slot the previous step wrote
    wr = L % 2

    s = blk * BLOCK_T + tl.arange(0, BLOCK_T).to(tl.int64)
    dblk = tl.program_id(2)  # a block of channels: every formula here is per channel (rot(S V) included)
    dd = dblk * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = dd < D
    is_out = s < n_out
    is_sel = (s >= n_out) & (s < n_out + n_chosen)
    is_tail = (s >= n_out + n_chosen) & (s < count)
    out_off = b * stride_xb + h * stride_xh + s[:, None] * D + dd[None, :]
    k_ty = kout_ptr.dtype.element_ty
    # outlier and tail tokens: exact keys from the cache
    tok_out = tl.load(out_ptr + b * stride_ob + h * stride_oh + s, mask=is_out, other=0)
    tok = tl.where(is_out, tok_out, start + s - n_out - n_chosen)
    exact = (is_out | is_tail)[:, None] & dmask[None, :]
    kv_off = b * stride_kb + h * stride_kh + tok[:, None] * stride_kl + dd[None, :]
    tl.store(kout_ptr + out_off, tl.load(k_ptr + kv_off, mask=exact, other=0.0).to(k_ty), mask=exact)
    # selected chunks: rank j, token w of the chunk
    j = tl.where(is_sel, (s - n_out) // C, 0)
    w = tl.where(is_sel, (s - n_out) % C, 0)
    if RANKED:
        rank = tl.load(top_ptr + bh * NT + j, mask=is_sel, other=0).to(tl.int64)
    else:  # every candidate is selected, in candidate order
        rank = j
    chunk = tl.load(cand_ptr + b * stride_cb + h * stride_ch + rank, mask=is_sel, other=0).to(tl.int64)
    tok_sel = chunk * C + w
    sel2 = is_sel[:, None] & dmask[None, :]
    # values: exact from the cache; a selected chunk's from the temporal buffer where it was selected at the previous
    # step (a hit: its slot rd, entry src; -1 = empty), else from the host store (offloading) or the cache
    prev_row = bufc_ptr + b * stride_bcb + rd * stride_bcp + h * stride_bch
    src = tl.full([BLOCK_T], -1, tl.int64)
    for p0 in range(0, NT, BLOCK_P):
        pj = p0 + tl.arange(0, BLOCK_P)
        prev = tl.load(prev_row + pj, mask=pj < NT, other=-1)
        eq = (chunk[:, None] == prev[None, :]) & (prev >= 0)[None, :]
        src = tl.maximum(src, tl.max(tl.where(eq, pj[None, :].to(tl.int64), -1), axis=1))
    hit = (src >= 0) & is_sel
    # disjoint masks: each slot's value is one of the loads, the others add 0
    v = tl.load(v_ptr + kv_off, mask=exact, other=0.0).to(tl.float32)
    if OFFLOAD:
        v += tl.load(bufv_ptr + b * stride_bvb + rd * stride_bvp + h * stride_bvh + src[:, None] * stride_bvj
                     + w[:, None] * D + dd[None, :], mask=hit[:, None] & dmask[None, :], other=0.0).to(tl.float32)
        v += tl.load(host_ptr + b * stride_hb + h * stride_hh + chunk[:, None] * stride_hc + w[:, None] * D
                     + dd[None, :], mask=(is_sel & ~hit)[:, None] & dmask[None, :], other=0.0).to(tl.float32)
    else:
        v += tl.load(v_ptr + b * stride_kb + h * stride_kh + tok_sel[:, None] * stride_kl + dd[None, :], mask=sel2,
                     other=0.0).to(tl.float32)
    tl.store(vout_ptr + out_off, v.to(k_ty), mask=exact | sel2)
    if OFFLOAD:  # the temporal buffer's slot wr: this step's selected values
        tl.store(bufv_ptr + b * stride_bvb + wr * stride_bvp + h * stride_bvh + j[:, None] * stride_bvj
                 + w[:, None] * D + dd[None, :], v.to(bufv_ptr.dtype.element_ty), mask=sel2)
    # rebuilt keys: U[t] (S V_h) accumulated in fp32, rounded to the keys' dtype, then rotated in fp32
    acc = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    acc_rot = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    sv_row = b * stride_sb + h * stride_sh
    for r0 in range(0, R, BLOCK_R):
        rr = r0 + tl.arange(0, BLOCK_R)
        rmask = rr < R
        u = tl.load(u_ptr + b * stride_ub + tok_sel[:, None] * stride_ul + rr[None, :],
                    mask=is_sel[:, None] & rmask[None, :], other=0.0)
        sv_off = sv_row + rr[:, None] * stride_sr + dd[None, :]
        smask = rmask[:, None] & dmask[None, :]
        sv = tl.load(sv_ptr + sv_off, mask=smask, other=0.0)
        if F32:
            acc += tl.dot(u.to(tl.float32), sv.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(u, sv)
        if ROPE:
            svr = tl.load(svr_ptr + sv_off, mask=smask, other=0.0)
            if F32:
                acc_rot += tl.dot(u.to(tl.float32), svr.to(tl.float32), input_precision="ieee")
            else:
                acc_rot += tl.dot(u, svr)
    pre = acc.to(k_ty).to(tl.float32)
    if ROPE:
        rope_off = b * stride_rb + tok_sel[:, None] * stride_rl + dd[None, :]
        cos = tl.load(cos_ptr + rope_off, mask=sel2, other=0.0).to(tl.float32)
        sin = tl.load(sin_ptr + rope_off, mask=sel2, other=0.0).to(tl.float32)
        k_sel = (pre * cos + acc_rot.to(k_ty).to(tl.float32) * sin).to(k_ty)
    else:
        k_sel = pre.to(k_ty)
    tl.store(kout_ptr + out_off, k_sel, mask=sel2)
    # this step's selected chunk ids become the temporal buffer's slot wr (-1 past n_sel)
    wr_row = bufc_ptr + b * stride_bcb + wr * stride_bcp + h * stride_bch
    if dblk == 0:
        tl.store(wr_row + j, chunk, mask=(w == 0) & is_sel)
    if (blk == 0) & (dblk == 0):
        for p0 in range(0, NT, BLOCK_P):
            pj = p0 + tl.arange(0, BLOCK_P)
            tl.store(wr_row + pj, tl.full([BLOCK_P], -1, tl.int64), mask=(pj >= n_sel) & (pj < NT))
    if (h == 0) & (blk == 0) & (dblk == 0):
        tl.store(count_ptr + b, count.to(tl.int32))
        # the row's accounting: per KV head its hits, and the selected chunks rebuilt (the misses when offloading,
        # else all of them)
        total = tl.full([], 0.0, tl.float64)
        heads = tl.full([], 0.0, tl.float64)
        hits = tl.full([], 0.0, tl.float64)
        for hh in range(0, Hkv):
            nh = tl.full([], 0.0, tl.float64)
            for j0 in range(0, NT, BLOCK_P):
                jj = j0 + tl.arange(0, BLOCK_P)
                ok = jj < n_sel
                if RANKED:
                    r2 = tl.load(top_ptr + (b * Hkv + hh) * NT + jj, mask=ok, other=0).to(tl.int64)
                else:
                    r2 = jj.to(tl.int64)
                ch = tl.load(cand_ptr + b * stride_cb + hh * stride_ch + r2, mask=ok, other=0).to(tl.int64)
                found = tl.zeros([BLOCK_P], dtype=tl.int32)
                for p0 in range(0, NT, BLOCK_P):
                    pj = p0 + tl.arange(0, BLOCK_P)
                    pv = tl.load(bufc_ptr + b * stride_bcb + rd * stride_bcp + hh * stride_bch + pj, mask=pj < NT,
                                 other=-1)
                    eq2 = (ch[:, None] == pv[None, :]) & (pv >= 0)[None, :]
                    found = tl.maximum(found, tl.max(eq2.to(tl.int32), axis=1))
                nh += tl.sum(((found > 0) & ok).to(tl.float64), axis=0)
            if OFFLOAD:
                rebuilt = (n_sel.to(tl.float64) - nh) * C
            else:
                rebuilt = n_sel.to(tl.float64) * C
            total += rebuilt
            heads += tl.where(rebuilt > 0, 1.0, 0.0)
            hits += nh
        keys = ELEM * D * total
        tl.store(bytes_ptr + b * 3, ELEM * R * total + ELEM * D * R * heads)
        tl.store(bytes_ptr + b * 3 + 1, keys)
        if OFFLOAD:
            tl.store(bytes_ptr + b * 3 + 2, keys)
        else:
            tl.store(bytes_ptr + b * 3 + 2, keys * 0.0)
        if n_sel > 0:
            tl.store(hits_ptr + b, tl.load(hits_ptr + b) + hits / (Hkv * n_sel).to(tl.float64))


def shadow_gather(keys: Tensor, values: Tensor, top: Tensor | None, candidates: Tensor, outlier_tokens: Tensor,
                  U: Tensor, SV: Tensor, SV_rot: Tensor | None, cos: Tensor | None, sin: Tensor | None,
                  buf_chunks: Tensor, buf_values: Tensor | None, host: Tensor | None, params: Tensor, length: Tensor,
                  *, slots: int, chunk_size: int, budget: int, paper: bool, elem_bytes: int, step_bytes: Tensor,
                  hit_sum: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The step's attended keys and values, compacted (module docstring) -> (keys [B, Hkv, slots, d], values
    [B, Hkv, slots, d], count [B] int32: row b attends its first count[b] slots). keys/values: the cache
    [B, Hkv, capacity, d]; top [B, Hkv, NT] (torch.topk's ranks among the candidates, best first; None: every
    candidate in order); candidates [B, Hkv, NC]; outlier_tokens [B, Hkv, C O]; U [B, P, r]; SV, SV_rot
    [B, Hkv, r, d] (SV_rot = rot(SV), None without RoPE, then cos/sin too); cos/sin [B, P, d]; buf_chunks
    [B, 2, Hkv, NT] int64 (the temporal buffer's chunk ids, -1 empty); buf_values [B, 2, Hkv, NT, C*d] and host
    [B, Hkv, chunks, C*d] (a `device_view`) when offloading, else None; params [B, 6] int64 (PARAMS); length [1] or
    [B]. Writes step_bytes [B, 3] fp64 and adds each row's hit rate to hit_sum [B] fp64. Oracle: the torch branch of
    `ShadowKVSelector.select_static`."""
    offload = buf_values is not None
    check_device(_shadow_gather_kernel, keys, values, candidates, outlier_tokens, U, SV, buf_chunks, params, length,
                 step_bytes, hit_sum, *(t for t in (top, SV_rot, cos, sin, buf_values) if t is not None))
    B, H, _, d = keys.shape
    NT = buf_chunks.shape[-1]
    length, per_row = device_length(length, B)
    _check_params(params, B)
    if keys.stride() != values.stride() or keys.stride(-1) != 1:
        raise ValueError("shadow_gather needs keys and values of one layout with unit-stride rows")
    rope = SV_rot is not None
    dev = keys.device
    k_out = torch.empty(B, H, slots, d, dtype=keys.dtype, device=dev)
    v_out = torch.empty(B, H, slots, d, dtype=values.dtype, device=dev)
    count = torch.empty(B, dtype=torch.int32, device=dev)
    ranked = top is not None
    top = top.contiguous() if ranked else candidates  # (not read unranked)
    for t in (U, SV, candidates, outlier_tokens, buf_chunks):
        if t.stride(-1) != 1:
            raise ValueError("shadow_gather needs unit-stride rows")
    cos_t = cos if rope else U
    svr = SV_rot if rope else SV
    bufv = buf_values if offload else values
    host_t = host if offload else values
    bv_strides = buf_values.stride()[:4] if offload else (0, 0, 0, 0)
    h_strides = host.stride()[:3] if offload else (0, 0, 0)
    block_t = 16
    block_d = min(pow2(d, 16), 64)
    launch(_shadow_gather_kernel, (B * H, cdiv(slots, block_t), cdiv(d, block_d)),
           keys, values, keys.stride(0), keys.stride(1), keys.stride(2),
           top, candidates, candidates.stride(0), candidates.stride(1), outlier_tokens, outlier_tokens.stride(0),
           outlier_tokens.stride(1), U, U.stride(0), U.stride(1), SV, svr, SV.stride(0), SV.stride(1), SV.stride(2),
           cos_t, sin if rope else U, cos_t.stride(0), cos_t.stride(1),
           buf_chunks, buf_chunks.stride(0), buf_chunks.stride(1), buf_chunks.stride(2), bufv, *bv_strides,
           host_t, *h_strides, k_out, v_out, k_out.stride(0), k_out.stride(1), count, step_bytes, hit_sum,
           params, length, H, NT, chunk_size, budget, d, float(elem_bytes),
           PAPER=paper, RANKED=ranked, OFFLOAD=offload, ROPE=rope,
           F32=dot_in_f32(_shadow_gather_kernel, U.dtype, SV.dtype), PER_ROW=per_row, BLOCK_T=block_t,
           BLOCK_R=32, BLOCK_D=block_d, BLOCK_P=16, num_warps=4)
    return k_out, v_out, count
