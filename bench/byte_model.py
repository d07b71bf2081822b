"""The byte-bound model of a decode step (docs/launches.md): what FullKV and LOCKS read per step and layer, the
weights a whole step reads once, and the ceiling on LOCKS's whole-step speedup that bandwidth alone sets. The claims
report (paper_figs/claims.py) and the launch model (bench/launches.py) both read it from here."""
from __future__ import annotations

import functools

BYTES_BUDGET = 2048  # the write-up's budget at long context (scripts/bench_decode.py's default)


def step_bytes(shape: str, context: int, budget: int = BYTES_BUDGET) -> tuple[float, float]:
    """(FullKV, LOCKS) bytes of one decode step and layer over all KV heads (bf16 K/V), from the selectors' own
    accounting: LOCKS reads the candidate pages' summaries, the group's queries and the aggregated scores
    (LocksSelector.scoring_bytes), then the attended tokens' K/V."""
    import torch

    from bench.inputs import random_summaries
    from bench.shapes import ATTENTION
    from locks.core.selector import LayerInfo
    from locks.method.selector import LocksSelector

    hq, hkv, d = ATTENTION[shape]
    info = LayerInfo(0, hq, hkv, d, d ** -0.5, kv_element_bytes=2)
    selector = LocksSelector(info, budget, page_size=16, rank=8)
    selector.use_summaries(random_summaries(1, 1, 1, d, 8, 16, torch.device("cpu"), torch.Generator()))
    _, metadata, attended = selector.static_step_cost(context)
    token_kv = 2 * d * info.kv_element_bytes * hkv
    return float(context * token_kv), float(metadata + attended * token_kv)



@functools.cache
def weights_and_layers(shape: str) -> tuple[int, int]:
    """(bf16 weight bytes, layers) of the random-weight model bench/e2e.py builds for a shape (on the meta device)."""
    import torch

    from bench.e2e import build_model
    from bench.shapes import MODELS

    kind, overrides = MODELS[shape]
    model = build_model(kind, overrides, torch.device("meta"), torch.bfloat16)
    return sum(p.numel() * p.element_size() for p in model.parameters()), model.config.num_hidden_layers


def byte_ceiling(shape: str, context: int, batch: int = 1) -> float:
    """FullKV's whole-step bytes / LOCKS's at batch B: the weights W (bf16) are read once per step, the K/V (or
    LOCKS's reads) once per row and layer:  (W + B n full) / (W + B n locks)."""
    weights, layers = weights_and_layers(shape)
    full, locks = step_bytes(shape, context)
    return (weights + batch * layers * full) / (weights + batch * layers * locks)
