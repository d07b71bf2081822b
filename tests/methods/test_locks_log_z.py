"""LOCKS `log_z=previous` (one-pass normalized aggregation): every step normalizes each head by the log Z of the
previous scoring (the first step: the last prompt query's), computed independently here, and never by its own."""
from __future__ import annotations

import pytest
import torch

from bench.prefill_state import prefill_selector
from locks.core.paging import aggregate_heads
from locks.core.registry import MethodSpec
from locks.core.selector import LayerInfo
from locks.errors import ConfigError
from locks.method.summaries import page_scores

B, HQ, HKV, D, L0 = 2, 8, 2, 32, 600


def selector(**options):
    return MethodSpec("locks", 128, options=options).build(LayerInfo(0, HQ, HKV, D, D ** -0.5))


def log_z(scores, candidates):
    c = candidates.repeat_interleave(HQ // HKV, dim=1)
    return torch.logsumexp(scores.masked_fill(~c, float("-inf")), dim=-1)


@pytest.mark.parametrize("aggregation", ["norm", "max"])
def test_each_step_normalizes_by_the_previous_log_z(aggregation):
    g = torch.Generator().manual_seed(0)
    keys = torch.randn(B, HKV, L0 + 40, D, generator=g)
    s = selector(log_z="previous", aggregation=aggregation)
    exact = selector(aggregation=aggregation)
    gen = torch.Generator().manual_seed(3)
    prefill_selector(s, keys[:, :, :L0], keys[:, :, :L0], gen, "real", max_new_tokens=40)
    # the first step's log Z: the last prompt query's, over the candidates of a step at the prompt's length
    q_last = torch.randn(B, HQ, 1, D, generator=torch.Generator().manual_seed(3)).squeeze(2)  # prefill_selector's
    plan = s.plan(L0)
    cand = torch.ones(B, HKV, plan.num_pages, dtype=torch.bool)
    cand[:, :, sorted(plan.forced)] = False
    want = log_z(page_scores(q_last, s.summaries, s.info.scaling)[..., : plan.num_pages], cand)
    assert torch.allclose(s.prev_log_z, want)
    differs = False
    for L in range(L0 + 1, L0 + 40, 7):
        k = keys[:, :, :L]
        s.append(k, k)
        plan = s.plan(L)
        prev = s.prev_log_z.clone()
        q = torch.randn(B, HQ, D, generator=g)
        scores, agg = s.scored_pages(q, k, plan.num_pages, set(plan.forced), None)
        cand = torch.ones(B, HKV, plan.num_pages, dtype=torch.bool)
        cand[:, :, sorted(plan.forced)] = False
        assert torch.allclose(agg, aggregate_heads(scores, HQ // HKV, aggregation, cand, log_z=prev))
        assert torch.allclose(s.prev_log_z, log_z(scores, cand))  # kept for the next step
        exact.summaries = s.summaries
        _, agg_exact = exact.scored_pages(q, k, plan.num_pages, set(plan.forced), None)
        differs |= not torch.allclose(agg, agg_exact)
    assert differs  # not the exact aggregation


def test_log_z_errors_are_one_line():
    with pytest.raises(ConfigError, match="method.log_z must be one of"):
        selector(log_z="streaming")
    with pytest.raises(ConfigError, match="applies to aggregation norm or max"):
        selector(log_z="previous", aggregation="raw")
    assert selector(log_z="previous").prefill_queries() == 1 and selector().prefill_queries() == 0
