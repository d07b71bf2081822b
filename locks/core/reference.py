"""The PyTorch reference decode: exact attention of one query token over a selected token list, and the token
counts of a selection. The fused Triton kernels (locks/kernels/decode.py) are tested against it.
"""
from __future__ import annotations

import torch
from torch import Tensor

from locks.core.paging import pages_to_tokens
from locks.core.selector import Selection, row_length


def gather_tokens(x: Tensor, indices: Tensor) -> Tensor:
    """x [B, Hkv, L, d], indices [B, Hkv, Gs, K] -> [B, Hkv, Gs, K, d] (no copy of x per query head).

    When x is a prefix along the token axis of a row-major [B, Hkv, C, d] buffer (the cache's layout, C >= L), its
    rows are picked by one index_select at row (b * Hkv + h) * C + i of that buffer: the same values as a gather
    along the token axis, 2-6x faster on CPU, and no copy of the cache. Any other layout gathers."""
    B, H, Gs, K = indices.shape
    L, d = x.shape[2], x.shape[-1]
    rows_per_head = x.stride(1) // d if d else 0
    if (x.stride(-1) == 1 and x.stride(2) == d and x.stride(1) == rows_per_head * d and rows_per_head >= L
            and x.stride(0) == H * x.stride(1) and B * H * L > 0):
        rows = x.as_strided(((B * H - 1) * rows_per_head + L, d), (d, 1))
        offset = torch.arange(B * H, device=indices.device).view(B, H, 1, 1) * rows_per_head
        return rows.index_select(0, (indices + offset).reshape(-1)).view(B, H, Gs, K, d)
    flat = indices.reshape(B, H, Gs * K, 1).expand(B, H, Gs * K, d)
    return torch.gather(x, 2, flat).view(B, H, Gs, K, d)


def take_rows(x: Tensor, idx: Tensor) -> Tensor:
    """x [B, H, L, c], idx [B, H, n] -> x[b, h, idx[b, h]] [B, H, n, c] (gather_tokens' index_select path when x is
    a row-major buffer or a prefix of one)."""
    return gather_tokens(x, idx.unsqueeze(2)).squeeze(2)


def sparse_decode(query: Tensor, keys: Tensor, values: Tensor, sel: Selection, scaling: float) -> tuple[Tensor, Tensor]:
    """Exact attention of one query token over the selected tokens.

    query [B, Hq, d]; keys/values [B, Hkv, L, d]; returns (out [B, Hq, d] in query dtype, lse [B, Hq] fp32) with
    lse_g = logsumexp_{i in T_g} scaling * q_g . k_i (+ the selection's logit_bias_i, where it has one).
    """
    B, Hq, d = query.shape
    Hkv = keys.shape[1]
    G = Hq // Hkv
    idx = sel.indices
    Gs = idx.shape[2]
    one_list = all(stride == 0 or size == 1 for stride, size in zip(idx.stride()[:3], idx.shape[:3]))
    if sel.keys is None and sel.values is None and sel.all_slots:  # slots 0 .. K-1: the cache itself, no copy
        K = idx.shape[-1]
        k, v = keys[:, :, :K].unsqueeze(2), values[:, :, :K].unsqueeze(2)
        Gs = 1
    elif sel.keys is None and sel.values is None and one_list:  # one token list for every row and head
        shared = idx[0, 0, 0].clamp(0, keys.shape[2] - 1)
        k, v = keys.index_select(2, shared).unsqueeze(2), values.index_select(2, shared).unsqueeze(2)
        Gs = 1
    else:
        idx = idx.clamp(0, keys.shape[2] - 1)
        k = sel.keys if sel.keys is not None else gather_tokens(keys, idx)
        v = sel.values if sel.values is not None else gather_tokens(values, idx)
    q = query.view(B, Hkv, G, d).float()
    if Gs == 1:
        logits = torch.einsum("bhgd,bhkd->bhgk", q, k[:, :, 0].float())
    else:
        logits = torch.einsum("bhgd,bhgkd->bhgk", q, k.float())
    logits = logits * scaling
    if sel.logit_bias is not None:
        logits = logits + sel.logit_bias.expand_as(logits)
    logits = logits.masked_fill(~sel.valid, float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)
    p = torch.exp(logits - lse.unsqueeze(-1))
    if Gs == 1:
        out = torch.einsum("bhgk,bhkd->bhgd", p, v[:, :, 0].float())
    else:
        out = torch.einsum("bhgk,bhgkd->bhgd", p, v.float())
    return out.reshape(B, Hq, d).to(query.dtype), lse.reshape(B, Hq)


