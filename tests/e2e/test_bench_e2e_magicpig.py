"""scripts/bench_e2e.py --dry-run of MagicPIG against FullKV (a file of its own, so that the test workers share the
dry runs), on CPU at tiny sizes under the Triton interpreter."""
from __future__ import annotations

import triton  # noqa: F401  (a dev dependency: a missing triton fails, it never skips)

from tests.e2e.test_bench_e2e import dry_run, same_bytes_per_row

MAGICPIG = ("magicpig",)


def test_bench_e2e_dry_run_of_magicpig(tmp_path):
    """Its fused static step equals an eager run at batch 1 and 2, equal rows read the same bytes per row, it attends
    fewer tokens than FullKV at budget 128 of ~710 tokens but reads more bytes (every middle token's hash codes),
    nothing crosses from the host, and its design's state (codes, norms, projections) sits on top of the whole K/V."""
    recs = dry_run(tmp_path, ("fullkv", *MAGICPIG))
    pairs = {(r["method"], r["batch"]): r for r in recs if r["kind"] == "e2e"}
    assert set(pairs) == {(m, b) for m in ("fullkv", *MAGICPIG) for b in (1, 2)}
    same_bytes_per_row(pairs)
    full, r = pairs["fullkv", 1], pairs["magicpig", 1]
    assert r["ms_graph"] > 0 and r["timing"] == "eager_static" and r["h2d_bytes_per_step"] == 0
    assert r["attended_tokens"] < full["attended_tokens"]
    assert r["kv_and_metadata_bytes_per_step"] > full["kv_and_metadata_bytes_per_step"]
    assert r["fullkv_reference"] == "fullkv" and r["speedup_vs_fullkv"] > 0
    design = r["design_bytes"]
    assert design["kv"] == full["design_bytes"]["kv"] and design["state"] > 0 and design["host"] == 0
