"""Selector.memory_bytes: each method's analytic bytes on the device (K/V, selection state) and in host memory
equal the bytes of the tensors it holds after a real prefill of the tiny shapes (fp32 tensors, so the LayerInfo
counts 4-byte elements), per sequence."""
from __future__ import annotations

import pytest
import torch

from bench.prefill_state import prefill_selector
from locks.core.registry import MethodSpec
from locks.core.selector import LayerInfo

B, HKV, HQ, D = 2, 2, 8, 32


def nbytes(*tensors) -> float:
    return float(sum(t.nbytes for t in tensors)) / B


def held(method, s, keys, values):
    """(kv, state, host) bytes per sequence of the tensors the selector holds, by what each one is."""
    full = nbytes(keys, values)
    if method in ("fullkv", "oracle", "oracle_token"):
        return full, 0.0, 0.0
    if method == "locks":
        summ = s.summaries
        fields = [getattr(summ, f) for f in ("mu_int", "mu_scale", "head_mean", "v_pack", "c_int", "w", "rho")]
        return full, nbytes(*fields), 0.0
    if method == "quest":
        pages = -(-s.length // s.page_size)
        return full, nbytes(s._max[:, :, :pages], s._min[:, :, :pages]), 0.0
    if method == "shadowkv":
        exact = (s.window + s.chunk_size * s.outliers) * s.info.token_kv_bytes
        return exact + nbytes(s.buf_k, s.buf_v), nbytes(s.U, s.SV, s.landmarks), nbytes(s.host_values)
    if method == "rocketkv":
        chunks = -(-s.kept // s.params.cs)
        return s.kept * s.info.token_kv_bytes, nbytes(s.kmin[:, :, :chunks], s.kmax[:, :, :chunks]), 0.0
    if method == "lrqk":
        return (nbytes(s.Kh, s.Vh), nbytes(s.A_K[:, :, : s.ak_len], s.B_Q, s.B_K),
                nbytes(s.store[:, :, : s.store_len]))
    raise AssertionError(method)


@pytest.mark.parametrize("L", [700, 2000])
@pytest.mark.parametrize("method,options", [("fullkv", {}), ("oracle_token", {}), ("locks", {}), ("quest", {}),
                                            ("shadowkv", {"rank": 16}), ("rocketkv", {}), ("lrqk", {"rank": 8})])
def test_memory_bytes_match_the_tensors_a_prefill_leaves(method, options, L):
    gen = torch.Generator().manual_seed(0)
    keys, values = torch.randn(B, HKV, L, D, generator=gen), torch.randn(B, HKV, L, D, generator=gen)
    layer = 2 if method == "quest" else 0  # Quest keeps its first two layers dense (no metadata)
    selector = MethodSpec(method, 256, options=options).build(LayerInfo(layer, HQ, HKV, D, D ** -0.5,
                                                                        kv_element_bytes=4))
    prefill_selector(selector, keys, values, gen, "real", max_new_tokens=0)
    got = selector.memory_bytes(L)
    want = held(method, selector, keys, values)
    assert (got["kv"], got["state"], got["host"]) == pytest.approx(want)
    if method in ("shadowkv", "rocketkv", "lrqk") and L == 2000:  # less K/V on the device than the cache holds
        assert got["kv"] < nbytes(keys, values)  # (LRQK's hot cache is per query head: not at 700 tokens)


def test_quest_dense_layers_hold_no_metadata():
    selector = MethodSpec("quest", 256).build(LayerInfo(0, HQ, HKV, D, D ** -0.5))
    assert selector.memory_bytes(4096)["state"] == 0.0
