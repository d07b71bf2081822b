"""MagicPIG (docs/methods/magicpig.md): the official reference's sampled sets and outputs on identical inputs, each
token sampled with its collision probability w_i (Monte Carlo over projections), the fair budget's (K, L) against a
brute-force search of the documented rule, and one rule for eager and static steps."""
import math
from pathlib import Path

import pytest
import torch

from baselines.magicpig.selector import MAX_BITS, collision_probability
from locks.core.dense import DenseAttention
from locks.core.reference import sparse_decode
from locks.core.registry import MethodSpec
from locks.core.selector import LayerInfo, PrefillContext
from locks.errors import ConfigError

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "conformance" / "magicpig" / "cases.pt"


def build(budget, Hq, Hkv, d, layer=1, num_layers=4, **options):
    info = LayerInfo(layer_idx=layer, num_heads=Hq, num_kv_heads=Hkv, head_dim=d, scaling=d**-0.5,
                     num_layers=num_layers)
    return MethodSpec("magicpig", budget, options).build(info)


def prefill(s, keys, values, queries=None):
    B, Hkv, n, d = keys.shape
    queries = keys.new_zeros(B, s.info.num_heads, 0, d) if queries is None else queries
    s.prefill(PrefillContext(keys, values, queries, torch.arange(n).expand(B, -1), lambda: keys))


def inject(s, R: torch.Tensor, K: int, L: int):
    """The official R [1, Hkv, d, K L] (table t's bit b in column t K + b) in the selector's [Hkv, d, L, MAX_BITS]."""
    Hkv, d = R.shape[1], R.shape[2]
    s.R = torch.zeros(Hkv, d, L, MAX_BITS)
    s.R[..., :K] = R[0].float().view(Hkv, d, L, K)


