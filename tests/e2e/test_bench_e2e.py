"""scripts/bench_e2e.py (bench/e2e.py) --dry-run: the whole-model benchmark on CPU at tiny sizes under the Triton
interpreter, and scripts/fit_t_node.py on its records. Timings on CPU are meaningless; this checks the plumbing and
the script's own checks (each static step against an eager run)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton  # noqa: F401  (a dev dependency: a missing triton fails, it never skips)

from bench import e2e as bench_e2e
from bench.e2e import FULLKV

ROOT = Path(__file__).resolve().parents[2]


# the methods of this file's dry run; tests/e2e/test_bench_e2e_late.py runs the rest (two files: two test workers)
FIRST = ("fullkv", "fullkv_sdpa", "locks", "quest", "shadowkv", "rocketkv", "lrqk")


def dry_run(tmp_path, methods) -> list[dict]:
    """scripts/bench_e2e.py --dry-run over `methods` at batch 1 and 2 -> its records, after the checks every method
    must pass: each static step equals an eager run, and the run measured the host copy bandwidth."""
    out = tmp_path / "e2e.jsonl"
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_e2e.py"), "--dry-run", "--shapes", "glm",
                           "--batch", "1", "2", "--methods", *methods, "--out", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert recs[0]["kind"] == "run" and recs[0]["script"] == "bench_e2e"
    checks = [r for r in recs if r["kind"] == "check"]
    assert len(checks) == 2 * len(methods) and all(c["ok"] and c["max_rel_err"] <= 1e-2 for c in checks)
    assert len([r for r in recs if r["kind"] == "bandwidth"]) == 1
    return recs


def same_bytes_per_row(pairs: dict) -> None:
    """Batch 2 reads the weights once and each row's K/V and metadata as batch 1 does (the rows' random K/V differ,
    so only FullKV is exact)."""
    for (method, batch), r in pairs.items():
        if batch == 2:
            one = pairs[(method, 1)]
            assert r["bytes_per_step"] == pytest.approx(r["weights_bytes"] + 2 * r["kv_and_metadata_bytes_per_step"])
            tol = 0 if method.startswith("fullkv") else 0.05
            assert r["kv_and_metadata_bytes_per_step"] == pytest.approx(one["kv_and_metadata_bytes_per_step"],
                                                                        rel=tol), method
            assert r["attended_tokens"] == pytest.approx(one["attended_tokens"], rel=tol), method


def test_bench_e2e_dry_run(tmp_path):
    """scripts/bench_e2e.py --dry-run: random-weight GLM-shaped model, cache filled at 700 tokens and every
    selector's own prefill on it, the static step of FullKV (twice), LOCKS, Quest, ShadowKV, RocketKV and LRQK (eager
    on CPU) at batch 1 and 2, its check against an eager run, and the e2e records: equal rows read the same bytes per
    row and the weights once per step; host-to-device bytes with their floor at the run's measured copy bandwidth;
    each method's own design's device and host bytes."""
    from tests.e2e.test_bench_e2e_late import LATE
    from tests.e2e.test_bench_e2e_magicpig import MAGICPIG

    assert set(bench_e2e.METHODS) == set(FIRST) | set(LATE) | set(MAGICPIG)
    methods = FIRST
    recs = dry_run(tmp_path, methods)
    bandwidth = [r for r in recs if r["kind"] == "bandwidth"]
    pairs = {(r["method"], r["batch"]): r for r in recs if r["kind"] == "e2e"}
    assert set(pairs) == {(m, b) for m in methods for b in (1, 2)}
    same_bytes_per_row(pairs)
    e2e = {m: r for (m, b), r in pairs.items() if b == 1}
    for method, r in e2e.items():
        assert r["ms_graph"] > 0 and r["tokens_per_s"] > 0 and r["timing"] == "eager_static"
        assert r["bytes_per_step"] > r["weights_bytes"] > 0
    full = e2e["fullkv"]
    assert full["attended_tokens"] > 700 and "speedup_vs_fullkv" not in full
    assert e2e["fullkv_sdpa"]["bytes_per_step"] == full["bytes_per_step"]
    faster = min(("fullkv", "fullkv_sdpa"), key=lambda m: e2e[m]["ms_graph"])
    assert e2e["locks"]["fullkv_reference"] == faster  # speedups against the faster FullKV
    assert e2e["locks"]["speedup_vs_fullkv"] == pytest.approx(e2e[faster]["ms_graph"] / e2e["locks"]["ms_graph"])
    assert e2e["locks"]["attended_tokens"] <= 128  # quest keeps its first 2 of the 3 layers dense
    for method in ("locks", "quest"):  # budget 128 of ~710 tokens: fewer K/V bytes than FullKV
        assert e2e[method]["attended_tokens"] < full["attended_tokens"]
        assert e2e[method]["kv_and_metadata_bytes_per_step"] < full["kv_and_metadata_bytes_per_step"]
        assert e2e[method]["byte_ceiling"] > 1 and e2e[method]["speedup_vs_fullkv"] > 0
    for method, r in e2e.items():  # the floor adds the host reads at the measured copy bandwidth
        assert r["h2d_floor_ms"] == pytest.approx(1e3 * r["h2d_bytes_per_step"] / bandwidth[0]["bytes_per_s"])
        assert r["floor_ms"] == pytest.approx(r["byte_floor_ms"] + r["h2d_floor_ms"])
        assert (r["h2d_bytes_per_step"] > 0) == (method in ("shadowkv", "lrqk")), method  # their misses
        if method not in FULLKV:
            assert r["byte_ceiling"] == pytest.approx(e2e[r["fullkv_reference"]]["floor_ms"] / r["floor_ms"])
        assert r["cache_and_state_bytes"] is None and r["prefill_state"] == "real"  # CPU: no device memory
    design = {m: r["design_bytes"] for m, r in e2e.items()}
    assert design["fullkv"]["kv"] == 3 * 700 * 2 * 64 * 2  # 3 layers of 700 tokens, 1 KV head, bf16
    assert design["locks"]["kv"] == design["fullkv"]["kv"] < design["locks"]["kv"] + design["locks"]["state"]
    for method in ("shadowkv", "rocketkv"):  # keep fewer tokens' K/V on the device than the cache holds
        assert design[method]["kv"] < design["fullkv"]["kv"], method
    assert design["shadowkv"]["host"] > 0 and design["lrqk"]["host"] > 0 and design["rocketkv"]["host"] == 0
    check_t_node_fit(recs, tmp_path)


def check_t_node_fit(recs: list[dict], tmp_path):
    """scripts/fit_t_node.py on the dry run's records: refused (CPU timings, no device profile); on the same records
    turned into GPU ones whose steps cost their floor plus 3 µs per profiled kernel, it recovers 3 µs."""
    from tests.helpers import load_script

    fit_t_node = load_script("fit_t_node")
    dry = tmp_path / "dry.jsonl"
    dry.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert fit_t_node.main([str(dry)]) == 1
    gpu = []
    for r in recs:
        if r["kind"] == "profile":
            gpu.append(dict(r, time_unit="device_us", kernels_per_step=100 + 37 * len(gpu)))
    steps = {tuple(p[k] for k in ("shape", "context", "batch", "method")): p["kernels_per_step"] for p in gpu}
    for r in recs:
        if r["kind"] == "e2e":
            nodes = steps[(r["shape"], r["context"], r["batch"], r["method"])]
            gpu.append(dict(r, timing="cuda_graph", ms_graph=r["floor_ms"] + nodes * 3e-3))
    assert len(gpu) == 2 * len(steps) > 4
    path = tmp_path / "gpu.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in gpu))
    assert fit_t_node.main([str(path), "--out", str(tmp_path / "t_node.json")]) == 0
    result = json.loads((tmp_path / "t_node.json").read_text())
    assert result["t_node_us"] == pytest.approx(3.0) and result["steps"] == len(steps)
    assert result["rms_residual_us"] == pytest.approx(0.0, abs=1e-6)
    assert fit_t_node.main([str(tmp_path / "missing.jsonl")]) == 2
