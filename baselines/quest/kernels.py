"""Fused Quest page scoring (per-page channel-wise key max/min bound; baselines/quest.py, docs/methods/quest.md).

    U_{g,j} = sum_c max(q_g[c] * kmax_j[c], q_g[c] * kmin_j[c])       (fp32, no scaling, no softmax)

`_quest_score_kernel` -- grid (B * Hkv, cdiv(P, BLOCK_P)): one program loads the [BLOCK_P, d] max and min tiles of
one KV head once (2*d*s B per page, s = element size of the metadata) and scores them for all G query heads of the
group with two tensor-core dots, using max(q M, q m) = q+ M + q- m (q+ = max(q, 0), q- = min(q, 0)), which holds
because kmax >= kmin channel-wise (true for any real metadata; the same identity as baselines/quest.py). With
bf16/fp16 metadata and queries the products are exact and accumulate in fp32; with fp32 inputs the dots run in IEEE
fp32. Output: per head [B, Hq, P] (4*G B written per page), or reduced over the group in the same program (max or
sum over the G heads, 4 B per page) -- the `gqa=group` mode of the Quest selector. In a static step of the eval rule
it writes the pages' int64 ranking keys instead (`quest_eval_keys`), so that one torch.topk is the rule's top-k.

`_quest_append_kernel` -- grid (B * Hkv): the static decode's metadata update, the new key (at the device length
minus one) folded into its page's max/min in one launch.

`_quest_pages_kernel` -- grid (B * Hkv): the static step's page list and each KV head's union count.

The static kernels read the device length: one for every row, or row b's own (constexpr PER_ROW), so that rows of
different lengths decode in one batch.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from locks.kernels._common import cdiv, check_device, dot_in_f32, empty, interpreted, launch, pow2
from locks.kernels.decode import device_length

__all__ = ["quest_page_scores", "quest_eval_keys", "quest_group_scores", "quest_append", "quest_static_pages", "QUEST_REDUCE"]

QUEST_REDUCE = {"max": 1, "sum": 2}


@triton.jit(do_not_specialize=["Hkv", "G"])
def _quest_score_kernel(q_ptr, stride_qb, stride_qh, mx_ptr, mn_ptr, stride_mb, stride_mh, stride_mp,
                        out_ptr, len_ptr, Hkv, P, G, D,
                        BLOCK_G: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr,
                        F32: tl.constexpr, REDUCE: tl.constexpr, OPEN_PAGE: tl.constexpr, PER_ROW: tl.constexpr,
                        EVAL: tl.constexpr, KEYS: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    pb = tl.program_id(1)
    b = bh // Hkv
    h = bh % Hkv
    offs_p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    pmask = offs_p < P
    g = tl.arange(0, BLOCK_G)
    gmask = g < G
    dd = tl.arange(0, BLOCK_D)
    dmask = dd < D

    q = tl.load(q_ptr + b * stride_qb + (h * G + g)[:, None] * stride_qh + dd[None, :],
                mask=gmask[:, None] & dmask[None, :], other=0.0).to(tl.float32)
    qp = tl.maximum(q, 0.0)  # exact in the query dtype again below (sign split only)
    qn = tl.minimum(q, 0.0)
    base = b * stride_mb + h * stride_mh + offs_p.to(tl.int64)[:, None] * stride_mp + dd[None, :]
    tmask = pmask[:, None] & dmask[None, :]
    kmax = tl.load(mx_ptr + base, mask=tmask, other=0.0)
    kmin = tl.load(mn_ptr + base, mask=tmask, other=0.0)
    if F32:
        U = tl.dot(qp.to(tl.float32), tl.trans(kmax.to(tl.float32)), input_precision="ieee")
        U += tl.dot(qn.to(tl.float32), tl.trans(kmin.to(tl.float32)), input_precision="ieee")
    else:
        U = tl.dot(qp.to(kmax.dtype), tl.trans(kmax))
        U += tl.dot(qn.to(kmin.dtype), tl.trans(kmin))
    if OPEN_PAGE > 0:  # static decode, n = OPEN_PAGE: the open page is ceil(L / n) - 1
        if PER_ROW:
            len_ptr += b
        last = (tl.load(len_ptr).to(tl.int32) + OPEN_PAGE - 1) // OPEN_PAGE - 1
        if EVAL:  # the eval rule: the pages after the open one score -inf
            U = tl.where(offs_p[None, :] > last, float("-inf"), U)
        else:  # the kernel rule's candidates: the open page and every later one score -inf
            U = tl.where(offs_p[None, :] >= last, float("-inf"), U)
    if REDUCE == 0:
        out = _ranking_keys(U, offs_p[None, :], P) if KEYS else U
        tl.store(out_ptr + (bh * G + g)[:, None] * P + offs_p[None, :], out, mask=gmask[:, None] & pmask[None, :])
    else:
        if REDUCE == 1:
            A = tl.max(tl.where(gmask[:, None], U, float("-inf")), axis=0)
        else:
            A = tl.sum(tl.where(gmask[:, None], U, 0.0), axis=0)
        out = _ranking_keys(A, offs_p, P) if KEYS else A
        tl.store(out_ptr + bh * P + offs_p, out, mask=pmask)


@triton.jit
def _ranking_keys(u, j, n):
    """locks.core.topk.lowest_first_keys of fp32 scores u at positions j of n: (order-preserving bits << 32) +
    (n - 1 - j), so that torch.topk of the keys takes the larger score first and ties to the lower position."""
    bits = tl.where(u == 0.0, 0.0, u).to(tl.int32, bitcast=True)  # -0.0 as +0.0, which it equals
    ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64)
    return (ordered << 32) + (n - 1 - j).to(tl.int64)


def _launch(q: Tensor, kmax: Tensor, kmin: Tensor, reduce: int, block_p: int | None,
            num_warps: int | None, length: Tensor | None = None, page_size: int = 0, eval_rule: bool = False,
            keys: bool = False) -> Tensor:
    if q.dim() != 3 or kmax.dim() != 4 or kmax.shape != kmin.shape:
        raise ValueError(f"expected q [B, Hq, d] and kmax/kmin [B, Hkv, P, d] (got {tuple(q.shape)}, "
                         f"{tuple(kmax.shape)}, {tuple(kmin.shape)})")
    B, Hq, d = q.shape
    Bm, H, P, dm = kmax.shape
    if Bm != B or dm != d or Hq % H:
        raise ValueError(f"q {tuple(q.shape)} does not match metadata {tuple(kmax.shape)}")
    check_device(_quest_score_kernel, q, kmax, kmin)
    G = Hq // H
    if q.stride(-1) != 1:
        q = q.contiguous()
    if kmax.stride() != kmin.stride() or kmax.stride(-1) != 1:
        kmax, kmin = kmax.contiguous(), kmin.contiguous()
    if q.dtype != kmax.dtype and kmax.dtype != torch.float32:
        # mixed precision: score in fp32 on the metadata values (exact upcast)
        q = q.float()
    f32 = dot_in_f32(_quest_score_kernel, q.dtype, kmax.dtype)
    # fp32 operands (IEEE dots) at d = 128 spill with 64-page tiles and 4 warps (results/kernels_compile.md)
    wide_f32 = (d > 64 and not interpreted(_quest_score_kernel)
                and not (q.dtype == kmax.dtype and q.dtype in (torch.bfloat16, torch.float16)))
    block_p = block_p or (32 if wide_f32 else 64)
    num_warps = num_warps or (8 if wide_f32 else 4)
    out = empty(B, Hq if reduce == 0 else H, P, dtype=torch.int64 if keys else torch.float32, device=q.device)
    per_row = False
    if length is not None:
        length, per_row = device_length(length, B)
    if P > 0:
        launch(
            _quest_score_kernel, (B * H, cdiv(P, block_p)),
            q, q.stride(0), q.stride(1), kmax, kmin, kmax.stride(0), kmax.stride(1), kmax.stride(2),
            out, out if length is None else length, H, P, G, d, BLOCK_G=pow2(G, 16), BLOCK_P=block_p,
            BLOCK_D=pow2(d, 16), F32=f32, REDUCE=reduce, OPEN_PAGE=0 if length is None else int(page_size),
            PER_ROW=per_row, EVAL=eval_rule, KEYS=keys, num_warps=num_warps)
    return out


def quest_page_scores(q: Tensor, kmax: Tensor, kmin: Tensor, *, length: Tensor | None = None, page_size: int = 0,
                      block_p: int | None = None, num_warps: int | None = None) -> Tensor:
    """U [B, Hq, P] fp32 per query head; q [B, Hq, d], kmax/kmin [B, Hkv, P, d] (kmax >= kmin). With `length` (a
    device tensor of 1 element, every row's, or B, row b's: static decode) the open page ceil(L / page_size) - 1 and
    every later page score -inf: the candidates of the kernel page rule."""
    if length is not None and page_size <= 0:
        raise ValueError("quest_page_scores: a length needs the page size")
    return _launch(q, kmax, kmin, 0, block_p, num_warps, length, page_size)


def quest_eval_keys(q: Tensor, kmax: Tensor, kmin: Tensor, length: Tensor, page_size: int,
                    reduce: str | None = None) -> Tensor:
    """The static eval rule's ranking keys [B, Hq or Hkv, P] int64: the bounds per query head (reduce None) or their
    max over the group (reduce "max"), the pages after the open one ceil(L / page_size) - 1 at -inf, as
    `locks.core.topk.lowest_first_keys`, so that torch.topk of them is the eval rule's top-k (ties: the lower page)."""
    if reduce not in (None, "max"):
        raise ValueError(f"quest_eval_keys: reduce must be None or 'max' (got {reduce!r})")
    return _launch(q, kmax, kmin, 0 if reduce is None else QUEST_REDUCE[reduce], None, None, length, page_size,
                   eval_rule=True, keys=True)


