"""RULER score aggregation (docs/benchmarks/ruler.md).

  * score at a length = plain mean of the task scores present (13 for full RULER);
  * per-category view (paper): NIAH = 8 niah tasks, VT, Aggregation = cwe + fwe, QA = qa_1 + qa_2,
    each the mean over the tasks of that category that are present (absent categories are omitted);
  * across lengths: Avg, wAvg(inc) (weights 1..n, shortest first), wAvg(dec) (n..1) and the effective
    length (threshold 85.6), as in ``metrics.aggregate_lengths``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from .metrics import EFFECTIVE_LENGTH_THRESHOLD, aggregate_lengths, length_score, task_score
from .tasks import ALL_TASKS, CATEGORIES


def category_scores(task_scores: Mapping[str, float]) -> dict[str, float]:
    """{category: mean of its present task scores}; unknown task names raise ValueError."""
    unknown = [t for t in task_scores if t not in ALL_TASKS]
    if unknown:
        raise ValueError(f"unknown RULER task(s) {unknown}")
    out = {}
    for cat, tasks in CATEGORIES.items():
        vals = [task_scores[t] for t in tasks if t in task_scores]
        if vals:
            out[cat] = sum(vals) / len(vals)
    return out


def summarize_lengths(scores: Mapping[int, Mapping[str, float]],
                      threshold: float = EFFECTIVE_LENGTH_THRESHOLD) -> dict:
    """``scores`` = {length: {task: score 0..100}} ->
    {"per_length": {length: mean of task scores}, "categories": {length: {category: mean}},
     "avg", "wavg_inc", "wavg_dec" (rounded to 2 decimals), "effective_length"}."""
    if not scores:
        raise ValueError("no lengths to aggregate")
    per_length = {int(n): length_score(ts) for n, ts in scores.items()}
    return {
        "per_length": dict(sorted(per_length.items())),
        "categories": {int(n): category_scores(ts) for n, ts in sorted(scores.items())},
        **aggregate_lengths(per_length, threshold),
    }


def task_scores_from_rows(rows: Iterable[Mapping], length_key: str = "context_length") -> dict[int, dict[str, float]]:
    """Per-sample rows ({"task", "score", length_key}) -> {length: {task: task_score}} (mean of the
    sample scores rounded to 2 decimals, like the RULER scorers)."""
    acc: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        acc[int(r[length_key])][r["task"]].append(float(r["score"]))
    return {n: {t: task_score(v) for t, v in ts.items()} for n, ts in sorted(acc.items())}


__all__ = ["category_scores", "summarize_lengths", "task_scores_from_rows"]
