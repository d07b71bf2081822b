"""LRQK's static-step kernels (baselines/lrqk/kernels.py): every decode iteration's q^ and k^ (the r x r solves in
registers) against the float64 solves of `decode_coordinates`, and the fused step of stacked rows (one resident that
outgrows the hot cache, one past it; both rings flushed to the cold store) equal to each row's PyTorch static step
alone, step after step: ring, slots, hot cache, factors, missed rows, bytes and the union of attended tokens."""
import pytest
import torch

from baselines.lrqk import LRQKSelector, decode_coordinates
from baselines.lrqk.kernels import lrqk_solve
from locks.core.batch import stack_selectors
from locks.core.reference import attended_per_kv_head
from locks.core.selector import LayerInfo, PrefillContext
from locks.kernels import poisoned
from tests.helpers import stacked_step_inputs

H, G, D = 2, 3, 32
OPTIONS = dict(rank=8, lite_tokens=8)
BUDGET = 48  # fair: top_k = 40, hot cache 48 rows per query head


def _prefilled(L, backend, seed, **options):
    info = LayerInfo(layer_idx=1, num_heads=H * G, num_kv_heads=H, head_dim=D, scaling=D ** -0.5, backend=backend)
    gen = torch.Generator().manual_seed(seed)
    keys, values = torch.randn(1, H, L, D, generator=gen), torch.randn(1, H, L, D, generator=gen)
    queries = torch.randn(1, H * G, L, D, generator=gen)
    sel = LRQKSelector(info, BUDGET, **{**OPTIONS, **options})
    sel.prefill(PrefillContext(keys=keys, values=values, queries=queries, positions=torch.arange(L)[None],
                               pre_rope_keys=lambda: keys))
    return sel, keys, values


def test_every_iteration_solves_its_normal_equations_as_float64():
    """The workspaces of `lrqk_solve` hold, per iteration, the q^ and k^ of `decode_coordinates` run in float64
    on the same state (Omega rows, ring slot of the new token), and their squared change."""
    L, cap = 70, 80
    sel, keys, values = _prefilled(L, "triton", 3)
    sel.start_static(cap)
    gen = torch.Generator().manual_seed(5)
    keys = torch.cat([keys, torch.randn(1, H, cap - L, D, generator=gen)], 2)
    values = torch.cat([values, torch.randn(1, H, cap - L, D, generator=gen)], 2)
    length = torch.tensor([L + 1])
    query = torch.randn(1, H * G, D, generator=gen)
    state = {name: getattr(sel, name).clone() for name in ("Kh", "slots", "s_lite", "A_K", "B_Q", "B_K")}
    with poisoned():
        ws_q, ws_k, ws_e, _ = lrqk_solve(query, keys, values, length, sel.s_ring_base, sel.Kh, sel.Vh, sel.s_lite,
                                      sel.slots, sel.A_K, sel.B_Q, sel.B_K, sel.s_count, sel.s_step_bytes,
                                      sel.s_attended, max_iter=3, lambda1=0.7, lambda2=1.3)
    k, n, r = sel.k, sel.n, sel.r
    ring = (L - sel.ring_base) % n
    key = keys[:, :, L].repeat_interleave(G, 1).double()
    Kh = state["Kh"].double()
    Kh[:, :, k + ring] = key
    lite = state["s_lite"].clone()
    lite[0, ring] = L
    omega = torch.cat([state["slots"], lite.expand(H * G, n)[None]], -1)
    ok = (omega >= 0) & (omega < L)
    A_om = state["A_K"].double().gather(2, (omega * ok)[..., None].expand(-1, -1, -1, r)) * ok[..., None]
    assert torch.equal(sel.Kh[:, :, k + ring], key.float()) and int(sel.s_lite[0, ring]) == L
    k_prev = None
    for it in range(3):
        q_hat, k_hat, k_used = decode_coordinates(state["B_Q"].double(), state["B_K"].double(), A_om, Kh,
                                                  query.double().unsqueeze(2), key.unsqueeze(2), max_iter=it + 1,
                                                  tol=-1.0, lambda1=0.7, lambda2=1.3)
        assert torch.allclose(ws_q[:, it, :r].double(), q_hat.view(H * G, r), rtol=1e-4, atol=1e-5), it
        assert torch.allclose(ws_k[:, it, :r].double(), k_hat.view(H * G, r), rtol=1e-4, atol=1e-5), it
        assert (ws_q[:, it, r:] == 0).all() and (ws_k[:, it, r:] == 0).all()
        change = (k_used - k_hat).square().sum((-2, -1)).view(H * G)
        assert torch.allclose(ws_e[:, it].double(), change, rtol=1e-2, atol=1e-7), it  # a difference of close vectors
        if k_prev is not None:
            assert torch.allclose(k_used, k_prev)
        k_prev = k_hat


