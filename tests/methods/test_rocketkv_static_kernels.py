"""RocketKV's static-step kernels (baselines/rocketkv/kernels.py) against an independent float64 reference of the
formulas in docs/methods/rocketkv.md, and stacked rows whose decompositions differ (cs, r_ch, survivors, k) equal
each row alone, for the kernels and the selector's torch and triton static steps."""
import math

import pytest
import torch

from baselines.rocketkv import RocketKVSelector
from baselines.rocketkv.selector import survivor_scores
from baselines.rocketkv.kernels import rocket_append, rocket_static_tokens, rocket_token_scores
from locks.core.batch import _stacked
from locks.core.selector import LayerInfo, PrefillContext
from locks.kernels import poisoned

H, G, D = 2, 3, 32


def reference_scores(q, kmin, kmax, cs, r, n, cap):
    """float64: one row and KV head, q [G, d], kmin/kmax [chunks, d] -> [cap] (-inf at t >= n)."""
    q, kmin, kmax = q.double(), kmin.double(), kmax.double()
    a = q.abs().sum(0)
    order = sorted(range(D), key=lambda i: (-a[i].item(), i))[:r]
    chosen = torch.zeros(D, dtype=torch.bool)
    chosen[order] = True
    qs = torch.where(chosen, q, 0.0)
    bound = torch.where(q.sum(0) > 0, kmax, kmin)
    tau = torch.sqrt(D * qs.abs().sum(1) / q.abs().sum(1))
    chunk = torch.arange(n) // cs
    x = (qs @ bound.T)[:, chunk] / tau[:, None]  # [G, n]
    out = torch.full((cap,), -math.inf, dtype=torch.float64)
    out[:n] = torch.softmax(x, dim=-1).sum(0)
    return out


def random_rows(seed):
    """Three rows: (cs, r_ch, prompt - survivors, k) and lengths of their own."""
    gen = torch.Generator().manual_seed(seed)
    params = torch.tensor([[1, 32, 0, 16], [3, 11, 40, 12], [2, 20, 7, 16]])
    length = torch.tensor([70, 150, 101])
    cap = 120
    chunks = 120
    q = torch.randn(3, H * G, D, generator=gen)
    a, b = torch.randn(3, H, chunks, D, generator=gen), torch.randn(3, H, chunks, D, generator=gen)
    return gen, params, length, cap, q, torch.minimum(a, b), torch.maximum(a, b)


def scores_of(key, n):
    """The fp32 scores a ranking key holds at positions < n."""
    return (key[..., :n] >> 31).to(torch.int32).view(torch.float32)


@pytest.mark.parametrize("seed", [0, 1])
def test_token_scores_are_the_reference_softmax_over_survivors(seed):
    """The kernel's keys hold the float64 reference's scores (within fp32 rounding) and each position below T', and
    rank as the selector's `survivor_scores` does; each row alone gives the same keys bitwise."""
    _, params, length, cap, q, kmin, kmax = random_rows(seed)
    with poisoned():
        got = rocket_token_scores(q, kmin, kmax, params, length, cap)
    for r in range(3):
        cs, rch, evicted, _ = params[r].tolist()
        n = int(length[r]) - evicted
        torch_keys = survivor_scores(q[r : r + 1].view(1, H, G, D), kmin[r : r + 1], kmax[r : r + 1], rch, cs, n, cap)
        for h in range(H):
            want = reference_scores(q[r, h * G : (h + 1) * G], kmin[r, h], kmax[r, h], cs, rch, n, cap)
            for key in (got[r, h], torch_keys[0, h]):
                assert torch.equal(key[n:], -1 - torch.arange(n, cap))
                assert torch.equal(key[:n] & (2**31 - 1), 2**31 - 1 - torch.arange(n))
                assert torch.allclose(scores_of(key, n).double(), want[:n], rtol=1e-5)
        alone = rocket_token_scores(q[r : r + 1], kmin[r : r + 1], kmax[r : r + 1], params[r : r + 1],
                                    length[r : r + 1], cap)
        assert torch.equal(alone, got[r : r + 1])


