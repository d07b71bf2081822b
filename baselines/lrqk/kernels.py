"""LRQK's static decode step in three Triton launches around torch.topk and a sort (baselines/lrqk/selector.py,
docs/methods/lrqk.md). A program owns one (row, query head) of query head hq of KV head hq // G; each row reads its
own length (PER_ROW: length [B]) and the position of its lite ring (ring_base [B]), so rows of different lengths run
in one launch. State per (row, query head): B_Q, B_K [r, d], A_K [capacity, r], the hot cache Kh, Vh [k + n, d]
(k top-k slots, then the n-slot ring), the slots' tokens (slot order) and the same set sorted.

`_lrqk_solve_kernel` (new token t = L - 1 at ring slot (t - ring_base) mod n, query q, key k, Omega = the k + n
resident rows, rows without an A_K row zeroed): writes k and v into the ring, then builds

    P = B_K B_K^T,  M_q = B_Q B_Q^T + l2 A_O^T A_O,  b_q = q B_Q^T + l2 (q K_O^T) A_O,  b_k = k B_K^T,  c = l1 q.k

and runs every one of the max_iter_decode alternating solves from k^ = b_k P^-1:

    q^ = (b_q + c k^)(M_q + l1 k^T k^)^-1,   k^ = (b_k + c q^)(P + l1 q^T q^)^-1

writing each iteration's q^, k^ and squared change sum_r (k^_used - k^_new)^2. P and M_q are symmetric positive
definite (Gram matrices; B_K B_K^T is nonsingular for rank r <= d): each is inverted once in registers by the sweep
operator (Gauss-Jordan elimination without pivoting, in symmetric form, stable for SPD matrices), and each
iteration's rank-one update is solved from the inverse by Sherman-Morrison. No data-dependent control flow, no
linalg call, no host synchronization: the step is capturable (docs/methods/lrqk.md, "Static decode and kernels").
Padded rank entries carry an identity block, so they solve to 0.

`_lrqk_scores_kernel`: the row's stop iteration (the first whose mean squared change over the row's query heads and
rank entries is below tol_decode, else the last, as the eager loop stops) picks q^, k^; then z_t = q^ . A_K[t]
for the candidates t < L - n (- 1), -inf past them. Block 0 of each program also applies the Kaczmarz updates
B <- B - a G, G = h^T (h B - x), a = ||G||^2 / (||h G||^2 + 1e-6), to B_Q (h = q^, x = q) and B_K (h = k^, x = k)
and writes A_K[t] = k^ (the current token is never a candidate, so no program reads that row).

`_lrqk_replace_kernel` (after topk and sort: the new top-k set, ascending): while the context exceeds the hot cache
(L > k + n), a slot whose token left the set is overwritten by a token that joined it, the j-th overwritten slot
(slot order) taking the j-th joining token (ascending), as the official boolean assignment does; membership is a
binary search in the sorted sets. Missed rows are read from the cold store [B, Hkv, capacity, 2d] in place (a
device view of pinned host memory on CUDA). The step's attended tokens per KV head are counted as the union over its
query heads (each head sets its tokens' bits in the KV head's seen-set with an atomic or and counts the bits it set
first; the n ring tokens, never candidates, once) and the
missed rows as host-to-device bytes (2 d s each, fp64, exact integers). While the context fits, nothing changes and
each KV head attends the L resident tokens. The attention then reads each query head's first count = min(L, k + n)
slots of Kh, Vh in slot order (locks/kernels/decode.py, full_decode).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from locks.kernels._common import cdiv, check_device, launch, pow2
from locks.kernels.decode import device_length

__all__ = ["lrqk_solve", "lrqk_scores", "lrqk_replace"]

_COUNTS = ["Hq", "G", "K", "N", "AK_ROWS", "WORDS"]


@triton.jit
def _row_head(Hq, G, length_ptr, PER_ROW: tl.constexpr):
    """Program -> (b * Hq + hq, b, hq, KV head, the row's length L)."""
    bh = tl.program_id(0).to(tl.int64)
    b = bh // Hq
    hq = bh % Hq
    L = tl.load(length_ptr + (b if PER_ROW else 0))
    return bh, b, hq, hq // G, L


@triton.jit
def _gram(X):
    """X X^T of X [R, D] in IEEE fp32."""
    return tl.dot(X, tl.trans(X), input_precision="ieee")


@triton.jit
def _spd_inverse(M, R, RP: tl.constexpr):
    """M^-1 of a symmetric positive definite M [RP, RP] (fp32, in registers) whose entries past R are an identity
    block: the sweep operator on the first R pivots turns M into -M^-1 (Gauss-Jordan elimination without pivoting,
    kept symmetric; stable for SPD M). Sweep on pivot k, D = M_kk, c = M[:, k]:
        M_ij <- M_ij - c_i c_j / D (i, j != k),   M_ik, M_ki <- c_i / D,   M_kk <- -1 / D"""
    i = tl.arange(0, RP)
    for k in range(R):
        c = tl.sum(tl.where(i[None, :] == k, M, 0.0), axis=1)
        D = tl.sum(tl.where(i == k, c, 0.0), axis=0)
        on_k = (i[:, None] == k) | (i[None, :] == k)
        edge = tl.where(i[:, None] == k, c[None, :], c[:, None]) / D
        M = tl.where(on_k, tl.where((i[:, None] == k) & (i[None, :] == k), -1.0 / D, edge),
                     M - c[:, None] * c[None, :] / D)
    return tl.where(i[None, :] < R, -M, M)  # (the identity block was not swept)


@triton.jit
def _matvec(M, y):
    return tl.sum(M * y[None, :], axis=1)


@triton.jit
def _solve_rank_one(M_inv, lam, u, y):
    """x with (M + lam u u^T) x = y from M^-1 (Sherman-Morrison; the denominator is >= 1 for SPD M, lam >= 0):
    x = M^-1 y - lam w (u . M^-1 y) / (1 + lam u . w),  w = M^-1 u. (x M = y is the same system for symmetric M.)"""
    x = _matvec(M_inv, y)
    w = _matvec(M_inv, u)
    return x - lam * w * tl.sum(u * x, axis=0) / (1.0 + lam * tl.sum(u * w, axis=0))


@triton.jit(do_not_specialize=_COUNTS)
def _lrqk_solve_kernel(q_ptr, stride_qb, stride_qh, k_ptr, v_ptr, stride_kb, stride_kh, stride_kl, length_ptr,
                       ring_ptr, kh_ptr, vh_ptr, lite_ptr, slots_ptr, ak_ptr, bq_ptr, bk_ptr, ws_q_ptr, ws_k_ptr,
                       ws_e_ptr, seen_ptr, count_ptr, bytes_ptr, attended_ptr,
                       Hq, G, K, N, AK_ROWS, R, D, WORDS, lambda1, lambda2,
                       MAX_ITER: tl.constexpr, PER_ROW: tl.constexpr, RP: tl.constexpr, BLOCK_D: tl.constexpr,
                       BLOCK_M: tl.constexpr):
    bh, b, hq, h, L = _row_head(Hq, G, length_ptr, PER_ROW)
    pos = L - 1
    ring = ((pos - tl.load(ring_ptr + b)) % N + N) % N
    S = K + N
    dd = tl.arange(0, BLOCK_D)
    dm = dd < D
    rr = tl.arange(0, RP)
    rm = rr < R
    kv_row = b * stride_kb + h * stride_kh + pos * stride_kl
    key = tl.load(k_ptr + kv_row + dd, mask=dm, other=0.0)
    tl.store(kh_ptr + (bh * S + K + ring) * D + dd, key.to(kh_ptr.dtype.element_ty), mask=dm)
    tl.store(vh_ptr + (bh * S + K + ring) * D + dd,
             tl.load(v_ptr + kv_row + dd, mask=dm, other=0.0).to(vh_ptr.dtype.element_ty), mask=dm)
    if hq == 0:
        tl.store(lite_ptr + b * N + ring, pos)
        tl.store(count_ptr + b, tl.minimum(L, S).to(tl.int32))
        three = tl.arange(0, 4)
        tl.store(bytes_ptr + b * 3 + three, tl.zeros([4], dtype=tl.float64), mask=three < 3)
    if hq % G == 0:
        tl.store(attended_ptr + b * (Hq // G) + h, 0.0)
    per_head = (WORDS + G - 1) // G  # this head's share of its KV head's seen-set, cleared for _lrqk_replace_kernel
    for w0 in range(0, per_head, 256):
        w = (hq % G) * per_head + w0 + tl.arange(0, 256)
        tl.store(seen_ptr + (b * (Hq // G) + h) * WORDS + w, tl.zeros([256], dtype=tl.int32),
                 mask=(w < WORDS) & (w0 + tl.arange(0, 256) < per_head))

    kf = key.to(tl.float32)
    q = tl.load(q_ptr + b * stride_qb + hq * stride_qh + dd, mask=dm, other=0.0).to(tl.float32)
    rd = rm[:, None] & dm[None, :]
    B_Q = tl.load(bq_ptr + bh * R * D + rr[:, None] * D + dd[None, :], mask=rd, other=0.0).to(tl.float32)
    B_K = tl.load(bk_ptr + bh * R * D + rr[:, None] * D + dd[None, :], mask=rd, other=0.0).to(tl.float32)
    pad = tl.where((rr[:, None] == rr[None, :]) & ~rm[:, None], 1.0, 0.0)  # identity on the padded rank entries
    P = _gram(B_K) + pad
    b_k = tl.sum(B_K * kf[None, :], axis=1)
    AtA = tl.zeros([RP, RP], dtype=tl.float32)
    b_o = tl.zeros([RP], dtype=tl.float32)
    for m0 in range(0, S, BLOCK_M):  # Omega: the k slots, then the ring (the current token's slot holds t)
        m = m0 + tl.arange(0, BLOCK_M)
        mm = m < S
        tok = tl.where(m < K, tl.load(slots_ptr + bh * K + m, mask=m < K, other=-1),
                       tl.load(lite_ptr + b * N + (m - K), mask=mm & (m >= K), other=-1))
        tok = tl.where(m == K + ring, pos, tok)
        ok = mm & (tok >= 0) & (tok < pos)  # the current token has no A_K row yet
        A = tl.load(ak_ptr + (bh * AK_ROWS + tok)[:, None] * R + rr[None, :], mask=ok[:, None] & rm[None, :],
                    other=0.0).to(tl.float32)
        K_O = tl.load(kh_ptr + (bh * S + m)[:, None] * D + dd[None, :], mask=mm[:, None] & dm[None, :],
                      other=0.0).to(tl.float32)
        K_O = tl.where((m == K + ring)[:, None], kf[None, :], K_O)
        w = tl.sum(K_O * q[None, :], axis=1)
        b_o += tl.sum(w[:, None] * A, axis=0)
        AtA += tl.dot(tl.trans(A), A, input_precision="ieee")
    M_q = _gram(B_Q) + lambda2 * AtA + pad
    b_q = tl.sum(B_Q * q[None, :], axis=1) + lambda2 * b_o
    c = lambda1 * tl.sum(q * kf, axis=0)
    P_inv = _spd_inverse(P, R, RP)
    M_inv = _spd_inverse(M_q, R, RP)
    k_hat = _matvec(P_inv, b_k)
    for it in tl.static_range(MAX_ITER):
        q_new = _solve_rank_one(M_inv, lambda1, k_hat, b_q + c * k_hat)
        k_new = _solve_rank_one(P_inv, lambda1, q_new, b_k + c * q_new)
        change = tl.where(rm, k_hat - k_new, 0.0)
        tl.store(ws_q_ptr + (bh * MAX_ITER + it) * RP + rr, q_new)
        tl.store(ws_k_ptr + (bh * MAX_ITER + it) * RP + rr, k_new)
        tl.store(ws_e_ptr + bh * MAX_ITER + it, tl.sum(change * change, axis=0))
        k_hat = k_new


@triton.jit
def _kaczmarz(B, h, x):
    """B - a G with G = h^T (h B - x), a = ||G||^2 / (||h G||^2 + 1e-6); B [R, D], h [R], x [D] (fp32)."""
    G = h[:, None] * (tl.sum(h[:, None] * B, axis=0) - x)[None, :]
    hG = tl.sum(h[:, None] * G, axis=0)
    return B - tl.sum(tl.sum(G * G, axis=1), axis=0) / (tl.sum(hG * hG, axis=0) + 1e-6) * G


@triton.jit(do_not_specialize=["Hq", "G", "N", "CAP", "AK_ROWS"])
def _lrqk_scores_kernel(q_ptr, stride_qb, stride_qh, k_ptr, stride_kb, stride_kh, stride_kl, length_ptr, ak_ptr,
                        bq_ptr, bk_ptr, ws_q_ptr, ws_k_ptr, ws_e_ptr, z_ptr,
                        Hq, G, N, CAP, AK_ROWS, R, D, OFF, tol,
                        MAX_ITER: tl.constexpr, PER_ROW: tl.constexpr, RP: tl.constexpr, BLOCK_D: tl.constexpr,
                        BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr):
    bh, b, hq, h, L = _row_head(Hq, G, length_ptr, PER_ROW)
    blk = tl.program_id(1)
    heads = tl.arange(0, BLOCK_H)
    chosen = MAX_ITER - 1
    found = False
    for it in tl.static_range(MAX_ITER):  # the row's stop: the first iteration with mean squared change < tol
        e = tl.load(ws_e_ptr + (b * Hq + heads) * MAX_ITER + it, mask=heads < Hq, other=0.0)
        stop = (tl.sum(e, axis=0) / (Hq * R) < tol) & ~found
        chosen = tl.where(stop, it, chosen)
        found = found | stop
    rr = tl.arange(0, RP)
    rm = rr < R
    q_hat = tl.load(ws_q_ptr + (bh * MAX_ITER + chosen) * RP + rr)
    t = blk * BLOCK_T + tl.arange(0, BLOCK_T)
    A = tl.load(ak_ptr + (bh * AK_ROWS + t)[:, None] * R + rr[None, :], mask=(t < CAP)[:, None] & rm[None, :],
                other=0.0)
    z = tl.sum(A.to(tl.float32) * q_hat[None, :], axis=1)
    tl.store(z_ptr + bh * CAP + t, tl.where(t < L - N - OFF, z, float("-inf")), mask=t < CAP)
    if blk == 0:
        pos = L - 1
        k_hat = tl.load(ws_k_ptr + (bh * MAX_ITER + chosen) * RP + rr)
        dd = tl.arange(0, BLOCK_D)
        dm = dd < D
        rd = rm[:, None] & dm[None, :]
        q = tl.load(q_ptr + b * stride_qb + hq * stride_qh + dd, mask=dm, other=0.0).to(tl.float32)
        key = tl.load(k_ptr + b * stride_kb + h * stride_kh + pos * stride_kl + dd, mask=dm, other=0.0).to(tl.float32)
        at = bh * R * D + rr[:, None] * D + dd[None, :]
        B_Q = tl.load(bq_ptr + at, mask=rd, other=0.0).to(tl.float32)
        B_K = tl.load(bk_ptr + at, mask=rd, other=0.0).to(tl.float32)
        tl.store(bq_ptr + at, _kaczmarz(B_Q, q_hat, q).to(bq_ptr.dtype.element_ty), mask=rd)
        tl.store(bk_ptr + at, _kaczmarz(B_K, k_hat, key).to(bk_ptr.dtype.element_ty), mask=rd)
        tl.store(ak_ptr + (bh * AK_ROWS + pos) * R + rr, k_hat.to(ak_ptr.dtype.element_ty), mask=rm)


@triton.jit
def _member(sorted_ptr, x, K, LOG_K: tl.constexpr):
    """Whether each x is among the K ascending values at sorted_ptr (vectorized binary search)."""
    lo = tl.zeros(x.shape, dtype=tl.int64)
    hi = tl.zeros(x.shape, dtype=tl.int64) + K
    for _ in range(LOG_K):
        mid = (lo + hi) // 2
        below = tl.load(sorted_ptr + mid, mask=mid < K, other=0) < x
        lo = tl.where((lo < hi) & below, mid + 1, lo)
        hi = tl.where((lo < hi) & ~below, mid, hi)
    return (lo < K) & (tl.load(sorted_ptr + lo, mask=lo < K, other=-1) == x)


@triton.jit(do_not_specialize=["Hq", "G", "K", "N", "WORDS"])
def _lrqk_replace_kernel(top_ptr, slots_ptr, sorted_ptr, fresh_ptr, seen_ptr, length_ptr, kh_ptr, vh_ptr, store_ptr,
                         stride_sb, stride_sh, stride_sl, missed_ptr, bytes_ptr, attended_ptr,
                         Hq, G, K, N, D, WORDS, elem_bytes,
                         PER_ROW: tl.constexpr, LOG_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    bh, b, hq, h, L = _row_head(Hq, G, length_ptr, PER_ROW)
    S = K + N
    if L <= S:  # the context fits: every token resident, nothing replaced
        if hq % G == 0:
            tl.atomic_add(attended_ptr + b * (Hq // G) + h, L.to(tl.float64))
    else:
        top = top_ptr + bh * K
        # the tokens that join the set, in ascending order, listed by their rank among the joining ones
        joined = tl.full([], 0, tl.int64)
        for j0 in range(0, K, BLOCK_K):
            j = j0 + tl.arange(0, BLOCK_K)
            t = tl.load(top + j, mask=j < K, other=-1)
            fresh = (j < K) & ~_member(sorted_ptr + bh * K, t, K, LOG_K)
            rank = joined + tl.cumsum(fresh.to(tl.int64), axis=0) - fresh.to(tl.int64)
            tl.store(fresh_ptr + bh * K + rank, t, mask=fresh)
            joined += tl.sum(fresh.to(tl.int64), axis=0)
        tl.debug_barrier()
        dd = tl.arange(0, BLOCK_D)
        dm = dd < D
        left = tl.full([], 0, tl.int64)
        for i0 in range(0, K, BLOCK_K):  # the leaving slots, in slot order, take them and load their rows
            i = i0 + tl.arange(0, BLOCK_K)
            old = tl.load(slots_ptr + bh * K + i, mask=i < K, other=-1)
            miss = (i < K) & ~_member(top, old, K, LOG_K)
            rank = left + tl.cumsum(miss.to(tl.int64), axis=0) - miss.to(tl.int64)
            new = tl.load(fresh_ptr + bh * K + rank, mask=miss, other=0)
            tl.store(slots_ptr + bh * K + i, new, mask=miss)
            row = store_ptr + b * stride_sb + h * stride_sh + new[:, None] * stride_sl + dd[None, :]
            md = miss[:, None] & dm[None, :]
            dst = (bh * S + i)[:, None] * D + dd[None, :]
            tl.store(kh_ptr + dst, tl.load(row, mask=md, other=0.0).to(kh_ptr.dtype.element_ty), mask=md)
            tl.store(vh_ptr + dst, tl.load(row + D, mask=md, other=0.0).to(vh_ptr.dtype.element_ty), mask=md)
            left += tl.sum(miss.to(tl.int64), axis=0)
        tl.debug_barrier()
        # union over the group: the bits of the KV head's seen-set this head sets first (+ the ring once)
        distinct = tl.where(hq % G == 0, N, 0).to(tl.int64)
        for j0 in range(0, K, BLOCK_K):
            j = j0 + tl.arange(0, BLOCK_K)
            t = tl.load(top + j, mask=j < K, other=0)
            tl.store(sorted_ptr + bh * K + j, t, mask=j < K)
            bit = (tl.full(t.shape, 1, tl.int32) << (t % 32).to(tl.int32))
            old = tl.atomic_or(seen_ptr + (b * (Hq // G) + h) * WORDS + t // 32, bit, mask=j < K)
            distinct += tl.sum(((j < K) & ((old & bit) == 0)).to(tl.int64), axis=0)
        tl.atomic_add(attended_ptr + b * (Hq // G) + h, distinct.to(tl.float64))
        tl.atomic_add(missed_ptr + b, left.to(tl.float64))
        tl.atomic_add(bytes_ptr + b * 3 + 2, (2 * D * elem_bytes * left).to(tl.float64))


def _rank_block(R: int) -> int:
    return pow2(R, 16)


def _check_contiguous(**tensors: Tensor) -> None:
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise ValueError(f"LRQK's static state {name} must be contiguous (got strides {t.stride()})")


def lrqk_solve(query: Tensor, keys: Tensor, values: Tensor, length: Tensor, ring_base: Tensor, Kh: Tensor,
               Vh: Tensor, lite: Tensor, slots: Tensor, A_K: Tensor, B_Q: Tensor, B_K: Tensor, count: Tensor,
               step_bytes: Tensor, attended: Tensor, *, max_iter: int, lambda1: float, lambda2: float):
    """The ring write and every decode iteration of each (row, query head) -> workspaces (q^ [B Hq, I, RP],
    k^ [B Hq, I, RP], squared change [B Hq, I], each KV head's seen-set of tokens [B Hkv, capacity / 32] int32
    bits, cleared) for `lrqk_scores` and `lrqk_replace`; zeroes the row's step bytes and attended counts and writes
    count [B] = min(L, k + n)."""
    check_device(_lrqk_solve_kernel, query, keys, Kh, A_K)
    _check_contiguous(Kh=Kh, Vh=Vh, lite=lite, slots=slots, A_K=A_K, B_Q=B_Q, B_K=B_K, step_bytes=step_bytes,
                      attended=attended)
    B, Hq, S, d = Kh.shape
    Hkv, cap = keys.shape[1], keys.shape[2]
    K, R = slots.shape[-1], B_Q.shape[-2]
    N = S - K
    length, per_row = device_length(length, B)
    RP = _rank_block(R)
    ws_q = torch.empty(B * Hq, max_iter, RP, dtype=torch.float32, device=Kh.device)
    ws_k = torch.empty_like(ws_q)
    ws_e = torch.empty(B * Hq, max_iter, dtype=torch.float32, device=Kh.device)
    words = cdiv(cap, 32)
    seen = torch.empty(B * Hkv, words, dtype=torch.int32, device=Kh.device)
    launch(_lrqk_solve_kernel, (B * Hq,), query, query.stride(0), query.stride(1), keys, values, keys.stride(0),
           keys.stride(1), keys.stride(2), length, ring_base, Kh, Vh, lite, slots, A_K, B_Q, B_K, ws_q, ws_k, ws_e,
           seen, count, step_bytes, attended, Hq, Hq // Hkv, K, N, A_K.shape[2], R, d, words, float(lambda1),
           float(lambda2),
           MAX_ITER=max_iter, PER_ROW=per_row, RP=RP, BLOCK_D=pow2(d, 16), BLOCK_M=32,
           num_warps=8 if RP * pow2(d, 16) > 4096 else 4)
    return ws_q, ws_k, ws_e, seen


def lrqk_scores(query: Tensor, keys: Tensor, length: Tensor, A_K: Tensor, B_Q: Tensor, B_K: Tensor,
                workspaces: tuple[Tensor, Tensor, Tensor], *, lite_tokens: int, off_by_one: bool, tol: float) -> Tensor:
    """z [B, Hq, capacity] fp32 (module docstring), -inf past each row's candidates; updates B_Q, B_K in place
    (Kaczmarz) and writes the current token's A_K row."""
    B, Hq, rows, R = A_K.shape
    cap, d = keys.shape[2], B_Q.shape[-1]
    length, per_row = device_length(length, B)
    ws_q, ws_k, ws_e, _ = workspaces
    z = torch.empty(B, Hq, cap, dtype=torch.float32, device=A_K.device)
    block = 128
    launch(_lrqk_scores_kernel, (B * Hq, cdiv(cap, block)), query, query.stride(0), query.stride(1), keys,
           keys.stride(0), keys.stride(1), keys.stride(2), length, A_K, B_Q, B_K, ws_q, ws_k, ws_e, z,
           Hq, Hq // keys.shape[1], lite_tokens, cap, rows, R, d, int(off_by_one), float(tol),
           MAX_ITER=ws_e.shape[1], PER_ROW=per_row, RP=ws_q.shape[-1], BLOCK_D=pow2(d, 16), BLOCK_H=pow2(Hq),
           BLOCK_T=block, num_warps=4)
    return z


def lrqk_replace(top: Tensor, slots: Tensor, slots_sorted: Tensor, length: Tensor, Kh: Tensor, Vh: Tensor,
                 store: Tensor, missed: Tensor, step_bytes: Tensor, attended: Tensor,
                 workspaces: tuple[Tensor, Tensor, Tensor, Tensor], *, group: int, elem_bytes: int) -> None:
    """The slot replacement of the step's sorted top-k `top` [B, Hq, k] (module docstring), in place: slots,
    slots_sorted (-> top), the missed rows of Kh, Vh from `store` [B, Hkv, capacity, 2d]; missed [B] += the
    row's missed rows, step_bytes[:, 2] += their bytes, attended [B, Hkv] += each KV head's distinct tokens."""
    check_device(_lrqk_replace_kernel, top, slots, Kh, store)
    _check_contiguous(top=top, slots=slots, slots_sorted=slots_sorted, Kh=Kh, Vh=Vh, step_bytes=step_bytes,
                      attended=attended)
    B, Hq, S, d = Kh.shape
    K = slots.shape[-1]
    length, per_row = device_length(length, B)
    fresh = torch.empty(B * Hq, K, dtype=torch.int64, device=Kh.device)
    seen = workspaces[3]
    launch(_lrqk_replace_kernel, (B * Hq,), top, slots, slots_sorted, fresh, seen, length, Kh, Vh, store,
           store.stride(0), store.stride(1), store.stride(2), missed, step_bytes, attended,
           Hq, group, K, S - K, d, seen.shape[1], int(elem_bytes),
           PER_ROW=per_row, LOG_K=max(1, math.ceil(math.log2(K + 1))),
           BLOCK_K=min(pow2(K, 16), max(16, 4096 // pow2(d, 16))), BLOCK_D=pow2(d, 16), num_warps=4)
