"""RULER post-processing, scorers and score aggregation (docs/benchmarks/ruler.md).

Semantics follow NVIDIA/RULER c3f5e3b ``scripts/eval/evaluate.py`` (``postprocess_pred``) and
``scripts/eval/synthetic/constants.py`` (``string_match_all`` / ``string_match_part``), re-written
here.  Both scorers are case-insensitive substring tests on post-processed predictions (so
``1234567`` matches inside ``12345678``, and a reference containing a tab/newline can never match).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

_CONTROL_CHARS = re.compile(r"[\x00-\x1f]")

# Threshold of the "effective length" (the Llama-2-7B score at 4K, §9).
EFFECTIVE_LENGTH_THRESHOLD = 85.6


def postprocess(pred: str) -> str:
    """strip, replace every control character \\x00-\\x1f (incl. \\n, \\t) with \\n, strip again."""
    return _CONTROL_CHARS.sub("\n", pred.strip()).strip()


def _all_fraction(pred: str, refs: Sequence[str]) -> float:
    low = pred.lower()
    return sum(1.0 if r.lower() in low else 0.0 for r in refs) / len(refs)


def _part_fraction(pred: str, refs: Sequence[str]) -> float:
    low = pred.lower()
    return max(1.0 if r.lower() in low else 0.0 for r in refs)


def _check(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> None:
    if isinstance(preds, str):
        raise TypeError("preds must be a list of strings, not a string")
    if len(preds) != len(refs):
        raise ValueError(f"{len(preds)} predictions but {len(refs)} reference lists")
    if not preds:
        raise ValueError("no predictions to score")
    for r in refs:
        if isinstance(r, str) or not len(r):
            raise ValueError(f"each reference entry must be a non-empty list of strings, got {r!r}")


def string_match_all(preds: list[str], refs: list[list[str]]) -> float:
    """round(100 * mean_i(fraction of refs_i found in pred_i), 2), case-insensitive.

    Predictions are used as given (call ``postprocess`` first, as RULER's evaluate.py does).
    The float evaluation order (sum / n * 100) is upstream's.
    """
    _check(preds, refs)
    score = sum(_all_fraction(p, r) for p, r in zip(preds, refs)) / len(preds) * 100
    return round(score, 2)


def string_match_part(preds: list[str], refs: list[list[str]]) -> float:
    """round(100 * mean_i(1 if any ref of refs_i is found in pred_i else 0), 2), case-insensitive."""
    _check(preds, refs)
    score = sum(_part_fraction(p, r) for p, r in zip(preds, refs)) / len(preds) * 100
    return round(score, 2)


METRICS = {"string_match_all": string_match_all, "string_match_part": string_match_part}
_FRACTIONS = {"string_match_all": _all_fraction, "string_match_part": _part_fraction}


def sample_score(pred: str, refs: list[str], metric: str) -> float:
    """Unrounded 0..100 score of one sample; the prediction is post-processed first.

    ``postprocess`` is idempotent, so passing an already post-processed prediction is fine.  The task
    score is ``task_score([...sample scores...])`` (= the metric over all samples, up to float
    rounding order).
    """
    try:
        frac = _FRACTIONS[metric]
    except KeyError:
        raise ValueError(f"unknown RULER metric {metric!r}; valid: {sorted(_FRACTIONS)}") from None
    if isinstance(refs, str) or not len(refs):
        raise ValueError(f"refs must be a non-empty list of strings, got {refs!r}")
    return 100.0 * frac(postprocess(pred), refs)


def task_score(sample_scores: Sequence[float]) -> float:
    """Mean of per-sample scores (``sample_score``), rounded to 2 decimals like the RULER scorers."""
    if not len(sample_scores):
        raise ValueError("no sample scores")
    return round(sum(sample_scores) / len(sample_scores), 2)


def count_nulls(preds: Sequence[str]) -> int:
    """RULER's "Nulls": number of empty predictions after post-processing (reported, not scored)."""
    return sum(1 for p in preds if not postprocess(p))


def length_score(task_scores: Mapping[str, float] | Sequence[float]) -> float:
    """Score at one length = plain mean of the task scores (13 tasks for full RULER), unrounded."""
    vals = list(task_scores.values()) if isinstance(task_scores, Mapping) else list(task_scores)
    if not vals:
        raise ValueError("no task scores")
    return sum(vals) / len(vals)


def aggregate_lengths(
    scores_by_length: Mapping[int, float], threshold: float = EFFECTIVE_LENGTH_THRESHOLD
) -> dict:
    """Across lengths (§9): Avg, wAvg(inc) (weights 1..n, shortest first), wAvg(dec) (n..1) and the
    effective length (largest length whose score exceeds ``threshold``; None if none does).

    The averages are rounded to 2 decimals.
    """
    if not scores_by_length:
        raise ValueError("no lengths to aggregate")
    lengths = sorted(scores_by_length)
    vals = [scores_by_length[n] for n in lengths]
    n = len(vals)
    wsum = n * (n + 1) / 2
    inc = sum((i + 1) * v for i, v in enumerate(vals)) / wsum
    dec = sum((n - i) * v for i, v in enumerate(vals)) / wsum
    passing = [length for length, v in zip(lengths, vals) if v > threshold]
    return {
        "avg": round(sum(vals) / n, 2),
        "wavg_inc": round(inc, 2),
        "wavg_dec": round(dec, 2),
        "effective_length": max(passing) if passing else None,
    }
