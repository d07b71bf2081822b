"""The generic Triton kernels (locks/kernels/: split-K sparse / paged / full decode, the static page list) against
their PyTorch references. The method kernels are tested in tests/methods/test_locks_kernels.py and
test_quest_kernels.py, the same way.

On CPU the kernels run under the Triton interpreter (tests/conftest.py sets TRITON_INTERPRET=1 when CUDA is
unavailable); on a CUDA machine the same tests run the compiled kernels. Every output and workspace the entry points
allocate starts as NaN (`poisoned()`), so an element a kernel fails to write fails the comparison. Shapes are small
(the interpreter is slow) but cover GQA groups 1, 3, 4, 7, 16, head dims 64 and 128, page counts that are not a
multiple of the kernels' page blocks, bf16 and fp32 inputs. Errors are relative to the largest magnitude of the
reference: <= 1e-3 for fp32 inputs, <= 1e-2 for bf16 inputs.
"""
from __future__ import annotations

import pytest
import torch
import triton  # noqa: F401  (a dev dependency: a missing triton fails, it never skips)

from locks.core.paging import pages_to_tokens, static_page_list
from locks.core.reference import sparse_decode as ref_sparse_decode
from locks.core.selector import Selection
from locks.kernels import full_decode, paged_decode, poisoned, sparse_decode, static_pages
from tests.helpers import DEV, TOL, kv_inputs, ref_decode_fp32, rel_err

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's log(0) / inf - inf in the interpreter


# ------------------------------------------------------------------------------------------------------------------
# split-K sparse decode, paged decode, FullKV decode


# (B, Hkv, G, d, L, K tokens, dtype, per_head, num_splits)
DECODE_CASES = [
    (1, 2, 1, 64, 300, 70, torch.float32, False, None),
    (2, 1, 3, 128, 260, 90, torch.bfloat16, True, 3),
    (1, 2, 4, 128, 400, 130, torch.float32, False, 1),
    (1, 1, 7, 64, 200, 45, torch.bfloat16, True, None),
    (1, 1, 16, 64, 300, 100, torch.bfloat16, False, 2),
    (1, 1, 16, 128, 150, 40, torch.float32, True, None),
]


@pytest.mark.parametrize("B,Hkv,G,d,L,K,dtype,per_head,splits", DECODE_CASES)
def test_sparse_decode(B, Hkv, G, d, L, K, dtype, per_head, splits):
    q, k, v = kv_inputs(B, Hkv, G, d, L, dtype, seed=K)
    gs = G if per_head else 1
    g = torch.Generator().manual_seed(L)
    idx = torch.randint(0, L, (B, Hkv, gs, K), generator=g)
    valid = torch.rand(B, Hkv, gs, K, generator=g) > 0.25
    idx = torch.where(valid, idx, torch.randint(-5, 3 * L, idx.shape, generator=g))  # garbage where invalid
    sel = Selection(indices=idx.to(DEV), valid=valid.to(DEV))
    scaling = d ** -0.5
    ref_out, ref_lse = ref_decode_fp32(q, k, v, sel, scaling)
    with poisoned():
        out, lse = sparse_decode(q, k, v, sel.indices, sel.valid, scaling, num_splits=splits, block_n=16)
    assert out.dtype == q.dtype and out.shape == (B, Hkv * G, d) and lse.dtype == torch.float32
    assert rel_err(out, ref_out) <= TOL[dtype]
    assert rel_err(lse, ref_lse) <= 1e-3
    # the reference itself on the original dtype agrees too (what the lead swaps in)
    out_ref_dtype, _ = ref_sparse_decode(q, k, v, sel, scaling)
    assert rel_err(out, out_ref_dtype) <= TOL[dtype]


def test_sparse_decode_invalid_rows_and_defaults():
    """A head whose entries are all invalid gets out 0 and lse -inf (the reference gives NaN); the default split
    count and block size agree with forced ones."""
    B, Hkv, G, d, L, K = 1, 2, 4, 64, 100, 40
    q, k, v = kv_inputs(B, Hkv, G, d, L, torch.float32, seed=11)
    idx = torch.randint(0, L, (B, Hkv, 1, K), device=DEV)
    valid = torch.ones_like(idx, dtype=torch.bool)
    valid[:, 1] = False
    with poisoned():
        out, lse = sparse_decode(q, k, v, idx, valid, 0.125)
    assert torch.isneginf(lse[:, G:]).all() and (out[:, G:] == 0).all()
    ref_out, ref_lse = ref_decode_fp32(q, k, v, Selection(indices=idx, valid=valid), 0.125)
    assert rel_err(out[:, :G], ref_out[:, :G]) <= 1e-3 and rel_err(lse[:, :G], ref_lse[:, :G]) <= 1e-3
    with poisoned():
        out2, lse2 = sparse_decode(q, k, v, idx, valid, 0.125, num_splits=4, block_n=32)
    assert rel_err(out2[:, :G], out[:, :G]) <= 1e-5