def brute_force_sampled(q, keys, R, K, L, sink, local, n):
    """C_h per query head [Hq, |M|], from the definition: codes of q / |q| and of the centred middle keys."""
    Hq, d = q.shape
    G = Hq // keys.shape[0]
    middle = keys[:, sink : n - local]
    centred = middle - middle.mean(1, keepdim=True)
    out = []
    for h in range(Hq):
        Rj = R[h // G]  # [d, L, K]
        code = lambda x: ((x @ Rj.flatten(1)).view(*x.shape[:-1], L, K) > 0).long() @ (2 ** torch.arange(K))
        out.append((code(centred[h // G]) == code(q[h] / q[h].norm())).sum(-1) >= 2)
    return torch.stack(out)


@pytest.mark.skipif(not FIXTURE.exists(), reason="fixture missing")
def test_the_official_reference_samples_and_attends_alike():
    """Every case, sampled layer and step of SimCache (main@dc682a3): the same sampled set C_h per query head, and
    the same output (the harness uses the raw keys for the logits: centring cancels in the softmax)."""
    for case in torch.load(FIXTURE):
        Hq, Hkv, d, n, K, L = (case[k] for k in ("Hq", "Hkv", "d", "n", "K", "L"))
        sink, local = case["sink"], case["local"]
        for layer in case["sparse_layers"]:
            s = build(10**6, Hq, Hkv, d, layer=layer, num_layers=case["layers"], budget_mode="paper", bits=K,
                      tables=L, sink=sink, local=local)
            inject(s, case["R"], K, L)
            keys, values = case["pre_k"][layer].float(), case["pre_v"][layer].float()
            prefill(s, keys, values)
            for t in range(case["steps"]):
                keys = torch.cat([keys, case["dec_k"][layer][t : t + 1].float()], 2)
                values = torch.cat([values, case["dec_v"][layer][t : t + 1].float()], 2)
                s.append(keys, values)
                q = case["dec_q"][layer][t : t + 1, :, 0].float()
                sel = s.select(q, keys, values)
                sampled = sel.valid[0, :, :, sink : n - local].reshape(Hq, -1)
                assert torch.equal(sampled, case["sampled"][(t, layer)]), (case["name"], layer, t)
                assert sel.valid[0, :, :, :sink].all() and sel.valid[0, :, :, n - local :].all()
                out, _ = sparse_decode(q, keys, values, sel, d**-0.5)
                torch.testing.assert_close(out[0], case["outputs"][(t, layer)], atol=2e-5, rtol=1e-4)


def test_collision_probability_is_the_binomial_tail():
    for u in (0.0, 1e-3, 0.05, 0.3, 0.9, 1.0):
        for L in (2, 7, 150):
            tail = sum(math.comb(L, i) * u**i * (1 - u) ** (L - i) for i in range(2, L + 1))
            assert float(collision_probability(torch.tensor(u, dtype=torch.float64), L)) == pytest.approx(tail,
                                                                                                         abs=1e-12)


def test_each_middle_token_is_sampled_with_its_weight():
    """Over independent projections, token i enters C_h with frequency w_i = P[>= 2 of L tables collide] at the
    angle between q and k~_i (the estimator's premise), within 4.5 binomial standard deviations."""
    torch.manual_seed(0)
    Hq, Hkv, d, n, K, L, draws = 2, 1, 16, 4 + 40 + 4, 3, 6, 400
    keys, values = torch.randn(1, Hkv, n, d) + 0.5, torch.randn(1, Hkv, n, d)
    q = torch.randn(1, Hq, d)
    q[0, 0] += 2 * (keys[0, 0, 10] - keys[0, 0, 4:44].mean(0))  # one token near the query
    hits = torch.zeros(Hq, 40)
    for seed in range(draws):
        s = build(10**6, Hq, Hkv, d, budget_mode="paper", bits=K, tables=L, sink=4, local=4, seed=seed)
        prefill(s, keys, values)
        hits += s.select(q, keys, values).valid[0, :, :, 4:44].reshape(Hq, -1).float()
    centred = keys[0, 0, 4:44] - keys[0, 0, 4:44].mean(0)
    cos = (q[0] @ centred.T / (q[0].norm(dim=-1, keepdim=True) * centred.norm(dim=-1))).double()
    w = collision_probability((1 - torch.arccos(cos) / math.pi) ** K, L)
    sd = (w * (1 - w) / draws).sqrt()
    assert ((hits / draws - w).abs() <= 4.5 * sd + 1e-9).all()
    assert w[0, 6] > 0.5 > float(w[1].median())  # the planted token, against the background


def test_the_selection_is_the_brute_force_rule_and_the_bias_its_weight():
    torch.manual_seed(1)
    Hq, Hkv, d, n, K, L = 6, 2, 32, 200, 8, 30
    keys, values = torch.randn(1, Hkv, n, d) + 1.0, torch.randn(1, Hkv, n, d)
    s = build(10**6, Hq, Hkv, d, budget_mode="paper", bits=K, tables=L)
    prefill(s, keys, values)
    q = torch.randn(1, Hq, d)
    sel = s.select(q, keys, values)
    want = brute_force_sampled(q[0], keys[0], s.R[..., :K], K, L, 4, 64, n)
    assert torch.equal(sel.valid[0, :, :, 4 : n - 64].reshape(Hq, -1), want)
    middle = keys[0, :, 4 : n - 64].double()
    centred = (middle - middle.mean(1, keepdim=True)).repeat_interleave(3, 0)
    cos = (q[0].double().unsqueeze(1) * centred).sum(-1) / (q[0].double().norm(dim=-1, keepdim=True)
                                                           * centred.norm(dim=-1))
    w = collision_probability((1 - torch.arccos(cos) / math.pi) ** K, L)
    bias = sel.logit_bias[0, :, :, 4 : n - 64].reshape(Hq, -1).double()
    torch.testing.assert_close(bias[want], -torch.log(w[want] + 1e-4), atol=1e-4, rtol=1e-4)
    assert (sel.logit_bias[0, :, :, :4] == 0).all() and (sel.logit_bias[0, :, :, n - 64 :] == 0).all()


def test_the_fair_budget_maps_to_the_documented_k_and_l():
    """(K, L) against a brute-force search: the largest K with E(K, L_max) >= m, then the smallest L with
    E(K, L) >= m, E the mean over query heads of sum_i w_i for the prompt's last query; the realised mean |C_h| at
    that query is near m over projections."""
    torch.manual_seed(2)
    Hq, Hkv, d, n, budget = 4, 2, 32, 600, 168
    keys, values = torch.randn(1, Hkv, n, d) + 0.3, torch.randn(1, Hkv, n, d)
    queries = torch.randn(1, Hq, n, d)
    s = build(budget, Hq, Hkv, d)
    prefill(s, keys, values, queries)
    middle = keys[0, :, 4 : n - 64].double()
    centred = (middle - middle.mean(1, keepdim=True)).repeat_interleave(2, 0)
    q = queries[0, :, -1].double().unsqueeze(1)
    angle = 1 - torch.arccos(((q * centred).sum(-1) / (q.norm(dim=-1) * centred.norm(dim=-1))).clamp(-1, 1)) / math.pi
    E = {(k, l): float(collision_probability(angle**k, l).sum(-1).mean()) for k in range(1, MAX_BITS + 1)
         for l in range(2, 151)}
    m = budget - 68
    K = max(k for k in range(1, MAX_BITS + 1) if E[(k, 150)] >= m)
    L = min(l for l in range(2, 151) if E[(K, l)] >= m)
    assert s.shape_used == (K, L)
    assert s.extra_metrics()["magicpig_bits"] == K and s.extra_metrics()["magicpig_tables"] == L
    counts = []
    for seed in range(12):
        t = build(budget, Hq, Hkv, d, seed=seed)
        prefill(t, keys, values, queries)
        counts.append(float(t.select(queries[:, :, -1], keys, values).valid[..., 4 : n - 64].sum()) / Hq)
    assert sum(counts) / len(counts) == pytest.approx(E[(K, L)], rel=0.1)


def test_a_middle_within_the_budget_is_attended_whole():
    keys = torch.randn(1, 2, 150, 32)
    s = build(200, 4, 2, 32)
    prefill(s, keys, keys, torch.randn(1, 4, 150, 32))
    assert s.select(torch.randn(1, 4, 32), keys, keys).dense


def test_static_steps_are_the_eager_rule_over_the_preallocated_slots():
    torch.manual_seed(3)
    Hq, Hkv, d, n, capacity = 6, 2, 32, 300, 320
    keys, values = torch.randn(1, Hkv, capacity, d), torch.randn(1, Hkv, capacity, d)
    eager = build(10**6, Hq, Hkv, d, budget_mode="paper", bits=8, tables=40)
    static = build(10**6, Hq, Hkv, d, budget_mode="paper", bits=8, tables=40)
    for s in (eager, static):
        prefill(s, keys[:, :, :n], values[:, :, :n])
    static.start_static(capacity)
    for length in (n + 1, n + 5):
        q = torch.randn(1, Hq, d)
        a = eager.select(q, keys[:, :, :length], values[:, :, :length])
        b = static.select_static(q, keys, values, torch.tensor([length]))
        assert torch.equal(b.valid[..., :length], a.valid) and not b.valid[..., length:].any()
        assert torch.equal(b.logit_bias[..., :length], a.logit_bias)
        assert static.static_step_cost(length)[:2] == (a.forced_tokens, a.metadata_bytes)


def test_options_and_dense_layers():
    with pytest.raises(ConfigError, match="budget must exceed"):
        build(68, 4, 2, 32)
    build(68, 4, 2, 32, budget_mode="paper")
    with pytest.raises(ConfigError, match="method.bits must be <= 15"):
        build(128, 4, 2, 32, bits=16)
    with pytest.raises(ConfigError, match="dense_layers"):
        build(128, 4, 2, 32, dense_layers="0,half")
    dense = [isinstance(build(128, 4, 2, 32, layer=i, num_layers=32), DenseAttention) for i in range(32)]
    assert [i for i, x in enumerate(dense) if x] == [0, 16]
    assert isinstance(build(128, 4, 2, 32, layer=5, dense_layers="5,9"), DenseAttention)
    assert not isinstance(build(128, 4, 2, 32, layer=0, dense_layers="none"), DenseAttention)


def test_the_fused_static_step_is_the_pytorch_rule():
    """Backend triton (the interpreter on CPU): query codes, sampling, weights and attention in three launches give
    the PyTorch rule's output and log-sum-exp (the weights' arc cosine is a polynomial within 2e-8, hence a
    tolerance), its attended tokens per KV head and its sample counters exactly; rows of their own lengths."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs TRITON_INTERPRET=1 (set by tests/conftest.py)")
    from locks.core.reference import attended_per_kv_head

    torch.manual_seed(4)
    B, Hq, Hkv, d, n, capacity = 2, 6, 2, 32, 300, 320
    keys, values = torch.randn(B, Hkv, capacity, d) + 0.5, torch.randn(B, Hkv, capacity, d)
    queries = torch.randn(B, Hq, n, d)
    pair = []
    for backend in ("torch", "triton"):
        info = LayerInfo(layer_idx=1, num_heads=Hq, num_kv_heads=Hkv, head_dim=d, scaling=d**-0.5, num_layers=4,
                         backend=backend)
        s = MethodSpec("magicpig", 160, {}).build(info)
        prefill(s, keys[:, :, :n], values[:, :, :n], queries)
        s.start_static(capacity)
        pair.append(s)
    reference, fused = pair
    for step, length in enumerate(([n + 1, n - 20], [n + 9, n + 2])):
        q, length = torch.randn(B, Hq, d), torch.tensor(length)
        want = reference.select_static(q, keys, values, length)
        out, lse = sparse_decode(q, keys, values, want, d**-0.5)
        got = fused.select_static(q, keys, values, length)
        torch.testing.assert_close(got.attention[0], out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got.attention[1], lse, atol=1e-5, rtol=1e-5)
        assert torch.equal(got.attended_rows, attended_per_kv_head(want, capacity).double())
        assert torch.equal(fused.sampled, reference.sampled)


def test_chunked_code_comparisons_and_the_in_place_attention_change_nothing(monkeypatch):
    """The hits made a few tokens at a time (HITS_CHUNK_BYTES) equal the one-shot comparison, and the reference
    attends the list of every slot (Selection.all_slots) in place exactly as over the gathered copy."""
    import baselines.magicpig.selector as magicpig
    from dataclasses import replace

    torch.manual_seed(3)
    Hq, Hkv, d, n = 6, 2, 32, 300
    keys, values = torch.randn(1, Hkv, n, d) + 0.5, torch.randn(1, Hkv, n, d)
    s = build(10**6, Hq, Hkv, d, budget_mode="paper", bits=6, tables=30)
    prefill(s, keys, values)
    q = torch.randn(1, Hq, d)
    whole = s.select(q, keys, values)
    monkeypatch.setattr(magicpig, "HITS_CHUNK_BYTES", 7 * Hq * s.codes.shape[-1])  # 7 tokens at a time
    chunked = s.select(q, keys, values)
    assert torch.equal(chunked.valid, whole.valid) and torch.equal(chunked.logit_bias, whole.logit_bias)
    assert whole.all_slots and not whole.valid.all() and whole.valid.any()  # some middle tokens left out
    out, lse = sparse_decode(q, keys, values, whole, s.info.scaling)
    gathered = replace(whole, all_slots=False, indices=whole.indices.contiguous())  # one list per head: a gather
    ref_out, ref_lse = sparse_decode(q, keys, values, gathered, s.info.scaling)
    torch.testing.assert_close(out, ref_out, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(lse, ref_lse, atol=1e-6, rtol=1e-6)
