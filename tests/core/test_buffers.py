"""Growable buffers (locks/core/buffers.py) and per-page key bounds (locks/core/page_bounds.py)."""
import pytest
import torch

from locks.core.buffers import grown, resized
from locks.core.page_bounds import fold_into_page


def test_grown_keeps_the_used_slots_and_grows_geometrically():
    buf = torch.arange(2 * 5 * 3, dtype=torch.float32).view(1, 2, 5, 3)
    assert grown(buf, 5, 5) is buf  # room enough: the same buffer
    big = grown(buf, 4, 6, factor=2.0, minimum=0)
    assert big.shape == (1, 2, 10, 3) and torch.equal(big[:, :, :4], buf[:, :, :4])
    assert grown(buf, 4, 6, factor=1.5, minimum=256).shape[2] == 256
    assert grown(buf, 4, 30, factor=1.5).shape[2] == 30  # needed beats the factor
    zeros = grown(buf, 3, 8, factor=1.0, zero=True)
    assert zeros.shape[2] == 8 and torch.equal(zeros[:, :, :3], buf[:, :, :3]) and not zeros[:, :, 3:].any()


def test_resized_along_the_last_dimension_can_shrink():
    index = torch.arange(12).view(1, 2, 6)
    small = resized(index, 2, 3, dim=-1, zero=True)
    assert small.shape == (1, 2, 3) and torch.equal(small[..., :2], index[..., :2]) and not small[..., 2].any()


def _bounds_by_page(keys: torch.Tensor, page: int):
    """Independent reference: amax / amin over each page's tokens, the partial last page included."""
    L = keys.shape[2]
    return (torch.stack([keys[:, :, p : p + page].amax(2) for p in range(0, L, page)], 2),
            torch.stack([keys[:, :, p : p + page].amin(2) for p in range(0, L, page)], 2))


@pytest.mark.parametrize("on_device", [False, True])
def test_folding_keys_one_at_a_time_gives_each_page_its_bounds(on_device):
    torch.manual_seed(0)
    page, L = 4, 11
    keys = torch.randn(2, 3, L, 5)
    mx = torch.full((2, 3, 3, 5), 7.0)  # stale values a new page must not keep
    mn = torch.full((2, 3, 3, 5), -7.0)
    for t in range(L):
        p, opens = divmod(t, page)[0], t % page == 0
        if on_device:
            fold_into_page(mx, mn, keys[:, :, t : t + 1], torch.tensor([p]), torch.tensor([opens]))
        else:
            fold_into_page(mx, mn, keys[:, :, t : t + 1], p, opens)
    ref_max, ref_min = _bounds_by_page(keys, page)
    assert torch.equal(mx, ref_max) and torch.equal(mn, ref_min)


def test_folding_several_keys_extends_an_open_page():
    torch.manual_seed(1)
    keys = torch.randn(1, 2, 8, 3)
    mx, mn = torch.empty(1, 2, 1, 3), torch.empty(1, 2, 1, 3)
    fold_into_page(mx, mn, keys[:, :, :3], 0, opens=True)
    fold_into_page(mx, mn, keys[:, :, 3:8], 0, opens=False)
    assert torch.equal(mx[:, :, 0], keys.amax(2)) and torch.equal(mn[:, :, 0], keys.amin(2))
