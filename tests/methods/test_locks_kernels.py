"""The LOCKS scoring kernels (locks/method/kernels.py) against the PyTorch scores of locks/method/summaries.py and
the GQA aggregation of locks/core/paging.py, under the Triton interpreter on CPU (compiled on CUDA), outputs poisoned
with NaN; and the fused LOCKS step (score, top-k, paged decode) against the reference step."""
from __future__ import annotations

import math

import pytest
import torch
import triton  # noqa: F401  (a dev dependency: a missing triton fails, it never skips)

from locks.core.paging import aggregate_heads, pages_to_tokens
from locks.core.reference import sparse_decode as ref_sparse_decode
from locks.core.selector import Selection
from locks.kernels import paged_decode, poisoned, select_pages, sparse_decode
from locks.method.kernels import locks_aggregated_scores, locks_page_scores
from locks.method.summaries import build_summaries, page_scores
from tests.helpers import DEV, TOL, gen, kv_inputs, locks_inputs, ref_decode_fp32, rel_err, topk_equal_except_ties

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's log(0) / inf - inf in the interpreter


# (B, Hkv, G, d, pages, dtype): page counts are not multiples of the 16..64-page blocks of the kernel
LOCKS_CASES = [
    (1, 2, 1, 64, 37, torch.float32),
    (2, 1, 3, 128, 21, torch.bfloat16),
    (1, 2, 4, 128, 50, torch.float32),
    (1, 1, 7, 64, 45, torch.bfloat16),
    (1, 1, 16, 128, 19, torch.float32),
    (1, 2, 16, 64, 70, torch.bfloat16),
]


@pytest.mark.parametrize("B,Hkv,G,d,P,dtype", LOCKS_CASES)
def test_locks_page_scores(B, Hkv, G, d, P, dtype):
    q, s = locks_inputs(B, Hkv, G, d, P, dtype)
    scaling = d ** -0.5
    ref = page_scores(q, s, scaling)
    with poisoned():
        out = locks_page_scores(q, s.kernel_tensors(), scaling)
    assert out.shape == ref.shape and out.dtype == torch.float32
    assert rel_err(out, ref) <= TOL[dtype]


@pytest.mark.parametrize("mode", ["norm", "raw", "max"])
@pytest.mark.parametrize("case", [0, 2, 3, 5])
def test_locks_aggregated_scores(case, mode):
    B, Hkv, G, d, P, dtype = LOCKS_CASES[case]
    q, s = locks_inputs(B, Hkv, G, d, P, dtype, seed=case)
    scaling = d ** -0.5
    lo, hi = 1, P - 4  # fair mode: sink page 0 and 4 recent pages are forced, the rest are candidates
    cand = torch.zeros(B, Hkv, P, dtype=torch.bool, device=DEV)
    cand[..., lo:hi] = True
    heads_ref = page_scores(q, s, scaling)
    ref = aggregate_heads(heads_ref, G, mode, cand)
    with poisoned():
        out, heads, logz = locks_aggregated_scores(q, s.kernel_tensors(), scaling, G, mode, lo, hi, return_heads=True)
    assert out.shape == (B, Hkv, P)
    assert rel_err(out, ref) <= TOL[dtype]
    assert rel_err(heads, heads_ref) <= TOL[dtype]
    if mode != "raw":
        logz_ref = torch.logsumexp(heads_ref.view(B, Hkv, G, P)[..., lo:hi], dim=-1).view(B, -1)
        assert rel_err(logz, logz_ref) <= TOL[dtype]
    # bounds read from device tensors (CUDA-graph path) give the same result, bitwise
    with poisoned():
        out_t = locks_aggregated_scores(q, s.kernel_tensors(), scaling, G, mode, torch.tensor(lo, device=DEV),
                                        torch.tensor(hi, device=DEV))
    assert torch.equal(out_t, out)
    # with device bounds the summaries of pages >= hi are not read (they may not exist yet in a static decode)
    tail = {name: getattr(s, name).clone() for name in ("mu_scale", "w")}
    s.mu_scale[:, :, hi:], s.w[:, :, hi:] = float("nan"), float("nan")
    with poisoned():
        out_n = locks_aggregated_scores(q, s.kernel_tensors(), scaling, G, mode, lo, torch.tensor(hi, device=DEV))
    for name, value in tail.items():
        setattr(s, name, value)
    assert torch.equal(out_n, out)
    # the range counted back from a device length (static decode): [lo, length // 16 - 4) is [lo, hi) here
    for L in (P * 16, P * 16 + 15):
        out_l = locks_aggregated_scores(q, s.kernel_tensors(), scaling, G, mode, lo, 4 + (P - hi) - 4, length=torch.tensor([L], device=DEV))
        assert torch.equal(out_l, out)
    # the selected page sets equal the reference's except for exact ties
    k = (hi - lo) // 3
    topk_equal_except_ties(out, ref, k, 1e-5)


