"""Channel-wise key bounds per page: max_j[c] = max_{t in page j} k_t[c] and min_j[c] likewise (Quest's page
metadata, RocketKV's chunk bounds), kept as tokens arrive one or a few at a time."""
from __future__ import annotations

import torch
from torch import Tensor

from locks.core.buffers import grown
from locks.core.selector import LayerInfo, newest_key, row_length


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


def extend_bounds(page_max: Tensor | None, page_min: Tensor | None, keys: Tensor, start: int,
                  page_size: int) -> tuple[Tensor | None, Tensor | None]:
    """Fold rows start .. L-1 of a layer's keys [B, H, L, d] into the bounds of pages of `page_size` tokens whose
    first `start` tokens are folded already -> (page_max, page_min), grown geometrically (locks/core/buffers.py) to
    ceil(L / page_size) pages, created like the keys when None. The open page is merged, whole new pages are reduced
    at once, and a new partial page starts from its first key."""
    L, P = keys.shape[2], page_size
    if L <= start:
        return page_max, page_min
    if page_max is None:
        page_max = page_min = keys.new_empty(*keys.shape[:2], 0, keys.shape[3])
    page_max, page_min = (grown(b, -(-start // P), -(-L // P), minimum=16) for b in (page_max, page_min))
    new = keys[:, :, start:]
    if start % P:  # the open page: merge with the rows that complete (or extend) it
        r = min(P - start % P, L - start)
        fold_into_page(page_max, page_min, new[:, :, :r], start // P, opens=False)
        new, start = new[:, :, r:], start + r
    B, H, n, d = new.shape
    full, tail = divmod(n, P)
    p = start // P
    if full:
        x = new[:, :, : full * P].reshape(B, H, full, P, d)
        page_max[:, :, p : p + full] = x.amax(3)
        page_min[:, :, p : p + full] = x.amin(3)
    if tail:
        fold_into_page(page_max, page_min, new[:, :, full * P :], p + full, opens=True)
    return page_max, page_min


def fold_static_key(keys: Tensor, page_max: Tensor, page_min: Tensor, length: Tensor, page_size: int) -> None:
    """A static step's fold, on the device: the key at slot length - 1 of the preallocated keys [B, H, capacity, d]
    (length [1], or [B]: each stacked row's own) into its page, which it opens when it is the page's first."""
    position = length.reshape(-1) - 1
    page = torch.div(position, page_size, rounding_mode="floor")
    fold_into_page(page_max, page_min, newest_key(keys, position), page, opens=position % page_size == 0)


def reserve_bounds(page_max: Tensor, page_min: Tensor, used: int, pages: int) -> tuple[Tensor, Tensor]:
    """Bounds with room for `pages` pages before a static decode, the slots past the `used` pages zeroed: a static
    step scores every slot with the unwritten ones masked, so they must hold finite values."""
    page_max, page_min = (grown(b, used, pages, minimum=16) for b in (page_max, page_min))
    page_max[:, :, used:], page_min[:, :, used:] = 0, 0
    return page_max, page_min


def open_page(length: Tensor, page_size: int) -> Tensor:
    """The page of the newest token, (L - 1) // page_size, at a device length L ([1] or [B]) -> [1 or B, 1, 1, 1]."""
    return torch.div(row_length(length, 4) - 1, page_size, rounding_mode="floor")


def bounds_bytes(info: LayerInfo, length: int, page_size: int) -> float:
    """One layer's max and min per page and KV head after `length` tokens, in the keys' dtype:
    2 * ceil(length / page_size) * d * s * H_kv."""
    return float(2 * -(-length // page_size) * info.head_dim * info.kv_element_bytes * info.num_kv_heads)
