"""LOCKS summary layouts (locks/method/layouts.py): every switch of the quantized layout builds summaries whose
stored bytes are what `summary_bytes_per_page` reports, whose rho^ bounds the reconstruction error of every token,
whose page scores equal an independent float64 evaluation of the dequantized reconstruction, and whose default
equals today's 804 B/page layout exactly."""
from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch

from locks.errors import ConfigError
from locks.method.layouts import LayoutSummaries, SummaryLayout, _pack, _unpack
from locks.method.summaries import (_summarize, build_summaries, concat_summaries, dequantize, page_scores,
                                    preallocate_summaries, score_bound, summary_bytes_per_page)

LAYOUTS = [SummaryLayout(*c) for c in itertools.product((8, 4, 2), (0, 32), (8, 4), ("head_int8", "page_int8", "fp16"),
                                                        ("fp32", "fp16"))]
D, N, R = 64, 16, 8


def low_rank_keys(B=1, H=2, P=12, d=D, n=N, seed=0):
    """Pages of rank-4 structure plus noise around a common offset (post-RoPE keys have a large mean)."""
    g = torch.Generator().manual_seed(seed)
    basis = torch.randn(B, H, P, 4, d, generator=g)
    coef = torch.randn(B, H, P, n, 4, generator=g) * 3
    k = coef @ basis + 0.05 * torch.randn(B, H, P, n, d, generator=g) + 2.0
    return k.reshape(B, H, P * n, d)


def reconstruction(s):
    mu, v, c = s.dequantize() if isinstance(s, LayoutSummaries) else dequantize(s)
    return mu.unsqueeze(3) + c @ v.mT  # [B, H, P, n, d]


def test_the_default_layout_through_the_general_path_is_todays_layout():
    keys = low_rank_keys()
    today = build_summaries(keys, N, R)
    general = _summarize(keys, N, R, "int", None, SummaryLayout())
    for x, y in zip(dequantize(today), general.dequantize()):
        assert torch.equal(x, y)
    assert torch.equal(today.rho, general.rho) and summary_bytes_per_page(general) == summary_bytes_per_page(today)
    assert build_summaries(keys, N, R, layout=SummaryLayout()).__class__.__name__ == "QuantizedPageSummaries"
    q = torch.randn(1, 8, D)
    assert torch.allclose(page_scores(q, today, 0.125), page_scores(q, general, 0.125), atol=1e-5)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.name)