@pytest.mark.parametrize("mode", ["norm", "raw", "max"])
def test_locks_static_scores_per_row_lengths_equal_rows_alone(mode):
    """length [B] (a page boundary, a short row, one near the capacity): row b's candidates are
    [lo, length[b] // 16 - hi); scores, aggregation and log Z equal the row alone bitwise, and the aggregation equals
    the int range of the row."""
    B, Hkv, G, d, P, dtype = 3, 2, 4, 64, 40, torch.bfloat16
    q, s = locks_inputs(B, Hkv, G, d, P, dtype, seed=9)
    scaling, lo, recent = d ** -0.5, 1, 2
    length = torch.tensor([16 * 25, 16 * 6 + 3, 16 * P - 1], device=DEV)
    summary = s.kernel_tensors()
    with poisoned():
        out, heads, logz = locks_aggregated_scores(q, summary, scaling, G, mode, lo, recent, length=length,
                                                   return_heads=True)
    for b, L in enumerate(length.tolist()):
        row = tuple(t[b : b + 1] for t in summary)
        alone = locks_aggregated_scores(q[b : b + 1], row, scaling, G, mode, lo, recent, length=length[b : b + 1],
                                        return_heads=True)
        assert torch.equal(out[b : b + 1], alone[0]) and torch.equal(heads[b : b + 1], alone[1]), b
        assert (logz is None and alone[2] is None) or torch.equal(logz[b : b + 1], alone[2])
        hi = L // 16 - recent
        assert torch.equal(out[b : b + 1], locks_aggregated_scores(q[b : b + 1], row, scaling, G, mode, lo, hi))
        assert torch.isneginf(out[b, :, hi:]).all() and torch.isfinite(out[b, :, lo:hi]).all()
    with pytest.raises(ValueError, match="1 or B"):
        locks_aggregated_scores(q, summary, scaling, G, mode, lo, recent, length=length[:2])


@pytest.mark.parametrize("block_p,chunk", [(16, 16), (16, 4), (16, 2), (32, 8)])
@pytest.mark.parametrize("case", [2, 5])
def test_locks_scores_at_every_launch_shape(case, block_p, chunk):
    """The GPU's launch shapes (16 pages per program; the page LSE in chunks of 4 tokens for fp32 queries), which
    the interpreter does not pick by default, give the reference scores; a bad chunk is refused."""
    B, Hkv, G, d, P, dtype = LOCKS_CASES[case]
    q, s = locks_inputs(B, Hkv, G, d, P, dtype, seed=case)
    scaling = d ** -0.5
    cand = torch.zeros(B, Hkv, P, dtype=torch.bool, device=DEV)
    cand[..., 1:P - 4] = True
    heads_ref = page_scores(q, s, scaling)
    with poisoned():
        out, heads, _ = locks_aggregated_scores(q, s.kernel_tensors(), scaling, G, "norm", 1, P - 4, return_heads=True,
                                                block_p=block_p, chunk=chunk)
    assert rel_err(heads, heads_ref) <= TOL[dtype]
    assert rel_err(out, aggregate_heads(heads_ref, G, "norm", cand)) <= TOL[dtype]
    with pytest.raises(ValueError, match="chunk"):
        locks_aggregated_scores(q, s.kernel_tensors(), scaling, G, "norm", 1, P - 4, chunk=3)


def test_locks_aggregation_one_pass_and_edges():
    B, Hkv, G, d, P, dtype = 1, 2, 4, 64, 33, torch.float32
    q, s = locks_inputs(B, Hkv, G, d, P, dtype, seed=7)
    scaling = d ** -0.5
    heads_ref = page_scores(q, s, scaling)
    # one-pass variant with the exact log Z passed in == the two-pass result
    exact, _, logz = locks_aggregated_scores(q, s.kernel_tensors(), scaling, G, "norm", 0, P, return_heads=True)
    with poisoned():
        one = locks_aggregated_scores(q, s.kernel_tensors(), scaling, G, "norm", 0, None, log_z=logz)
    assert rel_err(one, exact) <= 1e-5
    with poisoned():
        mx = locks_aggregated_scores(q, s.kernel_tensors(), scaling, G, "max", 0, P, log_z=logz)
    everything = torch.ones(B, Hkv, P, dtype=torch.bool, device=DEV)
    assert rel_err(mx, aggregate_heads(heads_ref, G, "max", everything)) <= 1e-3
    # an empty candidate range: every page -inf
    with poisoned():
        none = locks_aggregated_scores(q, s.kernel_tensors(), scaling, G, "norm", 5, 5)
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
    out = locks_aggregated_scores(q, s.kernel_tensors(), 0.125, G, "norm", 0, P)
    assert torch.equal(out[0, 0, 8:11], out[0, 0, 8:9].expand(3))  # bitwise ties stay ties
    for k in (3, 9, 10):
        topk_equal_except_ties(out, ref, k, 1e-5)


def test_locks_fused_step_matches_reference_step():
    """Score + aggregate + top-k + forced pages + paged decode == the PyTorch path with the same selection."""
    B, Hkv, G, d, n = 1, 2, 4, 64, 16
    L = n * 40 + 9
    q, k, v = kv_inputs(B, Hkv, G, d, L, torch.float32, seed=40)
    s = build_summaries(k)
    P = s.num_pages
    scaling = d ** -0.5
    lo, hi, kp = 1, P - 4, 8
    forced = torch.tensor([0, P - 4, P - 3, P - 2, P - 1, P], device=DEV)  # sink, recent pages, partial page P
    agg = locks_aggregated_scores(q, s.kernel_tensors(), scaling, G, "norm", lo, hi)
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
        out = locks_aggregated_scores(q, s.kernel_tensors(), scaling, G, "norm", lo, hi)
    assert rel_err(out, ref) <= TOL[dtype]
    topk_equal_except_ties(out, ref, max(1, (hi - lo) // 4), 1e-5)
    K = int(torch.randint(1, 3 * 64, (1,), generator=g))
    gs = pick([1, G])
    idx = torch.randint(0, L, (B, Hkv, gs, K), generator=g).to(DEV)
    valid = (torch.rand(B, Hkv, gs, K, generator=g) > 0.1).to(DEV)
    sel = Selection(indices=idx, valid=valid)
    ref_out, ref_lse = ref_decode_fp32(q, keys, values, sel, scaling)
    with poisoned():
        o, lse = sparse_decode(q, keys, values, sel.indices, sel.valid, scaling)
    assert rel_err(o, ref_out) <= TOL[dtype] and rel_err(lse, ref_lse) <= 1e-3

