"""paper_figs/claims.py: each claim's value, verdict and source from fixture runs with per-sample scores, and the
bytes model against the formula it implements."""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from paper_figs import claims

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = json.loads((ROOT / "tests" / "fixtures" / "report" / "metrics_template.json").read_text())
N = 40


def run(method, budget, correct, coverage=None, sound=None):
    """A metrics.json of niah_single_2 with `correct` of N samples right."""
    m = copy.deepcopy(TEMPLATE)
    m["method"] = {**m["method"], "name": method, "budget": budget}
    m["budget"] = budget
    if method == "fullkv":
        m["method"] = {"name": "fullkv", "budget": None}
        m["budget"] = m["budget_mode"] = None
    m["samples"] = {f"niah_single_2/2048/{i}": {"task": "niah_single_2", "score": 100.0 if i < correct else 0.0}
                    for i in range(N)}
    m["scores"] = {"niah_single_2": 100.0 * correct / N}
    m["average"] = m["scores"]["niah_single_2"]
    m["num_samples"] = {"niah_single_2": N}
    m["per_length"]["task_scores"] = {"4096": dict(m["scores"])}
    m["coverage"] = coverage if coverage is not None else 1.0
    m["diagnostics"] = {} if sound is None else {"certificate": 0.2, "plugin_coverage": 0.8,
                                                  "certificate_sound": sound}
    return m


def write_results(root: Path, locks_sound: float = 1.0) -> Path:
    d = root / "ruler_embedded"
    d.mkdir(parents=True)
    runs = {"fullkv": run("fullkv", None, 38),
            "oracle_b64": run("oracle", 64, 30, coverage=0.80), "oracle_b128": run("oracle", 128, 36, coverage=0.90),
            "locks_b64": run("locks", 64, 30, coverage=0.78, sound=locks_sound),
            "locks_b128": run("locks", 128, 35, coverage=0.80, sound=1.0),
            "quest_b64": run("quest", 64, 2, coverage=0.5), "quest_b128": run("quest", 128, 25, coverage=0.6)}
    for name, m in runs.items():
        (d / f"{name}.json").write_text(json.dumps(m))
    return root


def by_claim(table: pd.DataFrame) -> dict:
    """Rows by claim, without the suite a RULER row names ("... (SmolLM2-135M-Instruct, RULER ... tokens)")."""
    return {re.sub(r" \([^()]*RULER[^()]*tokens\)$", "", r.claim): r for r in table.itertuples()}


def test_claims_from_fixture_runs(tmp_path):
    rows = by_claim(claims.claims_table(write_results(tmp_path)))
    ranking = rows["quantized rank-8 summaries rank pages almost like the exact-mass oracle"]
    assert ranking.verdict == "does not hold"  # 0.80 / 0.90 at b=128 < 0.95
    assert "b=64: 0.975" in ranking.measured and "b=128: 0.889" in ranking.measured
    assert rows["Quest collapses at budget 64"].verdict == "holds"  # 5 vs 95, 36 discordant pairs
    assert "; smallest detectable difference " in rows["Quest collapses at budget 64"].measured  # 36 of 40
    assert rows["Quest collapses at budget 128"].verdict == "does not hold"  # 62.5 > 95 / 2
    assert rows["LOCKS collapses at budget 64"].verdict == "does not hold"
    cert = rows["Theorem 1 coverage bound (the per-step certificate is a lower bound on coverage)"]
    assert cert.verdict == "holds" and "over 2 runs, 80 samples" in cert.measured
    assert all(r.verdict == "not measured" for c, r in rows.items() if "speedup" in c)  # no results/gpu here
    assert all("ruler_embedded" in r.source for c, r in rows.items() if "collapses" in c)
    assert all(r.configuration for r in rows.values())  # every row names its configuration
    assert "LOCKS b=64 fair, forced: the partial page, sink_pages=1, recent_window=64" in \
        rows["LOCKS collapses at budget 64"].configuration  # the fixture's recorded options
    # the write-up's parity claim: 30 vs 38 of 40 is a loss of 20 points, its interval far below -1
    assert rows["LOCKS within about 1 point of FullKV at budget 64"].verdict == "does not hold"
    assert rows["LOCKS within about 1 point of FullKV at budget 128"].verdict == "not separated"  # 35 vs 38
    above = rows["LOCKS above FullKV at its largest budget, 128"]
    assert above.verdict == "not separated" and "one-sided p=" in above.measured