@pytest.mark.parametrize("B,Hkv,G,d,L,dtype,length", [
    (1, 2, 4, 128, 333, torch.bfloat16, None),
    (2, 1, 3, 64, 257, torch.float32, 200),
    (1, 1, 16, 64, 190, torch.float32, None),
    (1, 2, 7, 128, 100, torch.float32, 77),
])
def test_full_decode(B, Hkv, G, d, L, dtype, length):
    q, k, v = kv_inputs(B, Hkv, G, d, L, dtype, seed=L)
    n = L if length is None else length
    sel = Selection(indices=torch.arange(n, device=DEV).expand(B, Hkv, 1, n),
                    valid=torch.ones(B, Hkv, 1, n, dtype=torch.bool, device=DEV))
    ref_out, ref_lse = ref_decode_fp32(q, k, v, sel, d ** -0.5)
    with poisoned():
        out, lse = full_decode(q, k, v, d ** -0.5, length, block_n=32)
    assert rel_err(out, ref_out) <= TOL[dtype] and rel_err(lse, ref_lse) <= 1e-3
    # the valid length read from a device tensor (static decode): same result; slots past it are never read
    k_poison, v_poison = k.clone(), v.clone()
    k_poison[:, :, n:], v_poison[:, :, n:] = float("nan"), float("nan")
    with poisoned():
        out_t, lse_t = full_decode(q, k_poison, v_poison, d ** -0.5, torch.tensor([n], device=DEV), block_n=32)
    assert rel_err(out_t, ref_out) <= TOL[dtype] and rel_err(lse_t, ref_lse) <= 1e-3
    # FullKV also equals the dense SDPA math (GQA-native) on the original dtype
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q.float().unsqueeze(2), k[:, :, :n].float(), v[:, :, :n].float(), scale=d ** -0.5, enable_gqa=True)
    assert rel_err(out, sdpa[:, :, 0]) <= TOL[dtype]


@pytest.mark.parametrize("G,d,dtype,per_head", [(4, 128, torch.bfloat16, False), (3, 64, torch.float32, True),
                                                (16, 64, torch.float32, False)])
