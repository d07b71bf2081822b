"""Every selector's prefill state at benchmark sizes, through its own `prefill` (bench/decode.py, bench/e2e.py).

A selector's expensive, budget-independent prefill work goes through `PrefillContext.shared(key, compute)`: LOCKS's
page summaries, ShadowKV's SVD of the pre-RoPE keys, RocketKV's SnapKV++ scores, LRQK's ALS factors. At 128K-1M
tokens over 32-40 layers that work costs minutes of GPU time (a batched eigh over 2M pages, an SVD of a 1M x 1024
matrix per layer, an ALS over all 1M prompt queries), and a step's time depends on the state's layout, not its
values. `PrefillState` is the memo such a context reads: in mode "random" it answers each of those keys with random
values in the exact layout of the real result (same shapes and dtypes), and the selector's prefill does the rest as
in a real run (outlier chunks, landmarks, SnapKV's kept set, the host stores, the hot cache); in mode "real" every
key is computed by the selector itself, except LOCKS's summaries, built in chunks of at most 32,768 pages per eigh
call (cuSOLVER's batched eigh fails on 65,536 16 x 16 matrices in one call), which equals one call.
`tests/e2e/test_bench_prefill_state.py` checks, for every method, that random and real prefills leave state of the
same layout.
"""
from __future__ import annotations

import torch
from torch import Tensor

from bench.inputs import build_summaries_chunked, random_summaries
from locks.method.layouts import DEFAULT_LAYOUT


class PrefillState(dict):
    """A `PrefillContext.memo` for one layer's prefill of `keys` [B, Hkv, L, d] with `queries` [B, Hq, Lq, d]."""

    def __init__(self, keys: Tensor, queries: Tensor, gen: torch.Generator, mode: str = "random"):
        super().__init__()
        if mode not in ("random", "real"):
            raise ValueError(f"prefill state mode must be 'random' or 'real' (got {mode!r})")
        self.keys, self.queries, self.gen, self.mode = keys, queries, gen, mode

    def __contains__(self, key) -> bool:
        if not dict.__contains__(self, key):
            value = self._answer(key)
            if value is None:
                return False
            self[key] = value
        return True

    def __getitem__(self, key):
        return self.pop(key)  # each layer asks once; the memo keeps no second copy of a large state

    def _answer(self, key: tuple):
        B, H, L, d = self.keys.shape
        device = self.keys.device
        if key[0] == "locks.summaries":
            n, rank, quant, layout = key[1:]
            if quant != "int" or layout != DEFAULT_LAYOUT.name:
                return None  # unquantized summaries and other layouts: built by the selector
            if self.mode == "real":
                return build_summaries_chunked(self.keys[:, :, : L // n * n], n, rank)
            return random_summaries(B, H, L // n, d, rank, n, device, self.gen)
        if self.mode == "real":
            return None
        if key[0] == "shadowkv.svd":  # thin SVD of the pre-RoPE keys [B, L, H*d]: U [B, L, k], S [B, k], Vh [B, k, H*d]
            k = min(L, H * d)
            U = self._randn(B, L, k) * L ** -0.5
            S = torch.sort(self._rand(B, k) * L ** 0.5, dim=-1, descending=True).values
            return U, S, self._randn(B, k, H * d) * d ** -0.5
        if key[0] == "rocketkv.snapkv":  # pooled attention mass of the prefix [B, Hkv, L - window], fp32
            window = key[1]
            return self._rand(B, H, max(L - window, 0))
        if key[0] == "lrqk.als":  # (A_Q [B, Hq, Lq, r], B_Q [B, Hq, r, d], A_K [B, Hq, L, r], B_K [B, Hq, r, d]), fp32
            r, Hq, Lq = key[1], self.queries.shape[1], self.queries.shape[2]
            return (self._randn(B, Hq, Lq, r), self._randn(B, Hq, r, d), self._randn(B, Hq, L, r),
                    self._randn(B, Hq, r, d))
        return None  # cheap parts (e.g. ShadowKV's chunk means): computed by the selector

    def _randn(self, *shape) -> Tensor:
        return torch.randn(shape, generator=self.gen, device=self.keys.device)

    def _rand(self, *shape) -> Tensor:
        return torch.rand(shape, generator=self.gen, device=self.keys.device)


def prefill_selector(selector, keys: Tensor, values: Tensor, gen: torch.Generator, mode: str, *,
                     max_new_tokens: int, rotate=None, unrotate=None, rotation=None) -> None:
    """Run `selector.prefill` on keys/values [B, Hkv, L, d] as after a real prompt of L tokens: random queries (as
    many trailing ones as the selector reads; in mode "random" at most 64, since the memo answers the parts that
    read them all), the state's expensive parts from `PrefillState(mode)`. `rotate(keys, positions)` and
    `unrotate` are the model's RoPE (ShadowKV rebuilds post-RoPE keys); identity when None."""
    from locks.core.selector import PrefillContext

    B, H, L, d = keys.shape
    n_q = selector.prefill_queries()
    n_q = L if n_q is None else min(n_q, L)
    if mode == "random":
        n_q = min(n_q, 64)
    queries = torch.randn(B, selector.info.num_heads, n_q, d, generator=gen, device=keys.device).to(keys.dtype)
    positions = torch.arange(L, device=keys.device)[None].expand(B, -1)
    pre_rope = (lambda: keys) if unrotate is None else (lambda: unrotate(keys, positions))
    selector.prefill(PrefillContext(keys=keys, values=values, queries=queries, positions=positions,
                                    pre_rope_keys=pre_rope, max_new_tokens=max_new_tokens, rotate=rotate,
                                    rotation=rotation,
                                    memo=PrefillState(keys, queries, gen, mode)))
