"""Triton kernels (locks/kernels/) against their PyTorch references (issue 6, "Correctness").

On CPU the kernels run under the Triton interpreter (tests/conftest.py sets TRITON_INTERPRET=1 when CUDA is
unavailable); on a CUDA machine the same tests run the compiled kernels. Every output and workspace the entry points
allocate starts as NaN (`poisoned()`), so an element a kernel fails to write fails the comparison. Shapes are small
(the interpreter is slow) but cover GQA groups 1, 3, 4, 7, 16, head dims 64 and 128, page counts that are not a
multiple of the kernels' page blocks, bf16 and fp32 inputs. Errors are relative to the largest magnitude of the
reference: <= 1e-3 for fp32 inputs, <= 1e-2 for bf16 inputs.
"""
from __future__ import annotations

import math

import pytest
import torch

import triton  # noqa: E402,F401  (a dev dependency: a missing triton fails, it never skips)

from locks.attention import sparse_decode as ref_sparse_decode  # noqa: E402
from locks.kernels import (  # noqa: E402
    full_decode,
    locks_aggregated_scores,
    locks_page_scores,
    paged_decode,
    poisoned,
    quest_append,
    quest_group_scores,
    quest_page_scores,
    select_pages,
    sparse_decode,
    static_pages,
    topk_pages,
)
from locks.pages import aggregate_heads, pages_to_tokens, static_page_list  # noqa: E402
from locks.selector import Selection  # noqa: E402
from locks.summaries import build_summaries, page_scores  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOL = {torch.float32: 1e-3, torch.bfloat16: 1e-2}

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's log(0) / inf - inf in the interpreter


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref| over the reference's finite entries; the -inf / +inf / NaN patterns must agree."""
    out, ref = out.float().cpu(), ref.float().cpu()
    fin = torch.isfinite(ref)
    assert torch.equal(fin, torch.isfinite(out)), "finite-entry patterns differ (unwritten NaN or wrong mask)"
    assert torch.equal(out[~fin], ref[~fin]), "non-finite entries differ"
    if not fin.any():
        return 0.0
    scale = ref[fin].abs().max().clamp(min=1e-30)
    return float((out[fin] - ref[fin]).abs().max() / scale)


def gen(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype).to(DEV)


# ------------------------------------------------------------------------------------------------------------------
# LOCKS page scoring

# (B, Hkv, G, d, pages, dtype): page counts are not multiples of the 16..64-page blocks of the kernel
LOCKS_CASES = [
    (1, 2, 1, 64, 37, torch.float32),
    (2, 1, 3, 128, 21, torch.bfloat16),
    (1, 2, 4, 128, 50, torch.float32),
    (1, 1, 7, 64, 45, torch.bfloat16),
    (1, 1, 16, 128, 19, torch.float32),
    (1, 2, 16, 64, 70, torch.bfloat16),
]


def _locks_inputs(B, Hkv, G, d, P, dtype, seed=0, extra=5):
    keys = gen(B, Hkv, P * 16 + extra, d, dtype=dtype, seed=seed)  # a partial page too (ignored by summaries)
    keys = keys * (1 + torch.linspace(0, 3, d, device=DEV))  # uneven channel scales, like real keys
    q = gen(B, Hkv * G, d, dtype=dtype, seed=seed + 1) * 2
    return q, build_summaries(keys.to(dtype))


@pytest.mark.parametrize("B,Hkv,G,d,P,dtype", LOCKS_CASES)
def test_locks_page_scores(B, Hkv, G, d, P, dtype):
    q, s = _locks_inputs(B, Hkv, G, d, P, dtype)
    scaling = d ** -0.5
    ref = page_scores(q, s, scaling)
    with poisoned():
        out = locks_page_scores(q, s, scaling)
    assert out.shape == ref.shape and out.dtype == torch.float32
    assert rel_err(out, ref) <= TOL[dtype]


def _topk_equal_except_ties(out: torch.Tensor, ref: torch.Tensor, k: int, tol: float) -> None:
    """top-k index sets agree, except pages whose reference score ties (within tol) the k-th largest."""
    a = topk_pages(out, k).sort(-1).values.cpu()
    b = topk_pages(ref, k).sort(-1).values.cpu()
    kth = torch.topk(ref, k, dim=-1).values[..., -1:].cpu()
    refc = ref.cpu()
    for row in range(a.reshape(-1, k).shape[0]):
        sa, sb = set(a.reshape(-1, k)[row].tolist()), set(b.reshape(-1, k)[row].tolist())
        for page in sa ^ sb:
            v, t = refc.reshape(-1, ref.shape[-1])[row, page], kth.reshape(-1)[row]
            assert abs(float(v - t)) <= tol * max(1.0, abs(float(t))), f"row {row}: page {page} differs (no tie)"


