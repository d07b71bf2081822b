"""LOCKS theory invariants (docs/methods/locks.md): Theorem 1, certificate soundness, Lemma 1, Proposition 1.

Each checks a bound or identity against quantities computed densely from the full keys (float64 where it matters).
"""
import itertools
import math

import pytest
import torch

from locks.core.paging import aggregate_heads, exact_page_lse
from locks.core.reference import dense_lse, sparse_decode
from locks.core.registry import MethodSpec
from locks.core.selector import LayerInfo, PrefillContext, Selection
from locks.method.summaries import build_summaries, page_scores, score_bound

D, N = 32, 16
SCALE = D**-0.5


def keys_for(seed, B, H, P, clustered):
    g = torch.Generator().manual_seed(seed)
    if not clustered:
        return torch.randn(B, H, P * N, D, generator=g)
    centers = torch.randn(B, H, 6, D, generator=g) * 2
    k = centers[:, :, torch.randint(0, 6, (P * N,), generator=g)] + 0.2 * torch.randn(B, H, P * N, D, generator=g)
    return k


def mass_of(pages, lse_pages):
    """sum_{j in pages} exp(l_j) per head; pages [..., k] indices into lse_pages [..., P]."""
    return torch.exp(lse_pages.double()).gather(-1, pages).sum(-1)


@pytest.mark.parametrize("quant", ["int", "none"])
@pytest.mark.parametrize("clustered", [False, True])
def test_theorem1_single_head(quant, clustered):
    P, k = 64, 8
    keys = keys_for(1, 2, 1, P, clustered)
    summ = build_summaries(keys, N, 8, quant)
    for trial in range(5):
        q = torch.randn(2, 1, D, generator=torch.Generator().manual_seed(trial)) * 2
        S = page_scores(q, summ, SCALE)
        ell = exact_page_lse(q, keys, N, SCALE)
        eta = score_bound(q, summ, SCALE).max(-1).values.double()
        got = mass_of(torch.topk(S, k).indices, ell)
        best = mass_of(torch.topk(ell, k).indices, ell)
        assert torch.all(got >= torch.exp(-2 * eta) * best * (1 - 1e-6))


@pytest.mark.parametrize("quant", ["int", "none"])
def test_theorem1_normalized_group_aggregation(quant):
    B, Hkv, G, P, k = 1, 2, 4, 48, 6
    keys = keys_for(2, B, Hkv, P, clustered=True)
    summ = build_summaries(keys, N, 8, quant)
    cand = torch.ones(B, Hkv, P, dtype=torch.bool)
    for trial in range(5):
        q = torch.randn(B, Hkv * G, D, generator=torch.Generator().manual_seed(10 + trial)) * 2
        S, ell = page_scores(q, summ, SCALE), exact_page_lse(q, keys, N, SCALE)
        eta = float(score_bound(q, summ, SCALE).max())
        p = torch.softmax(ell.double(), -1).view(B, Hkv, G, P)  # exact per-head page probabilities
        chosen = torch.topk(aggregate_heads(S, G, "norm", cand), k).indices
        optimal = torch.topk(aggregate_heads(ell, G, "norm", cand), k).indices
        cov = lambda pages: p.gather(-1, pages[:, :, None].expand(B, Hkv, G, k)).sum(-1).sum(-1)  # noqa: E731
        assert torch.all(cov(chosen) >= math.exp(-4 * eta) * cov(optimal) * (1 - 1e-6))


