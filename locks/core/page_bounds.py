"""Channel-wise key bounds per page: max_j[c] = max_{t in page j} k_t[c] and min_j[c] likewise (Quest's page
metadata, RocketKV's chunk bounds), kept as tokens arrive one or a few at a time."""
from __future__ import annotations

import torch
from torch import Tensor


def fold_into_page(page_max: Tensor, page_min: Tensor, keys: Tensor, page: int | Tensor, opens: bool | Tensor) -> None:
    """Fold keys [B, H, n, d], tokens of one page, into that page's bounds in place (page_max / page_min
    [B, H, pages, d]): max_j <- max(max_j, max_t k_t), min_j likewise, or max_t k_t / min_t k_t when the keys
    `opens` the page (its first token is among them; what the slot held before is ignored). `page` and `opens` are
    host values (eager) or device tensors ([1] int64 and a bool of one element: a static step, no host reads; or [B]
each, one page per row: rows of different lengths stacked in one step)."""
    hi, lo = (keys, keys) if keys.shape[2] == 1 else (keys.amax(2, keepdim=True), keys.amin(2, keepdim=True))
    if isinstance(page, int):
        if opens:
            page_max[:, :, page : page + 1], page_min[:, :, page : page + 1] = hi, lo
        else:
            page_max[:, :, page : page + 1] = torch.maximum(page_max[:, :, page : page + 1], hi)
            page_min[:, :, page : page + 1] = torch.minimum(page_min[:, :, page : page + 1], lo)
        return
    if page.numel() > 1:  # stacked rows: row b's keys go to its own page[b] (opens[b])
        rows = torch.arange(page_max.shape[0], device=page.device)
        opens = opens.view(-1, 1, 1)
        hi, lo = hi[:, :, 0], lo[:, :, 0]
        page_max[rows, :, page] = torch.where(opens, hi, torch.maximum(page_max[rows, :, page], hi))
        page_min[rows, :, page] = torch.where(opens, lo, torch.minimum(page_min[rows, :, page], lo))
        return
    opens = opens.view(1, 1, 1, 1)
    page_max.index_copy_(2, page, torch.where(opens, hi, torch.maximum(page_max.index_select(2, page), hi)))
    page_min.index_copy_(2, page, torch.where(opens, lo, torch.minimum(page_min.index_select(2, page), lo)))