@pytest.mark.parametrize("mode", ["norm", "raw", "max"])
@pytest.mark.parametrize("case", [0, 2, 3, 5])
def test_locks_aggregated_scores(case, mode):
    B, Hkv, G, d, P, dtype = LOCKS_CASES[case]
    q, s = _locks_inputs(B, Hkv, G, d, P, dtype, seed=case)
    scaling = d ** -0.5
    lo, hi = 1, P - 4  # fair mode: sink page 0 and 4 recent pages are forced, the rest are candidates
    cand = torch.zeros(B, Hkv, P, dtype=torch.bool, device=DEV)
    cand[..., lo:hi] = True
    heads_ref = page_scores(q, s, scaling)
    ref = aggregate_heads(heads_ref, G, mode, cand)
    with poisoned():
        out, heads, logz = locks_aggregated_scores(q, s, scaling, G, mode, lo, hi, return_heads=True)
    assert out.shape == (B, Hkv, P)
    assert rel_err(out, ref) <= TOL[dtype]
    assert rel_err(heads, heads_ref) <= TOL[dtype]
    if mode != "raw":
        logz_ref = torch.logsumexp(heads_ref.view(B, Hkv, G, P)[..., lo:hi], dim=-1).view(B, -1)
        assert rel_err(logz, logz_ref) <= TOL[dtype]
    # bounds read from device tensors (CUDA-graph path) give the same result, bitwise
    with poisoned():
        out_t = locks_aggregated_scores(q, s, scaling, G, mode, torch.tensor(lo, device=DEV),
                                        torch.tensor(hi, device=DEV))
    assert torch.equal(out_t, out)
    # with device bounds the summaries of pages >= hi are not read (they may not exist yet in a static decode)
    tail = {name: getattr(s, name).clone() for name in ("mu_scale", "w")}
    s.mu_scale[:, :, hi:], s.w[:, :, hi:] = float("nan"), float("nan")
    with poisoned():
        out_n = locks_aggregated_scores(q, s, scaling, G, mode, lo, torch.tensor(hi, device=DEV))
    for name, value in tail.items():
        setattr(s, name, value)
    assert torch.equal(out_n, out)
    # the range counted back from a device length (static decode): [lo, length // 16 - 4) is [lo, hi) here
    for L in (P * 16, P * 16 + 15):
        out_l = locks_aggregated_scores(q, s, scaling, G, mode, lo, 4 + (P - hi) - 4, length=torch.tensor([L], device=DEV))
        assert torch.equal(out_l, out)
    # the selected page sets equal the reference's except for exact ties
    k = (hi - lo) // 3
    _topk_equal_except_ties(out, ref, k, 1e-5)


@pytest.mark.parametrize("block_p,chunk", [(16, 16), (16, 4), (16, 2), (32, 8)])
@pytest.mark.parametrize("case", [2, 5])
def test_locks_scores_at_every_launch_shape(case, block_p, chunk):
    """The GPU's launch shapes (16 pages per program; the page LSE in chunks of 4 tokens for fp32 queries), which
    the interpreter does not pick by default, give the reference scores; a bad chunk is refused."""
    B, Hkv, G, d, P, dtype = LOCKS_CASES[case]
    q, s = _locks_inputs(B, Hkv, G, d, P, dtype, seed=case)
    scaling = d ** -0.5
    cand = torch.zeros(B, Hkv, P, dtype=torch.bool, device=DEV)
    cand[..., 1:P - 4] = True
    heads_ref = page_scores(q, s, scaling)
    with poisoned():
        out, heads, _ = locks_aggregated_scores(q, s, scaling, G, "norm", 1, P - 4, return_heads=True,
                                                block_p=block_p, chunk=chunk)
    assert rel_err(heads, heads_ref) <= TOL[dtype]
    assert rel_err(out, aggregate_heads(heads_ref, G, "norm", cand)) <= TOL[dtype]
    with pytest.raises(ValueError, match="chunk"):
        locks_aggregated_scores(q, s, scaling, G, "norm", 1, P - 4, chunk=3)


