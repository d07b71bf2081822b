"""Selector invariants on synthetic K/V, against independent dense references (float64 softmax, brute force), and
every registered method on random-weight models with sliding-window layers (Gemma 3, GPT-OSS, Mistral, Qwen2)."""
import itertools
import math
from pathlib import Path

import pytest
import torch

from locks.core.reference import sparse_decode
from locks.core.registry import MethodSpec, discover, selector_class
from locks.core.selector import LayerInfo, PrefillContext, Selection
from locks.core.window import SlidingWindow
from locks.errors import ConfigError
from tests.helpers import (
    HYBRIDS,
    KEEP_ALL,
    SCALE,
    WINDOW,
    D,
    alone,
    attended_mask,
    build,
    coverage,
    decode_output,
    default_method_options,
    dense_reference,
    hybrid_case,
    make_kv,
    prefill,
    teacher_forced_logits,
)

SELECTOR_CONFIGS = [
    ("fullkv", {}),
    ("oracle", {}),
    ("oracle", {"aggregation": "max"}),
    ("oracle_token", {}),
    ("locks", {}),
    ("locks", {"quant": "none"}),
    ("locks", {"aggregation": "raw"}),
    ("locks", {"aggregation": "max"}),
    ("locks", {"budget_mode": "paper"}),
    ("locks", {"rank": 4, "page_size": 8}),
    ("locks", {"rank": 0}),  # centroid only
    ("locks", {"log_z": "previous"}),  # one-pass normalized aggregation
    ("locks", {"v_bits": 2, "v_group": 32, "c_bits": 4, "mu_format": "fp16", "w_dtype": "fp16"}),  # another layout
    ("quest", {"dense_layers": 0}),
    ("quest", {"dense_layers": 0, "gqa": "group"}),
    ("quest", {"dense_layers": 0, "page_rule": "eval", "budget_mode": "paper"}),
    ("rocketkv", {}),
    ("rocketkv", {"budget_mode": "paper"}),
    ("shadowkv", {}),
    ("shadowkv", {"budget_mode": "paper", "outlier_chunks": 2}),
    ("lrqk", {"rank": 8}),  # rank 8: at d = 32 the default rank-32 proxy scan alone reads as much as dense (B9)
    ("lrqk", {"rank": 8, "budget_mode": "paper"}),
    ("doublesparsity", {"dense_layers": 0}),
    ("doublesparsity", {"dense_layers": 0, "label_bits": 16, "group_factor": 4}),
    ("doublesparsity", {"dense_layers": 0, "channel": "qk"}),
    ("twilight", {"dense_layers": 0}),
    ("twilight", {"dense_layers": 0, "top_p_mode": "exact"}),
    ("twilight", {"dense_layers": 0, "base": "locks", "top_p": 0.95}),
    ("twilight", {"dense_layers": 0, "base": "doublesparsity"}),
    ("doublesparsity", {"dense_layers": 0, "variant": "twilight"}),
    ("magicpig", {"dense_layers": "none"}),
    ("magicpig", {"dense_layers": "none", "tables": 40}),
]














