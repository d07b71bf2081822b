"""Direct tests of three shared formulas that other tests only reach from far away: the reference decode's fp32
arithmetic on bf16 inputs (against fp64), a token's K/V bytes (2 d s H_kv, and the FullKV accounting built on it),
and the GQA page aggregations of locks/core/paging.py (against a float64 loop written from docs/methods/locks.md)."""
import math

import pytest
import torch

from locks.core.paging import aggregate_heads
from locks.core.reference import gather_tokens, sparse_decode
from locks.core.selector import LayerInfo, Selection
from tests.helpers import TINY_LLAMA, greedy


@pytest.mark.parametrize("per_head", [False, True])
def test_reference_decode_of_bf16_inputs_is_fp32_exact(per_head):
    """lse to 1e-4 of the fp64 value: logits computed in bf16 would be off by about 2e-2 here; the output carries
    only its bf16 rounding."""
    g = torch.Generator().manual_seed(0)
    B, Hkv, G, L, d, K = 2, 2, 3, 512, 64, 96
    q = (2 * torch.randn(B, Hkv * G, d, generator=g)).bfloat16()
    k = (2 * torch.randn(B, Hkv, L, d, generator=g)).bfloat16()
    v = torch.randn(B, Hkv, L, d, generator=g).bfloat16()
    Gs = G if per_head else 1
    idx = torch.stack([torch.randperm(L, generator=g)[:K] for _ in range(B * Hkv * Gs)]).view(B, Hkv, Gs, K)
    valid = torch.rand(B, Hkv, Gs, K, generator=g) > 0.1
    scaling = d ** -0.5
    out, lse = sparse_decode(q, k, v, Selection(indices=idx, valid=valid), scaling)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32

    kk, vv = gather_tokens(k.double(), idx), gather_tokens(v.double(), idx)  # [B, Hkv, Gs, K, d]
    qq = q.double().view(B, Hkv, G, 1, d)
    logits = (qq * kk.expand(B, Hkv, G, K, d)).sum(-1) * scaling
    logits = logits.masked_fill(~valid.expand(B, Hkv, G, K), -math.inf)
    lse64 = torch.logsumexp(logits, -1)
    out64 = torch.einsum("bhgk,bhgkd->bhgd", torch.softmax(logits, -1), vv.expand(B, Hkv, G, K, d))
    assert (lse.double() - lse64.reshape(B, -1)).abs().max() < 1e-4
    assert ((out.double() - out64.reshape(B, -1, d)).abs() <= out64.reshape(B, -1, d).abs() * 2 ** -8 + 1e-6).all()


@pytest.mark.parametrize("d,s,hkv", [(64, 2, 3), (128, 2, 8), (128, 4, 1), (256, 1, 2)])
def test_token_kv_bytes_is_two_d_s_hkv(d, s, hkv):
    info = LayerInfo(0, hkv * 4, hkv, d, d ** -0.5, kv_element_bytes=s)
    assert info.token_kv_bytes == 2 * d * s * hkv


def test_fullkv_bytes_per_step_count_every_cached_token_of_every_layer():
    """FullKV's bytes per decode step = sum over the steps of L_t * 2 d s H_kv * layers, divided by the steps,
    with L_t the tokens cached at step t (the prompt, the generated ones and the current one)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY_LLAMA)).eval()
    prompt, new = 40, 6
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (1, prompt))
    with torch.no_grad():
        _, cache = greedy(model, ids, new)
    stats = cache.stats.summary()
    d, hkv, layers = TINY_LLAMA["head_dim"], TINY_LLAMA["num_key_value_heads"], TINY_LLAMA["num_hidden_layers"]
    steps = new - 1  # the first new token comes from the prefill
    lengths = [prompt + t + 1 for t in range(steps)]
    expected = sum(lengths) / steps * 2 * d * 2 * hkv * layers
    assert stats["decode_steps"] == steps
    assert stats["full_bytes_per_step"] == pytest.approx(expected, rel=1e-12)
    assert stats["bytes_read_per_step"] == pytest.approx(expected, rel=1e-12)


def aggregate_loop(S, G, mode, cand, forced=None):
    """docs/methods/locks.md, GQA aggregation, one (row, KV head, page) at a time in float64:
    log Z_g = log(sum over candidate pages j' of exp S_gj' [+ exp forced_g]);
    norm: A_j = log sum_g exp(S_gj - log Z_g); raw: log sum_g exp S_gj; max: max_g (S_gj - log Z_g)."""
    B, Hq, P = S.shape
    out = torch.full((B, Hq // G, P), -math.inf, dtype=torch.float64)
    for b in range(B):
        for h in range(Hq // G):
            heads = range(h * G, (h + 1) * G)
            log_z = {}
            for g in heads:
                total = sum(math.exp(S[b, g, j].item()) for j in range(P) if cand[b, h, j])
                if forced is not None:
                    total += math.exp(forced[b, g].item())
                log_z[g] = math.log(total)
            for j in range(P):
                if not cand[b, h, j]:
                    continue
                if mode == "raw":
                    out[b, h, j] = math.log(sum(math.exp(S[b, g, j].item()) for g in heads))
                elif mode == "norm":
                    out[b, h, j] = math.log(sum(math.exp(S[b, g, j].item() - log_z[g]) for g in heads))
                else:
                    out[b, h, j] = max(S[b, g, j].item() - log_z[g] for g in heads)
    return out


@pytest.mark.parametrize("mode", ["norm", "raw", "max"])
@pytest.mark.parametrize("with_forced", [False, True])
def test_page_aggregation_matches_an_independent_loop(mode, with_forced):
    g = torch.Generator().manual_seed(1)
    B, Hkv, G, P = 2, 2, 4, 11
    S = 3 * torch.randn(B, Hkv * G, P, generator=g)
    cand = torch.rand(B, Hkv, P, generator=g) > 0.3
    forced = torch.randn(B, Hkv * G, generator=g) if with_forced else None
    got = aggregate_heads(S, G, mode, cand, forced)
    ref = aggregate_loop(S.double(), G, mode, cand, None if forced is None else forced.double())
    assert torch.equal(torch.isinf(got), torch.isinf(ref))
    finite = torch.isfinite(ref)
    assert (got.double()[finite] - ref[finite]).abs().max() < 1e-5
