"""scripts/bench_e2e.py --dry-run over the methods added after the first six (tests/e2e/test_bench_e2e.py runs the
others, test_bench_e2e_magicpig.py MagicPIG; the files run on the two test workers): DoubleSparsity and Twilight
against FullKV, on CPU at tiny sizes under the Triton interpreter."""
from __future__ import annotations

import triton  # noqa: F401  (a dev dependency: a missing triton fails, it never skips)

from tests.e2e.test_bench_e2e import dry_run, same_bytes_per_row

LATE = ("doublesparsity", "twilight")


def test_bench_e2e_dry_run_of_the_later_methods(tmp_path):
    """Their static steps equal an eager run at batch 1 and 2, equal rows read the same bytes per row, they attend
    fewer tokens than FullKV at budget 128 of ~710 tokens (but read more bytes, their metadata being per query head),
    nothing crosses from the host, and their design's state is their labels or 4-bit keys on top of the whole K/V."""
    recs = dry_run(tmp_path, ("fullkv", "fullkv_sdpa", *LATE))
    pairs = {(r["method"], r["batch"]): r for r in recs if r["kind"] == "e2e"}
    assert set(pairs) == {(m, b) for m in ("fullkv", "fullkv_sdpa", *LATE) for b in (1, 2)}
    same_bytes_per_row(pairs)
    e2e = {m: r for (m, b), r in pairs.items() if b == 1}
    full = e2e["fullkv"]
    for method in LATE:
        r = e2e[method]
        assert r["ms_graph"] > 0 and r["timing"] == "eager_static" and r["h2d_bytes_per_step"] == 0
        assert r["attended_tokens"] < full["attended_tokens"]
        # per query head metadata at GLM's GQA group of 16 (DoubleSparsity's 16 label rows per token, Twilight's 4-bit
        # keys of each head's candidates): more bytes than FullKV's at 700 tokens, though fewer K/V
        assert r["kv_and_metadata_bytes_per_step"] > full["kv_and_metadata_bytes_per_step"], method
        assert r["fullkv_reference"] in ("fullkv", "fullkv_sdpa") and r["speedup_vs_fullkv"] > 0
        design = r["design_bytes"]
        assert design["kv"] == full["design_bytes"]["kv"] and design["state"] > 0 and design["host"] == 0, method
