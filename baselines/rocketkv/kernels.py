"""RocketKV's static decode step in four Triton launches around one torch.topk (baselines/rocketkv/selector.py,
docs/methods/rocketkv.md). Programs run per (row, KV head), or per block of one; each row's decomposition comes from
its device parameters [B, 4] = (cs, r_ch, prompt - survivors, k) and its length from the device length, so rows of
different lengths (and decompositions) run in one launch (PER_ROW: length [B], row b's).

`_rocket_append_kernel`: the new token (slot L - 1) becomes survivor T' - 1, T' = L - (prompt - survivors): its
cache slot goes to index[T' - 1] and its key is folded into chunk (T' - 1) // cs's min/max (a new chunk starts
from it).

`_rocket_chunk_logits_kernel` (grid: row and KV head x blocks of chunks) and `_rocket_keys_kernel` (x blocks of
survivors): the aggregated stage-2 score of every survivor, with the approximation of the selector's `approx_scores`:

    I = the r_ch channels with the largest a_i = sum_g |q_{g,i}| (ties to the lower channel), sigma_i = sum_g q_{g,i}
    x_{g,c} = sum_{i in I} q_{g,i} (sigma_i > 0 ? kmax_{c,i} : kmin_{c,i}) / tau_g,
    tau_g = sqrt(d sum_{i in I} |q_{g,i}| / sum_i |q_{g,i}|)
    score_t = sum_g exp(x_{g,c(t)} - M_g) / Z_g,  Z_g = sum_c n_c exp(x_{g,c} - M_g),  M_g = max_c x_{g,c}

(the softmax over the T' survivors, a chunk's n_c live tokens sharing its score, in fp32). The first kernel writes
x (fp32, the official code's unfused approximate scores) and each block's (max, sum); the second merges them and
writes the ranking key (fp32 bits of score_t) * 2^31 + (2^31 - 1 - t), -1 - t at t >= T': larger score first, ties
(a chunk's tokens) to the earlier survivor, as `survivor_scores`. A row padded with chunks or blocks it does not
have (stacked rows) gets the same keys bitwise: its extra blocks add (-inf, 0).

`_rocket_tokens_kernel`: from torch.topk's positions (value order), the cache slots of the row's first k valid ones,
ascending, invalid entries last (slot 0, valid False): the token list the sparse decode reads.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from locks.kernels._common import cdiv, check_device, launch, pow2
from locks.kernels.decode import device_length

__all__ = ["rocket_append", "rocket_token_scores", "rocket_static_tokens"]

_BIG = tl.constexpr(2**62)  # sorts after every cache slot


def _check_params(params: Tensor, B: int) -> None:
    if params.shape != (B, 4) or params.dtype != torch.int64 or not params.is_contiguous():
        raise ValueError(f"RocketKV's static parameters must be a contiguous int64 [B = {B}, 4] tensor (one row per "
                         f"sequence; got {tuple(params.shape)}, {params.dtype})")


@triton.jit(do_not_specialize=["Hkv"])
def _rocket_append_kernel(k_ptr, stride_kb, stride_kh, stride_kl, mx_ptr, mn_ptr, stride_mb, stride_mh, stride_mc,
                          idx_ptr, stride_ib, stride_ih, prm_ptr, len_ptr, Hkv, D,
                          PER_ROW: tl.constexpr, BLOCK_D: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    b = bh // Hkv
    h = bh % Hkv
    if PER_ROW:
        len_ptr += b
    cs = tl.load(prm_ptr + b * 4).to(tl.int64)
    evicted = tl.load(prm_ptr + b * 4 + 2).to(tl.int64)
    pos = tl.load(len_ptr).to(tl.int64) - 1
    slot = pos - evicted
    chunk = slot // cs
    dd = tl.arange(0, BLOCK_D)
    dmask = dd < D
    # compared in fp32 (exact for 16-bit values), stored back exactly
    key = tl.load(k_ptr + b * stride_kb + h * stride_kh + pos * stride_kl + dd, mask=dmask).to(tl.float32)
    row = b * stride_mb + h * stride_mh + chunk * stride_mc + dd
    first = slot % cs == 0
    mx = tl.load(mx_ptr + row, mask=dmask).to(tl.float32)
    mn = tl.load(mn_ptr + row, mask=dmask).to(tl.float32)
    out_ty = mx_ptr.dtype.element_ty
    tl.store(mx_ptr + row, tl.where(first, key, tl.maximum(mx, key)).to(out_ty), mask=dmask)
    tl.store(mn_ptr + row, tl.where(first, key, tl.minimum(mn, key)).to(out_ty), mask=dmask)
    tl.store(idx_ptr + b * stride_ib + h * stride_ih + slot, pos)


def rocket_append(keys: Tensor, kmin: Tensor, kmax: Tensor, index: Tensor, params: Tensor, length: Tensor) -> None:
    """In place: keys [B, Hkv, C, d] (the new key at slot length - 1), kmin/kmax [B, Hkv, chunks, d] of the keys'
    dtype, index [B, Hkv, capacity] int64, params [B, 4] int64, length [1] or [B] on the device. Oracle:
    `RocketKVSelector._static_append`."""
    check_device(_rocket_append_kernel, keys, kmin, kmax, index, params, length)
    B, H, _, d = keys.shape
    length, per_row = device_length(length, B)
    _check_params(params, B)
    if (keys.stride(-1) != 1 or kmax.stride(-1) != 1 or kmax.stride() != kmin.stride() or kmax.dtype != keys.dtype
            or index.stride(-1) != 1):
        raise ValueError("rocket_append needs unit-stride rows and min/max of the keys' dtype and layout")
    launch(_rocket_append_kernel, (B * H,), keys, keys.stride(0), keys.stride(1), keys.stride(2), kmax, kmin,
           kmax.stride(0), kmax.stride(1), kmax.stride(2), index, index.stride(0), index.stride(1), params, length,
           H, d, PER_ROW=per_row, BLOCK_D=pow2(d, 16), num_warps=1)


@triton.jit(do_not_specialize=["Hkv", "G", "CHUNKS"])
def _rocket_chunk_logits_kernel(q_ptr, stride_qb, stride_qh, mx_ptr, mn_ptr, stride_mb, stride_mh, stride_mc,
                                prm_ptr, len_ptr, a_ptr, x_ptr, m_ptr, z_ptr, Hkv, G, D, CHUNKS,
                                PER_ROW: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr,
                                BLOCK_D: tl.constexpr, BLOCK_J: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    splits = tl.num_programs(1)
    b = bh // Hkv
    h = bh % Hkv
    if PER_ROW:
        len_ptr += b
    cs = tl.load(prm_ptr + b * 4).to(tl.int64)
    r_ch = tl.load(prm_ptr + b * 4 + 1).to(tl.int32)
    n = tl.load(len_ptr).to(tl.int64) - tl.load(prm_ptr + b * 4 + 2).to(tl.int64)  # T'
    g = tl.arange(0, BLOCK_G)
    gmask = g < G
    dd = tl.arange(0, BLOCK_D)
    dmask = dd < D
    q = tl.load(q_ptr + b * stride_qb + (h * G + g)[:, None] * stride_qh + dd[None, :],
                mask=gmask[:, None] & dmask[None, :], other=0.0).to(tl.float32)
    absq = tl.abs(q)
    a = tl.sum(absq, axis=0)
    # rank_i = #{j : a_j > a_i or (a_j == a_i and j < i)}; the channels of rank < r_ch are I. The a_j are read back
    # from this program's scratch row, BLOCK_J at a time (a [BLOCK_D, BLOCK_D] comparison would not fit in registers)
    row = a_ptr + (bh * splits + split) * BLOCK_D
    tl.store(row + dd, a)
    tl.debug_barrier()
    rank = tl.zeros([BLOCK_D], dtype=tl.int32)
    for j0 in range(0, BLOCK_D, BLOCK_J):
        j = j0 + tl.arange(0, BLOCK_J)
        aj = tl.load(row + j)
        ahead = (aj[None, :] > a[:, None]) | ((aj[None, :] == a[:, None]) & (j[None, :] < dd[:, None]))
        rank += tl.sum((ahead & (j < D)[None, :]).to(tl.int32), axis=1)
    chosen = (rank < r_ch) & dmask
    positive = tl.sum(q, axis=0) > 0  # sum 0 -> min
    c = split * BLOCK_C + tl.arange(0, BLOCK_C)
    live = tl.minimum(tl.maximum(n - c * cs, 0), cs)  # live tokens of each chunk
    off = b * stride_mb + h * stride_mh + c.to(tl.int64)[:, None] * stride_mc + dd[None, :]
    tmask = (c < CHUNKS)[:, None] & dmask[None, :]
    bound = tl.where(positive[None, :], tl.load(mx_ptr + off, mask=tmask, other=0.0),
                     tl.load(mn_ptr + off, mask=tmask, other=0.0)).to(tl.float32)
    tiny = 1.1754943508222875e-38
    for gi in range(0, G):  # one query head at a time: fp32 products, no [G, d] x [d, C] dot in registers
        qg = tl.load(q_ptr + b * stride_qb + (h * G + gi) * stride_qh + dd, mask=dmask, other=0.0).to(tl.float32)
        qs = tl.where(chosen, qg, 0.0)
        tau = tl.maximum(tl.sqrt(D * tl.sum(tl.abs(qs), axis=0) / tl.maximum(tl.sum(tl.abs(qg), axis=0), tiny)), tiny)
        x = tl.sum(qs[None, :] * bound, axis=1) / tau
        x = tl.where(live > 0, x, float("-inf"))
        tl.store(x_ptr + (bh * G + gi) * CHUNKS + c, x, mask=c < CHUNKS)
        m = tl.max(x, axis=0)  # -inf for a block past T' (z = 0)
        z = tl.sum(tl.where(live > 0, live.to(tl.float32) * tl.exp(x - tl.where(m > float("-inf"), m, 0.0)), 0.0),
                   axis=0)
        tl.store(m_ptr + (bh * splits + split) * BLOCK_G + gi, m)
        tl.store(z_ptr + (bh * splits + split) * BLOCK_G + gi, z)


@triton.jit(do_not_specialize=["Hkv", "G", "CAP", "CHUNKS", "SPLITS"])
def _rocket_keys_kernel(x_ptr, m_ptr, z_ptr, prm_ptr, len_ptr, out_ptr, Hkv, G, CAP, CHUNKS, SPLITS,
                        PER_ROW: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_T: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    b = bh // Hkv
    if PER_ROW:
        len_ptr += b
    cs = tl.load(prm_ptr + b * 4).to(tl.int64)
    n = tl.load(len_ptr).to(tl.int64) - tl.load(prm_ptr + b * 4 + 2).to(tl.int64)
    g = tl.arange(0, BLOCK_G)
    gmask = g < G
    # merge the splits' (m, z): M_g = max_s m_s, Z_g = sum_s z_s exp(m_s - M_g)
    big_m = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    for s0 in range(0, SPLITS, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        ms = tl.load(m_ptr + (bh * SPLITS + s)[:, None] * BLOCK_G + g[None, :],
                     mask=(s < SPLITS)[:, None] & gmask[None, :], other=float("-inf"))
        big_m = tl.maximum(big_m, tl.max(ms, axis=0))
    big_m = tl.where(gmask, big_m, 0.0)  # (query heads past G: never read)
    big_z = tl.zeros([BLOCK_G], dtype=tl.float32)
    for s0 in range(0, SPLITS, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        smask = (s < SPLITS)[:, None] & gmask[None, :]
        ms = tl.load(m_ptr + (bh * SPLITS + s)[:, None] * BLOCK_G + g[None, :], mask=smask, other=float("-inf"))
        zs = tl.load(z_ptr + (bh * SPLITS + s)[:, None] * BLOCK_G + g[None, :], mask=smask, other=0.0)
        big_z += tl.sum(tl.where(zs > 0, zs * tl.exp(ms - big_m[None, :]), 0.0), axis=0)
    big_z = tl.where(gmask, big_z, 1.0)
    t = tl.program_id(1).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    live = t < n
    x = tl.load(x_ptr + (bh * G + g)[:, None] * CHUNKS + (t // cs)[None, :], mask=gmask[:, None] & live[None, :],
                other=float("-inf"))
    score = tl.sum(tl.where(gmask[:, None] & live[None, :], tl.exp(x - big_m[:, None]) / big_z[:, None], 0.0), axis=0)
    key = (score.to(tl.int32, bitcast=True).to(tl.int64) << 31) + (2147483647 - t)
    tl.store(out_ptr + bh * CAP + t, tl.where(live, key, -1 - t), mask=t < CAP)


def rocket_token_scores(query: Tensor, kmin: Tensor, kmax: Tensor, params: Tensor, length: Tensor,
                        capacity: int) -> Tensor:
    """[B, Hkv, capacity] int64: each survivor's ranking key (module docstring), -1 - t at or past T'; query
    [B, Hq, d], kmin/kmax [B, Hkv, chunks, d]. Two launches: the chunk logits with each split's (max, sum), then the
    keys of a block of survivors from the merged (max, sum). Oracle: `baselines.rocketkv.selector.survivor_scores`."""
    check_device(_rocket_chunk_logits_kernel, query, kmin, kmax, params, length)
    B, Hq, d = query.shape
    _, H, chunks, _ = kmax.shape
    G = Hq // H
    length, per_row = device_length(length, B)
    _check_params(params, B)
    if query.stride(-1) != 1:
        query = query.contiguous()
    if kmax.stride() != kmin.stride() or kmax.stride(-1) != 1:
        kmax, kmin = kmax.contiguous(), kmin.contiguous()
    block_d, block_g = pow2(d, 16), pow2(G, 2)
    splits = cdiv(chunks, 32)
    dev = query.device
    channels = torch.empty(B * H * splits * block_d, dtype=torch.float32, device=dev)  # scratch: sum_g |q|
    logits = torch.empty(B * H * G * chunks, dtype=torch.float32, device=dev)  # x [B, Hkv, G, chunks]
    m, z = (torch.empty(B * H * splits * block_g, dtype=torch.float32, device=dev) for _ in range(2))
    out = torch.empty(B, H, capacity, dtype=torch.int64, device=dev)
    launch(_rocket_chunk_logits_kernel, (B * H, splits), query, query.stride(0), query.stride(1), kmax, kmin,
           kmax.stride(0), kmax.stride(1), kmax.stride(2), params, length, channels, logits, m, z, H, G, d, chunks,
           PER_ROW=per_row, BLOCK_G=block_g, BLOCK_C=32, BLOCK_D=block_d, BLOCK_J=16, num_warps=4)
    block_t = 256
    launch(_rocket_keys_kernel, (B * H, cdiv(capacity, block_t)), logits, m, z, params, length, out, H, G, capacity,
           chunks, splits, PER_ROW=per_row, BLOCK_G=block_g, BLOCK_S=16, BLOCK_T=block_t, num_warps=4)
    return out


@triton.jit(do_not_specialize=["Hkv", "K", "C"])
def _rocket_tokens_kernel(top_ptr, idx_ptr, stride_ib, stride_ih, prm_ptr, len_ptr, out_ptr, valid_ptr, Hkv, K, C,
                          PER_ROW: tl.constexpr, BLOCK_K: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    b = bh // Hkv
    h = bh % Hkv
    if PER_ROW:
        len_ptr += b
    n = tl.load(len_ptr).to(tl.int64) - tl.load(prm_ptr + b * 4 + 2).to(tl.int64)
    k = tl.load(prm_ptr + b * 4 + 3).to(tl.int64)
    j = tl.arange(0, BLOCK_K)
    top = tl.load(top_ptr + bh * K + j, mask=j < K, other=0).to(tl.int64)
    ok = (j < K) & (j < k) & (top < n)
    slot = tl.load(idx_ptr + b * stride_ib + h * stride_ih + top, mask=ok, other=0).to(tl.int64)
    slot = tl.sort(tl.where(ok, slot, _BIG), dim=0)
    ok = slot < C
    tl.store(out_ptr + bh * K + j, tl.where(ok, slot, 0), mask=j < K)
    tl.store(valid_ptr + bh * K + j, ok.to(tl.int8), mask=j < K)


def rocket_static_tokens(top: Tensor, index: Tensor, params: Tensor, length: Tensor,
                         cache_slots: int) -> tuple[Tensor, Tensor]:
    """top [B, Hkv, K] (torch.topk's positions among the survivors, value order) -> (indices [B, Hkv, 1, K] int64,
    valid [B, Hkv, 1, K] bool): the cache slots (index [B, Hkv, capacity]) of each row's first k positions below T',
    ascending, then the invalid ones (slot 0). Oracle: the torch branch of `RocketKVSelector.select_static`."""
    check_device(_rocket_tokens_kernel, top, index, params, length)
    B, H, K = top.shape
    length, per_row = device_length(length, B)
    _check_params(params, B)
    top = top.contiguous()
    indices = torch.empty(B, H, 1, K, dtype=torch.int64, device=top.device)
    valid = torch.empty(B, H, 1, K, dtype=torch.bool, device=top.device)
    launch(_rocket_tokens_kernel, (B * H,), top, index, index.stride(0), index.stride(1), params, length, indices,
           valid.view(torch.int8), H, K, cache_slots, PER_ROW=per_row, BLOCK_K=pow2(K, 2), num_warps=4)
    return indices, valid
