"""paper_figs/memory_table.py: the device / host bytes table of every method at 128K and 1M, against the layouts it
sums, and the README's copy of it."""
from __future__ import annotations

from pathlib import Path

import pytest

from paper_figs import memory_table

ROOT = Path(__file__).resolve().parents[2]


def test_memory_table_against_the_layouts():
    t = memory_table.memory_table().set_index(["model", "context", "method"])
    for model, layers, hkv in (("GLM-4-9B", 40, 2), ("Llama-3.1-8B", 32, 8)):
        for L in memory_table.CONTEXTS:
            full = t.loc[(model, L, "FullKV")]
            assert full.kv_gib * 2 ** 30 == layers * L * 2 * 128 * 2 * hkv and full.state_gib == full.host_gib == 0
            locks = t.loc[(model, L, "LOCKS")]  # 804 B per page of 16 tokens (8192 B of K/V) + the fp32 head mean
            want = layers * hkv * (L // 16 * 804 + 4 * 128)
            assert locks.state_gib * 2 ** 30 == want and locks.kv_gib == full.kv_gib
            quest = t.loc[(model, L, "Quest")]  # max + min per page, its first two layers dense
            assert quest.state_gib * 2 ** 30 == (layers - 2) * hkv * L // 16 * 2 * 128 * 2
            shadow = t.loc[(model, L, "ShadowKV")]  # the sparse chunks' values on the host: almost half the cache
            assert 0.49 * full.kv_gib < shadow.host_gib < 0.5 * full.kv_gib and shadow.device_vs_fullkv < 0.4
            lrqk = t.loc[(model, L, "LRQK")]  # A_K [Hq, L, 32] bf16 per layer dominates its state
            assert lrqk.host_gib == full.kv_gib and lrqk.state_gib * 2 ** 30 > layers * 32 * L * 32 * 2
            assert t.loc[(model, L, "RocketKV")].host_gib == 0
            magicpig = t.loc[(model, L, "MagicPIG")]  # codes (150 int16) and |k~| per middle token, R (bf16), means
            want = (layers - 2) * hkv * ((L - 68) * (2 * 150 + 4) + 2 * 128 * 10 * 150 + 2 * 128)
            assert magicpig.state_gib * 2 ** 30 == want and magicpig.kv_gib == full.kv_gib
    assert t.loc[("Llama-3.1-8B", 1048576, "RocketKV")].device_vs_fullkv == pytest.approx(0.031, abs=0.001)


def test_docs_memory_shows_the_table_the_script_writes():
    """docs/memory.md (linked from the README) holds the per-method table that paper_figs/memory_table.py writes."""
    table = memory_table.compact_markdown(memory_table.memory_table()).strip()
    assert table in (ROOT / "docs" / "memory.md").read_text()
    assert "docs/memory.md" in (ROOT / "README.md").read_text()
