"""scripts/bench_batch.py on the tiny random model: the throughput part at batch 1 and 2 writes its records and
tables, every batch predicts what batch 1 predicts (batch 1 eager, batch 2 in the stacked static step), and the
attention function's time is a share of the decode."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_batch_throughput_part_on_the_tiny_model(tmp_path):
    out = tmp_path / "bench_batch.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_batch.py"), "--out", str(out), "--num-samples", "3",
           "--batches", "1", "2", "--methods", "fullkv,locks", "--no-sweep",
           "--extra", "model=tiny_random_llama", "benchmark.context_length=1024"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    records = result["throughput"]
    assert [(r["method"], r["batch"]) for r in records] == [("fullkv", 1), ("fullkv", 2), ("locks", 1), ("locks", 2)]
    for r in records:
        assert r["samples"] == 3 and r["identical_predictions"] and r["decode_s"] > 0
        assert 0 < r["attention_share"] < 1 and r["state_bytes"] > 0
        # 3 samples at batch 2: a batch of two rows (stacked static step) and a last one of one row (eager)
        assert r["decode_mode"] == ("eager" if r["batch"] == 1 else "eager,static")
        assert r["decode_speedup"] > 0 and (r["batch"] > 1 or r["decode_speedup"] == 1.0)
    table = out.with_suffix(".md").read_text()
    assert "| fullkv |" in table and "| locks |" in table and "batch 2" in table
    again = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_batch.py"), "--table", str(out)],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and again.stdout == table