def test_locks_aggregation_one_pass_and_edges():
    B, Hkv, G, d, P, dtype = 1, 2, 4, 64, 33, torch.float32
    q, s = _locks_inputs(B, Hkv, G, d, P, dtype, seed=7)
    scaling = d ** -0.5
    heads_ref = page_scores(q, s, scaling)
    # one-pass variant with the exact log Z passed in == the two-pass result
    exact, _, logz = locks_aggregated_scores(q, s, scaling, G, "norm", 0, P, return_heads=True)
    with poisoned():
        one = locks_aggregated_scores(q, s, scaling, G, "norm", 0, None, log_z=logz)
    assert rel_err(one, exact) <= 1e-5
    with poisoned():
        mx = locks_aggregated_scores(q, s, scaling, G, "max", 0, P, log_z=logz)
    everything = torch.ones(B, Hkv, P, dtype=torch.bool, device=DEV)
    assert rel_err(mx, aggregate_heads(heads_ref, G, "max", everything)) <= 1e-3
    # an empty candidate range: every page -inf
    with poisoned():
        none = locks_aggregated_scores(q, s, scaling, G, "norm", 5, 5)
    assert torch.isneginf(none).all()


def test_locks_exact_ties_select_a_tied_page():
    """Duplicate pages tie exactly; any of them is an acceptable choice, everything else must match."""
    B, Hkv, G, d = 1, 1, 4, 64
    page = gen(1, 1, 16, d, seed=3)
    keys = torch.cat([gen(1, 1, 16 * 8, d, seed=4), page, page, page, gen(1, 1, 16 * 6, d, seed=5)], dim=2)
    s = build_summaries(keys)
    q = gen(B, Hkv * G, d, seed=6)
    P = s.num_pages
    cand = torch.ones(B, Hkv, P, dtype=torch.bool, device=DEV)
    ref = aggregate_heads(page_scores(q, s, 0.125), G, "norm", cand)
    out = locks_aggregated_scores(q, s, 0.125, G, "norm", 0, P)
    assert torch.equal(out[0, 0, 8:11], out[0, 0, 8:9].expand(3))  # bitwise ties stay ties
    for k in (3, 9, 10):
        _topk_equal_except_ties(out, ref, k, 1e-5)


# ------------------------------------------------------------------------------------------------------------------
# Quest page bound


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
    _topk_equal_except_ties(out, ref, 9, 1e-5)


# ------------------------------------------------------------------------------------------------------------------
# split-K sparse decode, paged decode, FullKV decode


def _kv(B, Hkv, G, d, L, dtype, seed):
    return (gen(B, Hkv * G, d, dtype=dtype, seed=seed), gen(B, Hkv, L, d, dtype=dtype, seed=seed + 1),
            gen(B, Hkv, L, d, dtype=dtype, seed=seed + 2))


def _ref_decode(q, k, v, sel, scaling):
    """The reference on fp32 copies of the inputs (fp32 output), so that bf16 runs measure the kernel's error and not
    the reference's own rounding of its output to bf16."""
    f = torch.float32
    sel32 = Selection(indices=sel.indices, valid=sel.valid)
    return ref_sparse_decode(q.to(f), k.to(f), v.to(f), sel32, scaling)


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
    q, k, v = _kv(B, Hkv, G, d, L, dtype, seed=K)
    gs = G if per_head else 1
    g = torch.Generator().manual_seed(L)
    idx = torch.randint(0, L, (B, Hkv, gs, K), generator=g)
    valid = torch.rand(B, Hkv, gs, K, generator=g) > 0.25
    idx = torch.where(valid, idx, torch.randint(-5, 3 * L, idx.shape, generator=g))  # garbage where invalid
    sel = Selection(indices=idx.to(DEV), valid=valid.to(DEV))
    scaling = d ** -0.5
    ref_out, ref_lse = _ref_decode(q, k, v, sel, scaling)
    with poisoned():
        out, lse = sparse_decode(q, k, v, sel, scaling, num_splits=splits, block_n=16)
    assert out.dtype == q.dtype and out.shape == (B, Hkv * G, d) and lse.dtype == torch.float32
    assert rel_err(out, ref_out) <= TOL[dtype]
    assert rel_err(lse, ref_lse) <= 1e-3
    # the reference itself on the original dtype agrees too (what the lead swaps in)
    out_ref_dtype, _ = ref_sparse_decode(q, k, v, sel, scaling)
    assert rel_err(out, out_ref_dtype) <= TOL[dtype]


