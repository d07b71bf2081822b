"""Invariants of the LOCKS page summaries (docs/methods/locks.md: 1-5, 10 (sign flips), 12, 13 and extras).

Every check compares against an independent reference (fp64 `torch.linalg.svd` per page, brute-force
log-sum-exp over explicitly reconstructed keys with `repeat_interleave` for GQA, numpy rounding, fp64 least
squares), never against the function under test.
"""
import math

import numpy as np
import pytest
import torch

from locks.core.paging import exact_page_lse
from locks.method.summaries import (
    PageSummaries,
    QuantizedPageSummaries,
    build_summaries,
    concat_summaries,
    dequantize,
    empty_summaries,
    pack_int4,
    page_scores,
    page_svd,
    quantize,
    score_bound,
    summary_bytes_per_page,
    unpack_int4,
)

N_PAGE = 16
RANK = 8


# ---------------------------------------------------------------------------------------------------------------
# data and references


def make_keys(kind, B, H, P, d, seed, tail=0, dtype=torch.bfloat16):
    """Synthetic post-RoPE-like keys [B, H, P*16 + tail, d].

    random:    per-head mean with a few outlier channels + isotropic noise;
    clustered: every page mixes 3 cluster centres (low rank) + small noise;
    spiked:    every page has 8 strong directions (decreasing strengths) + small isotropic noise, so the
               rank-8 subspace is well separated (sigma_8 - sigma_9 >> 1e-2 sigma_1);
    lowrank:   every page has rank(D) <= 3 exactly up to fp32 rounding (fp32 output).
    """
    g = torch.Generator().manual_seed(seed)
    L = P * N_PAGE + tail
    scale = torch.ones(d)
    scale[torch.randperm(d, generator=g)[:4]] = 6.0  # outlier channels
    head_mean = 3.0 * torch.randn(B, H, 1, d, generator=g) * scale
    if kind == "random":
        k = head_mean + torch.randn(B, H, L, d, generator=g) * scale
    elif kind == "clustered":
        centres = head_mean.unsqueeze(2) + 2.0 * torch.randn(B, H, P + 1, 3, d, generator=g) * scale
        pick = torch.randint(0, 3, (B, H, P + 1, N_PAGE), generator=g)
        k = torch.gather(centres, 3, pick.unsqueeze(-1).expand(B, H, P + 1, N_PAGE, d))
        k = k + 0.05 * torch.randn(k.shape, generator=g)
        k = k.reshape(B, H, (P + 1) * N_PAGE, d)[:, :, :L]
    elif kind == "spiked":
        a = torch.randn(B, H, P + 1, N_PAGE, RANK, generator=g) * torch.linspace(3.0, 1.0, RANK)
        basis = torch.linalg.qr(torch.randn(B, H, P + 1, d, RANK, generator=g))[0].mT * math.sqrt(d)
        k = head_mean.unsqueeze(2) + a @ basis + 0.05 * torch.randn(B, H, P + 1, N_PAGE, d, generator=g)
        k = k.reshape(B, H, (P + 1) * N_PAGE, d)[:, :, :L]
    elif kind == "lowrank":
        a = torch.randn(B, H, P + 1, N_PAGE, 3, generator=g, dtype=torch.float64)
        basis = torch.randn(B, H, P + 1, 3, d, generator=g, dtype=torch.float64) * scale.double()
        k = head_mean.double().unsqueeze(2) + 3.0 * a @ basis
        k = k.reshape(B, H, (P + 1) * N_PAGE, d)[:, :, :L]
        return k.to(torch.float32)
    else:
        raise ValueError(kind)
    return k.to(dtype)


def pages64(keys, n=N_PAGE):
    B, H, L, d = keys.shape
    P = L // n
    return keys[:, :, : P * n].double().reshape(B, H, P, n, d)


def ref_svd(keys, n=N_PAGE):
    """fp64 thin SVD of every centered page: (mu, D, sigma [.., n], W [.., n, d] rows = right singular vectors)."""
    X = pages64(keys, n)
    mu = X.mean(-2)
    D = X - mu.unsqueeze(-2)
    _, S, Wh = torch.linalg.svd(D, full_matrices=False)
    return mu, D, S, Wh


