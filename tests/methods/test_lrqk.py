"""LRQK invariants (docs/methods/lrqk.md §B10) against independent float64 references written here."""
import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from baselines.lrqk import als, decode_coordinates, init_factors, kaczmarz, replace_slots
from baselines.lrqk.capturable_solve import solve_rank_one, spd_inverse
from locks.core.reference import sparse_decode
from locks.core.registry import MethodSpec
from locks.core.selector import LayerInfo, PrefillContext
from locks.errors import ConfigError
from tests.helpers import SCALE, TINY_LLAMA, D, build, dense_reference, greedy, make_kv

B, HQ, HKV, G = 2, 4, 2, 2
RANK, LITE, BUDGET, PROMPT = 8, 16, 96, 300
TOPK = BUDGET - LITE


def start(budget=BUDGET, prompt=PROMPT, L=None, data_seed=0, layer_idx=0, **options):
    """Selector after prefill on seeded synthetic K/V/Q; returns (selector, keys, values) of length L."""
    L = L or prompt + 60
    keys, values = make_kv(B, HKV, L, seed=data_seed)
    q = torch.randn(B, HQ, prompt, D, generator=torch.Generator().manual_seed(data_seed + 100))
    options = {"rank": RANK, "lite_tokens": LITE, **options}
    info = LayerInfo(layer_idx=layer_idx, num_heads=HQ, num_kv_heads=HKV, head_dim=D, scaling=SCALE)
    s = MethodSpec("lrqk", budget, options).build(info)
    pos = torch.arange(prompt).expand(B, -1)
    s.prefill(PrefillContext(keys[:, :, :prompt], values[:, :, :prompt], q, pos, lambda: keys[:, :, :prompt]))
    return s, keys, values


def step(s, keys, values, length, seed):
    q = torch.randn(B, HQ, D, generator=torch.Generator().manual_seed(seed))
    s.append(keys[:, :, :length], values[:, :, :length])
    return q, s.select(q, keys[:, :, :length], values[:, :, :length])


def objective(Q, K, A_Q, B_Q, A_K, B_K, lq=1.0, lk=1.0):
    Q, K, A_Q, B_Q, A_K, B_K = (x.double() for x in (Q, K, A_Q, B_Q, A_K, B_K))
    return float(0.5 * (Q @ K.mT - A_Q @ A_K.mT).square().sum() + 0.5 * lq * (Q - A_Q @ B_Q).square().sum()
                 + 0.5 * lk * (K - A_K @ B_K).square().sum())


# ----- prefill ALS ---------------------------------------------------------------------------------------------------

def test_als_objective_non_increasing_after_every_block_update():
    g = torch.Generator().manual_seed(0)
    Q, K = torch.randn(3, 120, 16, generator=g, dtype=torch.float64), torch.randn(3, 120, 16, generator=g,
                                                                                   dtype=torch.float64)
    A_Q, A_K = init_factors(Q, K, 6, "randn", g)
    values = []
    als(Q, K, A_Q, A_K, max_iter=12, tol=0.0,
        callback=lambda block, *f: values.append(objective(Q, K, *f)))
    assert len(values) == 3 * 12 + 1
    for a, b in zip(values, values[1:]):
        assert b <= a * (1 + 1e-12)
    assert values[-1] < 0.9 * values[0]


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-9), (torch.float32, 1e-4)])
def test_als_B_equals_the_least_squares_solution(dtype, tol):
    g = torch.Generator().manual_seed(1)
    Q, K = torch.randn(2, 200, 32, generator=g, dtype=dtype), torch.randn(2, 200, 32, generator=g, dtype=dtype)
    A_Q, B_Q, A_K, B_K = als(Q, K, *init_factors(Q, K, 8, "randn", g))
    for A, X, Bm in ((A_Q, Q, B_Q), (A_K, K, B_K)):
        ref = torch.linalg.lstsq(A.double(), X.double()).solution
        assert torch.allclose(Bm.double(), ref, atol=tol * float(ref.abs().max()), rtol=0)