def test_locks_above_fullkv_is_a_one_sided_paired_test(tmp_path):
    """LOCKS right on 8 samples where FullKV is wrong (and never the reverse): one-sided p = 2^-8 < 0.05, holds; the
    parity row at that budget holds too (the interval's lower end is above -1)."""
    d = tmp_path / "ruler_embedded"
    d.mkdir()
    full, locks = run("fullkv", None, 30), run("locks", 256, 38, coverage=0.9, sound=1.0)
    for name, m in {"fullkv": full, "locks_b256": locks}.items():
        (d / f"{name}.json").write_text(json.dumps(m))
    rows = by_claim(claims.claims_table(tmp_path))
    above = rows["LOCKS above FullKV at its largest budget, 256"]
    assert above.verdict == "holds" and f"one-sided p={2 ** -8:.2g}" in above.measured
    assert rows["LOCKS within about 1 point of FullKV at budget 256"].verdict == "holds"


def test_an_unsound_certificate_is_reported(tmp_path):
    rows = by_claim(claims.claims_table(write_results(tmp_path, locks_sound=0.999)))
    assert rows["Theorem 1 coverage bound (the per-step certificate is a lower bound on coverage)"].verdict == \
        "does not hold"


def test_missing_results_are_not_measured(tmp_path):
    table = claims.claims_table(tmp_path)
    assert table.loc[table["claim"].str.startswith("RULER claims"), "verdict"].item() == "not measured"
    assert table["configuration"].str.len().gt(0).all()
    assert (table.loc[table["claim"].str.startswith("bytes"), "verdict"] == "holds").all()


