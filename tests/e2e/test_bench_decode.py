"""scripts/bench_decode.py (bench/decode.py) --dry-run: the whole benchmark on CPU at tiny sizes under the Triton interpreter.

Timings on CPU are meaningless; this checks the plumbing (every method x shape measured or skipped with a reason,
fields of each record, JSON lines appended as it goes) and the script's own correctness checks (each fused method
against the PyTorch reference once per configuration).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton  # noqa: E402,F401  (a dev dependency: a missing triton fails, it never skips)

from bench import decode as bench_decode
from bench.shapes import ATTENTION

ROOT = Path(__file__).resolve().parents[2]


def test_bench_decode_dry_run(tmp_path):
    out = tmp_path / "bench.jsonl"
    out.write_text('{"kind": "earlier run"}\n')  # appended to, never truncated
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_decode.py"), "--dry-run", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = out.read_text().splitlines()
    recs = [json.loads(line) for line in lines]  # strict JSON on every line
    assert recs[0] == {"kind": "earlier run"}
    run = [r for r in recs if r["kind"] == "run"]
    assert len(run) == 1 and run[0]["args"]["dry_run"] and run[0]["triton"]

    shapes = bench_decode.parse_args(["--dry-run"]).shapes
    assert set(shapes) == {"llama", "glm"}
    for shape in shapes:
        mine = [r for r in recs if r.get("shape") == shape]
        done = {r["method"]: r for r in mine if r["kind"] == "measurement"}
        skipped = {r["method"]: r for r in mine if r["kind"] == "skip"}
        for m in bench_decode.METHODS:
            assert m in done or m in skipped, f"{shape}: {m} neither measured nor skipped"
            if m in skipped:
                assert skipped[m]["reason"] and m in ("sdpa_cudnn", "sdpa_flash", "flash_attn_kvcache"), skipped[m]
        # our own kernels and the reference are always measured
        for m in ("triton_full", "locks_fused", "locks_score", "topk", "locks_decode", "quest_fused",
                  "quest_fused_per_head", "locks_torch", *bench_decode.SELECTOR_STEPS):
            r = done[m]
            assert r["ms"] > 0 and r["reps"] == 2 and r["timing"] == "cpu_wall" and r["bytes"] > 0 and r["gbps"] > 0
        assert "speedup_vs_fastest_fullkv" in done["locks_fused"] and done["locks_fused"]["fastest_fullkv"]
        assert 0 < done["topk"]["share_of_locks_fused"] and done["topk"]["topk_shape"][-1] > 0
        # analytic bytes: LOCKS reads fewer bytes than FullKV, and its summary part is 804 B/page at d=128
        # (here d=64: 484 B/page), plus attended K/V and queries
        assert done["locks_fused"]["bytes"] < done["triton_full"]["bytes"]
        assert done["locks_fused"]["bytes_with_intermediates"] > done["locks_fused"]["bytes"]
        # correctness: each fused method was compared with the reference once per configuration, and passed
        checks = {r["method"]: r for r in mine if r["kind"] == "check"}
        for m in ("triton_full", "locks_fused", "quest_fused", "quest_fused_per_head"):
            c = checks[m]
            assert c["ok"] and c["max_rel_err"] <= c["tolerance"] <= 1e-2, c
        for m in ("locks_fused", "quest_fused", "quest_fused_per_head"):
            assert checks[m]["set_agreement"] == 1.0 and checks[m]["score_rel_err"] <= 1e-3
        # every other selector through its own static step (the token Oracle: its exact top-k), checked against
        # the reference attention over its selection, with its own bytes accounting and host traffic
        bandwidth = next(r for r in recs if r["kind"] == "bandwidth")["bytes_per_s"]
        for m in bench_decode.SELECTOR_STEPS:
            assert checks[m]["ok"] and checks[m]["max_rel_err"] <= 1e-2, checks[m]
            r = done[m]
            assert r["ms"] > 0 and 0 < r["bytes"] and 0 < r["attended_tokens"] <= 256 * r["Hq"] // r["Hkv"], (m, r)
            assert (r["h2d_bytes"] > 0) == (m in ("shadowkv_static", "lrqk_static")), m
            assert r["h2d_floor_ms"] == pytest.approx(1e3 * r["h2d_bytes"] / bandwidth)
            assert r["floor_ms"] > r["h2d_floor_ms"] and r["byte_ceiling"] > 0 and "speedup_vs_fastest_fullkv" in r
        # RocketKV attends fewer bytes than FullKV; the exact top-k reads every key to choose
        assert done["rocketkv_static"]["bytes"] < done["triton_full"]["bytes"] < done["oracle_token_topk"]["bytes"]
    # printed as it goes: one line per measurement
    assert proc.stdout.count("ms (cpu_wall)") == sum(r["kind"] == "measurement" for r in recs)


def test_bench_decode_arguments():
    a = bench_decode.parse_args([])
    assert a.contexts == [131072, 262144, 1048576] and a.shapes == ["llama", "glm"] and a.batch == [1, 4]
    assert a.budget == 2048 and a.reps >= 20 and a.summaries == "random"
    assert ATTENTION == {"llama": (32, 8, 128), "glm": (32, 2, 128)}
    with pytest.raises(SystemExit):
        bench_decode.parse_args(["--reps", "5"])


def test_a_dry_run_never_writes_the_committed_gpu_results():
    """Without --out a GPU run appends to results/gpu/, a --dry-run (CPU records) to a scratch file elsewhere."""
    import tempfile

    from bench.records import out_path

    committed = "results/gpu/decode.jsonl"
    assert out_path(None, False, committed) == committed
    scratch = Path(out_path(None, True, committed))
    assert scratch.name == "decode.jsonl" and scratch.is_relative_to(tempfile.gettempdir())
    assert not scratch.resolve().is_relative_to(ROOT)
    assert out_path("/x/y.jsonl", True, committed) == "/x/y.jsonl"