def test_als_recovers_exactly_when_ranks_are_at_most_r():
    g = torch.Generator().manual_seed(2)
    r, l, d = 5, 80, 16
    Q = torch.randn(2, l, r, generator=g, dtype=torch.float64) @ torch.randn(2, r, d, generator=g, dtype=torch.float64)
    K = torch.randn(2, l, r, generator=g, dtype=torch.float64) @ torch.randn(2, r, d, generator=g, dtype=torch.float64)
    A_Q, B_Q, A_K, B_K = als(Q, K, *init_factors(Q, K, r, "randn", g), max_iter=300, tol=0.0)
    rel = lambda a, b: float((a - b).norm() / b.norm())  # noqa: E731
    assert rel(A_Q @ A_K.mT, Q @ K.mT) < 1e-6
    assert rel(A_Q @ B_Q, Q) < 1e-6 and rel(A_K @ B_K, K) < 1e-6


def test_selector_prefill_state_shapes_and_least_squares_bases():
    s, keys, values = start()
    assert s.state == "factorized" and s.ak_len == PROMPT
    assert s.A_K.shape[:2] == (B, HQ) and s.A_K.shape[-1] == RANK
    assert s.B_Q.shape == s.B_K.shape == (B, HQ, RANK, D)
    K = keys[:, :, :PROMPT].double().repeat_interleave(G, 1)
    ref = torch.linalg.lstsq(s.A_K[:, :, :PROMPT].double(), K).solution
    assert torch.allclose(s.B_K.double(), ref, atol=1e-4 * float(ref.abs().max()))
    for length in range(PROMPT + 1, PROMPT + 40):
        step(s, keys, values, length, length)
        assert s.ak_len == length  # one A_K row per token seen, per query head


# ----- decode solves and Kaczmarz ------------------------------------------------------------------------------------

def test_capturable_solver_equals_linalg_in_float64():
    """The static step's solves (sweep-operator inverse, Sherman-Morrison) against torch.linalg, on SPD matrices
    with condition numbers up to about 1e6."""
    g = torch.Generator().manual_seed(5)
    r = 32
    A = torch.randn(4, 3, r, r + 4, generator=g, dtype=torch.float64)
    M = A @ A.mT + torch.logspace(-4, 0, 4, dtype=torch.float64).view(4, 1, 1, 1) * torch.eye(r, dtype=torch.float64)
    inverse = torch.linalg.inv(M)
    assert float(((spd_inverse(M) - inverse).abs().amax((-2, -1)) / inverse.abs().amax((-2, -1))).max()) < 1e-8
    u, y = torch.randn(2, 4, 3, 1, r, generator=g, dtype=torch.float64)
    for lam in (0.0, 1.0, 3.0):
        x = solve_rank_one(spd_inverse(M), lam, u, y)
        assert torch.allclose(x @ (M + lam * u.mT @ u), y, rtol=0, atol=1e-8)


@pytest.mark.parametrize("on_device", [False, True])
def test_decode_solves_satisfy_their_normal_equations(on_device):
    g = torch.Generator().manual_seed(3)
    r, m = 8, 50
    B_Q, B_K = torch.randn(5, r, D, generator=g), torch.randn(5, r, D, generator=g)
    A, Kom = torch.randn(5, m, r, generator=g), torch.randn(5, m, D, generator=g)
    q, k = torch.randn(5, 1, D, generator=g), torch.randn(5, 1, D, generator=g)
    for l1, l2 in ((1.0, 1.0), (0.5, 2.0)):
        q_hat, k_hat, k_used = decode_coordinates(B_Q, B_K, A, Kom, q, k, 2, 0.0, l1, l2, on_device=on_device)
        Bq, Bk, A64, K64, q64, k64 = (x.double() for x in (B_Q, B_K, A, Kom, q, k))
        qk = q64 @ k64.mT
        lhs_q = q_hat.double() @ (Bq @ Bq.mT + l2 * A64.mT @ A64 + l1 * k_used.double().mT @ k_used.double())
        rhs_q = q64 @ Bq.mT + l2 * (q64 @ K64.mT) @ A64 + l1 * qk * k_used.double()
        lhs_k = k_hat.double() @ (Bk @ Bk.mT + l1 * q_hat.double().mT @ q_hat.double())
        rhs_k = k64 @ Bk.mT + l1 * qk * q_hat.double()
        assert float((lhs_q - rhs_q).norm() / rhs_q.norm()) < 1e-4
        assert float((lhs_k - rhs_k).norm() / rhs_k.norm()) < 1e-4


def test_kaczmarz_reproduces_the_vector_with_a_rank_one_change():
    g = torch.Generator().manual_seed(4)
    Bm, hat, x = torch.randn(3, 8, D, generator=g), torch.randn(3, 1, 8, generator=g), torch.randn(3, 1, D, generator=g)
    new = kaczmarz(Bm, hat, x)
    assert ((hat @ new - x).norm(dim=-1) <= 1e-3 * x.norm(dim=-1)).all()
    sv = torch.linalg.svdvals((new - Bm).double())
    assert (sv[:, 1] <= 1e-6 * sv[:, 0]).all()