@pytest.mark.parametrize("quant", ["int", "none"])
@pytest.mark.parametrize("budget", [48, 160, 400])
def test_certificate_is_a_lower_bound_on_true_coverage_every_step_and_head(quant, budget):
    B, Hq, Hkv, L = 1, 8, 2, 1100
    keys = keys_for(3, B, Hkv, L // N + 1, clustered=True)[:, :, :L]
    values = torch.randn(B, Hkv, L, D)
    info = LayerInfo(0, Hq, Hkv, D, SCALE)
    s = MethodSpec("locks", budget, {"quant": quant}).build(info)
    prompt = 1000
    s.prefill(PrefillContext(keys[:, :, :prompt], values[:, :, :prompt], torch.randn(B, Hq, prompt, D),
                             torch.arange(prompt)[None], lambda: keys))
    for length in range(prompt + 1, L + 1, 7):  # decode steps over page boundaries
        s.append(keys[:, :, :length], values[:, :, :length])
        q = torch.randn(B, Hq, D) * 2
        sel = s.select(q, keys[:, :, :length], values[:, :, :length])
        _, lse = sparse_decode(q, keys[:, :, :length], values[:, :, :length], sel, SCALE)
        cert = sel.diagnostics.per_head(lse)
        true_cov = torch.exp(lse - dense_lse(q, keys[:, :, :length], SCALE))
        assert torch.all(cert["certificate"] <= true_cov + 1e-6)
        sound, count = sel.diagnostics.soundness(lse, true_cov)["certificate_sound"]  # what decoding logs
        assert float(sound) == float(count) == B * Hq
        assert torch.all((cert["plugin_coverage"] > 0) & (cert["plugin_coverage"] <= 1 + 1e-6))


def test_lemma1_adversarial_values_attain_2b_times_uncovered_mass():
    B, Hq, Hkv, L, bound = 1, 1, 1, 160, 3.0
    keys = keys_for(4, B, Hkv, L // N, clustered=True)
    q = torch.randn(B, Hq, D)
    logits = (keys[0, 0].double() @ q[0, 0].double()) * SCALE
    p = torch.softmax(logits, 0)
    u = torch.randn(D, dtype=torch.float64)
    u /= u.norm()
    for pages in ([0, 3], [1, 2, 5, 9], [4]):
        T = (torch.tensor(pages)[:, None] * N + torch.arange(N)).flatten()
        inside = torch.zeros(L, dtype=torch.bool)
        inside[T] = True
        values = torch.where(inside[:, None], -bound * u, bound * u).float().view(1, 1, L, D)
        idx = T.view(1, 1, 1, -1)
        o_T, _ = sparse_decode(q, keys, values, Selection(indices=idx, valid=torch.ones_like(idx, dtype=torch.bool)), SCALE)
        o = p @ values[0, 0].double()
        err = float((o - o_T[0, 0].double()).norm())
        assert abs(err - 2 * bound * (1 - float(p[inside].sum()))) < 1e-5


def test_lemma1_top_k_by_mass_minimizes_worst_case_error_brute_force():
    P, k = 10, 3
    keys = keys_for(5, 1, 1, P, clustered=True)
    q = torch.randn(1, 1, D) * 2
    ell = exact_page_lse(q, keys, N, SCALE)[0, 0].double()
    mass = torch.softmax(ell, 0)
    worst = {c: 2 * (1 - float(mass[list(c)].sum())) for c in itertools.combinations(range(P), k)}
    top = tuple(sorted(torch.topk(ell, k).indices.tolist()))
    assert math.isclose(worst[top], min(worst.values()), abs_tol=1e-12)


def test_prop1_shared_projection_is_blind_where_locks_is_not():
    m, alpha = 8, 2.5
    g = torch.Generator().manual_seed(6)
    proj = torch.linalg.qr(torch.randn(D, m, generator=g, dtype=torch.float64))[0]  # shared P, orthonormal columns
    u = torch.randn(D, generator=g, dtype=torch.float64)
    u -= proj @ (proj.T @ u)  # u in ker(P^T)
    page = torch.randn(N, D, generator=g, dtype=torch.float64)
    keys = torch.stack([page, page + alpha * u]).reshape(1, 1, 2 * N, D)
    q = torch.randn(1, 1, D, generator=g, dtype=torch.float64)
    # a Loki-style selector scores page j by logsumexp_i (P^T q).(P^T k_i): the same for both pages
    shared_pages = torch.stack([torch.logsumexp((keys[0, 0, :N] @ proj) @ (proj.T @ q[0, 0]) * SCALE, 0),
                                torch.logsumexp((keys[0, 0, N:] @ proj) @ (proj.T @ q[0, 0]) * SCALE, 0)])
    assert abs(float(shared_pages[0] - shared_pages[1])) < 1e-9
    shift = SCALE * alpha * float(q[0, 0] @ u)
    S = page_scores(q.float(), build_summaries(keys.float(), N, 8, "none"), SCALE)[0, 0]
    ell = exact_page_lse(q.float(), keys.float(), N, SCALE)[0, 0]
    assert abs(float(S[1] - S[0]) - shift) < 1e-4
    assert abs(float(ell[1] - ell[0]) - shift) < 1e-4