@pytest.mark.parametrize("name,options", SELECTOR_CONFIGS)
@pytest.mark.parametrize("Hq,Hkv", [(4, 2), (3, 1), (6, 3)])
def test_budget_at_least_context_equals_fullkv(name, options, Hq, Hkv):
    B, L, prompt = 2, 203, 150
    keys, values = make_kv(B, Hkv, L, seed=Hq)
    sel_obj = build(name, 4096, Hq, Hkv, **{**options, **KEEP_ALL.get(name, {})})
    prefill(sel_obj, keys, values, Hq, prompt)
    for length in range(prompt + 1, L + 1):  # decode steps, crossing page boundaries
        sel_obj.append(keys[:, :, :length], values[:, :, :length])
    q = torch.randn(B, Hq, D)
    out, sel = decode_output(sel_obj, q, keys, values)
    ref, _ = dense_reference(q, keys, values)
    assert torch.allclose(out.double(), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("clustered", [False, True])
@pytest.mark.parametrize("budget", [48, 96, 160, 320])
def test_oracle_coverage_bounds_every_selector(clustered, budget):
    B, Hq, Hkv, L = 2, 8, 2, 700
    keys, values = make_kv(B, Hkv, L, clustered=clustered, seed=budget)
    q = torch.randn(B, Hq, D, generator=torch.Generator().manual_seed(budget)) * 2
    oracle = build("oracle", budget, Hq, Hkv)
    prefill(oracle, keys, values, Hq, L)
    cov_oracle = coverage(oracle.select(q, keys, values), q, keys)
    for name, options in SELECTOR_CONFIGS:
        if name not in ("oracle", "locks") or options.get("budget_mode") == "paper" or "page_size" in options:
            # budget-free, a different forced set / page size, per-query-head sets (Quest) or token-granular
            # selection (RocketKV): not the same selection problem as the page oracle's
            continue
        s = build(name, budget, Hq, Hkv, **options)
        prefill(s, keys, values, Hq, L)
        sel = s.select(q, keys, values)
        assert int(sel.valid.sum(-1).max()) <= budget
        assert coverage(sel, q, keys) <= cov_oracle + 1e-9, (name, options)


FORCED_OPTIONS = [({}, False), ({"sink_pages": 1, "recent_window": 64}, True)]  # the default, the harness options


@pytest.mark.parametrize("options,sink_and_recent", FORCED_OPTIONS)
def test_oracle_is_optimal_by_brute_force(options, sink_and_recent):
    """Sum over heads of coverage: the oracle's page set equals the best of all C(P_c, k) page sets (3 scored
    pages; by default nothing else, with the options also the sink page and the 4 recent pages)."""
    B, Hq, Hkv, n = 1, 4, 1, 16
    L = 12 * n
    keys, values = make_kv(B, Hkv, L, clustered=True, seed=3)
    q = torch.randn(B, Hq, D) * 3
    forced = {0, 8, 9, 10, 11} if sink_and_recent else set()
    oracle = build("oracle", n * (len(forced) + 3), Hq, Hkv, **options)
    sel = oracle.select(q, keys, values)
    best = 0.0
    for pages in itertools.combinations([p for p in range(12) if p not in forced], 3):
        idx = torch.tensor(sorted(list(forced) + list(pages)))
        tokens = (idx[:, None] * n + torch.arange(n)).flatten().view(1, 1, 1, -1)
        best = max(best, coverage(Selection(indices=tokens, valid=torch.ones_like(tokens, dtype=torch.bool)), q, keys))
    assert abs(coverage(sel, q, keys) - best) < 1e-9


@pytest.mark.parametrize("options,sink_and_recent", FORCED_OPTIONS)
@pytest.mark.parametrize("name", ["locks", "oracle"])
def test_selection_shape_forced_set_and_budget(name, options, sink_and_recent):
    """The forced set is the partial page alone by default (the write-up's selector); the sink page and the recent
    window are forced only when their options are set. Either way the step attends at most `budget` tokens."""
    B, Hq, Hkv, L, budget, n = 2, 4, 2, 1000, 256, 16
    keys, values = make_kv(B, Hkv, L, seed=1)
    s = build(name, budget, Hq, Hkv, **options)
    prefill(s, keys, values, Hq, L)
    sel = s.select(torch.randn(B, Hq, D), keys, values)
    assert sel.indices.shape == (B, Hkv, 1, budget)  # fixed size per step
    tail = L % n
    for b in range(B):
        for h in range(Hkv):
            idx = sel.indices[b, h, 0][sel.valid[b, h, 0]]
            assert len(idx) == budget - (budget - tail) % n and torch.equal(idx, idx.unique()) and int(idx.max()) < L
            got = set(idx.tolist())
            assert set(range(L - tail, L)) <= got  # the partial page
            if sink_and_recent:
                assert set(range(n)) <= got  # sink page
                assert set(range(L - tail - 64, L)) <= got  # 64 recent tokens of complete pages
    assert sel.forced_tokens == (n + 64 + tail if sink_and_recent else tail)


def test_selection_invariant_to_head_permutation_within_group():
    B, Hq, Hkv, L = 1, 8, 2, 640
    keys, values = make_kv(B, Hkv, L, seed=5)
    q = torch.randn(B, Hq, D)
    perm = torch.tensor([3, 1, 0, 2, 7, 4, 6, 5])  # permutes within each group of 4
    for agg in ("norm", "raw", "max"):
        s = build("locks", 128, Hq, Hkv, aggregation=agg)
        prefill(s, keys, values, Hq, L)
        a = s.select(q, keys, values).indices
        b = s.select(q[:, perm], keys, values).indices
        assert torch.equal(a, b)


def test_locks_incremental_summaries_equal_batched_rebuild():
    from locks.method.summaries import build_summaries, dequantize

    B, Hq, Hkv, L, prompt = 1, 4, 2, 200, 100
    keys, values = make_kv(B, Hkv, L, seed=7)
    s = build("locks", 64, Hq, Hkv)
    prefill(s, keys, values, Hq, prompt)
    for length in range(prompt + 1, L + 1):
        s.append(keys[:, :, :length], values[:, :, :length])
    rebuilt = build_summaries(keys[:, :, : (L // 16) * 16], 16, 8, "int", head_mean=s.summaries.head_mean)
    for a, b in zip(dequantize(s.summaries), dequantize(rebuilt)):
        assert torch.allclose(a, b, atol=1e-6)
    assert torch.equal(s.summaries.rho, rebuilt.rho)


def test_sparse_decode_all_tokens_matches_dense_output_and_lse():
    B, Hq, Hkv, L = 2, 6, 3, 77
    keys, values = make_kv(B, Hkv, L, seed=9)
    q = torch.randn(B, Hq, D)
    idx = torch.arange(L).expand(B, Hkv, 1, L)
    out, lse = sparse_decode(q, keys, values, Selection(indices=idx, valid=torch.ones_like(idx, dtype=torch.bool)), SCALE)
    ref, ref_lse = dense_reference(q, keys, values)
    assert torch.allclose(out.double(), ref, atol=1e-5) and torch.allclose(lse.double(), ref_lse, atol=1e-5)
    # per-query-head sets (Gs = G) with masked padding give the same result as the restricted dense softmax
    G = Hq // Hkv
    idx = torch.stack([torch.randperm(L)[:40] for _ in range(B * Hkv * G)]).view(B, Hkv, G, 40)
    valid = torch.rand(B, Hkv, G, 40) > 0.2
    out, lse = sparse_decode(q, keys, values, Selection(indices=idx, valid=valid), SCALE)
    for b, h, g in itertools.product(range(B), range(Hkv), range(G)):
        t = idx[b, h, g][valid[b, h, g]]
        logits = (keys[b, h, t].double() @ q[b, h * G + g].double()) * SCALE
        ref = torch.softmax(logits, 0) @ values[b, h, t].double()
        assert torch.allclose(out[b, h * G + g].double(), ref, atol=1e-5)
        assert math.isclose(float(lse[b, h * G + g]), float(torch.logsumexp(logits, 0)), abs_tol=1e-5)


@pytest.mark.parametrize("name,options,param", [
    ("locks", {"budget": 0}, "budget"),
    ("locks", {"budget": -5}, "budget"),
    ("locks", {"rank": 16}, "method.rank"),
    ("locks", {"page_size": 12}, "method.page_size"),
    ("locks", {"aggregation": "mean"}, "method.aggregation"),
    ("locks", {"quant": "fp8"}, "method.quant"),
    ("oracle", {"budget_mode": "loose"}, "method.budget_mode"),
    ("nosuch", {}, "unknown method"),
])
def test_bad_parameters_raise_one_line_errors(name, options, param):
    budget = options.pop("budget", 128)
    with pytest.raises(ConfigError) as err:
        build(name, budget, 4, 2, **options)
    assert param in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("name,options", SELECTOR_CONFIGS)
def test_shared_matrix_shapes_determinism_and_bytes(name, options):
    """Every method: well-formed fixed-size selections, the same selection from a fresh instance, non-negative
    accounting, and fewer bytes than FullKV at a small budget on a long context (except the Oracle, which reads
    every key to score and claims no saving)."""
    from locks.core.reference import attended_per_kv_head

    B, Hq, Hkv, L, prompt, budget = 2, 4, 2, 1024, 1000, 128
    keys, values = make_kv(B, Hkv, L, clustered=True, seed=11)
    torch.manual_seed(0)
    queries = torch.randn(L - prompt, B, Hq, D)

    def run():
        torch.manual_seed(1)
        s = build(name, budget, Hq, Hkv, **options)
        prefill(s, keys, values, Hq, prompt)
        out = []
        for t, length in enumerate(range(prompt + 1, L + 1)):
            s.append(keys[:, :, :length], values[:, :, :length])
            out.append((s.select(queries[t], keys[:, :, :length], values[:, :, :length]), length))
        return out

    first, second = run(), run()
    for (sel, length), (again, _) in zip(first, second):
        assert sel.dense == again.dense
        full_bytes = 2.0 * length * D * 2 * Hkv
        if sel.dense:
            assert name == "fullkv"
            continue
        assert torch.equal(sel.indices, again.indices) and torch.equal(sel.valid, again.valid)
        assert sel.indices.dtype == torch.int64 and sel.valid.shape == sel.indices.shape
        assert sel.indices.shape[:2] == (B, Hkv) and sel.indices.shape[2] in (1, Hq // Hkv)
        for row, ok in zip(sel.indices.reshape(-1, sel.indices.shape[-1]), sel.valid.reshape(-1, sel.valid.shape[-1])):
            picked = row[ok]
            assert len(picked) > 0 and int(picked.max()) < length and torch.equal(picked, picked.unique())
        assert sel.metadata_bytes >= 0 and sel.h2d_bytes >= 0 and sel.forced_tokens >= 0
        kv_bytes = sel.kv_bytes if sel.kv_bytes is not None else \
            2.0 * float(attended_per_kv_head(sel, length).mean()) * D * 2 * Hkv
        assert kv_bytes >= 0
        # (the oracles read every key to score; MagicPIG reads every middle token's L int16 codes, more than its key
        # and value at L = 150 and d = 64: docs/methods/magicpig.md)
        if not name.startswith("oracle") and not (name == "magicpig" and options.get("tables", 150) * 2 >= 4 * D):
            assert sel.metadata_bytes + kv_bytes < full_bytes, (name, options)


@pytest.mark.parametrize("path", sorted((Path(__file__).parents[2] / "conf" / "method").glob("*.yaml")),
                         ids=lambda p: p.stem)
def test_every_method_config_builds_its_selector(path):
    """conf/method/<name>.yaml: the name is registered, backend is valid, and it sets every option of the selector's
    Options at its default (an interpolation, such as the run's seed, stands for its default)."""
    from omegaconf import OmegaConf

    from eval.runner import method_spec

    cfg = OmegaConf.to_container(OmegaConf.load(path))
    assert cfg["name"] == path.stem and cfg["budget"] == "${budget}" and cfg["backend"] == "auto"
    options = {k: v for k, v in cfg.items() if k not in ("name", "budget", "backend")}
    defaults = selector_class(path.stem).Options.defaults()
    assert options.keys() == defaults.keys()
    assert {k: v for k, v in options.items() if not str(v).startswith("${")} == \
        {k: defaults[k] for k, v in options.items() if not str(v).startswith("${")}
    cfg["budget"] = 512
    for key in [k for k, v in cfg.items() if isinstance(v, str) and v.startswith("${")]:
        cfg[key] = 42  # other interpolations (e.g. the run's seed)
    selector = method_spec(cfg).build(LayerInfo(layer_idx=3, num_heads=4, num_kv_heads=2, head_dim=D, scaling=SCALE))
    assert selector.name == path.stem


# ----------------------------------------------------------------------------------------------------------------
# the contract, built from the registry: every registered method, in its default configuration


def registered():
    from locks.core.registry import discover

    return sorted(discover())


def default_options(name: str) -> dict:
    options = default_method_options(name)
    if options is None:
        pytest.fail(f"registered method {name!r} has no default configuration conf/method/{name}.yaml")
    return options


def test_the_variant_matrix_covers_every_registered_method():
    assert {name for name, _ in SELECTOR_CONFIGS} == set(registered())


@pytest.mark.parametrize("name", registered())
def test_contract(name):
    """Every registered method in its default configuration: with budget >= context it reproduces FullKV (head dim
    32, where even ShadowKV's default rank reconstructs keys exactly); at budget 128 of a 2K context (head dim 128,
    as deployed) every step's selection has one fixed shape, is deterministic, names valid distinct tokens, and
    accounts non-negative costs below FullKV's bytes (the oracles read every key to score); a method without a
    budget attends densely."""
    from locks.core.reference import attended_per_kv_head

    options = default_options(name)
    if "dense_layers" in options:
        options["dense_layers"] = 0  # layer 0 below: their first layers are dense by design

    def run(budget, d, L, prompt, extra=None):
        B, Hq, Hkv = 1, 4, 2
        keys, values = make_kv(B, Hkv, L, d=d, clustered=True, seed=3)
        g = torch.Generator().manual_seed(0)
        queries = torch.randn(L - prompt, B, Hq, d, generator=g)
        info = LayerInfo(layer_idx=0, num_heads=Hq, num_kv_heads=Hkv, head_dim=d, scaling=d ** -0.5)
        torch.manual_seed(1)
        s = MethodSpec(name, budget, alone(name, {**options, **(extra or {})}, Hq, d)).build(info)
        s.prefill(PrefillContext(keys[:, :, :prompt], values[:, :, :prompt], torch.randn(B, Hq, prompt, d, generator=g),
                                 torch.arange(prompt).expand(B, -1), lambda: keys[:, :, :prompt]))
        steps = []
        for t, length in enumerate(range(prompt + 1, L + 1)):
            s.append(keys[:, :, :length], values[:, :, :length])
            steps.append((s.select(queries[t], keys[:, :, :length], values[:, :, :length]), length))
        return s, steps, (queries, keys, values)

    s, steps, (queries, keys, values) = run(4096, D, 260, 200, KEEP_ALL.get(name))
    out, _ = decode_output(s, queries[-1], keys, values)
    assert torch.allclose(out.double(), dense_reference(queries[-1], keys, values)[0], atol=1e-5)

    d, Hkv = 128, 2
    s, first, _ = run(128, d, 2048 + 40, 2048)
    _, second, _ = run(128, d, 2048 + 40, 2048)
    if not s.uses_budget:
        assert all(sel.dense for sel, _ in first)
        return
    shapes = set()
    for (sel, length), (again, _) in zip(first, second):
        assert not sel.dense and torch.equal(sel.indices, again.indices) and torch.equal(sel.valid, again.valid)
        shapes.add(tuple(sel.indices.shape))
        for row, ok in zip(sel.indices.reshape(-1, sel.indices.shape[-1]), sel.valid.reshape(-1, sel.valid.shape[-1])):
            picked = row[ok]
            assert len(picked) > 0 and int(picked.max()) < length and torch.equal(picked, picked.unique())
        assert sel.metadata_bytes >= 0 and sel.h2d_bytes >= 0 and sel.forced_tokens >= 0
        attended = float(attended_per_kv_head(sel, length).mean())
        assert sel.forced_tokens <= attended <= length
        kv_bytes = sel.kv_bytes if sel.kv_bytes is not None else 2.0 * attended * d * 2 * Hkv
        if not name.startswith("oracle"):
            assert sel.metadata_bytes + kv_bytes < 2.0 * length * d * 2 * Hkv, (sel.metadata_bytes, kv_bytes)
    assert len(shapes) == 1, f"{name}: the selection's shape changed between steps: {shapes}"


def per_head_coverage(sel, q, keys):
    """[B, Hq] exact attention mass of each query head on its attended tokens, and [B, Hq] how many it attends."""
    B, Hq, d = q.shape
    Hkv, L = keys.shape[1], keys.shape[2]
    G = Hq // Hkv
    if sel.dense:
        return torch.ones(B, Hq, dtype=torch.float64), torch.full((B, Hq), float(L), dtype=torch.float64)
    logits = torch.einsum("bhgd,bhld->bhgl", q.view(B, Hkv, G, d).double(), keys.double()) * SCALE
    p = torch.softmax(logits, -1)
    mask = attended_mask(sel, L).expand(B, Hkv, G, L)
    return (p * mask).sum(-1).reshape(B, Hq), mask.sum(-1).double().reshape(B, Hq)


@pytest.mark.parametrize("clustered", [False, True])
@pytest.mark.parametrize("name", registered())
def test_the_token_oracle_bounds_every_method_per_query_head(name, clustered):
    """At equal attended tokens per query head, no selector covers more attention mass than the token Oracle (its
    own exact top tokens), whatever its granularity (pages, tokens, group-shared or per head)."""
    options = default_options(name)
    if "dense_layers" in options:
        options["dense_layers"] = 0
    B, Hq, Hkv, L = 1, 8, 2, 900
    keys, values = make_kv(B, Hkv, L, clustered=clustered, seed=17)
    q = torch.randn(B, Hq, D, generator=torch.Generator().manual_seed(5)) * 2
    s = build(name, 160, Hq, Hkv, **options)
    prefill(s, keys, values, Hq, L - 1)
    s.append(keys, values)
    cov, n = per_head_coverage(s.select(q, keys, values), q, keys)
    for g in range(Hq):
        oracle = build("oracle_token", int(n[0, g]), Hq, Hkv)
        best, _ = per_head_coverage(oracle.select(q, keys, values), q, keys)
        assert cov[0, g] <= best[0, g] + 1e-9, (name, g, float(cov[0, g]), float(best[0, g]))


PROMPT, STEPS = 40, 22  # every step past the window (16)


@pytest.fixture(scope="module", params=HYBRIDS)
def hybrid(request):
    """A random-weight Gemma 3 / GPT-OSS / Mistral / Qwen2 model (tests/helpers.py) with stock transformers' logits."""
    return hybrid_case(request.param, PROMPT, STEPS)


SMALL_BUDGET = {"lrqk": 96, "magicpig": 96}  # MagicPIG attends its sink and window (68 tokens) besides


@pytest.mark.parametrize("method", sorted(discover()))
def test_every_method_decodes_models_with_sliding_window_layers(hybrid, method):
    """Budget above the context: FullKV's logits. A small budget: the method acts on the full-attention layers only,
    the sliding ones attend their window, and the accounting says so per layer type."""
    name, model, ids, continuation, reference = hybrid
    options = default_method_options(method) or {}
    caches = []
    with torch.no_grad():
        dense = teacher_forced_logits(model, ids, continuation, method, 4096, **{**options, **KEEP_ALL.get(method, {})})
        small = teacher_forced_logits(model, ids, continuation, method, SMALL_BUDGET.get(method, 32),
                                      cache_out=caches, **options)
    assert (dense - reference).abs().max() < 1e-5, (name, method)
    assert torch.isfinite(small).all()
    cache = caches[0]
    for layer, info in zip(cache.layers, cache.infos):
        assert isinstance(layer.selector, SlidingWindow) == (info.sliding_window is not None)
        if info.sliding_window is None:  # the method's, or the core's dense layer on its first `dense_layers`
            dense = selector_class(method).Options.build(options).dense_layer(info.layer_idx, info.num_layers)
            assert layer.selector.name == ("dense" if dense else method)
    stats = cache.stats.summary()
    kinds = stats["by_layer_type"]
    token_bytes = cache.infos[0].token_kv_bytes
    steps = stats["decode_steps"]
    assert steps == STEPS - 1
    if "sliding_attention" in kinds:
        sliding = kinds["sliding_attention"]
        n = sum(info.sliding_window is not None for info in cache.infos)
        assert sliding["layers"] == n
        assert sliding["bytes_read_per_step"] == pytest.approx(n * WINDOW * token_bytes)
        assert sliding["full_bytes_per_step"] == pytest.approx(n * WINDOW * token_bytes)
    if "full_attention" in kinds:
        full = kinds["full_attention"]
        n = cache.full_attention_layers
        mean_length = PROMPT + (steps + 1) / 2
        assert full["full_bytes_per_step"] == pytest.approx(n * mean_length * token_bytes)
        assert stats["attended_tokens_per_step"] <= mean_length and stats["coverage"] <= 1 + 1e-6
    assert stats["bytes_read_per_step"] == pytest.approx(sum(k["bytes_read_per_step"] for k in kinds.values()))
