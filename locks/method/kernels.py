"""Fused LOCKS page scoring over the quantized summaries (docs/methods/locks.mdb).

Oracle: `locks.method.summaries.page_scores` (per-head scores) and `locks.core.paging.aggregate_heads` (GQA aggregation).

Kernel 1, `_locks_score_kernel` -- grid (B * Hkv, cdiv(P, BLOCK_P)): one program scores BLOCK_P pages of one KV
head for all G query heads of its group, so every summary byte is read once per step. Per page it reads
    mu_int (d B) + mu_scale (2 B) + v_pack (r*d/2 B) + c_int (n*r B) + w (4r B) = 802 B at d=128, r=8, n=16
(the 804 B summary minus rho, which only the certificate needs), plus, once per program, the G queries and the
KV head's fp32 head mean. For every page j and head g (fp32 accumulation throughout):
    u_{g,m}  = w_{j,m} * (q_g[even] . lo_nibble(Vpack_{j,m}) + q_g[odd] . hi_nibble(Vpack_{j,m}))
    logit_gi = scaling * (q_g.m_h + a_j * (q_g . mu_int_j) + sum_m u_{g,m} Cint_j[i,m])
    S_{g,j}  = logsumexp_i logit_gi
int4 unpacking: v_pack row m of page j holds d/2 bytes; byte k has channel 2k in its low nibble and channel 2k+1 in
its high nibble (4-bit two's complement). The kernel never interleaves: it loads the bytes once as a
[BLOCK_P, d/2] tile, splits them into lo = b & 15 and hi = b >> 4 (sign: x - 16 where x >= 8), and dots them with
the even and odd channels of the queries, which it loads as two strided [G, d/2] tiles. The three dots per rank
column (q.mu_int, q_even.lo, q_odd.hi) are tl.dot calls with the G heads padded to 16 rows (tensor cores): with
bf16/fp16 queries the int4/int8 operands are exact in the query dtype, so the products are exact and only the fp32
accumulation order differs from the fp32 reference; with fp32 queries the dots run in IEEE fp32 (never TF32).
The rank-r term is built by r broadcast multiply-adds (a runtime loop over m, not unrolled: unrolled, ptxas hoisted
the r loads and spilled) into a [G, BLOCK_P, IC] fp32 tile of IC tokens; the page LSE streams over the n / IC chunks
(running max and sum), re-reading the rank-r factors per chunk from L1. Launch shapes (`_launch_config`, chosen from
the compile table results/kernels_compile.md, docs/kernels.md): 16 pages per program; 16-bit queries one chunk (IC = n)
and 4 warps, fp32 queries IC = 4 and 8 warps -- no register spills on sm_80 / sm_90.

GQA aggregation (`locks_aggregated_scores`), exact two-pass scheme, candidate pages = the range [lo, hi):
  pass 1 (kernel 1) writes the per-head scores S [B, Hq, P] (fp32, 4*G B per page) and, per program, every head's
      partial log Z over the candidate pages of its block as (max, sum of exp) -- [B, Hq, cdiv(P, BLOCK_P)];
  reduce (`_logz_kernel`, grid B * Hq) combines the partials into log Z_g = logsumexp_{j in [lo,hi)} S_{g,j};
  pass 2 (`_aggregate_kernel`, grid (B * Hkv, cdiv(P, BLOCK_A))) re-reads S for the candidate pages (4*G B per page)
      and writes A_j = logsumexp_g (S_gj - log Z_g) (norm) or max_g (S_gj - log Z_g) (max) as fp32, -inf outside
      [lo, hi) (4 B per page).
  Bytes per candidate page and KV head: 802 (summary) + 4G (S written) + 4G (S read) + 4 (A written)
  + 8G / BLOCK_P (partials), e.g. 870 at G = 4 and 934 at G = 16 -- the spec's "+ G*P_c*4*2" option of A7.
  raw mode needs no log Z: pass 1 writes A_j = logsumexp_g S_gj directly (802 + 4 B per page, one launch).
  With `log_z` given (the spec's one-pass `logZ_prev` variant, e.g. the previous step's log Z) norm/max are also
  computed in pass 1 (one launch, 806 B per page); that is a different selector, not the exact aggregation.
The forced-set log-mass option of `aggregate_heads` (used by the Oracle only) is not supported.

Candidate bounds lo/hi are Python ints or int tensors on the device ([2] = (lo, hi), read by the kernels) so that a
captured CUDA graph can be replayed with new bounds without recapture. With device bounds the summaries of pages
>= hi are not read at all (a static decode scores preallocated summaries whose tail pages do not exist yet), and
their per-head scores S are meaningless. Or hi is counted back from the device length of the static step, one for
every row or one per row (PER_ROW: rows of different lengths in one batch).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from locks.kernels._common import cdiv, check_device, dot_in_f32, empty, interpreted, launch, pow2
from locks.kernels.decode import device_length

__all__ = ["locks_page_scores", "locks_aggregated_scores", "LOCKS_AGGREGATIONS"]

LOCKS_AGGREGATIONS = {"raw": 1, "norm": 2, "max": 3}
_MAX_BLOCK_R = 4096  # log Z of 65,536 pages (1M tokens, 16 pages per block) in one tile
NEG_INF = float("-inf")


@triton.jit
def _mm_t(a, b, F32: tl.constexpr):
    """a [M, K] @ b[N, K]^T -> [M, N] fp32 accumulation."""
    if F32:
        c = tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), input_precision="ieee")
    else:
        c = tl.dot(a, tl.trans(b.to(a.dtype)))
    return c


@triton.jit
def _bounds(bounds_ptr, b, lo, hi, BOUNDS: tl.constexpr, N: tl.constexpr, PER_ROW: tl.constexpr):
    """Candidate range [lo, hi) of row b: 0 the ints given; 1 read from bounds_ptr[0:2]; 2 hi counted back from the
    complete pages of the device length at bounds_ptr (bounds_ptr[b] with PER_ROW): hi = length // N - hi."""
    if BOUNDS == 1:
        lo = tl.load(bounds_ptr).to(tl.int32)
        hi = tl.load(bounds_ptr + 1).to(tl.int32)
    elif BOUNDS == 2:
        if PER_ROW:
            bounds_ptr += b
        hi = tl.load(bounds_ptr).to(tl.int32) // N - hi
    return lo, hi


