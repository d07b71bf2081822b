"""ShadowKV's static-step kernels (baselines/shadowkv/kernels.py): the landmark scores against a float64 reference
of the formula in docs/methods/shadowkv.md, and the fused step (rebuilt and rotated keys, temporal buffer, host
store, compacted K/V, accounting) of stacked rows whose layouts differ equal to each row's PyTorch static step
alone, step after step."""
import pytest
import torch

from baselines.shadowkv import ShadowKVSelector
from baselines.shadowkv.kernels import shadow_scores
from locks.core.batch import stack_selectors
from locks.core.selector import LayerInfo, PrefillContext
from locks.kernels import poisoned
from tests.helpers import stacked_step_inputs

H, G, D = 2, 3, 32


def test_landmark_scores_are_the_reference_softmax():
    """Per row and KV head: softmax over the row's own candidates per query head, max over the group (float64
    reference), -inf past them; rows padded with candidates they do not have."""
    gen = torch.Generator().manual_seed(0)
    NC = 40
    q = torch.randn(3, H * G, D, generator=gen)
    landmarks = torch.randn(3, H, NC, D, generator=gen)
    ncand = [40, 17, 1]
    params = torch.tensor([[0, 0, 0, n, 0, 0] for n in ncand])
    with poisoned():
        got = shadow_scores(q, landmarks, params, 0.3)
    for b, n in enumerate(ncand):
        for h in range(H):
            x = q[b, h * G : (h + 1) * G].double() @ landmarks[b, h, :n].double().T * 0.3
            want = torch.softmax(x, dim=-1).amax(0)
            assert torch.allclose(got[b, h, :n].double(), want, rtol=1e-5, atol=1e-7), (b, h)
            assert torch.isneginf(got[b, h, n:]).all()


class HalfRotation:
    """RoPE of the 'half' layout with theta 10000 (as `KeyRotation` for Llama): rotate, quarter_turn, tables."""

    def _cos_sin(self, positions):
        inv = 1.0 / 10000 ** (torch.arange(0, D, 2).float() / D)
        angle = positions[..., None].float() * inv
        angle = torch.cat([angle, angle], -1)
        return angle.cos(), angle.sin()

    def quarter_turn(self, x, layer_idx=None):
        return torch.cat([-x[..., D // 2 :], x[..., : D // 2]], -1)

    def rotate(self, keys, positions, layer_idx=None):
        cos, sin = self._cos_sin(positions)
        return (keys.float() * cos[:, None] + self.quarter_turn(keys.float()) * sin[:, None]).to(keys.dtype)

    def tables(self, positions, layer_idx, like):
        cos, sin = self._cos_sin(positions)
        return cos.to(like.dtype), sin.to(like.dtype)


def _prefilled(L, budget, options, backend, seed):
    info = LayerInfo(layer_idx=0, num_heads=H * G, num_kv_heads=H, head_dim=D, scaling=D ** -0.5, backend=backend)
    gen = torch.Generator().manual_seed(seed)
    keys, values = torch.randn(1, H, L, D, generator=gen), torch.randn(1, H, L, D, generator=gen)
    queries = torch.randn(1, H * G, L, D, generator=gen)
    rotation = HalfRotation() if options.pop("rope", True) else None
    sel = ShadowKVSelector(info, budget, **options)
    positions = torch.arange(L)[None]
    sel.prefill(PrefillContext(keys=keys, values=values, queries=queries, positions=positions,
                               pre_rope_keys=lambda: keys, rotate=rotation and rotation.rotate, rotation=rotation))
    return sel, keys, values


def _compacted(sel):
    """A static Selection's attended keys and values per row (the valid slots, in order)."""
    if sel.key_count is not None:
        counts = sel.key_count.tolist()
    else:
        counts = sel.valid[:, 0, 0].sum(-1).tolist()
        assert all(bool(sel.valid[b, :, 0, :n].all()) and not sel.valid[b, :, 0, n:].any()
                   for b, n in enumerate(counts))
    return [(sel.keys[b, :, 0, :n], sel.values[b, :, 0, :n]) for b, n in enumerate(counts)]


CASES = [("fair", dict(offload_values=True)), ("fair", dict(offload_values=False)),
         ("paper", dict(outlier_chunks=4, offload_values=True)), ("fair", dict(offload_values=True, rope=False)),
         ("paper", dict(outlier_chunks=16, offload_values=True)),  # every candidate selected: no ranking
         ("paper", dict(outlier_chunks=3, align_chunks_to_8=True, offload_values=False, rope=False))]


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("mode,options", CASES)
def test_stacked_rows_step_as_each_row_alone(backend, mode, options):
    """Rows of 181 and 234 tokens at budget 96 (windows, tails, candidates and selected chunks of their own; paper
    mode: outlier chunks, and every candidate or a ranking): five static steps of the stacked state (`backend`) attend, per row, the keys and
    values, and count the bytes and hits, of the row's own PyTorch static step."""
    budget = 96
    lengths = (181, 234)
    capacity = max(lengths) + 8
    rows, alone = [], []
    for L in lengths:
        sel, keys, values = _prefilled(L, budget, dict(options, budget_mode=mode), backend, L)
        ref, _, _ = _prefilled(L, budget, dict(options, budget_mode=mode), "torch", L)
        for s in (sel, ref):
            s.start_static(capacity)
        pad = keys.new_zeros(1, H, capacity - L, D)
        rows.append((sel, torch.cat([keys, pad], 2), torch.cat([values, pad], 2)))
        alone.append(ref)
    stacked = stack_selectors([s for s, _, _ in rows])
    stacked._host_of = None
    keys, values = torch.cat([k for _, k, _ in rows]), torch.cat([v for _, _, v in rows])
    gen = torch.Generator().manual_seed(7)
    for step in range(5):
        length, query = stacked_step_inputs(keys, values, lengths, step, gen, H * G)
        with poisoned():
            both = _compacted(stacked.select_static(query, keys, values, length))
        for r, ref in enumerate(alone):
            (k1, v1), = _compacted(ref.select_static(query[r : r + 1], keys[r : r + 1], values[r : r + 1],
                                                     length[r : r + 1]))
            k2, v2 = both[r]
            where = (backend, mode, step, r)
            assert k2.shape == k1.shape and torch.allclose(k2, k1, atol=1e-5), where
            assert torch.equal(v2, v1), where
            assert torch.equal(stacked.s_step_bytes[r], ref.s_step_bytes[0]), where
            assert torch.allclose(stacked.s_hit_sum[r], ref.s_hit_sum[0], rtol=1e-12), where
            assert torch.equal(stacked.s_chunks[r, :, :, : ref.n_top], ref.s_chunks[0]), where
    assert all(float(ref.s_hit_sum[0]) > 0 for ref in alone)  # chunks were really carried over between steps