def test_paged_decode(G, d, dtype, per_head):
    """Page ids (with the partial last page among them) == the token-index reference over the expanded pages."""
    B, Hkv, L, n = 1, 2, 16 * 19 + 7, 16
    q, k, v = kv_inputs(B, Hkv, G, d, L, dtype, seed=G)
    P = -(-L // n)
    gs = G if per_head else 1
    g = torch.Generator().manual_seed(d)
    pages = torch.stack([torch.randperm(P, generator=g)[:6] for _ in range(B * Hkv * gs)]).view(B, Hkv, gs, 6)
    pages[..., 0] = P - 1  # the partial page
    pvalid = torch.rand(B, Hkv, gs, 6, generator=g) > 0.2
    pvalid[..., 0] = True
    pages, pvalid = pages.to(DEV), pvalid.to(DEV)
    tokens = pages_to_tokens(pages, n)
    tvalid = pvalid.repeat_interleave(n, dim=-1) & (tokens < L)
    sel = Selection(indices=tokens.clamp(max=L - 1), valid=tvalid)
    ref_out, ref_lse = ref_decode_fp32(q, k, v, sel, d ** -0.5)
    with poisoned():
        out, lse = paged_decode(q, k, v, pages.int(), d ** -0.5, pvalid, page_size=n, block_n=32, num_splits=2)
    assert rel_err(out, ref_out) <= TOL[dtype] and rel_err(lse, ref_lse) <= 1e-3
    # a preallocated cache with more slots than valid tokens, the length on the device: same result
    k_big, v_big = (torch.cat([x, torch.full_like(x[:, :, :40], float("nan"))], 2) for x in (k, v))
    with poisoned():
        out_t, lse_t = paged_decode(q, k_big, v_big, pages.int(), d ** -0.5, pvalid, page_size=n,
                                    length=torch.tensor(L, device=DEV), block_n=32, num_splits=2)
    assert rel_err(out_t, ref_out) <= TOL[dtype] and rel_err(lse_t, ref_lse) <= 1e-3


# ------------------------------------------------------------------------------------------------------------------
# static decode helpers: the page list and Quest's metadata update, each in one launch


@pytest.mark.parametrize("budget,S,R", [(128, 1, 4), (200, 1, 4), (256, 2, 3)])
def test_static_pages_equal_the_reference(budget, S, R):
    n = 16
    Kt = budget // n - S - R
    g = torch.Generator().manual_seed(budget)
    # lengths in both regimes (<= budget: everything fits), every tail, page boundaries
    for L in [1, 17, budget - 1, budget, budget + 1, budget + 7, 16 * 40, 16 * 40 + 9, 16 * 41 - 1, 16 * 70 + 15]:
        candidates = max(L // n - R - S, Kt)  # top-k of the candidate pages [S, L // n - R), as the selector's
        top = torch.stack([torch.randperm(candidates, generator=g)[:Kt] + S for _ in range(6)]).view(2, 3, Kt).to(DEV)
        length = torch.tensor([L], device=DEV)
        ref_pages, ref_valid = static_page_list(top, length, budget, n, S, R)
        pages, valid = static_pages(top, length, budget, n, S, R)
        assert pages.dtype == torch.int32 and pages.shape == (2, 3, Kt + S + R + 1)
        assert torch.equal(pages, ref_pages) and torch.equal(valid, ref_valid), L
        # and the list names what eager selection attends: budget-many tokens at most, the partial page included
        tokens = pages.long().unsqueeze(-1) * n + torch.arange(n, device=DEV)
        attended = ((tokens < L) & valid.unsqueeze(-1)).sum((-1, -2))
        assert (attended == min(L, ((budget - L % n) // n) * n + L % n)).all()




# ------------------------------------------------------------------------------------------------------------------
# per-row lengths: a batch of rows of different lengths in one static call == each row alone, bitwise


def rows_alone(fn, length, *batched):
    """fn(row b's slices of `batched`, length[b:b+1]) for every row b, concatenated along the batch."""
    outs = [fn(*(x[b : b + 1] for x in batched), length[b : b + 1]) for b in range(length.numel())]
    return [torch.cat(parts) for parts in zip(*outs)]


@pytest.mark.parametrize("dtype,G", [(torch.bfloat16, 4), (torch.float32, 3)])
def test_decode_per_row_lengths_equal_rows_alone(dtype, G):
    """FullKV and page-list decode with length [B]: row b attends [0, length[b]) and gives exactly its output alone
    (a page boundary, a short row, one near the capacity); slots past each row's length are never read."""
    B, Hkv, d, C, n = 3, 2, 64, 16 * 12, 16
    q, k, v = kv_inputs(B, Hkv, G, d, C, dtype, seed=G)
    length = torch.tensor([16 * 7, 21, C - 3], device=DEV)
    for b, L in enumerate(length.tolist()):
        k[b, :, L:], v[b, :, L:] = float("nan"), float("nan")
    kw = dict(block_n=32, num_splits=3)
    with poisoned():
        out, lse = full_decode(q, k, v, d ** -0.5, length, **kw)
    assert torch.isfinite(out).all()
    alone = rows_alone(lambda q, k, v, L: full_decode(q, k, v, d ** -0.5, L, **kw), length, q, k, v)
    assert torch.equal(out, alone[0]) and torch.equal(lse, alone[1])
    for b, L in enumerate(length.tolist()):  # and the reference over the row's tokens
        ref_out, ref_lse = full_decode(q[b : b + 1], k[b : b + 1, :, :L], v[b : b + 1, :, :L], d ** -0.5, **kw)
        assert rel_err(out[b : b + 1], ref_out) <= 1e-5 and rel_err(lse[b : b + 1], ref_lse) <= 1e-5
    # every row at the same length: the one-element result, bitwise
    same = full_decode(q, k, v, d ** -0.5, length[1:2].expand(B), **kw)
    assert torch.equal(same[0], full_decode(q, k, v, d ** -0.5, length[1:2], **kw)[0])

    g = torch.Generator().manual_seed(d)
    pages = torch.stack([torch.randperm(C // n, generator=g)[:5] for _ in range(B * Hkv * G)]).view(B, Hkv, G, 5)
    pages[..., 0] = ((length - 1) // n).view(B, 1, 1)  # each row's partial page
    pvalid = (torch.rand(B, Hkv, G, 5, generator=g) > 0.2).to(DEV)
    pages = pages.to(DEV)
    with poisoned():
        out, lse = paged_decode(q, k, v, pages.int(), d ** -0.5, pvalid, page_size=n, length=length, **kw)
    alone = rows_alone(lambda q, k, v, p, ok, L: paged_decode(q, k, v, p, d ** -0.5, ok, page_size=n, length=L, **kw),
                       length, q, k, v, pages.int(), pvalid)
    assert torch.equal(out, alone[0]) and torch.equal(lse, alone[1])
    with pytest.raises(ValueError, match="1 or B"):
        full_decode(q, k, v, d ** -0.5, length[:2])


def test_static_pages_per_row_lengths_equal_rows_alone():
    """static_pages with length [B] (a page boundary, a row shorter than the budget, one near the capacity) == each
    row alone == the reference per row."""
    budget, n, S, R, B = 128, 16, 1, 2, 3
    Kt = budget // n - S - R
    length = torch.tensor([16 * 20, budget - 9, 16 * 64 - 2], device=DEV)
    g = torch.Generator().manual_seed(5)
    top = torch.stack([torch.randperm(16 * 20 // n - S - R, generator=g)[:Kt] + S for _ in range(B * 2)])
    top = top.view(B, 2, Kt).to(DEV)
    pages, valid = static_pages(top, length, budget, n, S, R)
    alone = rows_alone(lambda t, L: static_pages(t, L, budget, n, S, R), length, top)
    assert torch.equal(pages, alone[0]) and torch.equal(valid, alone[1])
    for b in range(B):
        ref_pages, ref_valid = static_page_list(top[b : b + 1], length[b : b + 1], budget, n, S, R)
        assert torch.equal(pages[b : b + 1], ref_pages) and torch.equal(valid[b : b + 1], ref_valid)
    assert valid[1].all() and (pages[1] == torch.arange(Kt + S + R + 1, device=DEV)).all()  # everything fits