def grouped_logits(query: Tensor, keys: Tensor) -> Tensor:
    """q_g . k_i in fp32 for query [B, Hq, d] and keys [B, Hkv, L, d] -> [B, Hkv, G, L] (query head g reads KV head
    g // G; unscaled), without repeating the keys per query head."""
    B, Hq, d = query.shape
    Hkv = keys.shape[1]
    return torch.einsum("bhgd,bhld->bhgl", query.view(B, Hkv, Hq // Hkv, d).float(), keys.float())


def dense_lse(query: Tensor, keys: Tensor, scaling: float, alive: Tensor | None = None) -> Tensor:
    """logsumexp over all (alive) cached tokens per query head: [B, Hq]."""
    B, Hq, _ = query.shape
    logits = grouped_logits(query, keys) * scaling
    if alive is not None:
        logits = logits.masked_fill(~alive[:, :, None, :], float("-inf"))
    return torch.logsumexp(logits, dim=-1).reshape(B, Hq)


def attended_per_kv_head(sel: Selection, length: int) -> Tensor:
    """Distinct tokens whose K/V are read, per (batch, KV head): the union over the group when Gs > 1."""
    if sel.indices.shape[2] == 1:
        return sel.valid[:, :, 0].sum(-1).float()
    B, H, Gs, K = sel.indices.shape
    # amax, not a plain scatter: an index may appear both valid and as masked padding (token 0), in any order
    read = torch.zeros(B, H, length, dtype=torch.int32, device=sel.indices.device)
    read.scatter_reduce_(2, sel.indices.clamp(0, length - 1).reshape(B, H, Gs * K),
                         sel.valid.reshape(B, H, Gs * K).to(torch.int32), reduce="amax")
    return read.sum(-1).float()


def attended_mean(sel: Selection, length: Tensor, capacity: int) -> Tensor:
    """[B] each row's distinct attended tokens per KV head, averaged over its KV heads, in a (non-dense) static
    Selection: the selector's own count where its kernel made one (`attended_rows`, in its own dtype), else a page
    list's or a token list's union over the group (float64)."""
    if sel.attended_rows is not None:
        return sel.attended_rows.mean(-1)
    if sel.pages is not None:
        return paged_attended(sel, length, capacity).mean(-1).to(torch.float64)
    return attended_per_kv_head(sel, capacity).mean(-1).to(torch.float64)


def paged_tokens(sel: Selection, length: Tensor, capacity: int) -> tuple[Tensor, Tensor]:
    """A paged Selection as token indices [B, Hkv, Gs, Kp * n] (clamped to the cache) and their validity: the page
    is valid and the token is below the device length."""
    tokens = pages_to_tokens(sel.pages.long(), sel.page_size)
    valid = tokens < row_length(length, 4)
    if sel.page_valid is not None:
        valid = valid & sel.page_valid.repeat_interleave(sel.page_size, dim=-1)
    return tokens.clamp(0, capacity - 1), valid


def paged_attended(sel: Selection, length: Tensor, capacity: int) -> Tensor:
    """Distinct tokens read per (batch, KV head) by a paged Selection (union over the group), at page granularity:
    sum over the pages read of min(n, max(0, L - j n))."""
    n = sel.page_size
    B, H = sel.pages.shape[:2]
    P = capacity // n + 1  # every page id a selection can name, the one just past a full cache included
    read = torch.zeros(B, H, P, dtype=torch.int32, device=sel.pages.device)
    valid = torch.ones_like(sel.pages, dtype=torch.int32) if sel.page_valid is None else sel.page_valid.to(torch.int32)
    read.scatter_reduce_(2, sel.pages.long().clamp(0, P - 1).reshape(B, H, -1), valid.reshape(B, H, -1), reduce="amax")
    page_tokens = (row_length(length, 3) - torch.arange(P, device=read.device) * n).clamp(0, n)
    return (read * page_tokens).sum(-1).float()


def add_sinks(out: Tensor, lse: Tensor, sinks: Tensor | None) -> tuple[Tensor, Tensor]:
    """Attention sinks (GPT-OSS's `s_aux`, one learned logit s_h per query head) in the softmax denominator of an
    attention over some tokens, from that attention's out [B, Hq, d] and lse [B, Hq] (fp32):
        lse' = log(exp(lse) + exp(s_h)),   out' = out * exp(lse - lse')
    exact for any token set (the sink has no value), so it applies after any kernel. sinks None: unchanged."""
    if sinks is None:
        return out, lse
    total = lse_with_sinks(lse, sinks)
    return (out.float() * torch.exp(lse - total).unsqueeze(-1)).to(out.dtype), total


def lse_with_sinks(lse: Tensor, sinks: Tensor | None) -> Tensor:
    """log(exp(lse) + exp(s_h)) per query head for lse [B, Hq]; sinks None: lse."""
    return lse if sinks is None else torch.logaddexp(lse, sinks.float().view(1, -1).expand_as(lse))


def dense_attention(query: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None, scaling: float,
                    sinks: Tensor | None = None, causal: bool = False) -> tuple[Tensor, Tensor]:
    """Exact attention of query [B, Hq, q, d] over keys/values [B, Hkv, L, d] in fp32 with an optional boolean
    mask [B or 1, 1, q, L] (True: attend) or, without one, a causal mask when `causal` -> (out [B, q, Hq, d] in the
    query's dtype, lse [B, Hq, q] fp32, sinks included). Query rows go in chunks that bound the fp32 logits to about
    64 MB on CPU (1 GB on GPU): the path of layers with attention sinks, which SDPA cannot take."""
    B, Hq, q, d = query.shape
    Hkv, L = keys.shape[1], keys.shape[2]
    G = Hq // Hkv
    k, v = keys.float(), values.float()
    budget = (1 << 24) if query.device.type == "cpu" else (1 << 28)
    step = max(1, budget // max(1, B * Hq * L))
    outs, lses = [], []
    for start in range(0, q, step):
        stop = min(q, start + step)
        qc = query[:, :, start:stop].float().view(B, Hkv, G, stop - start, d)
        logits = torch.einsum("bhgqd,bhld->bhgql", qc, k) * scaling
        if mask is not None:
            m = mask[:, :, start:stop].view(mask.shape[0], 1, 1, stop - start, L)
            logits = logits.masked_fill(~m, float("-inf"))
        elif causal:
            rows = torch.arange(start, stop, device=query.device).view(-1, 1) + (L - q)
            logits = logits.masked_fill(torch.arange(L, device=query.device) > rows, float("-inf"))
        lse = torch.logsumexp(logits, dim=-1)
        if sinks is not None:
            lse = torch.logaddexp(lse, sinks.float().view(1, Hkv, G, 1))
        p = torch.exp(logits - lse.unsqueeze(-1))
        outs.append(torch.einsum("bhgql,bhld->bhgqd", p, v).reshape(B, Hq, stop - start, d))
        lses.append(lse.reshape(B, Hq, stop - start))
    return torch.cat(outs, dim=2).transpose(1, 2).to(query.dtype), torch.cat(lses, dim=2)
