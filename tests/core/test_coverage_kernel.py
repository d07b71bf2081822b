"""The fused coverage kernel (locks/kernels/coverage.py) against the formulas written out in PyTorch, per row."""
import pytest
import torch

from locks.kernels import coverage_step, poisoned


def reference(q, keys, lengths, scaling, lse_sel, sinks, cert):
    """Per head: coverage (sinks in both sums), certificate and plug-in coverage over the candidate pages outside the
    page list, soundness; summed per row as the step's counters are -> (coverage [B], diagnostics [B, 3, 2] or
    None). lengths: one per row."""
    B, Hq, d = q.shape
    Hkv = keys.shape[1]
    G = Hq // Hkv
    cov = torch.zeros(B, dtype=torch.float64)
    diag = torch.zeros(B, 3, 2, dtype=torch.float64)
    for b, L in enumerate(lengths):
        logits = torch.einsum("hgd,hld->hgl", q[b].view(Hkv, G, d).double(), keys[b, :, :L].double()) * scaling
        dense = torch.logsumexp(logits, -1).reshape(Hq)
        sel = lse_sel[b].double()
        sel_s, dense_s = sel, dense
        if sinks is not None:
            sel_s = torch.logaddexp(sel, sinks.double())
            dense_s = torch.logaddexp(dense, sinks.double())
        c_b = torch.exp(sel_s - dense_s)
        cov[b] = c_b.sum()
        if cert is None:
            continue
        n, S, R = cert["page_size"], cert["sink_pages"], cert["recent_pages"]
        P = cert["scores"].shape[-1]
        outside = torch.zeros(Hkv, P, dtype=torch.bool)
        outside[:, S : min(L // n - R, P)] = True
        for h in range(Hkv):
            for page, ok in zip(cert["pages"][b, h].flatten().tolist(), cert["valid"][b, h].flatten().tolist()):
                if ok and 0 <= page < P:
                    outside[h, page] = False
        outside = outside.repeat_interleave(G, dim=0)
        eta = torch.zeros(Hq, P, dtype=torch.float64)
        if cert["rho"] is not None:
            qn = q[b].double().norm(dim=-1, keepdim=True)
            eta = scaling * qn * cert["rho"][b, :, :P].double().repeat_interleave(G, dim=0)
        s = cert["scores"][b].double()
        rest_b = torch.logsumexp((s + eta).masked_fill(~outside, float("-inf")), -1)
        rest_p = torch.logsumexp(s.masked_fill(~outside, float("-inf")), -1)
        c = torch.exp(sel - torch.logaddexp(sel, rest_b))
        p = torch.exp(sel - torch.logaddexp(sel, rest_p))
        sound = (c <= c_b + cert["tol"]).double()
        w = float(L > cert["budget"])
        diag[b] = torch.tensor([[c.sum() * w, Hq * w], [p.sum() * w, Hq * w], [sound.sum() * w, Hq * w]])
    return cov, (None if cert is None else diag)


def inputs(B, Hkv, G, d, C, lengths, sinks, rho, sink_pages, recent_pages, seed):
    gen = torch.Generator().manual_seed(seed)
    Hq, n, budget = Hkv * G, 16, 256
    P = C // n
    q = torch.randn(B, Hq, d, generator=gen)
    keys = torch.randn(B, Hkv, C, d, generator=gen)
    for b, L in enumerate(lengths):
        keys[b, :, L:] = 1e4  # slots past the row's length: never read
    lse_sel = torch.randn(B, Hq, generator=gen) + 3
    sink = torch.randn(Hq, generator=gen) if sinks else None
    Kp = 9
    pages = torch.randint(0, P, (B, Hkv, 1, Kp), generator=gen).to(torch.int32)
    valid = torch.rand(B, Hkv, 1, Kp, generator=gen) < 0.7
    cert = dict(scores=torch.randn(B, Hq, P, generator=gen), rho=torch.rand(B, Hkv, P + 3, generator=gen).half()
                if rho else None, pages=pages, valid=valid, sink_pages=sink_pages, recent_pages=recent_pages,
                page_size=n, budget=budget, tol=1e-5)
    return q, keys, lse_sel, sink, cert


@pytest.mark.parametrize("B,Hkv,G,d,C,L,sinks,rho,sink_pages,recent_pages", [
    (1, 2, 4, 32, 512, 300, False, True, 0, 0),
    (2, 1, 3, 16, 700, 700, True, True, 1, 2),
    (1, 3, 1, 64, 256, 97, False, False, 0, 1),
    (2, 2, 2, 32, 1024, 250, True, True, 0, 0),  # L <= budget: the certificate counts nothing
])
def test_coverage_kernel_matches_the_formulas(B, Hkv, G, d, C, L, sinks, rho, sink_pages, recent_pages):
    q, keys, lse_sel, sink, cert = inputs(B, Hkv, G, d, C, [L] * B, sinks, rho, sink_pages, recent_pages, C + L)
    for certificate in (None, cert):
        coverage = torch.full((B,), 2.5, dtype=torch.float64)
        diagnostics = torch.ones(B, 3, 2, dtype=torch.float64)
        with poisoned():
            coverage_step(q, keys, torch.tensor([L]), d ** -0.5, lse_sel, sink, coverage, certificate, diagnostics)
        want_cov, want_diag = reference(q, keys, [L] * B, d ** -0.5, lse_sel, sink, certificate)
        assert torch.allclose(coverage, 2.5 + want_cov, rtol=1e-5, atol=0)
        if certificate is None:
            assert torch.equal(diagnostics, torch.ones(B, 3, 2, dtype=torch.float64))
        else:
            assert torch.allclose(diagnostics, 1 + want_diag, rtol=1e-5, atol=1e-6)
    if B == 1:  # one row: the layer's [3, 2] diagnostics are accepted as they are
        diagnostics = torch.zeros(3, 2, dtype=torch.float64)
        coverage_step(q, keys, torch.tensor([L]), d ** -0.5, lse_sel, sink, torch.zeros(1, dtype=torch.float64),
                      cert, diagnostics)
        assert torch.allclose(diagnostics, want_diag[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("sinks,rho", [(False, True), (True, False)])
def test_coverage_per_row_lengths_equal_rows_alone(sinks, rho):
    """length [B]: each row's coverage and diagnostics use its own length (a page boundary, a row within the budget:
    nothing certified, one near the capacity), equal the formulas, and equal the row alone bitwise; the counters
    are strided views of [layers, B] / [layers, B, 3, 2] tensors (and a transposed one), only row b's is touched."""
    B, Hkv, G, d, C = 3, 2, 3, 32, 640
    lengths = [16 * 20, 200, C - 5]
    q, keys, lse_sel, sink, cert = inputs(B, Hkv, G, d, C, lengths, sinks, rho, 1, 2, 11)
    length = torch.tensor(lengths)
    counters = torch.full((B, 4), 0.5, dtype=torch.float64)  # coverage[layer] = counters[:, layer]: stride 4
    diag_all = torch.ones(2, B, 3, 2, dtype=torch.float64)
    with poisoned():
        coverage_step(q, keys, length, d ** -0.5, lse_sel, sink, counters[:, 2], cert, diag_all[1], num_splits=3)
    assert (counters[:, [0, 1, 3]] == 0.5).all() and (diag_all[0] == 1).all()
    want_cov, want_diag = reference(q, keys, lengths, d ** -0.5, lse_sel, sink, cert)
    assert torch.allclose(counters[:, 2], 0.5 + want_cov, rtol=1e-5, atol=0)
    assert torch.allclose(diag_all[1], 1 + want_diag, rtol=1e-5, atol=1e-6)
    assert (diag_all[1, 1] == 1).all()  # 200 <= budget: the row's diagnostics get nothing
    for b in range(B):
        cov_b = torch.full((1,), 0.5, dtype=torch.float64)
        diag_b = torch.ones(1, 3, 2, dtype=torch.float64)
        row_cert = {k: (v[b : b + 1] if isinstance(v, torch.Tensor) else v) for k, v in cert.items()}
        coverage_step(q[b : b + 1], keys[b : b + 1], length[b : b + 1], d ** -0.5, lse_sel[b : b + 1], sink, cov_b,
                      row_cert, diag_b, num_splits=3)
        assert torch.equal(cov_b, counters[b : b + 1, 2]) and torch.equal(diag_b[0], diag_all[1, b]), b
    with pytest.raises(ValueError, match="coverage"):
        coverage_step(q, keys, length, d ** -0.5, lse_sel, sink, torch.zeros(1, dtype=torch.float64))
