"""scripts/step_memory.py: what one decode step holds for a while, counted op by op (bench/live_tensors.py) and as
the process's resident growth; the two agree, and Quest's step holds what its reference attention gathers."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.live_tensors import LiveTensors

ROOT = Path(__file__).resolve().parents[2]


def test_live_tensors_counts_new_storages_until_freed_and_not_views_or_inputs():
    cache = torch.zeros(1000)
    with LiveTensors() as live:
        a = torch.ones(1000)  # 4000 B
        b = a * 2  # 8000 B held
        b.view(10, 100).add_(1)  # a view written in place: nothing new
        cache.add_(1)  # an input written in place: not counted
        del a  # 4000 B
        c = cache[:500] + 1  # 6000 B
        del b, c
    assert (live.peak, live.now) == (8000, 0)
    assert [(n, op) for n, op, _, _ in live.at_peak] == [(4000, "ones.default"), (4000, "mul.Tensor")]


def test_live_tensors_counts_a_replaced_buffer_by_what_it_adds():
    """A buffer from before the region replaced by a grown copy (torch.cat) counts the difference once the old one
    is freed, as the process's memory does."""
    state = {"buffer": torch.zeros(1000)}
    with LiveTensors() as live:
        state["buffer"] = torch.cat([state["buffer"], torch.zeros(250)])  # 1000 B new + 5000 B, then 4000 B freed
    assert (live.peak, live.now) == (6000, 1000)


def test_a_quest_step_holds_its_gathered_keys_and_values(tmp_path):
    """Quest at budget 512 (per query head, the reference backend, fp32) gathers 512 keys and values for each of the
    32 query heads: 2 x 32 x 512 x 128 x 4 B = 16 MiB, plus the step's index lists and logits."""
    out = tmp_path / "step.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "step_memory.py"), "--context", "2048", "--budget", "512",
           "--methods", "quest", "--modes", "eager", "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (record,) = json.loads(out.read_text())["records"]
    assert 16.0 <= record["tracked_mib"] <= 17.0, record
    assert record["resident_mib"] == pytest.approx(record["tracked_mib"], rel=0.15), record
    assert "index_select" in record["at_peak"][0] and "locks/core/reference.py" in record["at_peak"][0], record
    assert "| quest | eager | 2048 |" in out.with_suffix(".md").read_text()
