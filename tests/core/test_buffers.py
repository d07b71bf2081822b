"""Growable buffers (locks/core/buffers.py), per-page key bounds (locks/core/page_bounds.py) and the shared top-k
(locks/core/topk.py)."""
import pytest
import torch

from locks.core.buffers import grown, resized
from locks.core.page_bounds import extend_bounds, fold_into_page, fold_static_key, reserve_bounds
from locks.core.topk import head_sets, top_units


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


@pytest.mark.parametrize("chunks", [[11], [3, 1, 4, 3], [1] * 11, [8, 3]])
def test_extending_bounds_by_any_chunks_equals_each_pages_bounds(chunks):
    torch.manual_seed(2)
    page, L = 4, sum(chunks)
    keys = torch.randn(2, 3, L, 5)
    mx = mn = None
    done = 0
    for n in chunks:
        mx, mn = extend_bounds(mx, mn, keys[:, :, : done + n], done, page)
        done += n
    ref_max, ref_min = _bounds_by_page(keys, page)
    pages = ref_max.shape[2]
    assert torch.equal(mx[:, :, :pages], ref_max) and torch.equal(mn[:, :, :pages], ref_min)
    assert extend_bounds(mx, mn, keys, L, page) == (mx, mn)  # nothing new: the same buffers


def test_static_fold_and_reserve_give_the_eager_bounds_with_zeroed_free_slots():
    torch.manual_seed(3)
    page, L = 4, 10
    keys = torch.randn(1, 2, 16, 3)
    mx, mn = extend_bounds(None, None, keys[:, :, :7], 0, page)
    mx, mn = reserve_bounds(mx, mn, 2, 20)
    assert mx.shape[2] >= 20 and not mx[:, :, 2:].any() and not mn[:, :, 2:].any()
    for length in range(8, L + 1):  # slot 7 completes page 1, slot 8 opens page 2
        fold_static_key(keys, mx, mn, torch.tensor([length]), page)
    ref_max, ref_min = _bounds_by_page(keys[:, :, :L], page)
    assert torch.equal(mx[:, :, :3], ref_max) and torch.equal(mn[:, :, :3], ref_min)


def test_top_units_in_index_order_with_stable_ties_to_the_lower_index():
    scores = torch.tensor([[0.5, 2.0, 2.0, -1.0, 2.0, 0.1]])
    assert top_units(scores, 2, stable=True).tolist() == [[1, 2]]
    assert top_units(scores, 4, stable=True).tolist() == [[0, 1, 2, 4]]
    torch.manual_seed(4)
    x = torch.randn(2, 3, 4, 50)  # no ties: both ways pick the brute-force best, in index order
    want = torch.tensor([sorted(sorted(range(50), key=lambda j: -float(row[j]))[:7]) for row in x.reshape(-1, 50)])
    for stable in (True, False):
        assert torch.equal(top_units(x, 7, stable).reshape(-1, 7), want)


def test_head_sets_per_query_head_or_one_per_kv_head():
    torch.manual_seed(5)
    U = torch.randn(2, 3, 4, 9)
    assert head_sets(U, per_head=True) is U
    assert torch.equal(head_sets(U, False, "max"), U.amax(2, keepdim=True))
    summed = head_sets(U, False, "sum")
    assert torch.allclose(summed, U.sum(2, keepdim=True), atol=1e-6)
    assert torch.equal(head_sets(U[:, :, [2, 0, 3, 1]], False, "sum"), summed)  # the heads' order does not matter