def test_bytes_model_matches_the_formula():
    """FullKV reads 2 d s bytes per token and KV head; LOCKS reads, per candidate page, its summary (804 B at
    d = 128, rank 8, page 16) and 8 B of fp32 scores, the group's queries once, and the attended tokens' K/V."""
    for shape, (hq, hkv, d) in (("llama", (32, 8, 128)), ("glm", (32, 2, 128))):
        L, budget, n = 1048576, claims.BYTES_BUDGET, 16
        full, locks = claims.step_bytes(shape, L)
        assert full == L * 2 * d * 2 * hkv
        candidates = L // n  # nothing forced but the partial page, empty at L = 2^20
        attended = budget
        want = hkv * (candidates * (804 + 8) + (hq // hkv) * d * 2 + attended * 2 * d * 2)
        assert locks == want, (shape, locks, want)


def test_byte_ceiling_at_batch_b_reads_weights_once_and_kv_per_row():
    """(W + B n full) / (W + B n locks): batch 1 is the old ceiling, it grows with B towards full / locks, the
    reachable batch is the smallest power of two that reaches the claim, and FullKV's memory counts every row."""
    weights, layers = claims.weights_and_layers("glm")
    L = 131072
    full, locks = claims.step_bytes("glm", L)
    for batch in (1, 4, 16):
        want = (weights + batch * layers * full) / (weights + batch * layers * locks)
        assert claims.byte_ceiling("glm", L, batch) == pytest.approx(want, rel=1e-12)
        assert claims.fullkv_memory("glm", L, batch) == weights + batch * layers * full
    ceilings = [claims.byte_ceiling("glm", L, b) for b in (1, 2, 4, 16, 1 << 20)]
    assert ceilings == sorted(ceilings) and ceilings[-1] < full / locks
    b = claims.reachable_batch("glm", L, 1.59)
    assert claims.byte_ceiling("glm", L, b) >= 1.59 > claims.byte_ceiling("glm", L, b // 2)
    assert claims.reachable_batch("glm", L, full / locks * 1.01) is None
    table = claims.ceiling_table()
    assert len(table) == len(claims.SHAPES) * len(claims.SPEEDUP_CLAIMS) * len(claims.BATCHES)
    md = claims.ceiling_markdown(table)
    assert md.count("\n| ") == 1 + len(claims.SHAPES) * len(claims.SPEEDUP_CLAIMS)
    speedups = [r for r in claims.speedup_rows(Path("/nonexistent")) if "1.59x" in r["claim"]]
    assert f"reachable from batch {b} (GLM-4-9B" in speedups[0]["measured"]


def anchor(rows, prefix):
    return next(r for c, r in rows.items() if c.startswith(prefix))


def test_anchor_claims_without_gpu_records_are_analytic_and_not_measured(tmp_path):
    """Each anchor's speed claim without results/gpu/: "not measured", with the byte-bound ceiling computed from the
    selector's own step (between 1 and the method's K/V ratio); the batch and memory claims from memory_bytes."""
    rows = by_claim(pd.DataFrame(claims.anchor_rows(tmp_path)))
    for prefix in ("Quest: 1.74x", "RocketKV: 3.7x", "ShadowKV: 6x", "RocketKV: 32.6%"):
        assert anchor(rows, prefix).verdict == "not measured", prefix
    quest = claims.whole_step_ceiling("llama", "quest", 32768)
    assert 1 < quest < 1.74 and f"{quest:.2f}x" in anchor(rows, "Quest: 1.74x").measured
    weights, layers = claims.weights_and_layers("llama")
    full = claims.step_bytes("llama", 131072)[0]
    rocket = claims.whole_step_ceiling("llama", "rocketkv", 131072)
    assert 1 < rocket < (weights + layers * full) / weights  # below the ceiling of reading no K/V at all
    # ShadowKV: FullKV's 16 GB-per-row cache at 122K leaves room for 3 rows next to 16 GB of weights in 80 GB
    assert claims.max_batch("llama", "fullkv", 124928, 80e9) == 3
    assert "24 vs FullKV's 3 rows" in anchor(rows, "ShadowKV: 6x").measured
    assert anchor(rows, "LOCKS saves bandwidth").verdict == "holds"  # 1.098x the device bytes, 0.1x the reads


def test_anchor_claims_from_gpu_records(tmp_path):
    """With e2e records: the measured speedup, tokens/s and peak memory decide the verdicts."""
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    recs = [{"kind": "run", "script": "bench_e2e"}]

    def e2e(method, context, batch, ms, tps, peak, speedup=None):
        r = {"kind": "e2e", "shape": "llama", "context": context, "method": method, "budget": 2048, "batch": batch,
             "ms_graph": ms, "timing": "cuda_graph", "tokens_per_s": tps, "bytes_per_step": 1e9,
             "peak_allocated_bytes": peak}
        if speedup is not None:
            r.update(speedup_vs_fullkv=speedup, byte_ceiling=speedup * 1.2, fullkv_reference="fullkv")
        return r

    recs += [e2e("fullkv", 32768, 1, 10.0, 100.0, 20e9), e2e("quest", 32768, 1, 8.0, 125.0, 21e9, speedup=1.25),
             e2e("fullkv", 131072, 1, 20.0, 50.0, 32e9), e2e("rocketkv", 131072, 1, 5.0, 200.0, 20e9, speedup=4.0),
             e2e("fullkv", 124928, 1, 20.0, 50.0, 32e9), e2e("shadowkv", 124928, 8, 40.0, 200.0, 60e9)]
    (gpu / "e2e.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    rows = by_claim(pd.DataFrame(claims.anchor_rows(tmp_path)))
    assert anchor(rows, "Quest: 1.74x").verdict == "does not hold" and "1.25x" in anchor(rows, "Quest: 1.74x").measured
    assert anchor(rows, "RocketKV: 3.7x").verdict == "holds"
    assert anchor(rows, "ShadowKV: 6x").verdict == "holds" and "4.00x tokens/s" in anchor(rows, "ShadowKV: 6x").measured
    memory = anchor(rows, "RocketKV: 32.6%")
    assert memory.verdict == "holds" and "measured 37.5% lower" in memory.measured  # 1 - 20 / 32