def reference_decode(state, keys, q, L, lambda1=1.0, lambda2=1.0, iters=2):
    """float64, one head at a time: Omega = old slots + lite ring (current token's A_K row = 0)."""
    B_Q, B_K, A_K, slots, lite = state
    out = {}
    for b in range(B):
        for h in range(HQ):
            omega = slots[b, h].tolist() + lite
            A = torch.stack([A_K[b, h, t] if t < L - 1 else torch.zeros(RANK, dtype=torch.float64) for t in omega])
            Kom = keys[b, h // G, omega].double()
            qv, kv = q[b, h].double()[None], keys[b, h // G, L - 1].double()[None]
            bq, bk = B_Q[b, h], B_K[b, h]
            P = bk @ bk.T
            k_hat = torch.linalg.solve(P, (kv @ bk.T).T).T
            c = lambda1 * float(qv @ kv.T)
            for _ in range(iters):
                M = bq @ bq.T + lambda2 * A.T @ A + lambda1 * k_hat.T @ k_hat
                q_hat = torch.linalg.solve(M, (qv @ bq.T + lambda2 * (qv @ Kom.T) @ A + c * k_hat).T).T
                k_hat = torch.linalg.solve(P + lambda1 * q_hat.T @ q_hat, (kv @ bk.T + c * q_hat).T).T
            out[b, h] = (q_hat, k_hat, qv, kv)
    return out


def test_decode_step_matches_float64_reference_and_selects_its_top_k():
    s, keys, values = start(tol_decode=0.0)
    for length in range(PROMPT + 1, PROMPT + 5):
        step(s, keys, values, length, length)
    L = PROMPT + 5
    q = torch.randn(B, HQ, D, generator=torch.Generator().manual_seed(7))
    s.append(keys[:, :, :L], values[:, :, :L])
    state = (s.B_Q.double().clone(), s.B_K.double().clone(), s.A_K.double().clone(), s.slots.clone(), list(s.lite))
    s.select(q, keys[:, :, :L], values[:, :, :L])
    ref = reference_decode(state, keys, q, L)
    ncand = L - LITE - 1
    for (b, h), (q_hat, k_hat, qv, kv) in ref.items():
        assert torch.allclose(s.A_K[b, h, L - 1].double(), k_hat[0], rtol=1e-3, atol=1e-4)
        # after the Kaczmarz step q^ B_Q reproduces q (and k^ B_K reproduces k)
        assert float((q_hat @ s.B_Q[b, h].double() - qv).norm()) <= 1e-3 * float(qv.norm())
        assert float((k_hat @ s.B_K[b, h].double() - kv).norm()) <= 1e-3 * float(kv.norm())
        z = state[2][b, h, :ncand] @ q_hat[0]
        assert set(z.topk(TOPK).indices.tolist()) == set(s.slots[b, h].tolist())


# ----- selection, hit/miss, hot cache, cold store --------------------------------------------------------------------

def test_replace_slots_official_example():
    old, new = torch.tensor([[0, 1, 2, 6, 7]]), torch.tensor([[0, 2, 4, 5, 6]])
    updated, mask = replace_slots(old, new, 8)
    assert updated.tolist() == [[0, 4, 2, 6, 5]] and mask.tolist() == [[False, True, False, False, True]]


def test_selection_hit_miss_hot_cache_and_cold_store():
    s, keys, values = start()
    L0 = PROMPT
    for length in range(L0 + 1, L0 + 45):  # crosses two ring flushes (LITE = 16)
        old = s.slots.clone()
        hits_before, rows_before = float(s.hit_sum), s.h2d_rows
        q, sel = step(s, keys, values, length, length)
        L = length
        idx = sel.indices
        assert idx.shape == (B, HKV, G, BUDGET) and bool(sel.valid.all())
        assert sel.forced_tokens == LITE and sel.keys.shape == (B, HKV, G, BUDGET, D)
        lite = set(range(L - LITE, L))
        new_sets = {}
        for b in range(B):
            for h in range(HKV):
                for g in range(G):
                    t = idx[b, h, g]
                    assert torch.equal(t, t.sort().values) and len(set(t.tolist())) == BUDGET and int(t.max()) < L
                    top = set(t.tolist()) - lite
                    assert lite <= set(t.tolist()) and len(top) == TOPK  # exact cardinality, disjoint from lite
                    assert max(top) < L - LITE - 1  # candidates [0, oldest lite - 1)
                    new_sets[b, h * G + g] = top
                    assert set(s.slots[b, h * G + g].tolist()) == top  # resident set == new top-k set
        # rows moved == new-not-resident; hit = 1 - overwritten / (B * Hq * k)
        misses = sum(len(new_sets[b, j] - set(old[b, j].tolist())) for b in range(B) for j in range(HQ))
        assert math.isclose(s.h2d_rows - rows_before, misses / B)
        assert math.isclose(sel.h2d_bytes, 2 * D * 2 * misses / B)
        assert math.isclose(float(s.hit_sum) - hits_before, 1 - misses / (B * HQ * TOPK), abs_tol=1e-6)
        # hot cache: top-k slots hold K[slot] bit-exactly, the ring holds the last n tokens
        Krep, Vrep = keys.repeat_interleave(G, 1), values.repeat_interleave(G, 1)
        for b in range(B):
            for j in range(HQ):
                assert torch.equal(s.Kh[b, j, :TOPK], Krep[b, j, s.slots[b, j]])
                assert torch.equal(s.Vh[b, j, :TOPK], Vrep[b, j, s.slots[b, j]])
        assert set(s.lite) == lite
        assert torch.equal(s.Kh[:, :, TOPK:], Krep[:, :, s.lite]) and torch.equal(s.Vh[:, :, TOPK:], Vrep[:, :, s.lite])
        # served K/V equal the dense cache rows; output == dense softmax restricted to those tokens (float64)
        gathered = keys[:, :, None, :L].expand(B, HKV, G, L, D).gather(3, idx[..., None].expand(-1, -1, -1, -1, D))
        assert torch.equal(sel.keys, gathered)
        out, _ = sparse_decode(q, keys[:, :, :L], values[:, :, :L], sel, SCALE)
        for b in range(B):
            for j in range(HQ):
                t = idx[b, j // G, j % G]
                logits = keys[b, j // G, t].double() @ q[b, j].double() * SCALE
                ref = torch.softmax(logits, 0) @ values[b, j // G, t].double()
                assert torch.allclose(out[b, j].double(), ref, atol=1e-5)
        # cold store: every token except the unflushed ring writes, [K|V] round-trips bit-exactly
        unflushed = s.lite_len
        assert s.store_len == L - unflushed
        store = s.store[:, :, : s.store_len]
        assert torch.equal(store[..., :D], keys[:, :, : s.store_len]) and torch.equal(store[..., D:],
                                                                                      values[:, :, : s.store_len])
    m = s.extra_metrics()
    assert 0 <= m["hit_rate"] <= 1 and m["h2d_rows_per_step"] > 0 and m["effective_rank"] == RANK


def test_same_seed_same_selections_and_layers_differ():
    runs = []
    for seed, layer in ((5, 0), (5, 0), (6, 0), (5, 1)):
        s, keys, values = start(seed=seed, layer_idx=layer)
        sels = [step(s, keys, values, length, length)[1].indices for length in range(PROMPT + 1, PROMPT + 8)]
        runs.append((torch.stack(sels), s.A_K[:, :, :PROMPT].clone()))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    assert not torch.equal(runs[0][1], runs[2][1]) and not torch.equal(runs[0][1], runs[3][1])


# ----- budget semantics ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("budget,prompt", [(4096, 150), (200, 150), (200, 60)])
def test_budget_covering_context_equals_dense(budget, prompt):
    """4096: collecting (dense); 200/150: factorized, all resident in the hot cache; 200/60: factorized at decode."""
    L = 200
    s, keys, values = start(budget=budget, prompt=prompt, L=L, lite_tokens=64)
    for length in range(prompt + 1, L + 1):
        q, sel = step(s, keys, values, length, length)
        out = (dense_reference(q, keys[:, :, :length], values[:, :, :length])[0].float() if sel.dense
               else sparse_decode(q, keys[:, :, :length], values[:, :, :length], sel, SCALE)[0])
        ref, _ = dense_reference(q, keys[:, :, :length], values[:, :, :length])
        assert torch.allclose(out.double(), ref, atol=1e-5, rtol=0)
    if budget == 200:
        assert s.state == "factorized" and s.ak_len == L and not sel.dense


def test_collecting_then_selecting_past_the_hot_cache():
    s, keys, values = start(budget=96, prompt=50, L=160)  # k = 80: factorized when the context reaches 80 tokens
    for length in range(51, 161):
        _, sel = step(s, keys, values, length, length)
        assert s.state == ("collecting" if length < TOPK else "factorized")
        if length > TOPK + LITE:
            assert sel.indices.shape[-1] == BUDGET
    assert s.ak_len == 160 and s.store_len == 160 - s.lite_len


def test_paper_mode_attends_lite_outside_the_budget():
    s, keys, values = start(budget=64, budget_mode="paper")
    _, sel = step(s, keys, values, PROMPT + 1, 1)
    assert sel.indices.shape[-1] == 64 + LITE and s.k == 64


@pytest.mark.parametrize("budget,options,param", [
    (16, {}, "method.lite_tokens"),
    (96, {"rank": 0}, "method.rank"),
    (96, {"lite_tokens": 0}, "method.lite_tokens"),
    (96, {"max_iter_decode": 0}, "method.max_iter_decode"),
    (96, {"max_iter_prefill": -1}, "method.max_iter_prefill"),
    (96, {"tol_prefill": -1.0}, "method.tol_prefill"),
    (96, {"lambda_2": float("nan")}, "method.lambda_2"),
    (96, {"init": "svd"}, "method.init"),
    (96, {"prefill_order": "jacobi"}, "method.prefill_order"),
    (96, {"candidate_off_by_one": "yes"}, "method.candidate_off_by_one"),
    (96, {"seed": 1.5}, "method.seed"),
    (96, {"budget_mode": "loose"}, "method.budget_mode"),
])
def test_bad_options_raise_one_line_config_errors(budget, options, param):
    options = {"lite_tokens": LITE, **options}
    with pytest.raises(ConfigError) as err:
        build("lrqk", budget, HQ, HKV, **options)
    assert param in str(err.value) and "\n" not in str(err.value)


def test_yaml_options_build():
    from omegaconf import OmegaConf

    conf = OmegaConf.load("conf/method/lrqk.yaml")
    assert conf._get_node("seed")._value() == "${seed}"
    options = {k: v for k, v in OmegaConf.to_container(conf).items() if k not in ("name", "budget", "backend", "seed")}
    options["seed"] = 42
    s = build("lrqk", 2048, HQ, HKV, **options)
    assert s.k == 2048 - 64 and s.r == min(32, D) and s.seed == 42 and s.off_by_one


# ----- end to end on the tiny random Llama ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**TINY_LLAMA, attn_implementation="sdpa")).eval()


def test_generate_large_budget_matches_fullkv_and_small_budget_saves_bytes(tiny):
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (1, 600), generator=torch.Generator().manual_seed(3))
    ref, _ = greedy(tiny, ids, 12, "fullkv", 4096)
    out, _ = greedy(tiny, ids, 12, "lrqk", 4096)
    assert torch.equal(out, ref)
    budget, lite = 64, 16
    out, cache = greedy(tiny, ids, 12, "lrqk", budget, rank=4, lite_tokens=lite)
    s = cache.stats.summary()
    assert out.shape == (1, 12) and s["decode_steps"] == 11
    # per query head budget tokens; the harness counts the union over the G query heads of a KV head
    assert s["attended_tokens_per_step"] <= G * (budget - lite) + lite
    assert s["forced_tokens_per_step"] == lite
    assert s["bytes_read_per_step"] < s["full_bytes_per_step"]
    assert s["h2d_bytes_per_step"] > 0
    m = cache.extra_metrics()
    assert 0 <= m["hit_rate"] <= 1 and m["h2d_rows_per_step"] > 0
    for layer in cache.layers:
        assert layer.selector.ak_len == 600 + 11 and layer.selector.k + layer.selector.n == budget


def test_resident_hot_cache_logits_match_fullkv_along_its_trajectory(tiny):
    """budget 650, lite 64: k = 586 <= prompt 600, factorized at prefill, every token resident up to 650."""
    from tests.helpers import stock_greedy, teacher_forced_logits

    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (1, 600), generator=torch.Generator().manual_seed(4))
    ref_tokens = stock_greedy(tiny, ids, 20)
    ref = teacher_forced_logits(tiny, ids, ref_tokens, "fullkv", 4096)
    got = teacher_forced_logits(tiny, ids, ref_tokens, "lrqk", 650)
    assert torch.allclose(got, ref, atol=1e-5, rtol=0)