def test_sparse_decode_invalid_rows_and_defaults():
    """A head whose entries are all invalid gets out 0 and lse -inf (the reference gives NaN); the default split
    count and block size agree with forced ones; a dense Selection goes to full_decode."""
    B, Hkv, G, d, L, K = 1, 2, 4, 64, 100, 40
    q, k, v = _kv(B, Hkv, G, d, L, torch.float32, seed=11)
    idx = torch.randint(0, L, (B, Hkv, 1, K), device=DEV)
    valid = torch.ones_like(idx, dtype=torch.bool)
    valid[:, 1] = False
    with poisoned():
        out, lse = sparse_decode(q, k, v, Selection(indices=idx, valid=valid), 0.125)
    assert torch.isneginf(lse[:, G:]).all() and (out[:, G:] == 0).all()
    ref_out, ref_lse = _ref_decode(q, k, v, Selection(indices=idx, valid=valid), 0.125)
    assert rel_err(out[:, :G], ref_out[:, :G]) <= 1e-3 and rel_err(lse[:, :G], ref_lse[:, :G]) <= 1e-3
    with poisoned():
        out2, lse2 = sparse_decode(q, k, v, Selection(indices=idx, valid=valid), 0.125, num_splits=4, block_n=32)
    assert rel_err(out2[:, :G], out[:, :G]) <= 1e-5
    dense_out, dense_lse = sparse_decode(q, k, v, Selection.all_tokens(), 0.125)
    full_out, full_lse = full_decode(q, k, v, 0.125)
    assert torch.equal(dense_out, full_out) and torch.equal(dense_lse, full_lse)


@pytest.mark.parametrize("B,Hkv,G,d,L,dtype,length", [
    (1, 2, 4, 128, 333, torch.bfloat16, None),
    (2, 1, 3, 64, 257, torch.float32, 200),
    (1, 1, 16, 64, 190, torch.float32, None),
    (1, 2, 7, 128, 100, torch.float32, 77),
])
def test_full_decode(B, Hkv, G, d, L, dtype, length):
    q, k, v = _kv(B, Hkv, G, d, L, dtype, seed=L)
    n = L if length is None else length
    sel = Selection(indices=torch.arange(n, device=DEV).expand(B, Hkv, 1, n),
                    valid=torch.ones(B, Hkv, 1, n, dtype=torch.bool, device=DEV))
    ref_out, ref_lse = _ref_decode(q, k, v, sel, d ** -0.5)
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
    q, k, v = _kv(B, Hkv, G, d, L, dtype, seed=G)
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
    ref_out, ref_lse = _ref_decode(q, k, v, sel, d ** -0.5)
    with poisoned():
        out, lse = paged_decode(q, k, v, pages.int(), d ** -0.5, pvalid, page_size=n, block_n=32, num_splits=2)
    assert rel_err(out, ref_out) <= TOL[dtype] and rel_err(lse, ref_lse) <= 1e-3
    # a preallocated cache with more slots than valid tokens, the length on the device: same result
    k_big, v_big = (torch.cat([x, torch.full_like(x[:, :, :40], float("nan"))], 2) for x in (k, v))
    with poisoned():
        out_t, lse_t = paged_decode(q, k_big, v_big, pages.int(), d ** -0.5, pvalid, page_size=n,
                                    length=torch.tensor(L, device=DEV), block_n=32, num_splits=2)
    assert rel_err(out_t, ref_out) <= TOL[dtype] and rel_err(lse_t, ref_lse) <= 1e-3


