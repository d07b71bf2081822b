"""Sweeps that prefill once (eval/sweep.py, hydra/launcher=grouped): a group of runs that differ only in method and
budget writes, token for token, what separate runs write, resumes where each of its runs stopped, and prefills each
sample once."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from eval.results import without_timings
from locks.core.registry import discover
from tests.helpers import ROUNDING_SENSITIVE, assert_records_close, decoded_as

ROOT = Path(__file__).resolve().parents[2]
BASE = ["model=tiny_random_llama", "benchmark.context_length=1024", "benchmark.num_samples=2",
        "benchmark.tasks=[niah_single_1,vt]", "logger=none"]
# every registered method once; the methods that share budget-independent prefill work (PrefillContext.shared) at a
# second budget too: two runs of one method in a group, the second served from the memo
JOBS = [(name, 128) for name in sorted(discover())] + [(name, 256) for name in ("locks", "shadowkv", "lrqk", "rocketkv")]


def configs(runs_dir: Path, extra=()):
    out = []
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        for name, budget in JOBS:
            cfg = compose("config", overrides=BASE + [f"method={name}", f"budget={budget}",
                                                      f"paths.runs_dir={runs_dir}", *extra])
            out.append((OmegaConf.to_container(cfg, resolve=True), cfg))
    return out


def rows(run_dir: Path) -> list[dict]:
    return [without_timings(json.loads(line)) for line in (run_dir / "predictions.jsonl").read_text().splitlines()]


def metrics(run_dir: Path) -> dict:
    return without_timings(json.loads((run_dir / "metrics.json").read_text()))


@pytest.fixture(scope="module")
def separate(tmp_path_factory):
    """Each job as its own run (what the basic launcher does, in one process here)."""
    from eval.runner import run_benchmark

    runs = tmp_path_factory.mktemp("separate")
    for config, cfg in configs(runs):
        run_benchmark(config, cfg)
    return runs


def run_dirs(runs: Path) -> dict[str, Path]:
    return {p.name: p for p in runs.iterdir() if (p / "metrics.json").exists()}


def test_a_group_writes_what_separate_runs_write_and_prefills_once(separate, tmp_path, monkeypatch):
    from eval.sweep import run_group

    events = tmp_path / "events.jsonl"
    monkeypatch.setenv("LOCKS_EVENTS", str(events))
    runs = tmp_path / "grouped"
    jobs = configs(runs)
    run_group([c for c, _ in jobs], [cfg for _, cfg in jobs], progress=False)
    want, got = run_dirs(separate), run_dirs(runs)
    assert set(got) == set(want) and len(got) == len(set(JOBS))  # same run keys, one directory per (method, budget)
    for name in want:
        assert rows(got[name]) == rows(want[name]), name
        assert metrics(got[name]) == metrics(want[name]), name
    log = [json.loads(line) for line in events.read_text().splitlines()]
    assert sum(e["event"] == "model_load" for e in log) == 1
    prefills = [e for e in log if e["event"] == "prefill"]
    assert len(prefills) == 4 and all(e["shared_by"] == len(got) for e in prefills)  # 2 tasks x 2 samples


def test_a_killed_group_resumes_where_each_run_stopped(separate, tmp_path, monkeypatch):
    from eval.sweep import run_group

    runs = tmp_path / "resumed"
    runs.mkdir()
    want = run_dirs(separate)
    names = sorted(want)
    complete, partial = names[0], names[1]
    shutil.copytree(want[complete], runs / complete)  # finished before the kill: skipped, never rerun
    (runs / partial).mkdir()
    first = (want[partial] / "predictions.jsonl").read_text().splitlines()[0]
    (runs / partial / "predictions.jsonl").write_text(first + "\n" + '{"task": "vt", "ind')  # + a torn line
    events = tmp_path / "events.jsonl"
    monkeypatch.setenv("LOCKS_EVENTS", str(events))
    jobs = configs(runs)
    run_group([c for c, _ in jobs], [cfg for _, cfg in jobs], progress=False)
    got = run_dirs(runs)
    for name in want:
        assert rows(got[name]) == rows(want[name]), name
    log = [json.loads(line) for line in events.read_text().splitlines()]
    started = [e["job"] for e in log if e["event"] == "job_start"]
    assert len(started) == len(want) - 1  # the complete run was skipped
    assert sum(e["event"] == "prefill" for e in log) == 4  # the partial run still needed every sample but one


def test_a_group_at_batch_3_writes_what_separate_runs_at_batch_1_write(separate, tmp_path):
    """Every method, its samples decoded three at a time from the group's captures (docs/batching.md): the same
    rows (in the order the samples finished) and metrics, up to the float rounding of the batched model. LRQK
    selects by a tolerance-stopped solver whose basis is updated every step, so that rounding can flip a near-tie
    of its scores in float32 and its hit/miss and attended counts differ slightly (up to 1.1 % on this random model);
    in float64 they are equal too (tests/core/test_batch.py). DoubleSparsity's 2-bit labels flip the same way when
    a value sits at a rounding boundary of its code (tests/helpers.py: ROUNDING_SENSITIVE). Such a flip can also
    change a later generated token of the random model (seen on an AMD EPYC machine): for at most one sample of such
    a method the rows then differ from that token on, and must still agree on their first word and score; the run's
    score must be equal.

    On this CPU batch 1 decodes eagerly and a batch of rows in the stacked static step (static_decode=auto, no loop
    over rows): the records say so (decode_mode, decode_instrumented) and agree in everything else."""
    from eval.sweep import run_group

    runs = tmp_path / "batched"
    jobs = configs(runs, ["batch_size=3"])
    run_group([c for c, _ in jobs], [cfg for _, cfg in jobs], progress=False)
    want, got = run_dirs(separate), run_dirs(runs)
    assert set(got) == set(want)  # batch_size is not part of the run key

    def how_decoded(records: list[dict], mode: str) -> list[dict]:
        assert decoded_as(records) <= {mode, "eager"}  # a last batch of one row is eager
        return records

    for name in want:
        mine = {r["id"]: r for r in how_decoded(rows(got[name]), "static")}
        assert len(mine) == len(rows(got[name]))
        theirs = {r["id"]: r for r in how_decoded(rows(want[name]), "eager")}
        sensitive = any(f"_{method}_" in name for method in ROUNDING_SENSITIVE)
        rel = 5e-2 if sensitive else 1e-6
        if sensitive:  # a near-tie may change a later token (docstring): the first word and score hold
            for key in set(mine) & set(theirs):
                a, b = mine[key]["prediction"], theirs[key]["prediction"]
                if a != b:  # the rows decoded different tokens from the flip on: their step metrics differ too
                    assert a.split()[:1] == b.split()[:1] and mine[key]["score"] == theirs[key]["score"], (name, key)
                    mine.pop(key), theirs.pop(key)
            assert len(mine) >= len(rows(want[name])) - 1  # at most one sample flipped
        assert_records_close(mine, theirs, name, rel=rel)
        batched, alone = metrics(got[name]), metrics(want[name])
        assert batched.pop("batch_size") == 3 and alone.pop("batch_size") == 1
        (mode,), (alone_mode,) = decoded_as([batched]), decoded_as([alone])  # metrics.json: the modes, joined
        assert "static" in mode and alone_mode == "eager"
        if not sensitive or len(mine) == len(rows(want[name])):  # a flipped sample moves the run's means
            assert_records_close(batched, alone, name, rel=rel)
        else:
            assert batched["average"] == alone["average"], name


def test_group_jobs_by_everything_but_method_and_budget():
    from eval.sweep import group_jobs

    a = {"method": {"name": "locks"}, "budget": 64, "seed": 1, "benchmark": {"name": "ruler"}}
    b = {**a, "method": {"name": "quest"}, "budget": 128}
    c = {**a, "seed": 2}
    assert group_jobs([a, b, c, a]) == [[0, 1, 3], [2]]


def test_grouped_launcher_end_to_end(tmp_path):
    """`python run.py -m ... hydra/launcher=grouped`: one process, one model load, one prefill per sample."""
    events = tmp_path / "events.jsonl"
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_SILENT="true", LOCKS_EVENTS=str(events))
    cmd = [sys.executable, str(ROOT / "run.py"), "-m", *BASE, "benchmark.tasks=[niah_single_1]",
           "method=locks,quest,fullkv", "budget=64,128", "hydra/launcher=grouped", f"paths.runs_dir={tmp_path}/runs",
           f"hydra.sweep.dir={tmp_path}/sweep"]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert len(run_dirs(tmp_path / "runs")) == 5  # FullKV's two budgets share one run
    log = [json.loads(line) for line in events.read_text().splitlines()]
    assert sum(e["event"] == "model_load" for e in log) == 1 and sum(e["event"] == "prefill" for e in log) == 2
    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and again.stdout.count("skipped: results exist") == 5