def test_append_folds_the_new_key_into_its_chunk_and_order():
    gen, params, length, cap, _, kmin, kmax = random_rows(2)
    keys = torch.randn(3, H, 160, D, generator=gen)
    index = torch.randint(0, 160, (3, H, cap), generator=gen)
    length = torch.tensor([70, 150, 102])  # row 2: survivor 94 opens chunk 47 (cs 2)
    want_min, want_max, want_index = kmin.clone(), kmax.clone(), index.clone()
    for r in range(3):
        cs, _, evicted, _ = params[r].tolist()
        pos = int(length[r]) - 1
        slot = pos - evicted
        c = slot // cs
        key = keys[r, :, pos]
        opens = slot % cs == 0
        want_max[r, :, c] = key if opens else torch.maximum(kmax[r, :, c], key)
        want_min[r, :, c] = key if opens else torch.minimum(kmin[r, :, c], key)
        want_index[r, :, slot] = pos
    with poisoned():
        rocket_append(keys, kmin, kmax, index, params, length)
    assert torch.equal(kmin, want_min) and torch.equal(kmax, want_max) and torch.equal(index, want_index)


def test_token_list_is_each_rows_top_k_survivors_ascending():
    gen, params, length, cap, q, kmin, kmax = random_rows(3)
    index = torch.stack([torch.stack([torch.randperm(200, generator=gen)[:cap] for _ in range(H)]) for _ in range(3)])
    scores = rocket_token_scores(q, kmin, kmax, params, length, cap)
    K = 16
    top = torch.topk(scores, K, dim=-1).indices
    with poisoned():
        indices, valid = rocket_static_tokens(top, index, params, length, 200)
    for r in range(3):
        _, _, evicted, k = params[r].tolist()
        n = int(length[r]) - evicted
        for h in range(H):
            chosen = [p for p in top[r, h, :k].tolist() if p < n]
            want = sorted(index[r, h, chosen].tolist())
            assert indices[r, h, 0, : len(want)].tolist() == want and valid[r, h, 0, : len(want)].all()
            assert not valid[r, h, 0, len(want) :].any() and (indices[r, h, 0, len(want) :] == 0).all()


def _prefilled(L, budget, seed):
    info = LayerInfo(layer_idx=0, num_heads=H * G, num_kv_heads=H, head_dim=64, scaling=0.125, backend="torch")
    gen = torch.Generator().manual_seed(seed)
    keys, values = torch.randn(1, H, L, 64, generator=gen), torch.randn(1, H, L, 64, generator=gen)
    queries = torch.randn(1, H * G, L, 64, generator=gen)
    sel = RocketKVSelector(info, budget)
    sel.prefill(PrefillContext(keys=keys, values=values, queries=queries, positions=torch.arange(L)[None],
                               pre_rope_keys=lambda: keys, max_new_tokens=16, max_length=None))
    return sel, keys, values


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_stacked_selectors_with_their_own_decompositions_select_as_each_alone(backend):
    """Rows of 301 and 371 tokens at budget 16: cs 2 and 3, r_ch 32 and 30, survivors of their own. Four static
    steps of the stacked state select each row's own tokens."""
    rows = [_prefilled(L, 16, L) for L in (301, 371)]
    capacity = 371 + 16
    alone = []
    for sel, keys, values in rows:
        sel.info.backend = backend
        sel.start_static(capacity)
        alone.append((sel, torch.cat([keys, keys.new_zeros(1, H, capacity - keys.shape[2], 64)], 2)))
    assert [s.params.cs for s, _ in alone] == [2, 3] and len({s.params.r_ch for s, _ in alone}) == 2
    stacked = RocketKVSelector(rows[0][0].info, 16)
    for name in RocketKVSelector.row_state:
        setattr(stacked, name, _stacked([getattr(s, name) for s, _ in alone]))
    for name in RocketKVSelector.row_state:  # each row alone works on its own copy
        for s, _ in alone:
            value = getattr(s, name)
            setattr(s, name, value.clone() if isinstance(value, torch.Tensor) else value)
    gen = torch.Generator().manual_seed(7)
    keys = torch.cat([k for _, k in alone])
    for step in range(4):
        length = torch.tensor([301 + step + 1, 371 + step + 1])
        for r in range(2):
            keys[r, :, int(length[r]) - 1] = torch.randn(H, 64, generator=gen)
        query = torch.randn(2, H * G, 64, generator=gen)
        with poisoned():
            both = stacked.select_static(query, keys, keys, length)
        for r, (sel, _) in enumerate(alone):
            one = sel.select_static(query[r : r + 1], keys[r : r + 1], keys[r : r + 1], length[r : r + 1])
            K = one.indices.shape[-1]
            assert torch.equal(both.valid[r : r + 1, ..., :K], one.valid) and not both.valid[r, ..., K:].any()
            assert torch.equal(both.indices[r : r + 1, ..., :K], one.indices), (backend, step, r)
