"""Quest selector (docs/methods/quest.md) against independent float64 references written here."""
import itertools
import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from locks.core.attention import register_attention
from locks.core.cache import SelectorCache
from locks.core.dense import DenseAttention
from locks.core.reference import sparse_decode
from locks.core.registry import MethodSpec
from locks.core.selector import LayerInfo, PrefillContext
from locks.errors import ConfigError
from tests.helpers import SCALE, TINY_LLAMA, D, decode_output, dense_reference, greedy, make_kv

P = 16
RULES = ["kernel", "eval"]
GQA = [("per_head", "max"), ("group", "max"), ("group", "sum")]


def quest(budget, Hq, Hkv, layer_idx=2, **options):
    info = LayerInfo(layer_idx=layer_idx, num_heads=Hq, num_kv_heads=Hkv, head_dim=D, scaling=SCALE)
    return MethodSpec("quest", budget, options).build(info)


def run_prefill(sel, keys, values, Hq, n):
    B = keys.shape[0]
    ctx = PrefillContext(keys[:, :, :n], values[:, :, :n], torch.randn(B, Hq, n, D), torch.arange(n).expand(B, -1),
                         lambda: keys[:, :, :n])
    sel.prefill(ctx)


def decode_to(sel, keys, values, start, end):
    for length in range(start + 1, end + 1):
        sel.append(keys[:, :, :length], values[:, :, :length])


# ----- float64 references -------------------------------------------------------------------------------------------

def ref_minmax(keys, page):
    L = keys.shape[2]
    pages = [keys[:, :, p : min(L, p + page)].double() for p in range(0, L, page)]
    return torch.stack([x.amax(2) for x in pages], 2), torch.stack([x.amin(2) for x in pages], 2)


