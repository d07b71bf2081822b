"""Top-k over per-set scores, as every selector ranks its units (pages, chunks, tokens): the GQA sets and the k best
units of each set in index order."""
from __future__ import annotations

import torch
from torch import Tensor


def head_sets(scores: Tensor, per_head: bool, reduce: str = "max") -> Tensor:
    """[B, Hkv, G, n] scores per query head -> one set per query head (unchanged) or one per KV head [B, Hkv, 1, n]:
    the max over the group, or the sum over it sorted first (so that it does not depend on the heads' order)."""
    if per_head:
        return scores
    if reduce == "max":
        return scores.amax(2, keepdim=True)
    return scores.sort(dim=2).values.sum(2, keepdim=True)


def top_units_lowest_first(scores: Tensor, k: int) -> Tensor:
    """What `top_units(scores, k, stable=True)` selects (exact ties to the lower index), by one top-k over int64
    keys instead of a sort of every unit, so a static step can run it."""
    return top_of_keys(lowest_first_keys(scores), k)


def lowest_first_keys(scores: Tensor) -> Tensor:
    """key_i = (the fp32 score's order-preserving bits << 32) + (n - 1 - i): larger score first, ties to lower i."""
    bits = (scores.float() + 0.0).view(torch.int32)  # + 0.0: -0.0 becomes +0.0, which it equals
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(torch.int64)  # negative floats: reverse the order
    n = scores.shape[-1]
    return (ordered << 32) + (n - 1 - torch.arange(n, device=scores.device))


def top_of_keys(keys: Tensor, k: int) -> Tensor:
    """The k largest int64 keys' positions along the last axis, in increasing order."""
    return torch.topk(keys, k, dim=-1).indices.sort(dim=-1).values


def top_units(scores: Tensor, k: int, stable: bool = False) -> Tensor:
    """The k best units of each set along the last axis, in increasing index order. `stable`: ties go to the lower
    index (a full stable sort: a larger k then always selects a superset); else torch.topk, whose order among
    exactly equal scores is its implementation's (no full sort inside a static step)."""
    if stable:
        top = scores.sort(dim=-1, descending=True, stable=True).indices[..., :k]
    else:
        top = torch.topk(scores, k, dim=-1).indices
    return top.sort(dim=-1).values
