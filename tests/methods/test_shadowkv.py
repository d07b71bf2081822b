"""ShadowKV invariants (docs/methods/shadowkv.md and the task) against independent float64 references."""
import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from locks.core.reference import sparse_decode
from locks.core.selector import PrefillContext
from locks.errors import ConfigError
from tests.helpers import SCALE, TINY_LLAMA, D, build, dense_reference, greedy, make_kv, teacher_forced_logits
from tests.helpers import prefill as selectors_prefill

C = 8


def rope(x, pos, theta=10000.0):
    """Llama rotate_half RoPE in float64: x [B', H, n, d] pre-RoPE, pos [B', n] -> post-RoPE in x's dtype."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos.double()[..., None] * inv
    emb = torch.cat([ang, ang], -1)[:, None]
    xd = x.double()
    rot = torch.cat([-xd[..., d // 2:], xd[..., : d // 2]], -1)
    return (xd * emb.cos() + rot * emb.sin()).to(x.dtype)


def case(B, Hkv, L, extra=0, seed=0, offset=3, dtype=torch.float32):
    """Pre-RoPE keys, post-RoPE keys at positions offset + t (not the token index), values."""
    k_pre, v = make_kv(B, Hkv, L + extra, clustered=True, seed=seed)
    pos = (torch.arange(L + extra) + offset).expand(B, -1)
    return k_pre.to(dtype), rope(k_pre, pos).to(dtype), v.to(dtype), pos


def prefill(s, k_pre, k, v, pos, Lp, Hq, seed=0, rotate=rope):
    q = torch.randn(k.shape[0], Hq, Lp, k.shape[-1], generator=torch.Generator().manual_seed(seed)).to(k.dtype)
    s.prefill(PrefillContext(k[:, :, :Lp], v[:, :, :Lp], q, pos[:, :Lp], lambda: k_pre[:, :, :Lp], rotate=rotate))
    return q


def window(L, local_chunks=4):
    chunks = L // C - local_chunks
    return chunks, L - chunks * C


def chosen_chunks(s, sel, b, h):
    """Selected chunks read from a Selection: chunk-region tokens that are not outliers (all C tokens present)."""
    idx = sel.indices[b, h, 0][sel.valid[b, h, 0]].tolist()
    outl = set(s.outlier_chunks[b, h].tolist())
    region = s.num_chunks * C
    chunks = sorted({i // C for i in idx if i < region and i // C not in outl})
    assert {c * C + j for c in chunks for j in range(C)} <= set(idx)  # whole chunks
    return chunks


def min_cos64(k, chunks):
    """float64 min over each chunk of cos(k_i, chunk mean): [B, H, chunks]."""
    B, H, _, d = k.shape
    x = k[:, :, : chunks * C].double().view(B, H, chunks, C, d)
    m = x.mean(3, keepdim=True)
    cos = (x * m).sum(-1) / (x.norm(dim=-1) * m.norm(dim=-1))
    return cos.amin(-1)


# ---------------------------------------------------------------------------------------------------- SVD / RoPE

def test_svd_error_monotone_equals_eckart_young_tail():
    B, Hkv, L = 2, 2, 120
    k_pre, k, v, pos = case(B, Hkv, L, seed=1)
    X = k_pre.double().transpose(1, 2).reshape(B, L, Hkv * D)
    sigma = torch.linalg.svdvals(X)  # float64 reference, [B, 64]
    norm = float(X.norm())
    errors = []
    for rank in [1, 4, 16, 32, 50, 63, 64, 160]:
        s = build("shadowkv", 4096, 4, Hkv, rank=rank)
        prefill(s, k_pre, k, v, pos, L, 4)
        r = min(rank, Hkv * D, L)
        assert s.r == r and s.extra_metrics()["effective_rank"] == r
        assert s.U.shape == (B, L, r) and s.SV.shape == (B, Hkv, r, D) and s.U.dtype == k.dtype
        rec = torch.einsum("blr,bhrd->bhld", s.U.double(), s.SV.double())
        err = (rec - k_pre.double()).flatten(1).norm(dim=-1)  # per batch row
        tail = sigma[:, r:].pow(2).sum(-1).sqrt()
        assert torch.allclose(err, tail, atol=2e-5 * norm, rtol=1e-4), (rank, err, tail)
        errors.append(float(err.sum()))
    assert all(a >= b - 1e-5 * norm for a, b in zip(errors, errors[1:]))
    assert errors[-1] < 1e-5 * norm  # full rank: exact up to fp32 rounding


def test_effective_rank_scales_down_to_prompt_length():
    k_pre, k, v, pos = case(1, 2, 40, seed=2)
    s = build("shadowkv", 4096, 4, 2)
    prefill(s, k_pre, k, v, pos, 40, 4)
    assert s.r == 40  # min(160, Hkv*d = 64, L = 40)
    rec = torch.einsum("blr,bhrd->bhld", s.U.double(), s.SV.double())
    assert torch.allclose(rec, k_pre.double(), atol=1e-5)


@pytest.mark.parametrize("rank", [64, 12])
def test_reconstruction_commutes_with_rope(rank):
    B, Hq, Hkv, L = 2, 4, 2, 203
    k_pre, k, v, pos = case(B, Hkv, L, extra=1, seed=3)
    s = build("shadowkv", 4096, Hq, Hkv, budget_mode="paper", rank=rank, outlier_chunks=3)
    prefill(s, k_pre, k, v, pos, L, Hq)
    sel = s.select(torch.randn(B, Hq, D), k, v)  # budget covers every candidate
    got = sel.keys[:, :, 0]
    idx = sel.indices[:, :, 0]
    for b in range(B):
        for h in range(Hkv):
            cand_tok = (s.candidates[b, h, :, None] * C + torch.arange(C)).flatten()
            rows = torch.searchsorted(idx[b, h], cand_tok)
            assert torch.equal(idx[b, h, rows], cand_tok)
            # independent pre-RoPE reconstruction from the stored factors, then the test's own RoPE
            pre_hat = s.U[b, cand_tok].double() @ s.SV[b, h].double()
            post_hat = rope(pre_hat[None, None], pos[b:b + 1, cand_tok])[0, 0]
            assert torch.allclose(got[b, h, rows].double(), post_hat, atol=1e-5)
            err_post = (got[b, h, rows].double() - k[b, h, cand_tok].double()).norm(dim=-1)
            err_pre = (pre_hat - k_pre[b, h, cand_tok].double()).norm(dim=-1)
            assert torch.allclose(err_post, err_pre, atol=1e-5)  # RoPE is orthogonal per position
            if rank == Hkv * D:
                assert float(err_post.max()) < 1e-5 * float(k[b, h].norm(dim=-1).max())  # fp32 SVD rounding


# ---------------------------------------------------------------------------------------------------- structure

@pytest.mark.parametrize("align", [False, True])
def test_partition_outliers_and_selected(align):
    B, Hq, Hkv, L, O, budget = 2, 4, 2, 403, 5, 80
    k_pre, k, v, pos = case(B, Hkv, L, extra=1, seed=4)
    s = build("shadowkv", budget, Hq, Hkv, budget_mode="paper", outlier_chunks=O, align_chunks_to_8=align)
    prefill(s, k_pre, k, v, pos, L, Hq)
    chunks, W = window(L)
    if align:
        chunks = chunks // 8 * 8
        W = L - chunks * C
    assert (s.num_chunks, s.window) == (chunks, W)
    sel = s.select(torch.randn(B, Hq, D), k, v)
    for b in range(B):
        for h in range(Hkv):
            local = set(range(L - W, L))
            outl = {c * C + j for c in s.outlier_chunks[b, h].tolist() for j in range(C)}
            cand = {c * C + j for c in s.candidates[b, h].tolist() for j in range(C)}
            assert len(s.outlier_chunks[b, h].unique()) == O and len(outl) == O * C
            assert not (local & outl) and not (local & cand) and not (outl & cand)
            assert local | outl | cand == set(range(L))
            picked = chosen_chunks(s, sel, b, h)
            assert len(picked) == budget // C and set(picked) <= set(s.candidates[b, h].tolist())
            got = set(sel.indices[b, h, 0][sel.valid[b, h, 0]].tolist())
            assert got == local | outl | {c * C + j for c in picked for j in range(C)} | {L}


def test_outlier_rule_lowest_min_cosine():
    B, Hkv, L, O = 2, 3, 331, 6
    k_pre, k, v, pos = case(B, Hkv, L, seed=5)
    s = build("shadowkv", 64, 6, Hkv, budget_mode="paper", outlier_chunks=O)
    prefill(s, k_pre, k, v, pos, L, 6)
    chunks, _ = window(L)
    score = min_cos64(k, chunks)
    for b in range(B):
        for h in range(Hkv):
            mask = torch.zeros(chunks, dtype=torch.bool)
            mask[s.outlier_chunks[b, h]] = True
            assert int(mask.sum()) == O
            assert float(score[b, h][mask].max()) <= float(score[b, h][~mask].min()) + 1e-6


def test_outlier_count_rules():
    k_pre, k, v, pos = case(1, 2, 1200, seed=6)
    expected = [("fair", 48, 4096, 48), ("fair", 48, 2048, 48), ("fair", 48, 1024, 24), ("fair", 48, 1000, 0),
                ("fair", 10, 4096, 10), ("fair", "auto", 2048, 48), ("paper", 48, 512, 48),
                ("paper", "auto", 2048, 48), ("paper", "auto", 1024, 24), ("paper", 500, 64, 146)]
    for mode, O, budget, want in expected:  # 146 = all chunks of the 1200-token prompt (cap)
        s = build("shadowkv", budget, 4, 2, budget_mode=mode, outlier_chunks=O)
        prefill(s, k_pre, k, v, pos, 1200, 4)
        assert s.outliers == want and s.outlier_chunks.shape[-1] == want, (mode, O, budget)


def test_landmarks_are_post_rope_chunk_means():
    B, Hkv, L = 2, 2, 250
    k_pre, k, v, pos = case(B, Hkv, L, seed=7)
    s = build("shadowkv", 96, 4, Hkv, outlier_chunks=3, budget_mode="paper")
    prefill(s, k_pre, k, v, pos, L, 4)
    chunks, _ = window(L)
    means = k[:, :, : chunks * C].double().view(B, Hkv, chunks, C, D).mean(3)
    pre_means = k_pre[:, :, : chunks * C].double().view(B, Hkv, chunks, C, D).mean(3)
    ref = torch.gather(means, 2, s.candidates[..., None].expand(-1, -1, -1, D))
    assert torch.allclose(s.landmarks.double(), ref, atol=1e-6)
    assert not torch.allclose(s.landmarks.double(), torch.gather(pre_means, 2, s.candidates[..., None].expand(
        -1, -1, -1, D)), atol=1e-2)


@pytest.mark.parametrize("scale_opt,scale", [("official", 1 / math.sqrt(128)), ("head_dim", 1 / math.sqrt(D))])
def test_selection_reference_and_gqa_consistency(scale_opt, scale):
    B, Hq, Hkv, L, O, budget = 2, 6, 2, 480, 4, 96
    k_pre, k, v, pos = case(B, Hkv, L, extra=1, seed=8)
    s = build("shadowkv", budget, Hq, Hkv, budget_mode="paper", outlier_chunks=O, landmark_scale=scale_opt)
    prefill(s, k_pre, k, v, pos, L, Hq)
    q = torch.randn(B, Hq, D, generator=torch.Generator().manual_seed(10)) * 3
    sel = s.select(q, k, v)
    assert sel.indices.shape[2] == 1  # one set per KV head, shared by the whole group
    chunks, _ = window(L)
    means = k[:, :, : chunks * C].double().view(B, Hkv, chunks, C, D).mean(3)
    G = Hq // Hkv
    for b in range(B):
        for h in range(Hkv):
            cand = s.candidates[b, h]
            logits = q[b, h * G:(h + 1) * G].double() @ means[b, h, cand].T * scale
            score = torch.softmax(logits, -1).amax(0)
            ref = sorted(cand[torch.topk(score, budget // C).indices].tolist())
            assert chosen_chunks(s, sel, b, h) == ref
    # permuting the query heads inside each group leaves the selection unchanged
    perm = torch.cat([h * G + torch.randperm(G, generator=torch.Generator().manual_seed(h)) for h in range(Hkv)])
    s2 = build("shadowkv", budget, Hq, Hkv, budget_mode="paper", outlier_chunks=O, landmark_scale=scale_opt)
    prefill(s2, k_pre, k, v, pos, L, Hq)
    sel2 = s2.select(q[:, perm], k, v)
    assert torch.equal(sel.indices, sel2.indices) and torch.equal(sel.valid, sel2.valid)
    # the softmax temperature matters (max over the group): the other scale picks other chunks on this data
    other = "head_dim" if scale_opt == "official" else "official"
    s3 = build("shadowkv", budget, Hq, Hkv, budget_mode="paper", outlier_chunks=O, landmark_scale=other)
    prefill(s3, k_pre, k, v, pos, L, Hq)
    assert not torch.equal(sel.indices, s3.select(q, k, v).indices)


# ---------------------------------------------------------------------------------------------------- exactness

@pytest.mark.parametrize("options", [{}, {"budget_mode": "paper"}, {"offload_values": False},
                                     {"outlier_chunks": 3, "budget_mode": "paper"}, {"align_chunks_to_8": True}])
def test_full_rank_full_budget_is_dense(options):
    B, Hq, Hkv, L, extra = 2, 4, 2, 230, 6
    k_pre, k, v, pos = case(B, Hkv, L, extra=extra, seed=10)
    s = build("shadowkv", 4096, Hq, Hkv, **options)  # rank 160 >= Hkv*d = 64: full rank
    prefill(s, k_pre, k, v, pos, L, Hq)
    for t in range(1, extra + 1):
        kk, vv = k[:, :, : L + t], v[:, :, : L + t]
        s.append(kk, vv)
        q = torch.randn(B, Hq, D)
        sel = s.select(q, kk, vv)
        out, _ = sparse_decode(q, kk, vv, sel, SCALE)
        ref, _ = dense_reference(q, kk, vv)
        assert int(sel.valid.sum(-1).min()) == L + t
        assert torch.allclose(out.double(), ref, atol=1e-5, rtol=0)


def test_without_rotate_keys_are_used_as_given():
    """PrefillContext without `rotate` (pre_rope_keys() returns the cached keys): identity rotation, still dense."""
    B, Hq, Hkv, L = 2, 6, 3, 150
    keys, values = make_kv(B, Hkv, L + 1, seed=20)
    s = build("shadowkv", 4096, Hq, Hkv, outlier_chunks=2)  # Hkv*d = 96 <= 160: full rank
    selectors_prefill(s, keys, values, Hq, L)
    q = torch.randn(B, Hq, D)
    sel = s.select(q, keys, values)
    assert torch.allclose(sparse_decode(q, keys, values, sel, SCALE)[0].double(), dense_reference(q, keys, values)[0],
                          atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("offload", [True, False])
def test_exact_parts_bit_identical_and_values_bit_equal(dtype, offload):
    B, Hq, Hkv, L, extra = 2, 4, 2, 360, 8
    k_pre, k, v, pos = case(B, Hkv, L, extra=extra, seed=11, dtype=dtype)
    s = build("shadowkv", 160, Hq, Hkv, rank=16, budget_mode="paper", outlier_chunks=4, offload_values=offload)
    prefill(s, k_pre, k, v, pos, L, Hq)
    g = torch.Generator().manual_seed(12)
    qs = torch.randn(3, B, Hq, D, generator=g).to(dtype)
    for t in range(1, extra + 1):
        kk, vv = k[:, :, : L + t], v[:, :, : L + t]
        s.append(kk, vv)
        sel = s.select(qs[t % 3], kk, vv)  # repeated queries: hits served from the device buffer
        for b in range(B):
            for h in range(Hkv):
                ok = sel.valid[b, h, 0]
                idx = sel.indices[b, h, 0][ok]
                assert torch.equal(idx, idx.unique()) and int(idx.max()) < L + t
                assert torch.equal(sel.values[b, h, 0][ok], vv[b, h, idx])  # every value bit-equal
                exact = (idx >= L - s.window) | torch.isin(idx // C, s.outlier_chunks[b, h])
                assert torch.equal(sel.keys[b, h, 0][ok][exact], kk[b, h, idx[exact]])
                assert not torch.equal(sel.keys[b, h, 0][ok][~exact], kk[b, h, idx[~exact]])  # rank 16: rebuilt
    if offload:
        assert s.host_values.device.type == "cpu"
        assert s.host_values.data_ptr() != v.data_ptr()


def test_temporal_cache_transparent():
    """CPU class (host store + hit reuse) == accuracy class (values from the cache): same sets, same output."""
    B, Hq, Hkv, L, extra = 2, 4, 2, 300, 6
    k_pre, k, v, pos = case(B, Hkv, L, extra=extra, seed=13)
    a = build("shadowkv", 128, Hq, Hkv, rank=20, outlier_chunks=2, budget_mode="paper")
    c = build("shadowkv", 128, Hq, Hkv, rank=20, outlier_chunks=2, budget_mode="paper", offload_values=False)
    prefill(a, k_pre, k, v, pos, L, Hq)
    prefill(c, k_pre, k, v, pos, L, Hq)
    g = torch.Generator().manual_seed(14)
    qs = torch.randn(2, B, Hq, D, generator=g)
    for t in range(1, extra + 1):
        kk, vv = k[:, :, : L + t], v[:, :, : L + t]
        sa, sc = a.select(qs[t % 2], kk, vv), c.select(qs[t % 2], kk, vv)
        assert torch.equal(sa.indices, sc.indices) and torch.equal(sa.values, sc.values)
        assert torch.allclose(sa.keys, sc.keys, atol=1e-6)
        assert sc.h2d_bytes == 0
    assert a.extra_metrics()["chunk_hit_rate"] == c.extra_metrics()["chunk_hit_rate"]


def test_hit_rate_and_h2d_accounting():
    B, Hq, Hkv, L, O, budget = 2, 4, 2, 400, 3, 64
    s_elem = 2
    k_pre, k, v, pos = case(B, Hkv, L, extra=6, seed=15)
    s = build("shadowkv", budget, Hq, Hkv, budget_mode="paper", outlier_chunks=O, rank=24)
    q_prompt = prefill(s, k_pre, k, v, pos, L, Hq)
    chunks, W = window(L)
    n = budget // C
    g = torch.Generator().manual_seed(16)
    qa, qb = torch.randn(B, Hq, D, generator=g) * 4, torch.randn(B, Hq, D, generator=g) * 4
    # step 1 repeats the last prompt query (CPU class: selection at prefill) -> all hits; then new, repeat, new
    queries = [q_prompt[:, :, -1], qa, qa, qb, qa]
    prev = None
    rates = []
    for t, q in enumerate(queries, start=1):
        kk, vv = k[:, :, : L + t], v[:, :, : L + t]
        sel = s.select(q, kk, vv)
        cur = [[set(chosen_chunks(s, sel, b, h)) for h in range(Hkv)] for b in range(B)]
        if t == 1:
            misses = [[0] * Hkv for _ in range(B)]
        else:
            misses = [[len(cur[b][h] - prev[b][h]) for h in range(Hkv)] for b in range(B)]
        if t in (1, 3):
            assert all(m == 0 for row in misses for m in row)
        miss_tok = sum(sum(row) for row in misses) * C / B
        rates.append(sum(n - m for row in misses for m in row) / (B * Hkv * n))
        assert sel.h2d_bytes == pytest.approx(miss_tok * D * s_elem)
        attended = W + C * O + n * C + t
        assert sel.forced_tokens == W + C * O + t
        assert sel.kv_bytes == pytest.approx(2 * D * s_elem * Hkv * attended + s_elem * miss_tok * D)
        ncand = chunks - O
        rows_heads = sum(1 for row in misses for m in row if m) / B
        meta = Hkv * (s_elem * D * ncand + 4 * (Hq // Hkv) * ncand) + s_elem * 24 * miss_tok + s_elem * D * 24 * rows_heads
        assert sel.metadata_bytes == pytest.approx(meta)
        prev = cur
    assert rates[0] == rates[2] == 1.0 and rates[1] < 1.0 and rates[3] < 1.0
    assert s.extra_metrics()["chunk_hit_rate"] == pytest.approx(sum(rates) / len(rates))
    assert s.extra_metrics()["prefill_h2d_bytes"] == Hkv * n * C * D * s_elem


def test_generated_tokens_always_attended_and_fair_budget():
    B, Hq, Hkv, L, extra, budget = 1, 4, 2, 300, 40, 100
    k_pre, k, v, pos = case(B, Hkv, L, extra=extra, seed=17)
    s = build("shadowkv", budget, Hq, Hkv, rank=20)
    prefill(s, k_pre, k, v, pos, L, Hq)
    _, W = window(L)  # 36; fair mode at budget < 1024: no outliers
    assert s.outliers == 0
    for t in range(1, extra + 1):
        kk, vv = k[:, :, : L + t], v[:, :, : L + t]
        s.append(kk, vv)
        sel = s.select(torch.randn(B, Hq, D), kk, vv)
        assert sel.indices.shape[-1] == budget and int(sel.valid.sum(-1).max()) <= budget
        for h in range(Hkv):
            got = set(sel.indices[0, h, 0][sel.valid[0, h, 0]].tolist())
            if W + t <= budget:
                assert set(range(L - W, L + t)) <= got  # local window + every generated token
                n_sel = (budget - W - t) // C
                assert len(chosen_chunks(s, sel, 0, h)) == n_sel and sel.forced_tokens == W + t
            else:  # tail cap: only the most recent `budget` tokens of local + generated
                assert got == set(range(L + t - budget, L + t)) and sel.forced_tokens == budget


def test_generated_tokens_paper_mode_past_official_headroom():
    B, Hq, Hkv, L, extra = 1, 2, 1, 200, 130
    k_pre, k, v, pos = case(B, Hkv, L, extra=extra, seed=18)
    s = build("shadowkv", 32, Hq, Hkv, budget_mode="paper", outlier_chunks=2)
    prefill(s, k_pre, k, v, pos, L, Hq)
    for t in (1, 64, 130):
        sel = s.select(torch.randn(B, Hq, D), k[:, :, : L + t], v[:, :, : L + t])
        got = set(sel.indices[0, 0, 0][sel.valid[0, 0, 0]].tolist())
        assert set(range(L, L + t)) <= got and int(sel.valid.sum()) == s.window + 16 + 32 + t


def test_config_errors():
    for bad in [dict(landmark_scale="sqrt"), dict(outlier_chunks="many"), dict(outlier_chunks=-1), dict(rank=0),
                dict(align_chunks_to_8="yes"), dict(offload_values="no"), dict(chunk_size=0), dict(local_chunks=-2)]:
        with pytest.raises(ConfigError, match="method\\."):
            build("shadowkv", 256, 4, 2, **bad)
    with pytest.raises(ConfigError, match="multiple of method.chunk_size"):
        build("shadowkv", 100, 4, 2, budget_mode="paper")
    k_pre, k, v, pos = case(1, 2, 300, seed=19)
    s = build("shadowkv", 30, 4, 2)  # W = 36 > 30
    with pytest.raises(ConfigError, match="budget >= 36"):
        prefill(s, k_pre, k, v, pos, 300, 4)


# ---------------------------------------------------------------------------------------------------- tiny Llama

@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**TINY_LLAMA, attn_implementation="sdpa")).eval()


def test_tiny_llama_large_budget_matches_fullkv(tiny):
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (1, 300), generator=torch.Generator().manual_seed(2))
    ref_tokens, _ = greedy(tiny, ids, 16, "fullkv", 4096)
    out, cache = greedy(tiny, ids, 16, "shadowkv", 4096, outlier_chunks=4)
    assert torch.equal(out, ref_tokens)
    m = cache.extra_metrics()
    assert m["effective_rank"] == TINY_LLAMA["num_key_value_heads"] * TINY_LLAMA["head_dim"]  # 32 < 160
    assert m["chunk_hit_rate"] == 1.0  # every candidate selected at every step
    with torch.no_grad():  # logits along the FullKV trajectory (random-weight logits are nearly tied)
        ref = teacher_forced_logits(tiny, ids, ref_tokens.clone(), "fullkv", 4096)
        got = teacher_forced_logits(tiny, ids, ref_tokens.clone(), "shadowkv", 4096, outlier_chunks=4)
    assert torch.allclose(got, ref, atol=1e-4, rtol=0)


def test_tiny_llama_small_fair_budget(tiny):
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (1, 600), generator=torch.Generator().manual_seed(3))
    out, cache = greedy(tiny, ids, 10, "shadowkv", 128)
    s = cache.stats.summary()
    assert out.shape == (1, 10)
    assert s["attended_tokens_per_step"] <= 128
    assert s["bytes_read_per_step"] < s["full_bytes_per_step"]
    assert s["h2d_bytes_per_step"] > 0
    m = cache.extra_metrics()
    assert 0 <= m["chunk_hit_rate"] <= 1 and m["effective_rank"] == 32