def ref_lse_from_keys(q, khat, scaling):
    """Brute force: khat [B,Hkv,P,n,d] (any reconstruction) -> [B,Hq,P] fp64 log-sum-exp, GQA via repeat_interleave."""
    B, Hq, d = q.shape
    G = Hq // khat.shape[1]
    k = khat.double().repeat_interleave(G, dim=1)  # [B,Hq,P,n,d]
    logits = scaling * torch.einsum("bgd,bgpnd->bgpn", q.double(), k)
    return torch.logsumexp(logits, dim=-1)


def unquant_recon(s):
    return s.mu.double().unsqueeze(-2) + s.c.double() @ s.v.double().mT


def quant_recon(s):
    mu_hat, v_hat, c_hat = dequantize(s)
    return mu_hat.double().unsqueeze(-2) + c_hat.double() @ v_hat.double().mT


def rand_q(B, Hq, d, seed, scale=1.0, keys=None):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, d, generator=g) * scale
    if keys is not None:  # partly aligned with the keys so logits are large and pages differ a lot
        Hkv = keys.shape[1]
        kbar = keys.float().mean(2).repeat_interleave(Hq // Hkv, dim=1)
        q = q + 0.3 * kbar / kbar.norm(dim=-1, keepdim=True) * math.sqrt(d)
    return q


SCALE = {64: 64**-0.5, 128: 128**-0.5}
CASES = [  # (kind, B, Hkv, Hq, P, d, seed)
    ("random", 1, 2, 4, 24, 128, 0),
    ("clustered", 2, 2, 8, 12, 128, 1),
    ("random", 2, 1, 3, 20, 64, 2),
    ("clustered", 1, 4, 4, 16, 64, 3),
    ("spiked", 1, 2, 8, 16, 128, 4),
    ("spiked", 2, 1, 2, 8, 64, 5),
]


# ---------------------------------------------------------------------------------------------------------------
# A8.1 shapes, dtypes, bytes


@pytest.mark.parametrize("d", [64, 128])
def test_shapes_dtypes_and_bytes(d):
    B, H, P = 2, 3, 7
    keys = make_keys("random", B, H, P, d, seed=10, tail=5)
    q = build_summaries(keys)
    assert isinstance(q, QuantizedPageSummaries)
    assert q.mu_int.dtype == torch.int8 and q.mu_int.shape == (B, H, P, d)
    assert q.mu_scale.dtype == torch.float16 and q.mu_scale.shape == (B, H, P)
    assert q.head_mean.dtype == torch.float32 and q.head_mean.shape == (B, H, d)
    assert q.v_pack.dtype == torch.uint8 and q.v_pack.shape == (B, H, P, RANK, d // 2)
    assert q.c_int.dtype == torch.int8 and q.c_int.shape == (B, H, P, N_PAGE, RANK)
    assert q.w.dtype == torch.float32 and q.w.shape == (B, H, P, RANK)
    assert q.rho.dtype == torch.float16 and q.rho.shape == (B, H, P)
    per_page = sum(t.nbytes for name, t in vars(q).items() if name != "head_mean") / (B * H * P)
    expected = d + 2 + RANK * d // 2 + N_PAGE * RANK + 4 * RANK + 2
    assert per_page == expected
    assert summary_bytes_per_page(q) == expected
    if d == 128:
        assert per_page == 804

    s = build_summaries(keys, quant="none")
    assert isinstance(s, PageSummaries)
    shapes = dict(mu=(B, H, P, d), v=(B, H, P, d, RANK), c=(B, H, P, N_PAGE, RANK), rho=(B, H, P),
                  sigma=(B, H, P, N_PAGE), head_mean=(B, H, d))
    for name, shape in shapes.items():
        t = getattr(s, name)
        assert t.shape == shape and t.dtype == torch.float32, name
    assert summary_bytes_per_page(s) == sum(t.nbytes for n_, t in vars(s).items() if n_ not in ("head_mean", "sigma")) / (B * H * P)


# ---------------------------------------------------------------------------------------------------------------
# A8.2 Gram/eigh path vs fp64 SVD


@pytest.mark.parametrize("kind,B,Hkv,Hq,P,d,seed", CASES)
def test_gram_path_matches_fp64_svd(kind, B, Hkv, Hq, P, d, seed):
    keys = make_keys(kind, B, Hkv, P, d, seed)
    s = page_svd(keys)
    mu, D, S, Wh = ref_svd(keys)
    torch.testing.assert_close(s.mu.double(), mu, rtol=0, atol=1e-5 * mu.abs().max().item())
    s1 = S[..., :1]
    # singular values: relative 1e-5 where sigma_m > 1e-2 sigma_1; elsewhere (e.g. sigma_16 ~ 0 from the centering)
    # the fp32 Gram path has a noise floor (A6 caveat (i): eps_32 sigma_1^2 / gap in the eigenvectors), 1e-4 sigma_1
    err = (s.sigma.double() - S).abs()
    assert (err <= 1e-4 * s1).all()
    big = S > 1e-2 * s1
    assert (err[big] <= 1e-5 * S[big]).all()
    assert (s.sigma[..., :-1] >= s.sigma[..., 1:]).all()  # descending

    # V^T V = I on the kept columns, 0 on the masked ones
    kept = s.v.norm(dim=-2) > 0
    gram = s.v.double().mT @ s.v.double()
    eye = torch.diag_embed(kept.double())
    assert (gram - eye).abs().max() <= 1e-5
    # kept columns are exactly those above the A6 threshold (up to ties at the threshold)
    thr = torch.maximum(1e-3 * s1, 1e-6 * D.norm(dim=(-2, -1)).unsqueeze(-1))
    clear = (S[..., :RANK] - thr).abs() > 1e-3 * thr
    assert torch.equal(kept[clear], (S[..., :RANK] > thr)[clear])

    # projector difference where the gap sigma_r - sigma_{r+1} > 1e-2 sigma_1
    # (for two r-dim subspaces ||V V^T - Vr Vr^T||_2 = ||(I - V V^T) Vr||_2, the sine of the largest angle)
    Vr = Wh[..., :RANK, :].mT
    V64 = s.v.double()
    gap = (S[..., RANK - 1] - S[..., RANK]) > 1e-2 * S[..., 0]
    gap &= kept.all(-1)
    if kind in ("random", "spiked"):
        assert gap.float().mean() > 0.3
    diff = torch.linalg.matrix_norm(Vr - V64 @ (V64.mT @ Vr), ord=2)
    assert (diff[gap] <= 1e-4).all(), diff[gap].max()

    # C = D V, masked columns of V and C are zero
    torch.testing.assert_close(s.c.double(), D @ s.v.double(), rtol=0, atol=1e-4 * S[..., 0].max().item())
    assert (s.c.masked_select(~kept.unsqueeze(-2).expand_as(s.c)) == 0).all()

    # sign canonicalization: the largest-|entry| of every kept column is positive
    idx = s.v.abs().argmax(dim=-2, keepdim=True)
    top = torch.gather(s.v, -2, idx).squeeze(-2)
    assert (top[kept] > 0).all()


def test_rank_masking_low_rank_pages():
    keys = make_keys("lowrank", 1, 2, 6, 128, seed=4)
    s = page_svd(keys)
    kept = s.v.norm(dim=-2) > 0
    assert kept[..., :3].all() and not kept[..., 3:].any()
    assert (s.c[..., 3:] == 0).all()
    eye = torch.eye(3, dtype=torch.float64)
    assert ((s.v[..., :3].double().mT @ s.v[..., :3].double()) - eye).abs().max() <= 1e-5


# ---------------------------------------------------------------------------------------------------------------
# A8.3 exactness


@pytest.mark.parametrize("d", [64, 128])
def test_exact_for_rank_le_r(d):
    g = torch.Generator().manual_seed(5)
    B, H, Hq, P = 2, 2, 4, 9
    # pages of rank(D) = 1, 3, 8 exactly (fp64 construction, fp32 keys)
    ks = []
    for rk in (1, 3, 8):
        a = torch.randn(B, H, 3, N_PAGE, rk, generator=g, dtype=torch.float64)
        basis = torch.randn(B, H, 3, rk, d, generator=g, dtype=torch.float64)
        mean = 2.0 * torch.randn(B, H, 3, 1, d, generator=g, dtype=torch.float64)
        ks.append(mean + a @ basis)
    keys = torch.cat(ks, dim=2).reshape(B, H, P * N_PAGE, d).float()
    s = build_summaries(keys, quant="none")
    for seed in range(3):
        q = rand_q(B, Hq, d, seed=100 + seed, keys=keys)
        S = page_scores(q, s, SCALE[d])
        ref = ref_lse_from_keys(q, pages64(keys), SCALE[d])
        assert (S.double() - ref).abs().max() <= 1e-4


def test_all_equal_keys():
    g = torch.Generator().manual_seed(6)
    B, H, Hq, P, d = 1, 2, 6, 4, 128
    rows = (3.0 * torch.randn(B, H, P, 1, d, generator=g)).to(torch.bfloat16)
    keys = rows.expand(B, H, P, N_PAGE, d).reshape(B, H, P * N_PAGE, d)
    q = rand_q(B, Hq, d, seed=7)
    s = build_summaries(keys, quant="none")
    assert (s.v == 0).all() and (s.c == 0).all() and (s.rho == 0).all() and (s.sigma == 0).all()
    mu_ref = rows.double().squeeze(-2).repeat_interleave(Hq // H, dim=1)  # [B,Hq,P,d]
    expected = SCALE[d] * torch.einsum("bgd,bgpd->bgp", q.double(), mu_ref) + math.log(N_PAGE)
    assert (page_scores(q, s, SCALE[d]).double() - expected).abs().max() <= 1e-5
    assert (score_bound(q, s, SCALE[d]) == 0).all()
    # quantized: same with the dequantized mean, and rho^ bounds |k - mu^|
    qs = build_summaries(keys)
    mu_hat = dequantize(qs)[0].double().repeat_interleave(Hq // H, dim=1)
    expected_q = SCALE[d] * torch.einsum("bgd,bgpd->bgp", q.double(), mu_hat) + math.log(N_PAGE)
    assert (page_scores(q, qs, SCALE[d]).double() - expected_q).abs().max() <= 1e-5


# ---------------------------------------------------------------------------------------------------------------
# A8.4 residuals


@pytest.mark.parametrize("kind,B,Hkv,Hq,P,d,seed", CASES + [("lowrank", 1, 2, 4, 10, 128, 8)])
def test_rho_bounds(kind, B, Hkv, Hq, P, d, seed):
    keys = make_keys(kind, B, Hkv, P, d, seed)
    X = pages64(keys)
    _, D, S, _ = ref_svd(keys)
    s = build_summaries(keys, quant="none")
    # rho <= sigma_{r+1} (1 + 1e-5); the absolute 1e-6 sigma_1 is the fp32 evaluation noise of the residual, which
    # matters only where sigma_{r+1} ~ 0 (rank <= r pages)
    assert (s.rho.double() <= S[..., RANK] * (1 + 1e-5) + 1e-6 * S[..., 0]).all()
    # rho is the realized max residual of the stored fp32 (mu, V, C)
    realized = (X - unquant_recon(s)).norm(dim=-1).amax(-1)
    torch.testing.assert_close(s.rho.double(), realized, rtol=1e-5, atol=1e-6 * S[..., 0].max().item())

    qs = quantize(s, keys, s.head_mean)
    realized_q = (X - quant_recon(qs)).norm(dim=-1).amax(-1)
    assert (qs.rho.double() >= realized_q).all()  # fp16 rounded up: a true upper bound, no tolerance
    assert (qs.rho.double() <= realized_q * (1 + 2e-3) + 1e-6).all()  # ... and only one fp16 step above


# ---------------------------------------------------------------------------------------------------------------
# A8.5 the score bound


@pytest.mark.parametrize("kind,B,Hkv,Hq,P,d,seed", CASES + [("lowrank", 1, 2, 4, 10, 128, 8)])
@pytest.mark.parametrize("quant", ["none", "int"])
def test_score_error_within_bound(kind, B, Hkv, Hq, P, d, seed, quant):
    keys = make_keys(kind, B, Hkv, P, d, seed)
    s = build_summaries(keys, quant=quant)
    for qseed in range(4):
        q = rand_q(B, Hq, d, seed=1000 + qseed, scale=1.0 + qseed, keys=keys if qseed % 2 else None)
        exact = ref_lse_from_keys(q, pages64(keys), SCALE[d])
        S = page_scores(q, s, SCALE[d]).double()
        eta = score_bound(q, s, SCALE[d]).double()
        assert S.shape == eta.shape == exact.shape == (B, Hq, P)
        # 1e-5 relative to the logit scale: fp32 evaluation of S (eta can be ~0 on low-rank pages)
        tol = 1e-5 * (1 + exact.abs())
        assert ((S - exact).abs() <= eta + tol).all(), ((S - exact).abs() - eta).max()


@pytest.mark.parametrize("quant", ["none", "int"])
def test_score_bound_formula(quant):
    B, Hkv, Hq, P, d = 2, 2, 6, 9, 128
    keys = make_keys("spiked", B, Hkv, P, d, seed=23)
    s = build_summaries(keys, quant=quant)
    q = rand_q(B, Hq, d, seed=24, keys=keys)
    qd = q.double().view(B, Hkv, Hq // Hkv, 1, d)
    if quant == "none":
        V = s.v.double().unsqueeze(2)  # [B,Hkv,1,P,d,r]
        resid = qd - (V @ (V.mT @ qd.unsqueeze(-1))).squeeze(-1)  # explicit (I - V V^T) q
        ref = SCALE[d] * resid.norm(dim=-1) * s.rho.double().unsqueeze(2)
    else:
        ref = SCALE[d] * qd.norm(dim=-1) * s.rho.double().unsqueeze(2)
    torch.testing.assert_close(score_bound(q, s, SCALE[d]).double(), ref.reshape(B, Hq, P), rtol=1e-4, atol=1e-6)


def test_score_bound_is_tight_on_adversarial_page():
    """Token 0 carries a 9th direction e (weaker than the 8 others): the residual is e on token 0 (and -e/16 on
    the rest); a query alpha*e makes token 0 dominate the exact mass while the summary sees only q.mu, so
    l - S -> eta_bar (minus log 16) as alpha grows: the bound is attained, not just valid."""
    g = torch.Generator().manual_seed(25)
    d = 128
    basis = torch.linalg.qr(torch.randn(d, RANK + 1, generator=g, dtype=torch.float64))[0].mT  # 9 orthonormal rows
    a = 4.0 * torch.randn(N_PAGE, RANK, generator=g, dtype=torch.float64)
    page = a @ basis[:RANK]
    page[0] += 1.0 * basis[RANK]
    keys = (page + 2.0 * torch.randn(d, generator=g, dtype=torch.float64)).float().view(1, 1, N_PAGE, d)
    s = build_summaries(keys, quant="none")
    q = (400.0 * basis[RANK]).float().view(1, 1, d)
    eta = score_bound(q, s, SCALE[d]).double().item()
    gapv = (exact_page_lse(q, keys, N_PAGE, SCALE[d]) - page_scores(q, s, SCALE[d])).double().item()
    assert eta > 10
    assert 0.9 * eta <= gapv <= eta + 1e-4


def test_exact_page_lse_matches_brute_force():
    keys = make_keys("random", 2, 2, 5, 64, seed=9, tail=3)
    q = rand_q(2, 6, 64, seed=11)
    ref = ref_lse_from_keys(q, pages64(keys), 0.3)
    out = exact_page_lse(q, keys, N_PAGE, 0.3)
    assert out.dtype == torch.float32 and out.shape == (2, 6, 5)
    torch.testing.assert_close(out.double(), ref, rtol=1e-6, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# scoring: unquantized formula, folded dequantization


@pytest.mark.parametrize("kind,B,Hkv,Hq,P,d,seed", CASES)
def test_page_scores_match_reconstruction(kind, B, Hkv, Hq, P, d, seed):
    keys = make_keys(kind, B, Hkv, P, d, seed)
    s = build_summaries(keys, quant="none")
    qs = quantize(s, keys, s.head_mean)
    for qseed in range(3):
        q = rand_q(B, Hq, d, seed=2000 + qseed, keys=keys if qseed else None)
        ref_u = ref_lse_from_keys(q, unquant_recon(s), SCALE[d])
        torch.testing.assert_close(page_scores(q, s, SCALE[d]).double(), ref_u, rtol=1e-6, atol=1e-5)
        # folded (A3.2) scores == scores of the dequantize()'d tensors
        ref_q = ref_lse_from_keys(q, quant_recon(qs), SCALE[d])
        torch.testing.assert_close(page_scores(q, qs, SCALE[d]).double(), ref_q, rtol=1e-6, atol=1e-5)


def test_scoring_in_page_slices(monkeypatch):
    """Long contexts are scored a slice of pages at a time; force tiny slices and compare to brute force."""
    import locks.core.paging as paging
    import locks.method.summaries as summ

    def tiny(P, e, dev):
        return [slice(j, min(P, j + 3)) for j in range(0, P, 3)]

    monkeypatch.setattr(summ, "page_slices", tiny)  # LOCKS scoring
    monkeypatch.setattr(paging, "page_slices", tiny)  # the exact page lse
    B, Hkv, Hq, P, d = 1, 2, 4, 11, 64
    keys = make_keys("random", B, Hkv, P, d, seed=27)
    q = rand_q(B, Hq, d, seed=28, keys=keys)
    torch.testing.assert_close(exact_page_lse(q, keys, N_PAGE, SCALE[d]).double(),
                               ref_lse_from_keys(q, pages64(keys), SCALE[d]), rtol=1e-6, atol=1e-5)
    s = build_summaries(keys, quant="none")
    qs = quantize(s, keys, s.head_mean)
    torch.testing.assert_close(page_scores(q, s, SCALE[d]).double(), ref_lse_from_keys(q, unquant_recon(s), SCALE[d]),
                               rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(page_scores(q, qs, SCALE[d]).double(),
                               ref_lse_from_keys(q, quant_recon(qs), SCALE[d]), rtol=1e-6, atol=1e-5)
    V = s.v.double().unsqueeze(2)
    qd = q.double().view(B, Hkv, Hq // Hkv, 1, d)
    ref = SCALE[d] * (qd - (V @ (V.mT @ qd.unsqueeze(-1))).squeeze(-1)).norm(dim=-1) * s.rho.double().unsqueeze(2)
    torch.testing.assert_close(score_bound(q, s, SCALE[d]).double(), ref.reshape(B, Hq, P), rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# A8.10 (part) sign flips


def test_scores_invariant_to_sign_flips():
    B, Hkv, Hq, P, d = 2, 2, 8, 10, 128
    keys = make_keys("clustered", B, Hkv, P, d, seed=12)
    g = torch.Generator().manual_seed(13)
    flips = torch.where(torch.rand(B, Hkv, P, RANK, generator=g) < 0.5, -1.0, 1.0)
    q = rand_q(B, Hq, d, seed=14, keys=keys)

    s = build_summaries(keys, quant="none")
    f = PageSummaries(mu=s.mu, v=s.v * flips.unsqueeze(-2), c=s.c * flips.unsqueeze(-2), rho=s.rho,
                      sigma=s.sigma, head_mean=s.head_mean)
    torch.testing.assert_close(page_scores(q, f, SCALE[d]), page_scores(q, s, SCALE[d]), rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(score_bound(q, f, SCALE[d]), score_bound(q, s, SCALE[d]), rtol=1e-5, atol=1e-6)

    qs = quantize(s, keys, s.head_mean)
    fi = flips.to(torch.int8)
    vint = unpack_int4(qs.v_pack) * fi.unsqueeze(-1)
    fq = QuantizedPageSummaries(mu_int=qs.mu_int, mu_scale=qs.mu_scale, head_mean=qs.head_mean,
                                v_pack=pack_int4(vint), c_int=qs.c_int * fi.unsqueeze(-2), w=qs.w, rho=qs.rho)
    torch.testing.assert_close(page_scores(q, fq, SCALE[d]), page_scores(q, qs, SCALE[d]), rtol=1e-6, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# A8.12 incremental build


@pytest.mark.parametrize("quant", ["none", "int"])
@pytest.mark.parametrize("B,H,P", [(2, 2, 11), (1, 2, 600)])  # 600: the batched build spans several chunks
def test_incremental_page_equals_batched(quant, B, H, P):
    d = 128
    keys = make_keys("random", B, H, P, d, seed=15)
    full = build_summaries(keys, quant=quant)
    m_h = full.head_mean
    last = build_summaries(keys[:, :, (P - 1) * N_PAGE :], quant=quant, head_mean=m_h)
    prefix = build_summaries(keys[:, :, : (P - 1) * N_PAGE], quant=quant, head_mean=m_h)
    grown = concat_summaries(prefix, last)
    for name, t in vars(full).items():
        got = getattr(last, name)
        want = t if name == "head_mean" else t[:, :, P - 1 :]
        assert torch.equal(got, want), name
        assert torch.equal(getattr(grown, name), t), name


def test_build_int_equals_quantize_of_page_svd():
    keys = make_keys("clustered", 2, 2, 700, 64, seed=26)  # > one chunk of pages
    s = page_svd(keys)
    for m_h in (None, torch.randn(2, 2, 64)):
        fused = build_summaries(keys, quant="int", head_mean=m_h)
        ref = quantize(s, keys, s.head_mean if m_h is None else m_h)
        for name, t in vars(ref).items():
            assert torch.equal(getattr(fused, name), t), name
        plain = build_summaries(keys, quant="none", head_mean=m_h)
        for name, t in vars(s).items():
            assert torch.equal(getattr(plain, name), t if name != "head_mean" or m_h is None else m_h), name


def test_concat_and_empty():
    B, H, d = 1, 2, 64
    keys = make_keys("random", B, H, 3, d, seed=16)
    for quant, cls in (("none", PageSummaries), ("int", QuantizedPageSummaries)):
        e = empty_summaries(B, H, d, N_PAGE, RANK, quant, "cpu")
        assert isinstance(e, cls) and e.num_pages == 0
        s = build_summaries(keys, quant=quant)
        for out in (concat_summaries(e, s), concat_summaries(s, empty_summaries(B, H, d, N_PAGE, RANK, quant, "cpu"))):
            for name, t in vars(s).items():
                assert torch.equal(getattr(out, name), t), (quant, name)
    a = build_summaries(keys)
    b = build_summaries(keys)  # head_mean of its own pages: same here
    assert concat_summaries(a, b).num_pages == 6
    other = build_summaries(keys, head_mean=torch.zeros(B, H, d))
    with pytest.raises(ValueError):
        concat_summaries(a, other)


# ---------------------------------------------------------------------------------------------------------------
# A8.13 quantization round trip, int4 packing


def test_pack_unpack_int4_identity_and_layout():
    g = torch.Generator().manual_seed(17)
    x = torch.randint(-8, 8, (3, 5, 4, 32), generator=g, dtype=torch.int8)
    for dim in (-1, 2, 3):
        p = pack_int4(x, dim=dim)
        assert p.dtype == torch.uint8
        assert torch.equal(unpack_int4(p, dim=dim), x)
    p = pack_int4(x)
    assert p.shape == (3, 5, 4, 16)
    lo = (x[..., 0::2].to(torch.int16) & 0xF)
    hi = (x[..., 1::2].to(torch.int16) & 0xF)
    assert torch.equal(p.to(torch.int16), lo | (hi << 4))  # low nibble = even channel
    with pytest.raises(ValueError):
        pack_int4(torch.tensor([9, 0], dtype=torch.int8))


@pytest.mark.parametrize("kind,B,Hkv,Hq,P,d,seed", CASES[:2] + [("lowrank", 1, 2, 2, 5, 64, 18)])
def test_quantization_round_trip(kind, B, Hkv, Hq, P, d, seed):
    keys = make_keys(kind, B, Hkv, P, d, seed)
    s = build_summaries(keys, quant="none")
    qs = quantize(s, keys, s.head_mean)
    X = pages64(keys)

    # mu: mu^ = m_h + a mu_int with |mu^ - mu| <= a/2 (a is the stored fp16 scale), |mu_int| <= 127
    a = qs.mu_scale.double().unsqueeze(-1)
    mu_hat = qs.head_mean.double().unsqueeze(2) + a * qs.mu_int.double()
    assert (mu_hat - s.mu.double()).abs().le(a / 2 * (1 + 1e-6) + 1e-6).all()
    assert qs.mu_int.abs().max() <= 127
    amax = (s.mu.double() - qs.head_mean.double().unsqueeze(2)).abs().amax(-1)
    assert (qs.mu_scale.double() >= amax / 127).all()  # rounded up: clipping never needed
    torch.testing.assert_close(dequantize(qs)[0].double(), mu_hat, rtol=0, atol=1e-5)

    # V: int4 per column, scale b = max|V col| / 7, round-half-even (numpy reference) then clip
    V = s.v.double()
    b = V.abs().amax(dim=-2, keepdim=True) / 7
    b = torch.where(b > 0, b, torch.ones_like(b))
    vint_ref = torch.from_numpy(np.clip(np.round((s.v / b.float()).numpy()), -7, 7)).to(torch.int8)
    vint = unpack_int4(qs.v_pack).mT  # [.., d, r]
    assert (vint.int() - vint_ref.int()).abs().max() <= 1  # fp32 vs fp64 division can flip exact ties
    assert (vint != vint_ref).float().mean() < 1e-3
    assert (vint.double() * b - V).abs().le(b / 2 * (1 + 1e-5)).all()

    # C: least-squares refit against V^ (fp64 lstsq), then int8 per column; w = b t
    V_hat = vint.double() * b
    D = X - s.mu.double().unsqueeze(-2)
    zero = (V_hat == 0).all(dim=-2)
    C_ref = D @ torch.linalg.pinv(V_hat).mT  # least squares; pinv gives 0 for the zero (masked) columns
    assert (C_ref.masked_select(zero.unsqueeze(-2).expand_as(C_ref)) == 0).all()
    t = C_ref.abs().amax(dim=-2, keepdim=True) / 127
    t = torch.where(t > 0, t, torch.ones_like(t))
    cscale = C_ref.abs().amax().item()
    assert (qs.c_int.double() * t - C_ref).abs().le(t / 2 + 1e-4 * cscale).all()
    torch.testing.assert_close(qs.w.double(), (b * t).squeeze(-2), rtol=1e-4, atol=0)


# ---------------------------------------------------------------------------------------------------------------
# dtypes, P = 0, partial pages, rank 0


def test_bf16_keys_equal_their_fp32_upcast():
    keys = make_keys("random", 1, 2, 6, 128, seed=19)
    assert keys.dtype == torch.bfloat16
    for quant in ("none", "int"):
        a = build_summaries(keys, quant=quant)
        b = build_summaries(keys.float(), quant=quant)
        for name, t in vars(a).items():
            assert torch.equal(t, getattr(b, name)), (quant, name)
        c = build_summaries(keys.double(), quant=quant)  # any float dtype: upcast/downcast to fp32 is exact here
        for name, t in vars(a).items():
            assert torch.equal(t, getattr(c, name)), (quant, name)


@pytest.mark.parametrize("quant", ["none", "int"])
def test_zero_pages(quant):
    B, H, Hq, d = 2, 2, 4, 64
    keys = torch.randn(B, H, 11, d).to(torch.bfloat16)
    s = build_summaries(keys, quant=quant)
    assert s.num_pages == 0
    assert (s.head_mean == 0).all() and s.head_mean.shape == (B, H, d)
    q = torch.randn(B, Hq, d)
    assert page_scores(q, s, 0.1).shape == (B, Hq, 0)
    assert score_bound(q, s, 0.1).shape == (B, Hq, 0)
    assert exact_page_lse(q, keys, N_PAGE, 0.1).shape == (B, Hq, 0)
    assert summary_bytes_per_page(s) == summary_bytes_per_page(build_summaries(torch.randn(B, H, 16, d), quant=quant))
    e = empty_summaries(B, H, d, N_PAGE, RANK, quant, "cpu")
    for name, t in vars(s).items():
        assert t.shape == getattr(e, name).shape and t.dtype == getattr(e, name).dtype


@pytest.mark.parametrize("quant", ["none", "int"])
def test_partial_tail_is_ignored(quant):
    keys = make_keys("random", 2, 2, 5, 64, seed=20, tail=7)
    assert keys.shape[2] == 5 * N_PAGE + 7
    a = build_summaries(keys, quant=quant)
    b = build_summaries(keys[:, :, : 5 * N_PAGE], quant=quant)
    assert a.num_pages == 5
    for name, t in vars(a).items():
        assert torch.equal(t, getattr(b, name)), name


def test_rank_zero_is_centroid_only():
    B, H, Hq, P, d = 1, 2, 4, 6, 64
    keys = make_keys("random", B, H, P, d, seed=21)
    s = build_summaries(keys, rank=0, quant="none")
    q = rand_q(B, Hq, d, seed=22)
    mu = pages64(keys).mean(-2).repeat_interleave(Hq // H, dim=1)
    expected = SCALE[d] * torch.einsum("bgd,bgpd->bgp", q.double(), mu) + math.log(N_PAGE)
    torch.testing.assert_close(page_scores(q, s, SCALE[d]).double(), expected, rtol=1e-6, atol=1e-5)
    _, D, _, _ = ref_svd(keys)
    torch.testing.assert_close(s.rho.double(), D.norm(dim=-1).amax(-1), rtol=1e-5, atol=1e-5)
    qs = build_summaries(keys, rank=0)
    assert summary_bytes_per_page(qs) == d + 2 + 2
    exact = ref_lse_from_keys(q, pages64(keys), SCALE[d])
    assert ((page_scores(q, qs, SCALE[d]).double() - exact).abs() <= score_bound(q, qs, SCALE[d]).double() + 1e-5).all()


def test_invalid_arguments():
    keys = torch.randn(1, 1, 32, 64)
    with pytest.raises(ValueError):
        build_summaries(keys, page_size=12)
    with pytest.raises(ValueError):
        build_summaries(keys, page_size=16, rank=16)
    with pytest.raises(ValueError):
        build_summaries(keys, quant="fp8")
    s = build_summaries(keys)
    with pytest.raises(ValueError):
        page_scores(torch.randn(1, 3, 64), build_summaries(torch.randn(1, 2, 32, 64)), 0.1)
    assert page_scores(torch.randn(1, 2, 64), s, 0.1).shape == (1, 2, 2)