def quest_group_scores(q: Tensor, kmax: Tensor, kmin: Tensor, reduce: str = "max", *, block_p: int | None = None,
                       num_warps: int | None = None) -> Tensor:
    """[B, Hkv, P] fp32: max or sum over the G query heads of each KV head of `quest_page_scores`."""
    if reduce not in QUEST_REDUCE:
        raise ValueError(f"reduce must be one of {tuple(QUEST_REDUCE)} (got {reduce!r})")
    return _launch(q, kmax, kmin, QUEST_REDUCE[reduce], block_p, num_warps)


@triton.jit(do_not_specialize=["Hkv"])
def _quest_append_kernel(k_ptr, stride_kb, stride_kh, stride_kl, mx_ptr, mn_ptr, stride_mb, stride_mh, stride_mp,
                         len_ptr, Hkv, D, P: tl.constexpr, PER_ROW: tl.constexpr, BLOCK_D: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    b = bh // Hkv
    h = bh % Hkv
    if PER_ROW:
        len_ptr += b
    pos = tl.load(len_ptr).to(tl.int64) - 1
    page = pos // P
    dd = tl.arange(0, BLOCK_D)
    dmask = dd < D
    key = tl.load(k_ptr + b * stride_kb + h * stride_kh + pos * stride_kl + dd, mask=dmask)
    row = b * stride_mb + h * stride_mh + page * stride_mp + dd
    first = pos % P == 0  # a new page starts from its first key
    # compared in fp32 (exact for 16-bit values; the interpreter compares bf16 by bit pattern), stored back exactly
    key = key.to(tl.float32)
    mx = tl.load(mx_ptr + row, mask=dmask).to(tl.float32)
    mn = tl.load(mn_ptr + row, mask=dmask).to(tl.float32)
    out_ty = mx_ptr.dtype.element_ty
    tl.store(mx_ptr + row, tl.where(first, key, tl.maximum(mx, key)).to(out_ty), mask=dmask)
    tl.store(mn_ptr + row, tl.where(first, key, tl.minimum(mn, key)).to(out_ty), mask=dmask)


def quest_append(keys: Tensor, kmax: Tensor, kmin: Tensor, length: Tensor, page_size: int) -> None:
    """Fold the key at slot length - 1 of keys [B, Hkv, L, d] into its page's kmax/kmin [B, Hkv, P, d] in place (the
    page restarts from it when it is the page's first key); length is a device tensor (static decode) of 1 element
    (every row) or B (row b folds its key at slot length[b] - 1). Oracle: `QuestSelector._append_static_reference`."""
    check_device(_quest_append_kernel, keys, kmax, kmin, length)
    B, H, _, d = keys.shape
    length, per_row = device_length(length, B)
    if keys.stride(-1) != 1 or kmax.stride(-1) != 1 or kmax.stride() != kmin.stride() or kmax.dtype != keys.dtype:
        raise ValueError("quest_append needs unit-stride rows and metadata of the keys' dtype and layout")
    launch(_quest_append_kernel, (B * H,), keys, keys.stride(0), keys.stride(1), keys.stride(2), kmax, kmin,
           kmax.stride(0), kmax.stride(1), kmax.stride(2), length, H, d, P=page_size, PER_ROW=per_row,
           BLOCK_D=pow2(d, 16), num_warps=1)


@triton.jit(do_not_specialize=["Hkv", "S", "KT", "page_budget"])
def _quest_pages_kernel(top_ptr, len_ptr, pages_ptr, att_ptr, flat_ptr, Hkv, S, KT, page_budget,
                        N: tl.constexpr, COUNT: tl.constexpr, PER_ROW: tl.constexpr, BLOCK_S: tl.constexpr,
                        BLOCK_K: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)  # b * Hkv + h
    if PER_ROW:
        len_ptr += r // Hkv
    L = tl.load(len_ptr).to(tl.int64)
    last = (L + N - 1) // N - 1  # the open page
    s = tl.arange(0, BLOCK_S)[:, None]
    k = tl.arange(0, BLOCK_K)[None, :]
    used = (s < S) & (k <= KT)
    big = tl.full([BLOCK_S, BLOCK_K], 2**62, dtype=tl.int64)  # sorts after every page id
    top = tl.load(top_ptr + (r * S + s) * KT + k, mask=(s < S) & (k < KT), other=2**62).to(tl.int64)
    top = tl.sort(top, dim=1)  # ascending; slot KT onwards holds the padding
    page = tl.where(k < KT, top, last)
    page = tl.where(last < page_budget, k.to(tl.int64) + tl.zeros_like(page), page)  # everything fits: 0 .. budget - 1
    tl.store(pages_ptr + (r * S + s) * (KT + 1) + k, page, mask=used)
    if COUNT:  # tokens read for this KV head: the union of its S page sets, sum of min(n, L - j n) over distinct j
        flat = tl.sort(tl.reshape(tl.where(used, page, big), [BLOCK_S * BLOCK_K]), dim=0)
        i = tl.arange(0, BLOCK_S * BLOCK_K)
        tl.store(flat_ptr + r * BLOCK_S * BLOCK_K + i, flat)
        tl.debug_barrier()
        prev = tl.load(flat_ptr + r * BLOCK_S * BLOCK_K + i - 1, mask=i > 0, other=-1)
        tokens = tl.minimum(tl.maximum(L - flat * N, 0), N)
        new = (flat != prev) & (flat < 2**62)
        tl.store(att_ptr + r, tl.sum(tl.where(new, tokens, 0), axis=0).to(tl.float64))


def quest_static_pages(top: Tensor, length: Tensor, page_size: int, page_budget: int,
                       count: bool) -> tuple[Tensor, Tensor | None]:
    """The page list of a static Quest step (kernel rule) from the top candidates of each set, top [B, Hkv, S, Kt]
    (torch.topk of the masked bounds, Kt = page_budget - 1), in one launch: per set the Kt pages ascending, then the
    open page ceil(L / n) - 1, or pages 0 .. page_budget - 1 while the open page is below page_budget -> (pages
    [B, Hkv, S, Kt + 1] int64, with `count` the distinct tokens each KV head reads over its S sets [B, Hkv] fp64).
    length: a device tensor of 1 element (every row's L) or B (row b's). Oracle: the torch branch of
    `QuestSelector.select_static` and `locks.core.reference.paged_attended`."""
    check_device(_quest_pages_kernel, top, length)
    B, H, S, KT = top.shape
    length, per_row = device_length(length, B)
    if KT + 1 != page_budget:
        raise ValueError(f"quest_static_pages: {KT} top pages for a page budget of {page_budget}")
    top = top.contiguous()
    pages = torch.empty(B, H, S, KT + 1, dtype=torch.int64, device=top.device)
    block_s, block_k = pow2(S, 2), pow2(KT + 1, 2)  # tl.sort sorts along dimensions of 2 or more
    attended = empty(B, H, dtype=torch.float64, device=top.device) if count else None
    flat = torch.empty(B * H * block_s * block_k if count else 1, dtype=torch.int64, device=top.device)
    launch(_quest_pages_kernel, (B * H,), top, length, pages, attended if count else flat, flat, H, S, KT,
           page_budget, N=page_size, COUNT=count, PER_ROW=per_row, BLOCK_S=block_s, BLOCK_K=block_k, num_warps=4)
    return pages, attended
