"""The fused coverage kernel (locks/kernels/coverage.py) against the formulas written out in PyTorch."""
import pytest
import torch

from locks.kernels import coverage_step, poisoned


def reference(q, keys, L, scaling, lse_sel, sinks, cert):
    """Per head: coverage (sinks in both sums), certificate and plug-in coverage over the candidate pages outside the
    page list, soundness; summed as the step's counters are."""
    B, Hq, d = q.shape
    Hkv = keys.shape[1]
    G = Hq // Hkv
    logits = torch.einsum("bhgd,bhld->bhgl", q.view(B, Hkv, G, d).double(), keys[:, :, :L].double()) * scaling
    dense = torch.logsumexp(logits, -1).reshape(B, Hq)
    sel = lse_sel.double()
    sel_s, dense_s = sel, dense
    if sinks is not None:
        sel_s = torch.logaddexp(sel, sinks.double().expand(B, Hq))
        dense_s = torch.logaddexp(dense, sinks.double().expand(B, Hq))
    cov = torch.exp(sel_s - dense_s)
    if cert is None:
        return cov.sum(), None
    n, S, R = cert["page_size"], cert["sink_pages"], cert["recent_pages"]
    P = cert["scores"].shape[-1]
    outside = torch.zeros(B, Hkv, P, dtype=torch.bool)
    outside[:, :, S : min(L // n - R, P)] = True
    for b in range(B):
        for h in range(Hkv):
            for page, ok in zip(cert["pages"][b, h].flatten().tolist(), cert["valid"][b, h].flatten().tolist()):
                if ok and 0 <= page < P:
                    outside[b, h, page] = False
    outside = outside.repeat_interleave(G, dim=1)
    eta = torch.zeros(B, Hq, P, dtype=torch.float64)
    if cert["rho"] is not None:
        qn = q.double().norm(dim=-1, keepdim=True)
        eta = scaling * qn * cert["rho"][..., :P].double().repeat_interleave(G, dim=1)
    s = cert["scores"].double()
    rest_b = torch.logsumexp((s + eta).masked_fill(~outside, float("-inf")), -1)
    rest_p = torch.logsumexp(s.masked_fill(~outside, float("-inf")), -1)
    c = torch.exp(sel - torch.logaddexp(sel, rest_b))
    p = torch.exp(sel - torch.logaddexp(sel, rest_p))
    sound = (c <= cov + cert["tol"]).double()
    w = float(L > cert["budget"])
    count = B * Hq * w
    diag = torch.tensor([[c.sum() * w, count], [p.sum() * w, count], [sound.sum() * w, count]], dtype=torch.float64)
    return cov.sum(), diag


@pytest.mark.parametrize("B,Hkv,G,d,C,L,sinks,rho,sink_pages,recent_pages", [
    (1, 2, 4, 32, 512, 300, False, True, 0, 0),
    (2, 1, 3, 16, 700, 700, True, True, 1, 2),
    (1, 3, 1, 64, 256, 97, False, False, 0, 1),
    (2, 2, 2, 32, 1024, 250, True, True, 0, 0),  # L <= budget: the certificate counts nothing
])
def test_coverage_kernel_matches_the_formulas(B, Hkv, G, d, C, L, sinks, rho, sink_pages, recent_pages):
    gen = torch.Generator().manual_seed(C + L)
    Hq, n, budget = Hkv * G, 16, 256
    P = C // n
    q = torch.randn(B, Hq, d, generator=gen)
    keys = torch.randn(B, Hkv, C, d, generator=gen)
    keys[:, :, L:] = 1e4  # slots past the length: never read
    lse_sel = torch.randn(B, Hq, generator=gen) + 3
    sink = torch.randn(Hq, generator=gen) if sinks else None
    Kp = 9
    pages = torch.randint(0, P, (B, Hkv, 1, Kp), generator=gen).to(torch.int32)
    valid = torch.rand(B, Hkv, 1, Kp, generator=gen) < 0.7
    cert = dict(scores=torch.randn(B, Hq, P, generator=gen), rho=torch.rand(B, Hkv, P + 3, generator=gen).half()
                if rho else None, pages=pages, valid=valid, sink_pages=sink_pages, recent_pages=recent_pages,
                page_size=n, budget=budget, tol=1e-5)
    for certificate in (None, cert):
        coverage = torch.full((1,), 2.5, dtype=torch.float64)
        diagnostics = torch.ones(3, 2, dtype=torch.float64)
        with poisoned():
            coverage_step(q, keys, torch.tensor([L]), d ** -0.5, lse_sel, sink, coverage, certificate, diagnostics)
        want_cov, want_diag = reference(q, keys, L, d ** -0.5, lse_sel, sink, certificate)
        assert coverage.item() == pytest.approx(2.5 + want_cov.item(), rel=1e-5)
        if certificate is None:
            assert torch.equal(diagnostics, torch.ones(3, 2, dtype=torch.float64))
        else:
            assert torch.allclose(diagnostics, 1 + want_diag, rtol=1e-5, atol=1e-6)