@pytest.mark.parametrize("options", [{}, dict(tol_decode=1e3, candidate_off_by_one=False)])
def test_stacked_rows_step_as_each_row_alone(options):
    """Rows of 44 tokens (resident: every token in the hot cache, until the fifth step) and 70 tokens, stacked:
    ten fused steps (the interpreter) hold, per row, the ring, slots, sorted set, hot cache, A_K rows and
    factors of the row's own PyTorch static step, count its missed rows and bytes, and each KV head's attended
    tokens as the union its Selection names; the hot cache is attended in slot order, min(L, k + n) slots."""
    lengths = (44, 70)
    capacity = max(lengths) + 10
    rows, alone, caches = [], [], []
    for L in lengths:
        sel, keys, values = _prefilled(L, "triton", L, **options)
        ref, _, _ = _prefilled(L, "torch", L, **options)
        for s in (sel, ref):
            s.start_static(capacity)
        pad = keys.new_zeros(1, H, capacity - L, D)
        rows.append(sel)
        alone.append(ref)
        caches.append((torch.cat([keys, pad], 2), torch.cat([values, pad], 2)))
    stacked = stack_selectors(rows)
    keys, values = torch.cat([k for k, _ in caches]), torch.cat([v for _, v in caches])
    gen = torch.Generator().manual_seed(7)
    k, n = stacked.k, stacked.n
    for step in range(10):
        length, query = stacked_step_inputs(keys, values, lengths, step, gen, H * G)
        with poisoned():
            fused = stacked.select_static(query, keys, values, length)
        for r, (sel, ref) in enumerate(zip(rows, alone)):
            L = int(length[r])
            want = ref.select_static(query[r : r + 1], keys[r : r + 1], values[r : r + 1], length[r : r + 1])
            where = (options, step, r)
            for name in ("slots", "s_sorted", "s_lite", "Kh", "Vh", "s_missed", "s_step_bytes"):
                assert torch.equal(getattr(stacked, name)[r], getattr(ref, name)[0]), (where, name)
            for name in ("B_Q", "B_K", "A_K"):  # (A_K: the rows a step can write; a row may have more room)
                mine, theirs = getattr(stacked, name)[r, :, :capacity], getattr(ref, name)[0, :, :capacity]
                assert (mine - theirs).abs().max() <= 1e-4 * theirs.abs().max(), (where, name)  # fp32 solves
            assert int(fused.key_count[r]) == min(L, k + n), where
            assert torch.equal(fused.attended_rows[r], attended_per_kv_head(want, capacity)[0].double()), where
            assert torch.equal(fused.device_bytes[r], want.device_bytes[0]), where
            sel.after_static_step(keys[r : r + 1], values[r : r + 1], L)
            ref.after_static_step(keys[r : r + 1], values[r : r + 1], L)
            n_stored = ref.store_len
            assert sel.store_len == n_stored and torch.equal(stacked.store[r, :, :n_stored], ref.store[0, :, :n_stored])
    assert all(float(ref.s_missed[0]) > 0 for ref in alone)  # rows were really fetched from the cold store
    assert all(ref.store_len > ref.k for ref in alone)  # and the rings flushed into it
