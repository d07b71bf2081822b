"""The block-size variants of the Triton kernels that `scripts/bench_decode.py --tune` times on the GPU.

One list, read by the benchmark (to time them) and by `scripts/compile_kernels.py` (to compile each of them ahead
of time: a variant that does not compile or does not fit the GPU must be known before GPU time is spent).
Keys name the entry point; each variant is the keyword arguments it is called with.
"""
from __future__ import annotations

TUNING_VARIANTS: dict[str, list[dict]] = {
    # 64 pages per program spill registers at d = 128 (results/kernels_compile.md): not worth GPU time
    "locks_aggregated_scores": [dict(block_p=bp, num_warps=w) for bp in (16, 32) for w in (4, 8)],
    "full_decode": [dict(block_n=bn, num_warps=w) for bn in (32, 64, 128) for w in (4, 8)],
    "quest_group_scores": [dict(block_p=bp) for bp in (32, 64, 128)],
}
