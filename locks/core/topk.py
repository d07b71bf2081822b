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


def top_units(scores: Tensor, k: int, stable: bool = False) -> Tensor:
    """The k best units of each set along the last axis, in increasing index order. `stable`: ties go to the lower
    index (a full stable sort: a larger k then always selects a superset); else torch.topk, whose order among
    exactly equal scores is its implementation's (no full sort inside a static step)."""
    if stable:
        top = scores.sort(dim=-1, descending=True, stable=True).indices[..., :k]
    else:
        top = torch.topk(scores, k, dim=-1).indices
    return top.sort(dim=-1).values
