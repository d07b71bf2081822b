"""bench/prefill_state.py: a selector prefilled from the random memo holds state of exactly the layout (attribute
names, tensor shapes, dtypes, devices) that its real prefill leaves, and both decode the same static step shapes."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from bench.prefill_state import PrefillState, prefill_selector
from locks.core.registry import MethodSpec
from locks.core.selector import LayerInfo

B, HKV, HQ, L, D = 2, 2, 8, 700, 32
METHODS = {"locks": {}, "quest": {}, "shadowkv": {"rank": 16}, "rocketkv": {}, "lrqk": {"rank": 8}}


def layout(x, path="state"):
    """{path: (shape, dtype, device)} of every tensor reachable from a selector's attributes."""
    out = {}
    if isinstance(x, torch.Tensor):
        out[path] = (tuple(x.shape), x.dtype, x.device.type)
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        for f in dataclasses.fields(x):
            out |= layout(getattr(x, f.name), f"{path}.{f.name}")
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            out |= layout(v, f"{path}[{i}]")
    elif isinstance(x, dict):
        for k, v in x.items():
            out |= layout(v, f"{path}[{k!r}]")
    elif hasattr(x, "__dict__") and not callable(x) and type(x).__module__.split(".")[0] in ("locks", "baselines"):
        for k, v in vars(x).items():
            out |= layout(v, f"{path}.{k}")
    else:
        out[path] = type(x).__name__
    return out


def prefilled(method, mode, keys, values):
    info = LayerInfo(0, HQ, HKV, D, D ** -0.5)
    spec = MethodSpec(method, 256, options=METHODS[method])
    selector = spec.build(info)
    prefill_selector(selector, keys, values, torch.Generator().manual_seed(1), mode, max_new_tokens=8)
    return selector


@pytest.mark.parametrize("method", sorted(METHODS))
def test_random_prefill_state_has_the_real_layout(method):
    gen = torch.Generator().manual_seed(0)
    keys, values = torch.randn(B, HKV, L, D, generator=gen), torch.randn(B, HKV, L, D, generator=gen)
    real, rand = prefilled(method, "real", keys, values), prefilled(method, "random", keys, values)
    want, got = layout(real), layout(rand)
    assert want.keys() == got.keys()
    differ = {k: (want[k], got[k]) for k in want if want[k] != got[k]}
    assert not differ, differ
    capacity = L + 4
    shapes = []
    for selector in (real, rand):
        selector.start_static(capacity)
        k = torch.cat([keys, torch.randn(B, HKV, 4, D)], 2)
        v = torch.cat([values, torch.randn(B, HKV, 4, D)], 2)
        sel = selector.select_static(torch.randn(B, HQ, D), k, v, torch.tensor([L + 1]))
        shapes.append({f.name: tuple(t.shape) for f in dataclasses.fields(sel)
                       if isinstance(t := getattr(sel, f.name), torch.Tensor)})
    assert shapes[0] == shapes[1]


def test_the_memo_answers_each_expensive_key_once_and_keeps_no_copy():
    keys = torch.randn(1, HKV, L, D)
    memo = PrefillState(keys, torch.randn(1, HQ, 4, D), torch.Generator().manual_seed(0))
    assert ("lrqk.als", 8, "randn") in memo and ("shadowkv.svd",) in memo
    U, S, Vh = memo[("shadowkv.svd",)]
    assert U.shape == (1, L, HKV * D) and S.shape == (1, HKV * D) and Vh.shape == (1, HKV * D, HKV * D)
    assert bool((S[:, :-1] >= S[:, 1:]).all())  # singular values in descending order, as torch.linalg.svd's
    assert ("shadowkv.svd",) not in dict(memo)  # served once, then dropped
    assert ("shadowkv.chunks", 8, 80) not in memo  # cheap parts: computed by the selector
    assert ("locks.summaries", 16, 8, "none", "v4c8-head_int8-w32") not in memo  # unquantized: the selector builds
    assert ("locks.summaries", 16, 8, "int", "v2c8-head_int8-w32") not in memo  # another layout: likewise
    with pytest.raises(ValueError, match="mode"):
        PrefillState(keys, keys, torch.Generator(), "fake")
