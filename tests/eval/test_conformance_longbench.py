"""LongBench scorers against the official code (THUDM/LongBench 2e00731, `LongBench/eval.py` + `metrics.py`).

The goldens in tests/fixtures/conformance/longbench/ hold, for each of the 21 tasks, 300 prediction/answer pairs
with upstream's per-example score, and (task_scores.json) upstream's task score and, for the 13 LongBench-E tasks,
its length-bucket scores; fixtures/conformance/longbench/README.md names the commit and the command.  Checked here:
`metrics.example_score` per example (1e-9), `metrics.scorer` / `metrics.scorer_e`, and the benchmark's own scoring
and aggregation path (`LongBench.score` + `aggregate`, `LongBenchE`), which must give the same numbers.
"""
import json
import math
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from eval.longbench import metrics
from eval.longbench.benchmark import TASKS, TASKS_E, LongBench, LongBenchE

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "fixtures" / "conformance" / "longbench"
TASK_SCORES = json.loads((GOLDEN / "task_scores.json").read_text(encoding="utf-8"))


def _rows(task):
    with open(GOLDEN / f"{task}.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def _bench(name, cls):
    cfg = OmegaConf.merge(OmegaConf.load(ROOT / "conf" / "benchmark" / f"{name}.yaml"),
                          {"data_dir": str(ROOT / "tests" / "fixtures" / "longbench")})
    return cls(cfg)


def _buckets_equal(got, want):
    """Upstream gives NaN for an empty bucket (stored as null); metrics.scorer_e NaN, the benchmark None."""
    def norm(v):
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else v

    return {k: norm(v) for k, v in got.items()} == {k: norm(v) for k, v in want.items()}


def test_goldens_cover_every_task():
    assert sorted(TASK_SCORES) == sorted(TASKS)
    for task in TASKS:
        assert len(_rows(task)) == 300, task
    assert all("e_buckets" in TASK_SCORES[t] for t in TASKS_E)


@pytest.mark.parametrize("task", TASKS)
def test_per_example_and_task_scores_match_upstream(task):
    rows = _rows(task)
    classes = TASK_SCORES[task]["all_classes"]
    failures = []
    for row in rows:
        got = metrics.example_score(task, row["pred"], row["answers"], classes)
        if not math.isclose(got, row["official"], rel_tol=0.0, abs_tol=1e-9):
            failures.append(f"{row['id']}: pred={row['pred'][:200]!r} answers={str(row['answers'])[:200]} "
                            f"-> harness {got!r}, official {row['official']!r}")
    assert not failures, f"{task}: {len(failures)} differing example(s); first: {failures[0]}"

    preds, answers = [r["pred"] for r in rows], [r["answers"] for r in rows]
    assert metrics.scorer(task, preds, answers, classes) == TASK_SCORES[task]["score"]
    if task in TASKS_E:
        lengths = [r["length"] for r in rows]
        assert _buckets_equal(metrics.scorer_e(task, preds, answers, lengths, classes),
                              TASK_SCORES[task]["e_buckets"])
        short = [i for i, n in enumerate(lengths) if n < 8000]
        assert _buckets_equal(metrics.scorer_e(task, [preds[i] for i in short], [answers[i] for i in short],
                                               [lengths[i] for i in short], classes),
                              TASK_SCORES[task]["e_buckets_below_8000"])


def _benchmark_rows(bench, task, rows):
    sample = {"task": task, "all_classes": TASK_SCORES[task]["all_classes"]}
    return [{"task": task, "length": r["length"], "score": bench.score(r["pred"], {**sample, "outputs": r["answers"]})}
            for r in rows]


def test_benchmark_aggregation_matches_upstream():
    """The path a run takes (LongBench.score -> aggregate) gives upstream's task and bucket scores."""
    bench = _bench("longbench", LongBench)
    rows = [x for task in TASKS for x in _benchmark_rows(bench, task, _rows(task))]
    assert bench.aggregate(rows)["scores"] == {t: TASK_SCORES[t]["score"] for t in TASKS}

    bench_e = _bench("longbench_e", LongBenchE)
    rows_e = [x for task in TASKS_E for x in _benchmark_rows(bench_e, task, _rows(task))]
    agg = bench_e.aggregate(rows_e)
    for task in TASKS_E:
        assert agg["scores"][task] == TASK_SCORES[task]["score"], task
        assert _buckets_equal(agg["scores_by_length"][task], TASK_SCORES[task]["e_buckets"]), task
    agg_short = bench_e.aggregate([r for r in rows_e if r["length"] < 8000])
    for task in TASKS_E:
        assert _buckets_equal(agg_short["scores_by_length"][task], TASK_SCORES[task]["e_buckets_below_8000"]), task
