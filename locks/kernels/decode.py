"""Split-K flash-decoding over a selected token / page list, or over all tokens (FullKV).

Oracle: `locks.core.reference.sparse_decode` (gather + fp32 softmax). One query token per sequence.

`_decode_split_kernel` -- grid (B * Hkv * Gs, num_splits). A program owns one "row group": the G query heads of a
KV head when the selection is shared by the group (Gs = 1; the heads are padded to 16 rows and every K/V tile is
loaded once for all of them: one tensor-core dot for the logits, one for P @ V), or a single query head when each
head has its own list (Gs = G; same code with one valid row). It walks `tokens_per_split` consecutive entries of
the list in tiles of BLOCK_N tokens with the online softmax (fp32 running max m, sum l, accumulator acc) and writes
(m, l, acc) for its split. Three ways to name the tokens (constexpr MODE):
    0 tokens  `Selection.indices` [B, Hkv, Gs, K] int64 + `valid` (bool): 8 + 1 index bytes per token;
    1 pages   page ids [B, Hkv, Gs, Kp] (+ optional page validity): token t of the list is
              pages[t // page_size] * page_size + t % page_size, valid iff its page is valid and the token is
              < length (so the partial last page is just another page id); ~9/page_size index bytes per token;
    2 contig  all tokens [0, length): no index loads (FullKV decode).
Invalid entries are never loaded and contribute nothing (logit -inf). The list length K is fixed per call, so a
CUDA graph can replay it; indices are clamped to [0, L - 1] like the reference. The valid `length` (pages, contig)
may be a device tensor instead of an int: the kernel reads it, so a graph captured over a preallocated cache of L
slots replays with the current length (contig then walks the L slots and skips the tiles past length). It has one
element (every row) or B (constexpr PER_ROW: row b reads length[b], so rows of different lengths decode together).
`_combine_kernel` -- grid (B * Hq): merges the splits of one query head, out = sum_s e^{m_s - M} acc_s / L,
lse = M + log L with L = sum_s e^{m_s - M} l_s; writes out in the query dtype and lse in fp32. A head with no valid
token gets out = 0 and lse = -inf (the reference gives NaN there).

Bytes per step and KV head: 2 * d * s per attended token (K and V rows, s = element size), the index bytes above,
the G queries (G * d * s) and the partials (num_splits * G * (d + 2) * 4 written and read again; e.g. 64 splits of
a 2048-token list at G = 4: 132 KB, against 1 MB of K/V).
Numerics: with 16-bit q/K/V the logits are exact-product fp32-accumulated tensor-core dots; for P @ V the fp32
probabilities are split into P_hi = bf16(P) and P_lo = bf16(P - P_hi) and both are multiplied by V (two 16-bit
dots; flash attention rounds P to 16 bits once, a ~2^-9 relative error that used half of the 1e-2 bf16 tolerance).
The extra dot costs tensor-core time only, which a memory-bound decode has to spare. With fp32 inputs all dots are
IEEE fp32 (never TF32).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from locks.kernels._common import (
    cdiv,
    check_device,
    dot_in_f32,
    empty,
    interpreted,
    launch,
    num_sms,
    pow2,
    resident_blocks,
)

__all__ = ["sparse_decode", "paged_decode", "full_decode", "decode_splits"]

_TOKENS, _PAGES, _CONTIG = 0, 1, 2
# Scalar arguments that only bound loops and masks: not specialized on their value (no recompile when a decode
# length crosses a multiple of 16 or a list has one split; docs/kernels.md). Strides stay specialized (alignment).
_COUNTS_DECODE = ["Hkv", "GS", "NG", "K", "length", "L", "NSPLIT"]


@triton.jit(do_not_specialize=_COUNTS_DECODE)
def _decode_split_kernel(
    q_ptr, stride_qb, stride_qh,
    k_ptr, stride_kb, stride_kh, stride_kl,
    v_ptr, stride_vb, stride_vh, stride_vl,
    idx_ptr, val_ptr, stride_ir,
    acc_ptr, m_ptr, l_ptr, len_ptr,
    Hkv, GS, NG, D, K, length, L, TPS, NSPLIT, scaling,
    MODE: tl.constexpr, PAGE: tl.constexpr, HAS_VALID: tl.constexpr, LENGTH_PTR: tl.constexpr, PER_ROW: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, F32: tl.constexpr, SPLIT_P: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)  # ((b * Hkv + h) * GS + sub)
    sp = tl.program_id(1)
    bkv = r // GS
    b = bkv // Hkv
    if LENGTH_PTR:  # the valid length lives on the device (static decode: a captured graph replays it per step)
        if PER_ROW:
            len_ptr += b
        length = tl.load(len_ptr).to(tl.int32)
    h = bkv % Hkv
    sub = r % GS
    g = tl.arange(0, BLOCK_G)
    gmask = g < NG
    dd = tl.arange(0, BLOCK_D)
    dmask = dd < D

    q = tl.load(q_ptr + b * stride_qb + (h * GS * NG + sub * NG + g)[:, None] * stride_qh + dd[None, :],
                mask=gmask[:, None] & dmask[None, :], other=0.0)
    if F32:
        q = q.to(tl.float32)
    k_base = k_ptr + b * stride_kb + h * stride_kh
    v_base = v_ptr + b * stride_vb + h * stride_vh

    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    start0 = sp * TPS
    end = tl.minimum(start0 + TPS, K)
    if MODE == 2:
        end = tl.minimum(end, length)  # contiguous tokens: nothing at or past `length` is read
    for start in range(start0, end, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        nmask = offs < end
        if MODE == 0:
            tok = tl.load(idx_ptr + r * stride_ir + offs, mask=nmask, other=0)
            tok = tl.minimum(tl.maximum(tok, 0), L - 1)
            ok = nmask
            if HAS_VALID:
                ok = ok & (tl.load(val_ptr + r * stride_ir + offs, mask=nmask, other=0) != 0)
        elif MODE == 1:
            pg = tl.load(idx_ptr + r * stride_ir + offs // PAGE, mask=nmask, other=0).to(tl.int64)
            tok = pg * PAGE + offs % PAGE
            ok = nmask & (tok >= 0) & (tok < length)
            if HAS_VALID:
                ok = ok & (tl.load(val_ptr + r * stride_ir + offs // PAGE, mask=nmask, other=0) != 0)
            tok = tl.minimum(tl.maximum(tok, 0), L - 1)
        else:
            tok = offs.to(tl.int64)
            ok = nmask & (offs < length)
        kv_mask = ok[:, None] & dmask[None, :]
        kt = tl.load(k_base + tok[:, None] * stride_kl + dd[None, :], mask=kv_mask, other=0.0)
        if F32:
            s = tl.dot(q, tl.trans(kt.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(kt))
        s = tl.where(ok[None, :], s * scaling, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - safe)
        p = tl.exp(s - safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        vt = tl.load(v_base + tok[:, None] * stride_vl + dd[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None]
        if SPLIT_P:  # 16-bit values: P = P_hi + P_lo, two 16-bit dots keep P at ~2^-16 relative error
            p_hi = p.to(vt.dtype)
            p_lo = (p - p_hi.to(tl.float32)).to(vt.dtype)
            if F32:
                vf = vt.to(tl.float32)
                acc += tl.dot(p_hi.to(tl.float32), vf, input_precision="ieee")
                acc += tl.dot(p_lo.to(tl.float32), vf, input_precision="ieee")
            else:
                acc += tl.dot(p_hi, vt)
                acc += tl.dot(p_lo, vt)
        else:
            acc += tl.dot(p, vt.to(tl.float32), input_precision="ieee")
        m_i = m_new

    row = (r * NSPLIT + sp) * NG + g
    tl.store(acc_ptr + row[:, None] * D + dd[None, :], acc, mask=gmask[:, None] & dmask[None, :])
    tl.store(m_ptr + row, m_i, mask=gmask)
    tl.store(l_ptr + row, l_i, mask=gmask)


@triton.jit(do_not_specialize=["NG", "NSPLIT"])
def _combine_kernel(acc_ptr, m_ptr, l_ptr, out_ptr, lse_ptr, NG, D, NSPLIT,
                    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # b * Hq + query head
    r = row // NG
    gi = row % NG
    dd = tl.arange(0, BLOCK_D)
    dmask = dd < D
    Mv = tl.full([BLOCK_S], float("-inf"), dtype=tl.float32)
    for s0 in range(0, NSPLIT, BLOCK_S):
        offs = s0 + tl.arange(0, BLOCK_S)
        m = tl.load(m_ptr + (r * NSPLIT + offs) * NG + gi, mask=offs < NSPLIT, other=float("-inf"))
        Mv = tl.maximum(Mv, m)
    M = tl.max(Mv, axis=0)
    safe = tl.where(M == float("-inf"), 0.0, M)
    Lv = tl.zeros([BLOCK_S], dtype=tl.float32)
    o = tl.zeros([BLOCK_D], dtype=tl.float32)
    for s0 in range(0, NSPLIT, BLOCK_S):
        offs = s0 + tl.arange(0, BLOCK_S)
        smask = offs < NSPLIT
        rows = (r * NSPLIT + offs) * NG + gi
        m = tl.load(m_ptr + rows, mask=smask, other=float("-inf"))
        l = tl.load(l_ptr + rows, mask=smask, other=0.0)
        w = tl.exp(m - safe)
        Lv += w * l
        a = tl.load(acc_ptr + rows[:, None] * D + dd[None, :], mask=smask[:, None] & dmask[None, :], other=0.0)
        o += tl.sum(w[:, None] * a, axis=0)
    Ls = tl.sum(Lv, axis=0)
    pos = Ls > 0
    out = tl.where(pos, o / tl.where(pos, Ls, 1.0), 0.0)
    tl.store(out_ptr + row * D + dd, out.to(out_ptr.dtype.element_ty), mask=dmask)
    tl.store(lse_ptr + row, tl.where(pos, safe + tl.log(tl.where(pos, Ls, 1.0)), float("-inf")))


# ---------------------------------------------------------------------------------------------------------------


def decode_splits(rows: int, K: int, block_n: int, device: torch.device, num_splits: int | None = None,
                  max_splits: int = 256, resident: int = 4) -> tuple[int, int]:
    """(num_splits, tokens_per_split): one wave -- rows * num_splits <= SMs * `resident` (blocks of the kernel
    configuration that fit on an SM at once) -- of splits of whole BLOCK_N tiles. More programs than resident slots
    would run as a second, partly empty wave (docs/kernels.md)."""
    tiles = max(1, cdiv(K, block_n))
    if num_splits is None:
        num_splits = (num_sms(device) * max(1, resident)) // max(1, rows)
    num_splits = max(1, min(int(num_splits), tiles, max_splits))
    tps = cdiv(tiles, num_splits) * block_n
    return max(1, cdiv(K, tps)), tps


def _check_kv(query: Tensor, keys: Tensor, values: Tensor):
    if query.dim() != 3 or keys.dim() != 4 or values.shape != keys.shape:
        raise ValueError(f"expected query [B, Hq, d] and keys/values [B, Hkv, L, d] (got {tuple(query.shape)}, "
                         f"{tuple(keys.shape)}, {tuple(values.shape)})")
    B, Hq, d = query.shape
    if keys.shape[0] != B or keys.shape[3] != d or Hq % keys.shape[1]:
        raise ValueError(f"query {tuple(query.shape)} does not match keys {tuple(keys.shape)}")
    check_device(_decode_split_kernel, query, keys, values)
    if query.stride(-1) != 1:
        query = query.contiguous()
    if keys.stride(-1) != 1:
        keys = keys.contiguous()
    if values.stride(-1) != 1:
        values = values.contiguous()
    return query, keys, values


def _run(query, keys, values, scaling, mode, idx, valid, gs, K, length, page, num_splits, block_n, num_warps):
    B, Hq, d = query.shape
    Hkv, L = keys.shape[1], keys.shape[2]
    G = Hq // Hkv
    ng = G // gs
    dev = query.device
    f32 = dot_in_f32(_decode_split_kernel, query.dtype, keys.dtype, values.dtype) or not (
        query.dtype == keys.dtype == values.dtype)
    # fp32 operands (IEEE dots, no tensor cores) at d = 128 spill with 64-token tiles and 4 warps (kernels_compile.md;
    # registers do not exist under the interpreter, where smaller tiles only cost time)
    wide_f32 = (d > 64 and not interpreted(_decode_split_kernel)
                and not all(t.dtype in (torch.bfloat16, torch.float16) for t in (query, keys, values)))
    block_n = block_n or (32 if wide_f32 else 64)
    num_warps = num_warps or (8 if wide_f32 else 4)
    rows = B * Hkv * gs
    # The interpreter's fp32 -> bf16 cast truncates (triton 3.9 cast_impl); there the kernel stores fp32 and torch
    # rounds to nearest even, as the GPU's store does.
    out_dtype = torch.float32 if interpreted(_combine_kernel) else query.dtype
    out = empty(B, Hq, d, dtype=out_dtype, device=dev)
    lse = empty(B, Hq, dtype=torch.float32, device=dev)
    stride_ir = idx.shape[-1] if idx is not None else 0
    length_ptr = isinstance(length, Tensor)
    meta = dict(MODE=mode, PAGE=page, HAS_VALID=valid is not None, LENGTH_PTR=length_ptr,
                PER_ROW=length_ptr and length.numel() > 1,
                BLOCK_G=pow2(ng, 16), BLOCK_N=block_n, BLOCK_D=pow2(d, 16), F32=f32,
                SPLIT_P=values.dtype in (torch.bfloat16, torch.float16), num_warps=num_warps)

    def args(ns, tps, acc, m, l):  # absent idx / valid / length point at m: their constexpr flags are off
        return (query, query.stride(0), query.stride(1),
                keys, keys.stride(0), keys.stride(1), keys.stride(2),
                values, values.stride(0), values.stride(1), values.stride(2),
                idx if idx is not None else m, valid if valid is not None else m, stride_ir,
                acc, m, l, length if length_ptr else m,
                Hkv, gs, ng, d, K, 0 if length_ptr else length, max(L, 1), tps, ns, float(scaling))

    resident = 1
    if num_splits is None:  # one wave of this configuration's resident blocks (the split count is not specialized)
        resident = resident_blocks(_decode_split_kernel, args(2, block_n, lse, lse, lse), meta, dev)
    ns, tps = decode_splits(rows, K, block_n, dev, num_splits, resident=resident)
    acc = empty(rows * ns * ng, d, dtype=torch.float32, device=dev)
    m = empty(rows * ns * ng, dtype=torch.float32, device=dev)
    l = empty(rows * ns * ng, dtype=torch.float32, device=dev)
    launch(_decode_split_kernel, (rows, ns), *args(ns, tps, acc, m, l), **meta)
    launch(_combine_kernel, (B * Hq,), acc, m, l, out, lse, ng, d, ns, BLOCK_S=32, BLOCK_D=pow2(d, 16),
           num_warps=4)
    return out.to(query.dtype), lse


def _list_args(indices: Tensor, valid: Tensor | None, B: int, Hkv: int, G: int, what: str):
    if indices.dim() == 3:
        indices = indices.unsqueeze(2)
        valid = valid.unsqueeze(2) if valid is not None else None
    if indices.dim() != 4 or indices.shape[:2] != (B, Hkv) or indices.shape[2] not in (1, G):
        raise ValueError(f"{what} must be [B, Hkv, Gs, K] with Gs in (1, {G}) (got {tuple(indices.shape)})")
    if valid is not None and valid.shape != indices.shape:
        raise ValueError(f"valid {tuple(valid.shape)} must have the shape of {what} {tuple(indices.shape)}")
    idx = indices.contiguous()
    if valid is not None:
        valid = valid.contiguous()
        if valid.dtype == torch.bool:
            valid = valid.view(torch.uint8)
    return idx, valid, indices.shape[2], indices.shape[3]


def sparse_decode(query: Tensor, keys: Tensor, values: Tensor, indices: Tensor, valid: Tensor | None, scaling: float,
                  *, num_splits: int | None = None, block_n: int | None = None,
                  num_warps: int | None = None) -> tuple[Tensor, Tensor]:
    """(out [B, Hq, d] in query dtype, lse [B, Hq] fp32) == `locks.core.reference.sparse_decode` of the same token
    list: indices [B, Hkv, Gs, K] (Gs = 1 shared by the group or G per query head), valid (bool, same shape) masks
    entries out (None: all valid)."""
    query, keys, values = _check_kv(query, keys, values)
    B, Hq, d = query.shape
    Hkv = keys.shape[1]
    idx, valid, gs, K = _list_args(indices, valid, B, Hkv, Hq // Hkv, "indices")
    if idx.dtype not in (torch.int64, torch.int32):
        idx = idx.long()
    return _run(query, keys, values, scaling, _TOKENS, idx, valid, gs, K, keys.shape[2], 1, num_splits, block_n,
                num_warps)


def paged_decode(query: Tensor, keys: Tensor, values: Tensor, pages: Tensor, scaling: float,
                 page_valid: Tensor | None = None, page_size: int = 16, length: int | Tensor | None = None, *,
                 num_splits: int | None = None, block_n: int | None = None, num_warps: int | None = None):
    """Same as `sparse_decode` with the selection given as page ids: pages [B, Hkv, Kp] or [B, Hkv, Gs, Kp]
    (int32/int64), page_valid of the same shape (bool) or None. Page j covers tokens [j*page_size, (j+1)*page_size)
    truncated at `length` (default: all cached tokens), so the partial last page is simply its page id. `length`: an
    int, or a device int tensor of 1 element (every row) or B (row b's length[b]), each <= the cache's slots."""
    query, keys, values = _check_kv(query, keys, values)
    B, Hq, d = query.shape
    Hkv, L = keys.shape[1], keys.shape[2]
    idx, valid, gs, Kp = _list_args(pages, page_valid, B, Hkv, Hq // Hkv, "pages")
    if idx.dtype not in (torch.int64, torch.int32):
        idx = idx.long()
    length = _length_arg(length, L, B)
    return _run(query, keys, values, scaling, _PAGES, idx, valid, gs, Kp * page_size, length, page_size, num_splits,
                block_n, num_warps)


def full_decode(query: Tensor, keys: Tensor, values: Tensor, scaling: float, length: int | Tensor | None = None, *,
                num_splits: int | None = None, block_n: int | None = None, num_warps: int | None = None):
    """FullKV decode with the same kernel: attention of each query head over tokens [0, length) (default: all),
    contiguous (no index loads); `length` as in `paged_decode` (per row: row b attends [0, length[b])). Returns
    (out [B, Hq, d] in query dtype, lse [B, Hq] fp32)."""
    query, keys, values = _check_kv(query, keys, values)
    L = keys.shape[2]
    length = _length_arg(length, L, query.shape[0])
    K = L if isinstance(length, Tensor) else length
    return _run(query, keys, values, scaling, _CONTIG, None, None, 1, K, length, 1, num_splits, block_n, num_warps)


def device_length(length: Tensor, B: int) -> tuple[Tensor, bool]:
    """A static step's device length -> (flat tensor the kernels read, per row): [1] is every row's length, [B]
    (any shape of B elements, B > 1) row b's length[b]."""
    n = length.numel()
    if n != 1 and n != B:
        raise ValueError(f"length must have 1 or B = {B} elements (got shape {tuple(length.shape)})")
    return length.reshape(n).contiguous(), n > 1


def _length_arg(length, L: int, B: int):
    """None -> L; an int -> min(length, L); a device int tensor of 1 or B elements stays a tensor (read by the
    kernel, so a captured CUDA graph replays with the current length; every length must be <= L)."""
    if isinstance(length, Tensor):
        return device_length(length, B)[0]
    return L if length is None else min(int(length), L)
