"""Quest's kernels (baselines/quest/kernels.py): the page bound against its element-wise definition, the static
min/max update against the selector's reference, under the Triton interpreter on CPU (compiled on CUDA)."""
from __future__ import annotations

import pytest
import torch
import triton  # noqa: F401  (a dev dependency: a missing triton fails, it never skips)

from baselines.quest.kernels import quest_append, quest_group_scores, quest_page_scores
from locks.kernels import poisoned
from tests.helpers import DEV, TOL, gen, rel_err, topk_equal_except_ties

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's log(0) / inf - inf in the interpreter


def quest_reference(q: torch.Tensor, kmax: torch.Tensor, kmin: torch.Tensor) -> torch.Tensor:
    """U [B, Hq, P] = sum_i max(q_i kmax_i, q_i kmin_i) in fp32 (the element-wise definition, no identity used)."""
    B, Hq, d = q.shape
    H = kmax.shape[1]
    qf = q.float().view(B, H, Hq // H, 1, d)
    U = torch.maximum(qf * kmax.float()[:, :, None], qf * kmin.float()[:, :, None]).sum(-1)
    return U.reshape(B, Hq, -1)


QUEST_CASES = [
    (1, 2, 1, 64, 70, torch.float32),
    (2, 1, 3, 128, 65, torch.bfloat16),
    (1, 2, 4, 128, 33, torch.float32),
    (1, 1, 7, 64, 100, torch.bfloat16),
    (1, 1, 16, 128, 47, torch.float32),
]


@pytest.mark.parametrize("B,Hkv,G,d,P,dtype", QUEST_CASES)
def test_quest_scores(B, Hkv, G, d, P, dtype):
    keys = gen(B, Hkv, P, 16, d, dtype=dtype, seed=P)
    kmax, kmin = keys.amax(3), keys.amin(3)
    q = gen(B, Hkv * G, d, dtype=dtype, seed=P + 1)
    ref = quest_reference(q, kmax, kmin)
    with poisoned():
        out = quest_page_scores(q, kmax, kmin)
    assert out.shape == (B, Hkv * G, P) and rel_err(out, ref) <= TOL[dtype]
    ref_g = ref.view(B, Hkv, G, P)
    for reduce, r in (("max", ref_g.amax(2)), ("sum", ref_g.sum(2))):
        with poisoned():
            red = quest_group_scores(q, kmax, kmin, reduce)
        assert red.shape == (B, Hkv, P) and rel_err(red, r) <= TOL[dtype]
    topk_equal_except_ties(out, ref, 9, 1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quest_append_equals_the_reference(dtype):
    from locks.core.page_bounds import fold_static_key

    B, H, d, P = 2, 2, 64, 16
    keys = gen(B, H, 100, d, dtype=dtype, seed=3)
    kmax, kmin = gen(B, H, 8, d, dtype=dtype, seed=4), gen(B, H, 8, d, dtype=dtype, seed=5)
    kmin = torch.minimum(kmin, kmax)
    for L in (33, 40, 48, 49):  # the first key of a page, inside a page, the last one, the next page's first
        ref_max, ref_min = kmax.clone(), kmin.clone()
        fold_static_key(keys, ref_max, ref_min, torch.tensor([L], device=DEV), P)
        mx, mn = kmax.clone(), kmin.clone()
        quest_append(keys, mx, mn, torch.tensor([L], device=DEV), P)
        assert torch.equal(mx, ref_max) and torch.equal(mn, ref_min), L
        page = (L - 1) // P
        assert torch.equal(mx[:, :, page + 1 :], kmax[:, :, page + 1 :]) and torch.equal(mx[:, :, :page], kmax[:, :, :page])



@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quest_append_per_row_lengths_equal_rows_alone(dtype):
    """length [B]: row b folds its key at slot length[b] - 1 (a page's first key, a page's last, the capacity's
    last slot) into its own page; == each row alone, and no other page changes."""
    B, H, d, P, C = 3, 2, 64, 16, 128
    keys = gen(B, H, C, d, dtype=dtype, seed=7)
    kmax, kmin = gen(B, H, C // P, d, dtype=dtype, seed=8), gen(B, H, C // P, d, dtype=dtype, seed=9)
    kmin = torch.minimum(kmin, kmax)
    length = torch.tensor([33, 48, C], device=DEV)
    mx, mn = kmax.clone(), kmin.clone()
    quest_append(keys, mx, mn, length, P)
    for b, L in enumerate(length.tolist()):
        mx_b, mn_b = kmax[b : b + 1].clone(), kmin[b : b + 1].clone()
        quest_append(keys[b : b + 1], mx_b, mn_b, length[b : b + 1], P)
        assert torch.equal(mx[b : b + 1], mx_b) and torch.equal(mn[b : b + 1], mn_b), b
        page = (L - 1) // P
        others = torch.arange(C // P, device=DEV) != page
        assert torch.equal(mx[b, :, others], kmax[b, :, others]) and not torch.equal(mx[b, :, page], kmax[b, :, page])