@triton.jit
def _group_reduce(x, gmask, MODE: tl.constexpr):
    """x [BLOCK_G, BLOCK_P] -> [BLOCK_P]: logsumexp (raw/norm) or max (max) over the valid rows."""
    x = tl.where(gmask[:, None], x, float("-inf"))
    mx = tl.max(x, axis=0)
    if MODE == 3:
        out = mx
    else:
        safe = tl.where(mx == float("-inf"), 0.0, mx)
        out = safe + tl.log(tl.sum(tl.exp(x - safe[None, :]), axis=0))
    return out


@triton.jit(do_not_specialize=["lo", "hi", "Hkv", "NB", "G"])
def _locks_score_kernel(
    q_ptr, stride_qb, stride_qh,
    mu_ptr, mus_ptr, hm_ptr, v_ptr, c_ptr, w_ptr,
    s_ptr, agg_ptr, pm_ptr, pl_ptr, logz_ptr, bounds_ptr,
    lo, hi, Hkv, P, NB, G, D, scaling,
    R: tl.constexpr, N: tl.constexpr, IC: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DH: tl.constexpr,
    F32: tl.constexpr, WRITE_HEADS: tl.constexpr, WRITE_PARTIALS: tl.constexpr, AGG: tl.constexpr,
    BOUNDS: tl.constexpr, PER_ROW: tl.constexpr,
):
    bh = tl.program_id(0).to(tl.int64)  # b * Hkv + h
    pb = tl.program_id(1)
    b = bh // Hkv
    h = bh % Hkv
    lo, hi = _bounds(bounds_ptr, b, lo, hi, BOUNDS, N, PER_ROW)

    offs_p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    pmask = offs_p < P
    lmask = pmask  # pages whose summaries are read
    if BOUNDS != 0:  # device bounds (static decode over preallocated summaries): pages >= hi are not read
        lmask = pmask & (offs_p < hi)
    g = tl.arange(0, BLOCK_G)
    gmask = g < G
    dd = tl.arange(0, BLOCK_D)
    dmask = dd < D
    kh = tl.arange(0, BLOCK_DH)
    khmask = kh < D // 2
    ii = tl.arange(0, IC)

    # queries of the group: full rows (mu term), even / odd channels (int4 nibbles), all in the query dtype
    q_rows = q_ptr + b * stride_qb + (h * G + g)[:, None] * stride_qh
    q = tl.load(q_rows + dd[None, :], mask=gmask[:, None] & dmask[None, :], other=0.0)
    qe = tl.load(q_rows + 2 * kh[None, :], mask=gmask[:, None] & khmask[None, :], other=0.0)
    qo = tl.load(q_rows + 2 * kh[None, :] + 1, mask=gmask[:, None] & khmask[None, :], other=0.0)
    hm = tl.load(hm_ptr + bh * D + dd, mask=dmask, other=0.0)
    q_mh = tl.sum(q.to(tl.float32) * hm[None, :], axis=1)  # [BLOCK_G]

    page = bh * P + offs_p  # global page row (int64)
    mu = tl.load(mu_ptr + page[:, None] * D + dd[None, :], mask=lmask[:, None] & dmask[None, :], other=0)
    a = tl.load(mus_ptr + page, mask=lmask, other=0.0).to(tl.float32)
    mu_term = q_mh[:, None] + a[None, :] * _mm_t(q, mu, F32)  # [BLOCK_G, BLOCK_P]

    # S = logsumexp over the page's n tokens, streamed over chunks of IC tokens (running max mx, sum sm); the
    # rank-r factors are re-read per chunk (L1 hits) so that only a [BLOCK_G, BLOCK_P, IC] tile is live
    mx = tl.full([BLOCK_G, BLOCK_P], float("-inf"), dtype=tl.float32)
    sm = tl.zeros([BLOCK_G, BLOCK_P], dtype=tl.float32)
    for i0 in range(0, N, IC):
        low = tl.zeros([BLOCK_G, BLOCK_P, IC], dtype=tl.float32)
        for m in range(R):
            vb = tl.load(v_ptr + (page * R + m)[:, None] * (D // 2) + kh[None, :],
                         mask=lmask[:, None] & khmask[None, :], other=0).to(tl.int32)
            v_lo = vb & 15
            v_hi = (vb >> 4) & 15
            v_lo = tl.where(v_lo >= 8, v_lo - 16, v_lo)
            v_hi = tl.where(v_hi >= 8, v_hi - 16, v_hi)
            u = _mm_t(qe, v_lo, F32) + _mm_t(qo, v_hi, F32)  # [BLOCK_G, BLOCK_P]
            wm = tl.load(w_ptr + page * R + m, mask=lmask, other=0.0)
            u = u * wm[None, :]
            cm = tl.load(c_ptr + (page * N)[:, None] * R + (i0 + ii)[None, :] * R + m, mask=lmask[:, None], other=0)
            low += u[:, :, None] * cm.to(tl.float32)[None, :, :]
        logit = (mu_term[:, :, None] + low) * scaling
        new = tl.maximum(mx, tl.max(logit, axis=2))
        sm = sm * tl.exp(mx - new) + tl.sum(tl.exp(logit - new[:, :, None]), axis=2)
        mx = new
    S = mx + tl.log(sm)  # [BLOCK_G, BLOCK_P]

    if WRITE_HEADS:
        tl.store(s_ptr + (bh * G + g)[:, None] * P + offs_p[None, :], S, mask=gmask[:, None] & pmask[None, :])
    cmask = pmask & (offs_p >= lo) & (offs_p < hi)
    if WRITE_PARTIALS:
        Sc = tl.where(cmask[None, :], S, float("-inf"))
        pmax = tl.max(Sc, axis=1)
        safe = tl.where(pmax == float("-inf"), 0.0, pmax)
        psum = tl.sum(tl.exp(Sc - safe[:, None]), axis=1)
        tl.store(pm_ptr + (bh * G + g) * NB + pb, pmax, mask=gmask)
        tl.store(pl_ptr + (bh * G + g) * NB + pb, psum, mask=gmask)
    if AGG != 0:
        if AGG == 1:
            x = S
        else:
            lz = tl.load(logz_ptr + bh * G + g, mask=gmask, other=0.0)
            x = S - lz[:, None]
        A = _group_reduce(x, gmask, AGG)
        A = tl.where(cmask, A, float("-inf"))
        tl.store(agg_ptr + bh * P + offs_p, A, mask=pmask)


@triton.jit(do_not_specialize=["NB"])
def _logz_kernel(pm_ptr, pl_ptr, logz_ptr, NB, BLOCK_R: tl.constexpr):
    """log Z of one query head from its per-block (max, sum exp) partials."""
    row = tl.program_id(0).to(tl.int64)
    Mv = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    Lv = tl.zeros([BLOCK_R], dtype=tl.float32)
    for start in range(0, NB, BLOCK_R):
        offs = start + tl.arange(0, BLOCK_R)
        msk = offs < NB
        m = tl.load(pm_ptr + row * NB + offs, mask=msk, other=float("-inf"))
        l = tl.load(pl_ptr + row * NB + offs, mask=msk, other=0.0)
        new = tl.maximum(Mv, m)
        safe = tl.where(new == float("-inf"), 0.0, new)
        Lv = Lv * tl.exp(Mv - safe) + l * tl.exp(m - safe)
        Mv = new
    M = tl.max(Mv, axis=0)
    safe = tl.where(M == float("-inf"), 0.0, M)
    L = tl.sum(Lv * tl.exp(Mv - safe), axis=0)
    tl.store(logz_ptr + row, tl.where(L > 0, safe + tl.log(L), float("-inf")))


@triton.jit(do_not_specialize=["lo", "hi", "Hkv", "G"])
def _aggregate_kernel(s_ptr, logz_ptr, agg_ptr, bounds_ptr, lo, hi, Hkv, P, G,
                      MODE: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_A: tl.constexpr, BOUNDS: tl.constexpr,
                      N: tl.constexpr, PER_ROW: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)  # b * Hkv + h
    offs = tl.program_id(1) * BLOCK_A + tl.arange(0, BLOCK_A)
    lo, hi = _bounds(bounds_ptr, bh // Hkv, lo, hi, BOUNDS, N, PER_ROW)
    pmask = offs < P
    cmask = pmask & (offs >= lo) & (offs < hi)
    g = tl.arange(0, BLOCK_G)
    gmask = g < G
    S = tl.load(s_ptr + (bh * G + g)[:, None] * P + offs[None, :], mask=gmask[:, None] & cmask[None, :],
                other=float("-inf"))
    lz = tl.load(logz_ptr + bh * G + g, mask=gmask, other=0.0)
    A = _group_reduce(S - lz[:, None], gmask, MODE)
    A = tl.where(cmask, A, float("-inf"))
    tl.store(agg_ptr + bh * P + offs, A, mask=pmask)


# ---------------------------------------------------------------------------------------------------------------


def _launch_config(q_dtype: torch.dtype, block_g: int, n: int, block_p: int | None, chunk: int | None,
                   num_warps: int | None, interpreted_kernel: bool):
    """(BLOCK_P, IC, num_warps) of the scoring kernel, from the compile table (results/kernels_compile.md):
    16-bit queries: 16 pages per program, the page's n tokens in one chunk, 4 warps (~120 registers: 4 blocks per
    SM, no spills); fp32 queries (IEEE dots, no tensor cores): chunks of 4 tokens, 8 warps (no spills). Under the
    interpreter, where registers do not exist and every program and loop trip costs Python time: 32 pages, one
    chunk (tests/core/test_decode_kernels.py runs the GPU's shapes explicitly)."""
    if chunk is not None and (chunk < 1 or chunk & (chunk - 1) or n % chunk):
        raise ValueError(f"chunk must be a power of two dividing the page size {n} (got {chunk})")
    sixteen = q_dtype in (torch.bfloat16, torch.float16)
    if interpreted_kernel:
        return block_p or max(16, 512 // block_g), min(n, chunk or n), num_warps or 4
    bp = block_p or max(16, 256 // block_g)
    ic = min(n, chunk or (n if sixteen else 4))
    return bp, ic, num_warps or (4 if sixteen else 8)


SUMMARY_TENSORS = ("mu_int", "mu_scale", "head_mean", "v_pack", "c_int", "w")  # what `summary` holds, in order


def _prepare(q: Tensor, summary):
    if not isinstance(summary, (tuple, list)) or len(summary) != len(SUMMARY_TENSORS):
        raise TypeError(f"the fused LOCKS scoring kernel takes the quantized summary tensors {SUMMARY_TENSORS} "
                        f"(QuantizedPageSummaries.kernel_tensors()), got {type(summary).__name__}")
    mu_int, mu_scale, head_mean, v_pack, c_int, w = summary
    if q.dim() != 3:
        raise ValueError(f"q must be [B, Hq, d] (got {tuple(q.shape)})")
    B, Hq, d = q.shape
    Bs, H, P, ds = mu_int.shape
    if Bs != B or ds != d or Hq % H:
        raise ValueError(f"q {tuple(q.shape)} does not match summaries of shape {tuple(mu_int.shape)}")
    if d % 2:
        raise ValueError(f"head dim must be even (got {d})")
    n, r = c_int.shape[3], c_int.shape[4]
    if n & (n - 1):
        raise ValueError(f"page size must be a power of two (got {n})")
    if q.stride(-1) != 1:
        q = q.contiguous()
    parts = [t.contiguous() for t in (mu_int, mu_scale, head_mean.float().expand(B, H, d), v_pack, c_int, w.float())]
    return q, parts, (B, Hq, H, Hq // H, P, d, n, r)


def _bounds_args(lo, hi, P: int, B: int, device, length=None):
    """(pointer tensor or None, lo int, hi int, BOUNDS mode of `_bounds`, PER_ROW)."""
    if length is not None:
        if not isinstance(length, Tensor) or isinstance(lo, Tensor) or isinstance(hi, Tensor):
            raise ValueError("with `length` (a device tensor of 1 or B elements), lo and hi must be ints")
        length, per_row = device_length(length, B)
        return length, max(0, int(lo)), int(hi or 0), 2, per_row
    if isinstance(lo, Tensor) or isinstance(hi, Tensor):
        lo_t = lo if isinstance(lo, Tensor) else torch.full((), int(lo), device=device)
        hi_t = hi if isinstance(hi, Tensor) else torch.full((), int(P if hi is None else hi), device=device)
        bounds = torch.stack([lo_t.reshape(()), hi_t.reshape(())]).to(device=device, dtype=torch.int32)
        return bounds, 0, 0, 1, False
    hi = P if hi is None else int(hi)
    return None, max(0, int(lo)), min(P, hi), 0, False


def _launch_scores(q, summary, scaling, *, write_heads, agg, lo, hi, log_z=None, block_p=None, chunk=None,
                   num_warps=None, length=None):
    q, (mu, mus, hm, vp, ci, w), (B, Hq, H, G, P, d, n, r) = _prepare(q, summary)
    check_device(_locks_score_kernel, q, mu)
    dev = q.device
    block_g = pow2(G, 16)
    bp, ic, num_warps = _launch_config(q.dtype, block_g, n, block_p, chunk, num_warps,
                                       interpreted(_locks_score_kernel))
    nb = cdiv(P, bp)
    bounds, lo_i, hi_i, from_ptr, per_row = _bounds_args(lo, hi, P, B, dev, length)
    heads = empty(B, Hq, P, dtype=torch.float32, device=dev) if write_heads else None
    partials = agg in (2, 3) and log_z is None
    pm = empty(B, Hq, nb, dtype=torch.float32, device=dev) if partials else None
    pl = empty(B, Hq, nb, dtype=torch.float32, device=dev) if partials else None
    out = empty(B, H, P, dtype=torch.float32, device=dev) if agg else None
    one_pass = agg == 1 or (agg in (2, 3) and log_z is not None)
    if log_z is not None:
        log_z = log_z.to(device=dev, dtype=torch.float32).reshape(B, Hq).contiguous()
    dummy = mus  # never dereferenced: the matching constexpr flag is off
    f32 = dot_in_f32(_locks_score_kernel, q.dtype)
    if P > 0:
        launch(
            _locks_score_kernel, (B * H, nb),
            q, q.stride(0), q.stride(1),
            mu, mus, hm, vp, ci, w,
            heads if heads is not None else dummy, out if out is not None else dummy,
            pm if pm is not None else dummy, pl if pl is not None else dummy,
            log_z if log_z is not None else dummy, bounds if bounds is not None else dummy,
            lo_i, hi_i, H, P, nb, G, d, float(scaling),
            R=r, N=n, IC=ic, BLOCK_G=block_g, BLOCK_P=bp, BLOCK_D=pow2(d, 16), BLOCK_DH=pow2(d // 2, 16),
            F32=f32, WRITE_HEADS=write_heads, WRITE_PARTIALS=partials, AGG=agg if one_pass else 0,
            BOUNDS=from_ptr, PER_ROW=per_row, num_warps=num_warps,
        )
    return heads, out, pm, pl, (bounds, lo_i, hi_i, from_ptr, per_row), (B, Hq, H, G, P, nb, block_g)


def locks_page_scores(q: Tensor, summary, scaling: float, *, block_p: int | None = None,
                      chunk: int | None = None, num_warps: int | None = None) -> Tensor:
    """S [B, Hq, P] fp32 == `locks.method.summaries.page_scores(q, s, scaling)` for quantized summaries s, given as
    summary = s.kernel_tensors() (one launch)."""
    heads, *_ = _launch_scores(q, summary, scaling, write_heads=True, agg=0, lo=0, hi=None, block_p=block_p, chunk=chunk,
                               num_warps=num_warps)
    return heads


def locks_aggregated_scores(q: Tensor, summary, scaling: float, group: int, mode: str = "norm",
                            lo=0, hi=None, *, length: Tensor | None = None, log_z: Tensor | None = None,
                            return_heads: bool = False, block_p: int | None = None, chunk: int | None = None,
                            block_a: int = 256, num_warps: int | None = None):
    """A [B, Hkv, P] fp32 == `aggregate_heads(page_scores(q, s, scaling), group, mode, candidates)` where the
    candidates are the pages [lo, hi) (hi=None: P); other pages get -inf. summary = s.kernel_tensors().

    lo / hi: Python ints, or int tensors on the device (read by the kernels; CUDA-graph friendly).
    length: an int tensor on the device, of 1 element (every row) or B (row b's length[b]); then the candidates of
    row b are [lo, length[b] // page_size - hi) with lo, hi ints (hi = pages left out before the last complete page,
    e.g. the recent pages): the static decode's range, read by the kernels without any host-side arithmetic.
    log_z [B, Hq]: if given, norm/max use it instead of the exact current-step log Z (one-pass variant, spec A3.3).
    return_heads=True returns (A, S [B, Hq, P], log Z [B, Hq] or None): S is needed by the certificate (A5.5). In raw
    mode S is only materialized when requested; log Z is None in raw mode and when `log_z` is given.
    block_p / chunk / num_warps: pages per program, tokens per log-sum-exp chunk, warps (default `_launch_config`).
    """
    if mode not in LOCKS_AGGREGATIONS:
        raise ValueError(f"aggregation mode must be one of {tuple(LOCKS_AGGREGATIONS)} (got {mode!r})")
    agg = LOCKS_AGGREGATIONS[mode]
    kv_heads = summary[0].shape[1]
    if q.shape[1] != group * kv_heads:
        raise ValueError(f"group={group} does not match {q.shape[1]} query heads over {kv_heads} KV heads")
    two_pass = agg in (2, 3) and log_z is None
    heads, out, pm, pl, (bounds, lo_i, hi_i, from_ptr, per_row), (B, Hq, H, G, P, nb, block_g) = _launch_scores(
        q, summary, scaling, write_heads=two_pass or return_heads, agg=agg, lo=lo, hi=hi, log_z=log_z, block_p=block_p,
        chunk=chunk, num_warps=num_warps, length=length)
    logz = None
    if two_pass:
        logz = empty(B, Hq, dtype=torch.float32, device=q.device)
        if P > 0:
            launch(_logz_kernel, (B * Hq,), pm, pl, logz, nb, BLOCK_R=min(_MAX_BLOCK_R, pow2(nb, 16)))
            launch(
                _aggregate_kernel, (B * H, cdiv(P, block_a)),
                heads, logz, out, bounds if bounds is not None else logz, lo_i, hi_i, H, P, G,
                MODE=agg, BLOCK_G=block_g, BLOCK_A=block_a, BOUNDS=from_ptr, N=summary[4].shape[3],
                PER_ROW=per_row, num_warps=4)
        else:
            logz.fill_(NEG_INF)
    if return_heads:
        return out, heads, logz
    return out
