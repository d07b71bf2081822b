"""Quest's static-step kernels (baselines/quest/kernels.py) against the reference ops: the bounds masked from the
open page on, the eval rule's ranking keys, and the page list with each KV head's union of its page sets."""
import pytest
import torch

from baselines.quest.kernels import quest_eval_keys, quest_page_scores, quest_static_pages
from locks.core.reference import paged_attended
from locks.core.selector import Selection
from locks.core.topk import lowest_first_keys
from locks.kernels import poisoned


@pytest.mark.parametrize("L", [97, 96, 40, 16])
def test_masked_bounds_are_the_reference_bounds_before_the_open_page(L):
    gen = torch.Generator().manual_seed(L)
    q = torch.randn(2, 6, 32, generator=gen)
    a, b = torch.randn(2, 2, 8, 32, generator=gen), torch.randn(2, 2, 8, 32, generator=gen)
    kmax, kmin = torch.maximum(a, b), torch.minimum(a, b)
    full = quest_page_scores(q, kmax, kmin)
    masked = quest_page_scores(q, kmax, kmin, length=torch.tensor([L]), page_size=16)
    last = -(-L // 16) - 1
    assert torch.equal(masked[..., :last], full[..., :last]) and torch.isneginf(masked[..., last:]).all()


@pytest.mark.parametrize("L,sets", [(300, 4), (300, 1), (257, 3), (40, 4), (64, 2)])
def test_page_list_and_union_count_match_the_reference(L, sets):
    gen = torch.Generator().manual_seed(L + sets)
    B, H, n, page_budget = 2, 3, 16, 5
    last = -(-L // n) - 1
    top = torch.stack([torch.stack([torch.stack([torch.randperm(max(last, page_budget - 1), generator=gen)[
        : page_budget - 1] for _ in range(sets)]) for _ in range(H)]) for _ in range(B)])
    length = torch.tensor([L])
    with poisoned():
        pages, attended = quest_static_pages(top, length, n, page_budget, count=sets > 1)
    ref = torch.cat([top.sort(-1).values, torch.full((B, H, sets, 1), last)], -1)
    ref = torch.where(torch.tensor(last) < page_budget, torch.arange(page_budget), ref)
    assert torch.equal(pages, ref)
    if sets == 1:
        assert attended is None
    else:
        want = paged_attended(Selection(pages=ref, page_size=n), length, 512)
        assert torch.equal(attended, want.double())


def test_static_kernels_per_row_lengths_equal_rows_alone():
    """length [B] (a page boundary, a row whose open page is below the page budget: everything fits, one near the
    capacity): the masked bounds and the page lists (one set per KV head, or G with the union counted) use each
    row's own length and equal each row alone, bitwise."""
    B, H, G, d, n, P, page_budget = 3, 2, 3, 32, 16, 12, 5
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(B, H * G, d, generator=gen)
    a, b = torch.randn(B, H, P, d, generator=gen), torch.randn(B, H, P, d, generator=gen)
    kmax, kmin = torch.maximum(a, b), torch.minimum(a, b)
    length = torch.tensor([16 * 7, 50, 16 * P - 1])
    with poisoned():
        masked = quest_page_scores(q, kmax, kmin, length=length, page_size=n)
    for r, L in enumerate(length.tolist()):
        alone = quest_page_scores(q[r : r + 1], kmax[r : r + 1], kmin[r : r + 1], length=length[r : r + 1],
                                  page_size=n)
        assert torch.equal(masked[r : r + 1], alone)
        last = -(-L // n) - 1
        assert torch.isneginf(masked[r, :, last:]).all() and torch.isfinite(masked[r, :, :last]).all()
    for sets in (1, G):
        scores = masked.view(B, H, G, P)
        scores = scores if sets == G else scores.amax(2, keepdim=True)
        top = torch.topk(scores, page_budget - 1, dim=-1).indices
        with poisoned():
            pages, attended = quest_static_pages(top, length, n, page_budget, count=sets > 1)
        for r in range(B):
            alone = quest_static_pages(top[r : r + 1], length[r : r + 1], n, page_budget, count=sets > 1)
            assert torch.equal(pages[r : r + 1], alone[0])
            assert (attended is None and alone[1] is None) or torch.equal(attended[r : r + 1], alone[1])
        assert (pages[1] == torch.arange(page_budget)).all()  # the open page 3 < 5: everything fits
        if sets > 1:
            want = torch.cat([paged_attended(Selection(pages=pages[r : r + 1], page_size=n), length[r : r + 1], 16 * P)
                              for r in range(B)])
            assert torch.equal(attended, want.double())


@pytest.mark.parametrize("reduce", [None, "max"])
def test_eval_keys_are_the_reference_keys_of_the_masked_bounds(reduce):
    """quest_eval_keys: per row (lengths [B]: a page boundary, a partial page, one page) the lowest-first ranking keys
    of the bounds per query head or their max over the group, the pages after the open one at -inf; exact ties
    (equal pages) go to the lower page."""
    B, H, G, d, n, P = 3, 2, 3, 32, 16, 10
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(B, H * G, d, generator=gen)
    a, b = torch.randn(B, H, P, d, generator=gen), torch.randn(B, H, P, d, generator=gen)
    kmax, kmin = torch.maximum(a, b), torch.minimum(a, b)
    kmax[:, :, 4], kmin[:, :, 4] = kmax[:, :, 2], kmin[:, :, 2]  # pages 2 and 4 tie
    length = torch.tensor([16 * 6, 77, 9])
    with poisoned():
        keys = quest_eval_keys(q, kmax, kmin, length, n, reduce)
    U = quest_page_scores(q, kmax, kmin).view(B, H, G, P)
    U = U if reduce is None else U.amax(2, keepdim=True)
    last = ((length - 1) // n).view(B, 1, 1, 1)
    want = lowest_first_keys(U.masked_fill(torch.arange(P) > last, float("-inf")))
    assert keys.dtype == torch.int64 and torch.equal(keys.view_as(want), want)
    assert (keys[..., 2] > keys[..., 4]).all()  # the tie, and -inf past the open page, go to the lower page