def test_locks_fused_step_matches_reference_step():
    """Score + aggregate + top-k + forced pages + paged decode == the PyTorch path with the same selection."""
    B, Hkv, G, d, n = 1, 2, 4, 64, 16
    L = n * 40 + 9
    q, k, v = _kv(B, Hkv, G, d, L, torch.float32, seed=40)
    s = build_summaries(k)
    P = s.num_pages
    scaling = d ** -0.5
    lo, hi, kp = 1, P - 4, 8
    forced = torch.tensor([0, P - 4, P - 3, P - 2, P - 1, P], device=DEV)  # sink, recent pages, partial page P
    agg = locks_aggregated_scores(q, s, scaling, G, "norm", lo, hi)
    pages = select_pages(agg, kp, forced)
    out, lse = paged_decode(q, k, v, pages, scaling)
    cand = torch.zeros(B, Hkv, P, dtype=torch.bool, device=DEV)
    cand[..., lo:hi] = True
    ref_agg = aggregate_heads(page_scores(q, s, scaling), G, "norm", cand)
    ref_top = torch.topk(ref_agg, kp, dim=-1).indices
    assert torch.equal(pages[..., :kp].sort(-1).values, ref_top.sort(-1).values)
    chosen = torch.cat([ref_top, forced[:-1].expand(B, Hkv, 5)], -1).sort(-1).values
    tokens = torch.cat([pages_to_tokens(chosen, n), torch.arange(P * n, L, device=DEV).expand(B, Hkv, L - P * n)], -1)
    sel = Selection(indices=tokens.unsqueeze(2), valid=torch.ones_like(tokens, dtype=torch.bool).unsqueeze(2))
    ref_out, ref_lse = ref_sparse_decode(q, k, v, sel, scaling)
    assert rel_err(out, ref_out) <= 1e-3 and rel_err(lse, ref_lse) <= 1e-3
    assert math.isfinite(float(lse.sum()))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_sizes_strided_inputs(seed):
    """Seeded random shapes; K/V are slices of a longer (static-cache-like) buffer and the query is a strided view."""
    g = torch.Generator().manual_seed(seed)

    def pick(xs):
        return xs[int(torch.randint(len(xs), (1,), generator=g))]

    B, Hkv, G, d = pick([1, 2]), pick([1, 2]), pick([1, 3, 4, 7, 16]), pick([64, 128])
    dtype = pick([torch.float32, torch.bfloat16])
    P = int(torch.randint(17, 90, (1,), generator=g))
    L = P * 16 + int(torch.randint(0, 16, (1,), generator=g))
    buf = gen(B, Hkv, L + 40, d, dtype=dtype, seed=seed)
    keys, values = buf[:, :, :L], gen(B, Hkv, L + 40, d, dtype=dtype, seed=seed + 9)[:, :, 40:]
    q = gen(B, 2, Hkv * G, d, dtype=dtype, seed=seed + 5)[:, 1]  # strides (2*Hq*d, d, 1)
    scaling = d ** -0.5
    s = build_summaries(keys)
    lo, hi = 1, P - int(torch.randint(1, 5, (1,), generator=g))
    cand = torch.zeros(B, Hkv, P, dtype=torch.bool, device=DEV)
    cand[..., lo:hi] = True
    ref = aggregate_heads(page_scores(q, s, scaling), G, "norm", cand)
    with poisoned():
        out = locks_aggregated_scores(q, s, scaling, G, "norm", lo, hi)
    assert rel_err(out, ref) <= TOL[dtype]
    _topk_equal_except_ties(out, ref, max(1, (hi - lo) // 4), 1e-5)
    K = int(torch.randint(1, 3 * 64, (1,), generator=g))
    gs = pick([1, G])
    idx = torch.randint(0, L, (B, Hkv, gs, K), generator=g).to(DEV)
    valid = (torch.rand(B, Hkv, gs, K, generator=g) > 0.1).to(DEV)
    sel = Selection(indices=idx, valid=valid)
    ref_out, ref_lse = _ref_decode(q, keys, values, sel, scaling)
    with poisoned():
        o, lse = sparse_decode(q, keys, values, sel, scaling)
    assert rel_err(o, ref_out) <= TOL[dtype] and rel_err(lse, ref_lse) <= 1e-3


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quest_append_equals_the_reference(dtype):
    from baselines.quest import QuestSelector
    from locks.selector import LayerInfo

    B, H, d, P = 2, 2, 64, 16
    keys = gen(B, H, 100, d, dtype=dtype, seed=3)
    sel = QuestSelector(LayerInfo(2, 4, H, d, d ** -0.5), 64)
    kmax, kmin = gen(B, H, 8, d, dtype=dtype, seed=4), gen(B, H, 8, d, dtype=dtype, seed=5)
    kmin = torch.minimum(kmin, kmax)
    for L in (33, 40, 48, 49):  # the first key of a page, inside a page, the last one, the next page's first
        sel._max, sel._min = kmax.clone(), kmin.clone()
        sel._append_static_reference(keys, torch.tensor([L], device=DEV))
        mx, mn = kmax.clone(), kmin.clone()
        quest_append(keys, mx, mn, torch.tensor([L], device=DEV), P)
        assert torch.equal(mx, sel._max) and torch.equal(mn, sel._min), L
        page = (L - 1) // P
        assert torch.equal(mx[:, :, page + 1 :], kmax[:, :, page + 1 :]) and torch.equal(mx[:, :, :page], kmax[:, :, :page])