def ref_bounds(q, keys, page):
    """U [B, Hkv, G, pages] = sum_i max(q_i M_i, q_i m_i), element-wise in float64."""
    B, Hq, d = q.shape
    Hkv = keys.shape[1]
    M, m = ref_minmax(keys, page)
    qg = q.double().view(B, Hkv, Hq // Hkv, 1, d)
    return torch.maximum(qg * M[:, :, None], qg * m[:, :, None]).sum(-1)


def ref_sign_trick(q, keys, page):
    """U = sum_i |q_i| max_{j in p} sigma_i k_{j,i}, sigma_i = +1 if q_i > 0 else -1 (the eval path's form)."""
    B, Hq, d = q.shape
    Hkv, L = keys.shape[1], keys.shape[2]
    qg = q.double().view(B, Hkv, Hq // Hkv, 1, d)
    sigma = torch.where(qg > 0, 1.0, -1.0).double()
    signed = sigma * keys.double()[:, :, None]  # [B, Hkv, G, L, d]
    page_max = torch.stack([signed[:, :, :, p : p + page].amax(3) for p in range(0, L, page)], 3)
    return (qg.abs() * page_max).sum(-1)


def true_page_max_logit(q, keys, page):
    """max_{j in p} q . k_j per (b, kv head, g, page), float64."""
    B, Hq, d = q.shape
    Hkv, L = keys.shape[1], keys.shape[2]
    logits = torch.einsum("bhgd,bhld->bhgl", q.double().view(B, Hkv, Hq // Hkv, d), keys.double())
    return torch.stack([logits[..., p : p + page].amax(-1) for p in range(0, L, page)], -1)


def page_sets(sel, page=P):
    """Python sets of selected pages per (b, kv head, set)."""
    B, H, S, _ = sel.indices.shape
    return {(b, h, s): set((sel.indices[b, h, s][sel.valid[b, h, s]] // page).tolist())
            for b, h, s in itertools.product(range(B), range(H), range(S))}


def expected_pages(L, budget, rule, mode="fair", page=P):
    n = math.ceil(L / page)
    if rule == "kernel":
        return n if n <= budget // page else budget // page
    if budget >= L:
        return n
    floor = 3 if (mode == "paper" or 3 * page <= budget) else 1
    return min(max(floor, min(L, budget) // page), n)


# ----- invariant 1, 2: the bound ------------------------------------------------------------------------------------

@pytest.mark.parametrize("page", [16, 5, 1])
def test_bound_upper_bounds_every_logit_and_is_homogeneous(page):
    B, Hq, Hkv, L = 2, 6, 3, 87  # partial last page for every page size > 1
    keys, values = make_kv(B, Hkv, L, seed=page)
    q = torch.randn(B, Hq, D)
    q[0, 0, :5] = 0.0  # zero channels: sigma = -1 there, |q_i| = 0
    s = quest(max(page, 16), Hq, Hkv, page_size=page)
    run_prefill(s, keys, values, Hq, L)
    U = s.page_bounds(q, math.ceil(L / page)).double()
    ref = ref_bounds(q, keys, page)
    assert torch.allclose(U, ref, atol=1e-4, rtol=1e-5)
    # U_p >= q . k_j for every token j of the page, hence >= the page's max logit
    logits = torch.einsum("bhgd,bhld->bhgl", q.double().view(B, Hkv, Hq // Hkv, D), keys.double())
    token_page = torch.arange(L) // page
    assert (U[..., token_page] >= logits - 1e-4).all()
    tight = true_page_max_logit(q, keys, page)
    assert (U >= tight - 1e-4).all()
    if page == 1:  # a single key: M = m = k, U = q . k exactly
        assert torch.allclose(U, tight, atol=1e-4, rtol=0)
    else:
        assert (U > tight + 1e-3).any()
    for c in (0.25, 3.0, 17.0):  # positive homogeneity
        assert torch.allclose(s.page_bounds(q * c, math.ceil(L / page)).double(), c * U, atol=1e-4, rtol=1e-5)


def test_sign_trick_equivalence():
    B, Hq, Hkv, L = 1, 8, 2, 150  # partial last page: the sign trick only maxes over the page's real rows
    keys, values = make_kv(B, Hkv, L, seed=11)
    q = torch.randn(B, Hq, D)
    q[0, 3, ::3] = 0.0
    elementwise, sign_trick = ref_bounds(q, keys, P), ref_sign_trick(q, keys, P)
    assert torch.allclose(elementwise, sign_trick, atol=1e-10, rtol=0)
    s = quest(64, Hq, Hkv)
    run_prefill(s, keys, values, Hq, L)
    assert torch.allclose(s.page_bounds(q, math.ceil(L / P)).double(), sign_trick, atol=1e-4, rtol=1e-5)


# ----- invariant 4: incremental metadata ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("prompt,chunks", [
    (37, [1, 1, 10, 1, 16, 33, 1, 1, 2, 15, 1]),  # starts mid-page, bulk appends across several boundaries
    (32, [1] * 20 + [48, 3]),                      # prompt ends on a boundary: the next key opens a page
    (5, [1, 10, 1, 1, 20]),                         # prompt shorter than a page
])
def test_incremental_metadata_equals_recomputation(dtype, prompt, chunks):
    B, Hq, Hkv = 2, 4, 2
    L = prompt + sum(chunks)
    keys, values = make_kv(B, Hkv, L, seed=prompt)
    keys, values = keys.to(dtype), values.to(dtype)
    s = quest(32, Hq, Hkv)
    run_prefill(s, keys, values, Hq, prompt)
    length = prompt
    for n in chunks:
        length += n
        s.append(keys[:, :, :length], values[:, :, :length])  # the whole cache; new rows are [old length:]
        M, m = ref_minmax(keys[:, :, :length], P)
        pages = math.ceil(s.length / P)
        page_max, page_min = s._max[:, :, :pages], s._min[:, :, :pages]
        assert page_max.dtype == dtype and page_max.shape == (B, Hkv, math.ceil(length / P), D)
        assert torch.equal(page_max.double(), M) and torch.equal(page_min.double(), m)


# ----- invariant 3: pruning soundness -------------------------------------------------------------------------------

@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("gqa,reduce", GQA)
@pytest.mark.parametrize("budget", [32, 80, 200])
def test_pruning_soundness(rule, gqa, reduce, budget):
    B, Hq, Hkv, L = 2, 8, 2, 517
    keys, values = make_kv(B, Hkv, L, clustered=True, seed=budget)
    q = torch.randn(B, Hq, D) * 2
    s = quest(budget, Hq, Hkv, page_rule=rule, gqa=gqa, group_reduce=reduce)
    run_prefill(s, keys, values, Hq, L)
    sel = s.select(q, keys, values)
    assert not sel.dense
    U, true = ref_bounds(q, keys, P), true_page_max_logit(q, keys, P)  # [B, Hkv, G, pages]
    if gqa == "group":  # soundness of the aggregated score: agg(max logit) <= agg(U)
        agg = (lambda x: x.amax(2, keepdim=True)) if reduce == "max" else (lambda x: x.sum(2, keepdim=True))
        U, true = agg(U), agg(true)
    last = math.ceil(L / P) - 1
    for (b, h, g), chosen in page_sets(sel).items():
        scored = chosen - {last} if rule == "kernel" else chosen  # the kernel rule's last page is forced
        candidates = range(last) if rule == "kernel" else range(last + 1)
        floor = min(float(U[b, h, g, p]) for p in scored)
        for p in candidates:
            if p not in chosen:
                assert float(true[b, h, g, p]) <= float(U[b, h, g, p]) + 1e-6
                assert float(U[b, h, g, p]) <= floor + 1e-4


# ----- invariant 5, 6: dense equivalence and masked-dense equivalence ------------------------------------------------

@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("gqa,reduce", GQA[:2])
@pytest.mark.parametrize("L", [203, 192, 40])
def test_budget_covering_context_is_dense(rule, gqa, reduce, L):
    B, Hq, Hkv, prompt = 2, 4, 2, L - 20
    keys, values = make_kv(B, Hkv, L, seed=L)
    # kernel: dense iff ceil(L/P) <= B // P (spec 1.6.5); eval: B >= L (the "one page short" fix)
    budgets = [P * math.ceil(L / P), 4096] if rule == "kernel" else [L, L + 1, 4096]
    for budget, mode in itertools.product(budgets, ["fair", "paper"]):
        s = quest(budget, Hq, Hkv, page_rule=rule, gqa=gqa, group_reduce=reduce, budget_mode=mode)
        run_prefill(s, keys, values, Hq, prompt)
        decode_to(s, keys, values, prompt, L)
        q = torch.randn(B, Hq, D)
        out, sel = decode_output(s, q, keys, values)
        assert sel.dense
        # the same sets forced through the sparse path reproduce dense attention too
        idx = torch.arange(L).expand(B, Hkv, 1, L)
        sparse, _ = sparse_decode(q, keys, values, type(sel)(indices=idx, valid=torch.ones_like(idx, dtype=torch.bool)),
                                  SCALE)
        ref, _ = dense_reference(q, keys, values)
        assert torch.allclose(out.double(), ref, atol=1e-5, rtol=0)
        assert torch.allclose(sparse.double(), ref, atol=1e-5, rtol=0)


def test_kernel_rule_one_page_short_when_budget_equals_unaligned_length():
    """The kernel rule is faithful: B = L with L mod P != 0 gives B // P < ceil(L/P) pages (not dense)."""
    B, Hq, Hkv, L = 1, 4, 2, 203
    keys, values = make_kv(B, Hkv, L, seed=2)
    s = quest(L, Hq, Hkv, page_rule="kernel")
    run_prefill(s, keys, values, Hq, L)
    sel = s.select(torch.randn(B, Hq, D), keys, values)
    assert not sel.dense and all(len(p) == L // P for p in page_sets(sel).values())


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("gqa,reduce", GQA)
@pytest.mark.parametrize("mode", ["fair", "paper"])
def test_sparse_output_equals_masked_dense_softmax(rule, gqa, reduce, mode):
    B, Hq, Hkv, L, budget = 2, 6, 2, 301, 40
    keys, values = make_kv(B, Hkv, L, seed=4)
    q = torch.randn(B, Hq, D)
    s = quest(budget, Hq, Hkv, page_rule=rule, gqa=gqa, group_reduce=reduce, budget_mode=mode)
    run_prefill(s, keys, values, Hq, 250)
    decode_to(s, keys, values, 250, L)
    out, sel = decode_output(s, q, keys, values)
    G = Hq // Hkv
    for b, h, g in itertools.product(range(B), range(Hkv), range(G)):
        sset = 0 if sel.indices.shape[2] == 1 else g
        mask = torch.zeros(L, dtype=torch.bool)
        mask[sel.indices[b, h, sset][sel.valid[b, h, sset]]] = True
        logits = (keys[b, h].double() @ q[b, h * G + g].double()) * SCALE
        ref = torch.softmax(logits.masked_fill(~mask, float("-inf")), 0) @ values[b, h].double()
        assert torch.allclose(out[b, h * G + g].double(), ref, atol=1e-5, rtol=0)


# ----- invariant 7: cardinality, selection format, forced tokens, bytes ----------------------------------------------

@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("mode", ["fair", "paper"])
@pytest.mark.parametrize("gqa", ["per_head", "group"])
def test_cardinality_format_and_accounting(rule, mode, gqa):
    B, Hq, Hkv = 1, 4, 2
    G = Hq // Hkv
    keys, values = make_kv(B, Hkv, 300, seed=5)
    for L, budget in itertools.product([33, 48, 100, 177, 300], [16, 31, 32, 47, 48, 64, 100, 160, 400]):
        k, v = keys[:, :, :L], values[:, :, :L]
        s = quest(budget, Hq, Hkv, page_rule=rule, gqa=gqa, budget_mode=mode)
        run_prefill(s, k, v, Hq, L)
        sel = s.select(torch.randn(B, Hq, D), k, v)
        n, want = math.ceil(L / P), expected_pages(L, budget, rule, mode)
        assert sel.dense == (want == n)
        if sel.dense:
            continue
        assert sel.indices.dtype == torch.int64 and sel.indices.shape[2] == (G if gqa == "per_head" else 1)
        assert int(sel.indices.max()) < L and int(sel.indices.min()) >= 0
        for key, pages in page_sets(sel).items():
            assert len(pages) == want
            t = sel.indices[key][sel.valid[key]]
            assert torch.equal(t, t.unique())  # sorted and unique
            assert t.numel() == sum(min(P, L - p * P) for p in pages)
            if rule == "kernel":
                assert n - 1 in pages and t.numel() == (budget // P - 1) * P + L - (n - 1) * P
            if mode == "fair" or rule == "kernel":
                assert t.numel() <= budget
        tail = L - (n - 1) * P
        assert sel.forced_tokens == (tail if rule == "kernel" else 0)
        scored, top = (n - 1, want - 1) if rule == "kernel" else (n, want)
        sets = G if gqa == "per_head" else 1
        assert sel.metadata_bytes == Hkv * (2 * D * 2 * scored + 2 * scored * sets + 4 * top * sets)
        assert sel.kv_bytes is None


def test_eval_rule_min_three_pages():
    B, Hq, Hkv, L = 1, 2, 1, 200
    keys, values = make_kv(B, Hkv, L, seed=6)
    for mode, want in [("paper", 3), ("fair", 2)]:
        s = quest(32, Hq, Hkv, page_rule="eval", budget_mode=mode)
        run_prefill(s, keys, values, Hq, L)
        sel = s.select(torch.randn(B, Hq, D), keys, values)
        assert all(len(p) == want for p in page_sets(sel).values())


# ----- invariant 9: monotonicity and deterministic ties --------------------------------------------------------------

@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("gqa,reduce", GQA)
def test_larger_budget_selects_superset(rule, gqa, reduce):
    B, Hq, Hkv, L = 1, 4, 2, 250
    keys, values = make_kv(B, Hkv, L, seed=8)
    q = torch.randn(B, Hq, D)
    all_pages = set(range(math.ceil(L / P)))
    previous = None
    for budget in list(range(16, 270, 8)):
        s = quest(budget, Hq, Hkv, page_rule=rule, gqa=gqa, group_reduce=reduce, budget_mode="paper")
        run_prefill(s, keys, values, Hq, L)
        sel = s.select(q, keys, values)
        S = Hq // Hkv if gqa == "per_head" else 1
        cur = ({(0, h, g): all_pages for h in range(Hkv) for g in range(S)} if sel.dense else page_sets(sel))
        if previous is not None:
            assert all(previous[key] <= cur[key] for key in cur)
        previous = cur


@pytest.mark.parametrize("rule", RULES)
def test_ties_go_to_the_lower_page_and_are_deterministic(rule):
    B, Hq, Hkv, L = 1, 4, 2, 16 * 12 + 5
    page = torch.randn(1, Hkv, P, D)
    keys = page.repeat(1, 1, 13, 1)[:, :, :L]  # identical complete pages: every bound ties
    values = torch.randn(1, Hkv, L, D)
    s = quest(64, Hq, Hkv, page_rule=rule)
    run_prefill(s, keys, values, Hq, L)
    q = torch.randn(B, Hq, D)
    a, b = s.select(q, keys, values), s.select(q, keys, values)
    assert torch.equal(a.indices, b.indices)
    # kernel: top 3 among pages 0..11 + the last; eval: top 4 among all 13 (the partial last page's bound ties or
    # falls below the complete pages': it is computed over a subset of the same rows, and ties go to lower pages)
    want = {0, 1, 2, 12} if rule == "kernel" else {0, 1, 2, 3}
    assert all(pages == want for pages in page_sets(a).values())


# ----- GQA ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("reduce", ["max", "sum"])
def test_group_mode_invariant_to_head_permutation_within_group(rule, reduce):
    B, Hq, Hkv, L = 2, 8, 2, 640
    keys, values = make_kv(B, Hkv, L, seed=9)
    q = torch.randn(B, Hq, D)
    perm = torch.tensor([3, 1, 0, 2, 7, 4, 6, 5])
    s = quest(96, Hq, Hkv, page_rule=rule, gqa="group", group_reduce=reduce)
    run_prefill(s, keys, values, Hq, L)
    a, b = s.select(q, keys, values), s.select(q[:, perm], keys, values)
    assert a.indices.shape[2] == 1 and torch.equal(a.indices, b.indices) and torch.equal(a.valid, b.valid)


def test_per_head_mode_has_one_set_per_query_head_and_union_metric():
    B, Hq, Hkv, L = 1, 8, 2, 640
    keys, values = make_kv(B, Hkv, L, seed=10)
    s = quest(64, Hq, Hkv)  # defaults: kernel rule, per_head
    run_prefill(s, keys, values, Hq, L)
    q = torch.randn(B, Hq, D)
    sel = s.select(q, keys, values)
    assert sel.indices.shape[:3] == (B, Hkv, Hq // Hkv)
    # per head: its own top pages by its own bound (float64 reference, ties impossible with random keys)
    U = ref_bounds(q, keys, P)
    last = math.ceil(L / P) - 1
    for (b, h, g), pages in page_sets(sel).items():
        top = set(torch.topk(U[b, h, g, :last], 3).indices.tolist())
        assert pages == top | {last}
    union = [len(set().union(*(page_sets(sel)[(0, h, g)] for g in range(4)))) * P for h in range(Hkv)]
    ratio = (sum(union) / Hkv) / (4 * P)
    assert math.isclose(s.extra_metrics()["quest_union_ratio"], ratio, rel_tol=1e-6) and ratio > 1


# ----- dense layers, end to end -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny4():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**{**TINY_LLAMA, "num_hidden_layers": 4}, attn_implementation="sdpa")).eval()


def test_dense_layers_bit_identical_to_fullkv(tiny4):
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (1, 150), generator=torch.Generator().manual_seed(1))
    captured = {}
    hooks = [tiny4.model.layers[i].self_attn.register_forward_hook(
        lambda m, inp, out, i=i: captured.setdefault(i, []).append(out[0].detach().clone())) for i in range(4)]
    try:
        out_q, cache_q = greedy(tiny4, ids, 8, "quest", 32)
        got, captured = captured, {}
        out_f, _ = greedy(tiny4, ids, 8, "fullkv", 4096)
        ref = captured
    finally:
        for h in hooks:
            h.remove()
    assert len(got[0]) == 8  # prefill + 7 decode steps
    # the core's dense layer, with no metadata
    assert isinstance(cache_q.selector(0), DenseAttention) and isinstance(cache_q.selector(1), DenseAttention)
    assert cache_q.selector(2).length == 157
    compared = 0
    for step in range(8):  # call 0 = prefill; call i >= 1 decodes token i - 1: same inputs while tokens agree
        if step > 0 and not torch.equal(out_q[:, :step], out_f[:, :step]):
            break
        for layer in (0, 1):
            assert torch.equal(got[layer][step], ref[layer][step])
        compared += 1
    assert compared >= 2
    assert not torch.equal(got[2][1], ref[2][1])  # layer 2 really ran sparse at the first decode step


def teacher_forced_attention_outputs(model, ids, continuation, method, budget):
    """self_attn outputs of every layer at the prefill and every decode step, feeding `continuation` token by token."""
    captured = {}
    hooks = [model.model.layers[i].self_attn.register_forward_hook(
        lambda m, inp, out, i=i: captured.setdefault(i, []).append(out[0].detach().clone())) for i in range(4)]
    model.set_attn_implementation(register_attention())
    cache = SelectorCache(model, MethodSpec(method, budget, {}))
    try:
        with torch.inference_mode():
            cache.phase = "prefill"
            model(input_ids=ids, cache=cache, sparse_cache=cache)
            cache.phase = "decode"
            for i, token in enumerate(continuation[0]):
                model(input_ids=token.view(1, 1), position_ids=torch.tensor([[ids.shape[1] + i]]), cache=cache,
                      sparse_cache=cache)
    finally:
        for h in hooks:
            h.remove()
    return captured


def test_dense_layers_bit_identical_at_every_teacher_forced_step(tiny4):
    """With the same input tokens at every step, layers 0-1 match FullKV bit for bit however far layer 2+ drift."""
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (1, 150), generator=torch.Generator().manual_seed(1))
    continuation = torch.randint(0, TINY_LLAMA["vocab_size"], (1, 20), generator=torch.Generator().manual_seed(2))
    got = teacher_forced_attention_outputs(tiny4, ids, continuation, "quest", 32)
    ref = teacher_forced_attention_outputs(tiny4, ids, continuation, "fullkv", 4096)
    assert len(got[0]) == 21
    for layer, step in itertools.product((0, 1), range(21)):
        assert torch.equal(got[layer][step], ref[layer][step])
    assert not any(torch.equal(got[3][step], ref[3][step]) for step in range(1, 21))


def test_generate_large_budget_matches_fullkv_and_small_budget_saves_bytes(tiny4):
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (1, 160), generator=torch.Generator().manual_seed(3))
    ref, _ = greedy(tiny4, ids, 8, "fullkv", 4096)
    for options in ({}, {"page_rule": "eval"}, {"gqa": "group"}):
        out, _ = greedy(tiny4, ids, 8, "quest", 4096, **options)
        assert torch.equal(out, ref)
    G = TINY_LLAMA["num_attention_heads"] // TINY_LLAMA["num_key_value_heads"]
    for options, bound in [({"gqa": "group"}, 32), ({"gqa": "group", "page_rule": "eval"}, 32), ({}, 32 * G)]:
        out, cache = greedy(tiny4, ids, 8, "quest", 32, dense_layers=0, **options)
        s = cache.stats.summary()
        assert out.shape == (1, 8) and s["decode_steps"] == 7
        assert s["attended_tokens_per_step"] <= bound  # per KV head: union of the G query heads' sets in per_head
        assert s["bytes_read_per_step"] < 0.5 * s["full_bytes_per_step"]
        assert s["metadata_bytes_per_step"] > 0
        assert cache.extra_metrics()["quest_union_ratio"] >= 1.0


# ----- options ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("budget,options,param", [
    (8, {}, "method.page_size"),
    (64, {"page_size": 0}, "method.page_size"),
    (64, {"dense_layers": -1}, "method.dense_layers"),
    (64, {"page_rule": "mask"}, "method.page_rule"),
    (64, {"gqa": "mean"}, "method.gqa"),
    (64, {"group_reduce": "mean"}, "method.group_reduce"),
    (64, {"budget_mode": "loose"}, "method.budget_mode"),
])
def test_bad_options_raise_one_line_config_errors(budget, options, param):
    with pytest.raises(ConfigError) as err:
        quest(budget, 4, 2, **options)
    assert param in str(err.value) and "\n" not in str(err.value)


def test_yaml_options_build():
    from omegaconf import OmegaConf

    conf = OmegaConf.load("conf/method/quest.yaml")
    options = {k: v for k, v in OmegaConf.to_container(conf).items() if k not in ("name", "budget", "backend")}
    s = quest(2048, 4, 2, layer_idx=2, **options)
    assert s.page_size == 16 and s.dense_layers == 2 and s.page_rule == "kernel" and s.gqa == "per_head"
    dense = quest(2048, 4, 2, layer_idx=1, **options)  # the first two layers: the core's dense layer
    assert isinstance(dense, DenseAttention) and dense.select(torch.randn(1, 4, D), *make_kv(1, 2, 40)).dense
