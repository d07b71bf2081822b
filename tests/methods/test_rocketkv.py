"""RocketKV (docs/methods/rocketkv.md): decomposition, SnapKV++ stage 1 and the hybrid stage 2 against independent
float64 brute-force references written here, plus the tiny-Llama end-to-end runs."""
import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from baselines.rocketkv import approx_scores, rocket_params, snapkv_scores
from locks.core.selector import PrefillContext
from locks.errors import ConfigError
from tests.helpers import SCALE, TINY_LLAMA, D, build, decode_output, dense_reference, greedy, make_kv


def run_prefill(sel, keys, values, queries, prompt, max_new=None, max_length=None):
    B = keys.shape[0]
    sel.prefill(PrefillContext(keys[:, :, :prompt], values[:, :, :prompt], queries, torch.arange(prompt).expand(B, -1),
                               lambda: keys[:, :, :prompt], max_new_tokens=max_new, max_length=max_length))


def ref_accuracy(S, B, m, d, alpha=None):
    """infllm_utils.compress + rocket.py, transcribed from the spec §3.1."""
    c = max(1.0, S / B)
    a = min(0.2 + 0.06 * math.log2(c), 0.8) if alpha is None else alpha
    T = max(int(S / c**a), min(2 * m, S))
    c2 = max(1.0, T / B)
    cs = math.ceil(math.sqrt(c2)) if math.ceil(math.sqrt(c2)) <= c2 else 1
    return dict(c=c, alpha=a, T=T, prompt_budget=T - m, k=B // 2, c2=c2, cs=cs, r_ch=int(d * cs / c2))


def ref_gpt_fast(S, B, m, d):
    """gpt-fast get_params_for_token_budget (spec §3.1): B clamped to S, no 2*max_new floor, rounded k and r_ch."""
    B = min(S, B)
    c = max(1.0, S / B)
    a = min(0.2 + 0.06 * math.log2(c), 0.8)
    T = int(S / c**a)
    c2 = max(1.0, T / B)
    cs = min(math.floor(c2), math.ceil(math.sqrt(c2)))
    return dict(c=c, alpha=a, T=T, prompt_budget=min(S - m, T - m), k=min(round(B / 2), T), c2=c2, cs=cs,
                r_ch=min(d, max(1, round(d * cs / c2))))


def check(p, ref):
    for name, value in ref.items():
        assert math.isclose(getattr(p, name), value, rel_tol=1e-12), (name, getattr(p, name), value)


# ---------------------------------------------------------------------------------------------------- §3.1 decomposition

# spec §3.1 worked table (Llama-3.1-8B, d = 128, max_new = 128); S = nominal RULER length (16K = 16 000) + 128
SPEC_TABLE = [  # S, B, c, alpha, T, prompt_budget, k, cs, r_ch
    (16128, 256, 63, 0.56, 1593, 1465, 128, 3, 61),
    (32128, 512, 63, 0.56, 3186, 3058, 256, 3, 61),
    (64128, 1024, 63, 0.56, 6371, 6243, 512, 3, 61),
    (96128, 256, 376, 0.71, 1401, 1273, 128, 3, 70),
    (96128, 4096, 23, 0.47, 21596, 21468, 2048, 3, 72),
]


@pytest.mark.parametrize("S,B,c,alpha,T,prompt_budget,k,cs,r_ch", SPEC_TABLE)
def test_params_reproduce_spec_table(S, B, c, alpha, T, prompt_budget, k, cs, r_ch):
    p = rocket_params(S, B, 128, 128)
    assert round(p.c) == c and round(p.alpha, 2) == alpha
    assert (p.T, p.prompt_budget, p.k, p.cs, p.r_ch) == (T, prompt_budget, k, cs, r_ch)
    check(p, ref_accuracy(S, B, 128, 128))


GRID = [(S, B, m, d) for S in (37, 300, 1000, 5000, 16128, 96128) for B in (16, 64, 257, 4096, 200000)
        for m in (0, 5, 128, 512) for d in (64, 128)]


def test_params_accuracy_and_gpt_fast_formulas():
    for S, B, m, d in GRID:
        check(rocket_params(S, B, m, d), ref_accuracy(S, B, m, d))
        check(rocket_params(S, B, m, d, "gpt_fast"), ref_gpt_fast(S, B, m, d))
    # where they differ: gpt-fast has no 2*max_new floor on T (and its prompt_budget can go negative)
    acc, fast = rocket_params(20000, 16, 512, 128), rocket_params(20000, 16, 512, 128, "gpt_fast")
    assert acc.T == 1024 and fast.T == 66 and fast.prompt_budget == 66 - 512
    # gpt-fast clamps B to S: k = round(S/2) for a budget larger than the sequence
    assert rocket_params(300, 4096, 0, 128, "gpt_fast").k == 150 and rocket_params(300, 4096, 0, 128).k == 2048
    # fixed-alpha ablations (rocket_r0.x)
    for a in (0.3, 0.5, 0.7):
        check(rocket_params(16128, 256, 128, 128, alpha=a), ref_accuracy(16128, 256, 128, 128, alpha=a))


@pytest.mark.parametrize("variant", ["accuracy", "gpt_fast"])
def test_budget_identity(variant):
    for S, B, m, d in GRID:
        p = rocket_params(S, B, m, d, variant)
        b = min(S, B) if variant == "gpt_fast" else B
        assert math.isclose(p.c**p.alpha * p.c ** (1 - p.alpha), p.c, rel_tol=1e-12)
        assert 0.2 <= p.alpha <= 0.8 and 1 <= p.cs <= max(1.0, p.c2) and 1 <= p.r_ch <= d
        chunks = math.ceil(p.T / p.cs)
        approx, exact = p.r_ch * chunks, 2 * p.k * d
        if p.c2 > 1:  # approximation pass ~ B*d and exact pass ~ B*d
            # int(r_ch) loses < 1 channel row (chunks elements), round(r_ch) is off by <= half a row; ceil adds < 1
            # chunk column (r_ch elements)
            if variant == "accuracy":
                assert b * d - chunks < approx < b * d + p.r_ch, (S, B, m, d, p)
                assert exact == b * d - d * (b % 2)
            else:
                assert b * d - chunks / 2 <= approx <= b * d + chunks / 2 + p.r_ch, (S, B, m, d, p)
                assert abs(exact - b * d) <= d
        else:  # T <= B: everything fits, cs = 1, r_ch = d, traffic below 2*B*d
            assert p.cs == 1 and p.r_ch == d and approx + exact <= 2 * b * d + d


def test_sequence_length_from_context():
    keys, values = make_kv(1, 2, 100)
    q = torch.randn(1, 4, 100, D)
    for max_new, max_length, S in [(20, None, 120), (20, 110, 110), (None, None, 100), (None, 4096, 100)]:
        s = build("rocketkv", 16, 4, 2)
        run_prefill(s, keys, values, q, 100, max_new, max_length)
        assert s.params.S == S and s.params.B == 32  # fair: traffic budget 2 * budget
        check(s.params, ref_accuracy(S, 32, max_new or 0, D))
    s = build("rocketkv", 16, 4, 2, budget_mode="paper", params="gpt_fast", alpha=0.5)
    run_prefill(s, keys, values, q, 100, 20)
    assert s.params.B == 16 and s.params.alpha == 0.5 and s.params.k == 8


# ---------------------------------------------------------------------------------------------------- §3.2 stage 1

def ref_pooled_scores(queries, keys, w, kernel, scale):
    """queries [B, Hq, w, d] = the window. float64 brute force: per (b, KV head) sum over group heads and window
    queries of the causal softmax, prefix columns only, then a sliding max over [j - kernel//2, j + kernel//2]."""
    B, Hkv, L, d = keys.shape
    G = queries.shape[1] // Hkv
    prefix = L - w
    out = torch.zeros(B, Hkv, prefix, dtype=torch.float64)
    for b in range(B):
        for h in range(Hkv):
            for g in range(G):
                for i in range(w):
                    visible = L - w + i + 1
                    logits = keys[b, h, :visible].double() @ queries[b, h * G + g, i].double() * scale
                    out[b, h] += torch.softmax(logits, 0)[:prefix]
    r = kernel // 2
    pooled = torch.stack([out[..., max(0, j - r): j + r + 1].amax(-1) for j in range(prefix)], -1)
    return pooled


def stage1_case(seed=0, L=300, Hq=4, Hkv=2, B=2, clustered=True):
    keys, values = make_kv(B, Hkv, L + 120, clustered=clustered, seed=seed)
    queries = torch.randn(B, Hq, L, D, generator=torch.Generator().manual_seed(seed + 100)) * 2
    s = build("rocketkv", 32, Hq, Hkv, budget_mode="paper")
    run_prefill(s, keys, values, queries, L, max_new=30)
    return s, keys, values, queries


@pytest.mark.parametrize("seed", [0, 1])
def test_stage1_set_and_pooled_score_order(seed):
    L, w = 300, 32
    s, keys, values, queries = stage1_case(seed, L)
    p = s.params
    assert p.prompt_budget == ref_accuracy(330, 32, 30, D)["prompt_budget"] < L
    alive = s.alive
    assert alive.shape == (2, 2, L)
    assert (alive.sum(-1) == p.prompt_budget).all()  # exactly prompt_budget per KV head
    assert alive[..., L - w:].all()  # the window always survives
    kept = s.index[:, :, : s.kept]
    assert (kept[..., 1:] > kept[..., :-1]).all() and int(kept.max()) < L  # unique, sorted
    assert torch.equal(torch.zeros_like(alive).scatter_(2, kept, True), alive)
    ref = ref_pooled_scores(queries[:, :, -w:], keys[:, :, :L], w, 63, SCALE)
    ours_scores = snapkv_scores(queries[:, :, -w:], keys[:, :, :L], w, 63, SCALE)
    assert torch.allclose(ours_scores.double(), ref, atol=1e-5)
    for b in range(2):
        for h in range(2):
            keep = alive[b, h, : L - w]
            assert float(ref[b, h][keep].min()) >= float(ref[b, h][~keep].max()) - 1e-6
    assert s.extra_metrics()["kept_fraction"] == p.prompt_budget / L


def test_stage1_is_per_kv_head_and_invariant_to_query_heads_order():
    s, keys, values, queries = stage1_case(3)
    perm = torch.tensor([1, 0, 3, 2])  # within each group of 2
    t = build("rocketkv", 32, 4, 2, budget_mode="paper")
    run_prefill(t, keys, values, queries[:, perm], 300, max_new=30)
    assert torch.equal(s.alive, t.alive)
    assert not torch.equal(s.alive[:, 0], s.alive[:, 1])  # the kept set differs per KV head


def test_stage1_nothing_evicted_when_prompt_fits():
    keys, values = make_kv(1, 2, 80)
    q = torch.randn(1, 4, 50, D)
    for budget, max_new in [(64, 30), (64, 0), (200, 10)]:
        s = build("rocketkv", budget, 4, 2)
        run_prefill(s, keys, values, q, 50, max_new)
        assert s.params.prompt_budget >= 50 and s.alive is None and s.kept == 50
        assert s.extra_metrics()["kept_fraction"] == 1.0
    s = build("rocketkv", 16, 4, 2, budget_mode="paper", params="gpt_fast")  # prompt_budget < window: window kept
    run_prefill(s, keys, values, torch.randn(1, 4, 50, D), 50, 200)
    assert s.params.prompt_budget < 32 and (s.alive.sum(-1) == 32).all() and s.alive[..., -32:].all()


# ---------------------------------------------------------------------------------------------------- §3.3 stage 2

def compacted_order(alive, b, h, prompt, length):
    kept = torch.arange(prompt) if alive is None else alive[b, h].nonzero().flatten()
    return torch.cat([kept, torch.arange(prompt, length)])


def ref_stage2(q, keys, order, cs, r_ch, G):
    """float64 aggregated score per compacted token for one (b, KV head): q [G, d] of that group."""
    q, kc = q.double(), keys[order].double()
    n, d = kc.shape
    chunks = math.ceil(n / cs)
    kmin = torch.stack([kc[c * cs:(c + 1) * cs].amin(0) for c in range(chunks)])
    kmax = torch.stack([kc[c * cs:(c + 1) * cs].amax(0) for c in range(chunks)])
    chan = q.abs().sum(0).topk(r_ch).indices
    sign = q.sum(0)[chan] > 0
    bound = torch.where(sign, kmax[:, chan], kmin[:, chan])  # [chunks, r]
    s_hat = q[:, chan] @ bound.T  # [G, chunks]
    tau = torch.sqrt(d * q[:, chan].abs().sum(-1, keepdim=True) / q.abs().sum(-1, keepdim=True))
    tokens = torch.tensor([c for c in range(chunks) for _ in range(cs)])[:n]
    return torch.softmax(s_hat[:, tokens] / tau, -1).sum(0), kmin, kmax


@pytest.mark.parametrize("mode,budget", [("paper", 32), ("fair", 16)])
def test_stage2_against_reference_cardinality_and_eviction(mode, budget):
    B, Hq, Hkv, L, extra = 2, 4, 2, 400, 80
    keys, values = make_kv(B, Hkv, L + extra, clustered=True, seed=11)
    s = build("rocketkv", budget, Hq, Hkv, budget_mode=mode)
    run_prefill(s, keys, values, torch.randn(B, Hq, L, D), L, max_new=50)
    p = s.params
    assert p.k == (budget if mode == "fair" else budget // 2) and p.cs == 3 and p.r_ch < D and s.alive is not None
    gen = torch.Generator().manual_seed(5)
    for length in range(L + 1, L + extra + 1):  # more decode tokens than max_new: the buffers grow
        s.append(keys[:, :, :length], values[:, :, :length])
        if (length - L) % 7 and length != L + extra:
            continue
        q = torch.randn(B, Hq, D, generator=gen)
        sel = s.select(q, keys[:, :, :length], values[:, :, :length])
        n = p.prompt_budget + length - L
        assert sel.indices.shape == (B, Hkv, 1, min(p.k, n)) and sel.valid.all()
        assert sel.forced_tokens == 0 and sel.kv_bytes is None
        assert sel.metadata_bytes == Hkv * (2 * p.r_ch * math.ceil(n / p.cs) + 4 * (Hq // Hkv) * n)
        alive = s.alive_mask(length)
        assert alive[..., L:].all()  # decode tokens are never evicted
        for b in range(B):
            for h in range(Hkv):
                idx = sel.indices[b, h, 0]
                assert (idx[1:] > idx[:-1]).all() and alive[b, h, idx].all()  # evicted tokens never selected
                order = compacted_order(s.alive, b, h, L, length)
                assert torch.equal(s.index[b, h, :n], order)
                agg, _, _ = ref_stage2(q[b, h * 2:(h + 1) * 2], keys[b, h], order, p.cs, p.r_ch, 2)
                pos = torch.searchsorted(order, idx)
                kth = agg.sort(descending=True).values[p.k - 1]
                chosen = torch.zeros(n, dtype=torch.bool)
                chosen[pos] = True
                assert (agg[chosen] >= kth - 1e-6).all() and chosen[agg > kth + 1e-6].all()


def test_aux_keys_incremental_equal_recomputation():
    B, Hq, Hkv, L, extra = 1, 4, 2, 400, 70
    keys, values = make_kv(B, Hkv, L + extra, seed=13)
    s = build("rocketkv", 32, Hq, Hkv, budget_mode="paper")
    run_prefill(s, keys, values, torch.randn(B, Hq, L, D), L, max_new=20)  # capacity of 20 + 16: grows twice
    cs = s.params.cs
    assert cs >= 2
    steps = [1, 2, 1, 3, 1, 1, 5, 1, 2, 1] * 7
    length = L
    for step in steps:  # arbitrary decode appends (some calls add several tokens at once)
        length = min(length + step, L + extra)
        s.append(keys[:, :, :length], values[:, :, :length])
        n = s.n
        assert n == s.kept + length - L
        for h in range(Hkv):
            order = compacted_order(s.alive, 0, h, L, length)
            _, kmin, kmax = ref_stage2(torch.ones(2, D), keys[0, h], order, cs, 1, 2)
            chunks = math.ceil(n / cs)
            assert torch.equal(s.kmin[0, h, :chunks].double(), kmin) and torch.equal(s.kmax[0, h, :chunks].double(), kmax)


def test_degenerate_case_is_exact_group_topk_oracle():
    """S <= B (fair traffic 2*budget): c = 1, no eviction, cs = 1, r_ch = d, tau = sqrt(d), k = budget < T'."""
    B, Hq, Hkv, L, budget = 2, 6, 2, 60, 40
    keys, values = make_kv(B, Hkv, L + 10, seed=17)
    s = build("rocketkv", budget, Hq, Hkv)
    run_prefill(s, keys, values, torch.randn(B, Hq, L, D), L, max_new=10)
    p = s.params
    assert (p.cs, p.r_ch, p.k, p.prompt_budget) == (1, D, budget, L) and s.alive is None
    G = Hq // Hkv
    gen = torch.Generator().manual_seed(3)
    for length in range(L + 1, L + 11):
        s.append(keys[:, :, :length], values[:, :, :length])
        q = torch.randn(B, Hq, D, generator=gen) * 2
        sel = s.select(q, keys[:, :, :length], values[:, :, :length])
        logits = torch.einsum("bhgd,bhld->bhgl", q.view(B, Hkv, G, D).double(), keys[:, :, :length].double())
        oracle = torch.softmax(logits / math.sqrt(D), -1).sum(2).topk(budget, -1).indices.sort(-1).values
        assert torch.equal(sel.indices[:, :, 0], oracle)


@pytest.mark.parametrize("Hq,Hkv", [(4, 2), (3, 1), (6, 3)])
def test_budget_covering_context_equals_dense(Hq, Hkv):
    B, L, prompt = 2, 203, 150
    keys, values = make_kv(B, Hkv, L, seed=Hq)
    s = build("rocketkv", 4096, Hq, Hkv)
    run_prefill(s, keys, values, torch.randn(B, Hq, prompt, D), prompt, max_new=L - prompt)
    for length in range(prompt + 1, L + 1):
        s.append(keys[:, :, :length], values[:, :, :length])
    assert s.alive is None and s.params.k >= L
    q = torch.randn(B, Hq, D)
    out, sel = decode_output(s, q, keys, values)
    assert torch.allclose(out.double(), dense_reference(q, keys, values)[0], atol=1e-5, rtol=0)


def chunk_minmax(k, cs):
    C = math.ceil(k.shape[-2] / cs)
    return (torch.stack([k[..., c * cs:(c + 1) * cs, :].amin(-2) for c in range(C)], -2),
            torch.stack([k[..., c * cs:(c + 1) * cs, :].amax(-2) for c in range(C)], -2))


def test_bound_property_and_group_non_invariant():
    cs, d = 4, 8
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(1, 1, 10 * cs + 3, d, generator=gen)  # trailing partial chunk
    kmin, kmax = chunk_minmax(k, cs)
    tokens = torch.arange(k.shape[2]) // cs
    for G, same_signs in [(1, False), (3, True)]:
        q = torch.randn(1, 1, G, d, generator=gen)
        if same_signs:  # all heads agree on each channel's sign: the Quest bound holds per head
            q = q.abs() * torch.sign(torch.randn(d, generator=gen))
        s_hat, _ = approx_scores(q, kmin, kmax, d)
        exact = torch.einsum("bhgd,bhld->bhgl", q.double(), k.double())
        assert (s_hat.double()[..., tokens] >= exact - 1e-5).all()
    # documented non-invariant: G = 2 heads disagree on channel 0's sign; the group sum picks the min bound
    q = torch.zeros(1, 1, 2, 4)
    q[0, 0, 0, 0], q[0, 0, 1, 0] = 1.0, -2.0
    k = torch.zeros(1, 1, 2, 4)
    k[0, 0, 1, 0] = 1.0  # one chunk of two tokens: channel 0 in {0, 1}
    kmin, kmax = chunk_minmax(k, 2)
    s_hat, _ = approx_scores(q, kmin, kmax, 4)
    assert float(s_hat[0, 0, 0, 0]) == 0.0 < float(q[0, 0, 0] @ k[0, 0, 1])  # head 0: bound 0 < q.k = 1


@pytest.mark.parametrize("options,param", [
    ({"params": "fast"}, "method.params"),
    ({"alpha": 1.5}, "method.alpha"),
    ({"alpha": "adaptive"}, "method.alpha"),
    ({"window": 0}, "method.window"),
    ({"pool_kernel": 64}, "method.pool_kernel"),
    ({"budget_mode": "tokens"}, "method.budget_mode"),
    ({"budget_mode": "paper", "budget": 1}, "budget"),
])
def test_bad_options_raise_one_line_errors(options, param):
    budget = options.pop("budget", 64)
    with pytest.raises(ConfigError) as err:
        build("rocketkv", budget, 4, 2, **options)
    assert param in str(err.value) and "\n" not in str(err.value)


# ---------------------------------------------------------------------------------------------------- end to end

@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**TINY_LLAMA, attn_implementation="sdpa")).eval()


def test_tiny_llama_large_budget_equals_fullkv(tiny):
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (1, 300), generator=torch.Generator().manual_seed(2))
    ref, _ = greedy(tiny, ids, 20, "fullkv")
    out, cache = greedy(tiny, ids, 20, "rocketkv", 4096)
    assert torch.equal(out, ref)
    assert cache.extra_metrics()["kept_fraction"] == 1.0


@pytest.mark.parametrize("mode,attended", [("fair", 64), ("paper", 32)])
def test_tiny_llama_small_budget(tiny, mode, attended):
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (1, 600), generator=torch.Generator().manual_seed(3))
    out, cache = greedy(tiny, ids, 10, "rocketkv", 64, budget_mode=mode)
    s = cache.stats.summary()
    assert out.shape == (1, 10) and s["decode_steps"] == 9
    assert s["attended_tokens_per_step"] <= attended and s["forced_tokens_per_step"] == 0
    assert s["bytes_read_per_step"] < s["full_bytes_per_step"] and s["metadata_bytes_per_step"] > 0
    m = cache.extra_metrics()
    assert set(m) == {"alpha", "prompt_budget", "cs", "r_ch", "kept_fraction"} and m["kept_fraction"] < 1