def test_every_layout_bounds_and_scores_its_reconstruction(layout):
    keys = low_rank_keys()
    s = build_summaries(keys, N, R, layout=layout)
    P = keys.shape[2] // N
    # bytes per page: exactly the stored fields, from the formula of each switch
    want = ((D if layout.mu_format != "fp16" else 2 * D) + (2 if layout.mu_format != "fp16" else 0)
            + R * D * layout.v_bits // 8 + (R * D // 32 * 2 if layout.v_group else 0)
            + N * R * layout.c_bits // 8 + R * (4 if layout.w_dtype == "fp32" else 2) + 2)
    assert summary_bytes_per_page(s) == want
    stored = [getattr(s, f.name) for f in dataclasses.fields(s) if f.name not in ("layout", "head_mean")]
    assert sum(t.nbytes for t in stored) == want * 2 * P
    # rho^ bounds every token's reconstruction error
    rec = reconstruction(s)
    err = torch.linalg.vector_norm(keys.view(1, 2, P, N, D) - rec, dim=-1)
    assert bool((err <= s.rho.float().unsqueeze(-1)).all())
    # page scores: float64 logsumexp over the dequantized reconstruction, and the certificate's bound holds
    q = torch.randn(1, 8, D)
    qg = q.double().view(1, 2, 4, D)
    logits = torch.einsum("bhgd,bhpnd->bhgpn", qg, rec.double()) * 0.125
    want_s = torch.logsumexp(logits, -1).reshape(1, 8, P)
    assert torch.allclose(page_scores(q, s, 0.125).double(), want_s, rtol=1e-5, atol=1e-4)
    exact = torch.logsumexp(torch.einsum("bhgd,bhpnd->bhgpn", qg, keys.double().view(1, 2, P, N, D)) * 0.125, -1)
    gap = (page_scores(q, s, 0.125).double() - exact.reshape(1, 8, P)).abs()
    assert bool((gap <= score_bound(q, s, 0.125).double() + 1e-4).all())
    # decode-time pages against the prefill head mean, concatenated and preallocated like today's layout
    more = build_summaries(low_rank_keys(P=2, seed=1), N, R, layout=layout, head_mean=s.head_mean)
    both = preallocate_summaries(concat_summaries(s, more), P + 4)
    assert both.num_pages == P + 4 and getattr(both, "layout", SummaryLayout()) == layout
    assert summary_bytes_per_page(both) == want


def test_fewer_bits_reconstruct_worse():
    """On low-rank pages, V at 8 / 4 / 2 bits: the mean reconstruction error grows as bits shrink, and int2 is far
    worse than int4 (the write-up's 'int2 collapses')."""
    keys = low_rank_keys(P=40)
    errs = {}
    for bits in (8, 4, 2):
        s = build_summaries(keys, N, R, layout=SummaryLayout(v_bits=bits))
        errs[bits] = float(torch.linalg.vector_norm(keys.view(1, 2, 40, N, D) - reconstruction(s), dim=-1).mean())
    assert errs[8] < errs[4] < errs[2] and errs[2] > 3 * errs[4]
    grouped = build_summaries(keys, N, R, layout=SummaryLayout(v_bits=2, v_group=32))
    assert float(torch.linalg.vector_norm(keys.view(1, 2, 40, N, D) - reconstruction(grouped), dim=-1).mean()) \
        <= errs[2]  # a scale per 32 channels fits V at least as well as one per column


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_packing_round_trips(bits):
    m = 2 ** (bits - 1)
    x = torch.randint(-m + 1, m, (3, 5, 32), dtype=torch.int8)
    p = _pack(x, bits, dim=-1)
    assert p.dtype == torch.uint8 and p.shape[-1] == 32 * bits // 8
    assert torch.equal(_unpack(p, bits, dim=-1), x)


def test_layout_errors_are_one_line():
    with pytest.raises(ConfigError, match=r"method.v_bits must be one of \(8, 4, 2\)"):
        SummaryLayout(v_bits=3)
    with pytest.raises(ConfigError, match="method.mu_format must be one of"):
        SummaryLayout(mu_format="int4")
    with pytest.raises(ConfigError, match="v_group=32 needs a head_dim divisible"):
        SummaryLayout(v_group=32).check(48, 16)
    assert SummaryLayout().is_default and SummaryLayout().name == "v4c8-head_int8-w32"
    assert not math.isnan(summary_bytes_per_page(build_summaries(low_rank_keys(P=1), N, 0,
                                                                 layout=SummaryLayout(c_bits=4))))


def test_the_selector_takes_every_switch_and_scores_other_layouts_on_the_reference():
    """method.v_bits / v_group / c_bits / mu_format / w_dtype reach the summaries; a non-default layout is scored by
    the reference even with backend triton, and says so (extra_metrics fused_scoring = 0); errors are one line."""
    from bench.prefill_state import prefill_selector
    from locks.core.registry import MethodSpec
    from locks.core.selector import LayerInfo

    keys = low_rank_keys(P=40)
    info = LayerInfo(0, 8, 2, D, D ** -0.5, backend="triton")
    for options, fused in (({}, 1.0), ({"v_bits": 2, "c_bits": 4, "mu_format": "fp16"}, 0.0)):
        s = MethodSpec("locks", 256, options=options).build(info)
        prefill_selector(s, keys, keys, torch.Generator().manual_seed(0), "real", max_new_tokens=0)
        layout = SummaryLayout(**options)
        assert getattr(s.summaries, "layout", SummaryLayout()) == layout
        assert s.extra_metrics() == {"summary_bytes_per_page": float(summary_bytes_per_page(s.summaries)),
                                     "fused_scoring": fused}
    assert s.extra_metrics()["summary_bytes_per_page"] == 128 + 8 * 16 + 16 * 8 // 2 + 8 * 4 + 2  # fp16 mu, int2 V
    sel = s.select(torch.randn(1, 8, D), keys, keys)  # the reference path on the new layout
    assert sel.indices.shape[-1] <= 256 and s.scoring_bytes(10) > 0
    with pytest.raises(ConfigError, match="need method.quant=int"):
        MethodSpec("locks", 256, options={"quant": "none", "v_bits": 8}).build(info)
    with pytest.raises(ConfigError, match=r"method.c_bits must be one of \(8, 4\)"):
        MethodSpec("locks", 256, options={"c_bits": 2}).build(info)


def test_a_page_whose_quantized_rows_are_dependent_gets_the_least_squares_coefficients():
    """Low-bit V can round two of a page's orthonormal directions to the same row (int2: entries in {-1, 0, 1}
    times a scale), which makes V^ V^T singular. refit_coefficients then returns the minimal-norm least-squares C
    (D pinv(V^)), the fit an independent float64 lstsq gives, instead of failing; and a regular page keeps the
    exact solve."""
    from locks.method.summaries import refit_coefficients

    g = torch.Generator().manual_seed(0)
    row = torch.tensor([1.0, -1.0, 0.0, 1.0] * 4)
    wq = torch.stack([torch.stack([row, row, torch.roll(row, 1)]), torch.randn(3, 16, generator=g)])  # [2, 3, 16]
    d = torch.randn(2, 8, 16, generator=g)
    c = refit_coefficients(wq, d @ wq.mT, torch.zeros(2, 3, dtype=torch.bool))
    assert torch.isfinite(c).all()
    for p in range(2):
        ref = torch.linalg.lstsq(wq[p].double().T, d[p].double().T, driver="gelsd").solution.T  # min-norm C
        torch.testing.assert_close(c[p].double(), ref, atol=1e-4, rtol=1e-4)
    assert torch.linalg.matrix_rank(wq[0]) == 2 and torch.linalg.matrix_rank(wq[1]) == 3
    torch.testing.assert_close(c[1], torch.linalg.solve(wq[1] @ wq[1].mT, (d[1] @ wq[1].mT).mT).mT)
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.solve(wq[:1] @ wq[:1].mT, (d[:1] @ wq[:1].mT).mT)  # what the build did before: it stopped
