"""scripts/rehearse_scale.py at a small context: every method, each in a process of its own, replays the projected
prefill and decodes on the Llama-3.1-8B attention shape within its memory plan, and its records and table are
written; a plan that does not fit stops the method with one line before its prefill."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "rehearse_scale.py"


def test_every_method_rehearses_within_its_plan(tmp_path):
    out = tmp_path / "rehearsal.json"
    cmd = [sys.executable, str(SCRIPT), "--context", "4096", "--new-tokens", "3", "--budget", "512", "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = json.loads(out.read_text())["records"]
    assert [r["method"] for r in records] == "fullkv,locks,quest,shadowkv,rocketkv,lrqk,oracle,oracle_token".split(",")
    for r in records:
        assert r["within_plan"] and r["tokens"] == 3 and r["decode_steps"] == 2, r
        assert 0 < r["peak_gib"] <= r["plan_gib"] + 0.5, r  # scripts/rehearse_scale.py: RUNTIME_GIB
        full = r["method"] == "fullkv"
        # LRQK's factorization and ShadowKV's SVD hold more for a while: the plan counts it (one layer at a time)
        assert ("method prefill work (one layer)" in r["plan_terms"]) == (r["method"] in ("lrqk", "shadowkv")), r
        assert (r["attended_tokens_per_step"] > 4000) == full, r  # every method but FullKV selects
    assert "| lrqk | 4096 |" in out.with_suffix(".md").read_text()


def test_a_plan_that_does_not_fit_stops_the_method_in_one_line(tmp_path):
    out = tmp_path / "rehearsal.json"
    cmd = [sys.executable, str(SCRIPT), "--context", str(1 << 24), "--methods", "lrqk", "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    (record,) = json.loads(out.read_text())["records"]
    assert record["error"].startswith("memory plan: the run needs") and "\n" not in record["error"], record
