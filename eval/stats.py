"""Uncertainty for every reported score: bootstrap confidence intervals over samples, and paired comparisons of two
methods on the same samples (docs/benchmarks/README.md, "Statistics").

A score table's cell is a suite average: the mean over tasks of each task's mean sample score (RULER's `average`,
LongBench's task mean). Its 95% interval is a stratified percentile bootstrap: each task's samples are resampled with
replacement, and the suite average of every resample is taken,

    CI = [q_2.5, q_97.5] of { mean_t mean_{i in resample_t} s_i }   (B = 2000 resamples, fixed seed)

Two methods on the same samples are compared by their per-sample differences d_i = a_i - b_i. When every score is
0 or 100 (RULER, InfiniteBench's exact-match tasks) the test is McNemar's exact test: under H0 the discordant pairs
split 50/50, so p = min(1, 2 * P[Binomial(n_discordant, 1/2) <= min(n_10, n_01)]). Otherwise it is a paired sign-flip
permutation test on the task-weighted mean difference (exact up to 2^16 sign patterns, else 20000 random ones),
p = fraction with |mean| >= the observed |mean|. Each comparison also gives the bootstrap interval of the suite
difference.
"""
from __future__ import annotations

import itertools
import math
from collections import defaultdict

import numpy as np

B_RESAMPLES = 2000
SEED = 20250101
ALPHA = 0.05


def _by_task(scores: dict[str, float], task_of: dict[str, str]) -> dict[str, np.ndarray]:
    groups: dict[str, list] = defaultdict(list)
    for sid in sorted(scores):
        groups[task_of[sid]].append(float(scores[sid]))
    return {t: np.asarray(v) for t, v in sorted(groups.items())}


def suite_mean(scores: dict[str, float], task_of: dict[str, str]) -> float:
    """Mean over tasks of each task's mean score."""
    groups = _by_task(scores, task_of)
    return float(np.mean([g.mean() for g in groups.values()])) if groups else float("nan")


def _bootstrap_suite(groups: dict[str, np.ndarray], rng) -> np.ndarray:
    """B resampled suite averages: each task's values resampled with replacement, task means averaged."""
    means = []
    for values in groups.values():
        idx = rng.integers(0, len(values), size=(B_RESAMPLES, len(values)))
        means.append(values[idx].mean(axis=1))
    return np.mean(means, axis=0)


def bootstrap_ci(scores: dict[str, float], task_of: dict[str, str]) -> tuple[float, float, float]:
    """(suite mean, lower, upper) of the 95% stratified bootstrap interval; per-sample `scores` by sample id."""
    groups = _by_task(scores, task_of)
    if not groups:
        return float("nan"), float("nan"), float("nan")
    boot = _bootstrap_suite(groups, np.random.default_rng(SEED))
    lo, hi = np.quantile(boot, [ALPHA / 2, 1 - ALPHA / 2])
    return suite_mean(scores, task_of), float(lo), float(hi)


def mcnemar_p(n10: int, n01: int) -> float:
    """Exact two-sided McNemar p-value for the discordant counts (a right b wrong, a wrong b right)."""
    n = n10 + n01
    if n == 0:
        return 1.0
    k = min(n10, n01)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def _sign_flip_p(diffs_by_task: dict[str, np.ndarray], rng) -> float:
    """Paired sign-flip permutation p-value of the task-weighted mean difference."""
    weights, values = [], []
    for d in diffs_by_task.values():
        weights += [1.0 / (len(d) * len(diffs_by_task))] * len(d)
        values += list(d)
    w, v = np.asarray(weights), np.asarray(values)
    observed = abs(float(np.sum(w * v)))
    nonzero = v != 0
    w, v = w[nonzero], v[nonzero]
    if len(v) == 0:
        return 1.0
    if len(v) <= 16:
        signs = np.array(list(itertools.product((-1.0, 1.0), repeat=len(v))))
    else:
        signs = rng.choice((-1.0, 1.0), size=(20000, len(v)))
    stats = np.abs(signs @ (w * v))
    return float(np.mean(stats >= observed - 1e-12))


def paired_comparison(a: dict[str, float], b: dict[str, float], task_of: dict[str, str]) -> dict:
    """a vs b on the samples both have: the suite difference (a - b) with its 95% bootstrap interval, the test used,
    its p-value and the number of paired samples."""
    common = sorted(set(a) & set(b))
    if not common:
        return {"n": 0, "diff": None, "lo": None, "hi": None, "p": None, "test": None}
    diffs = {sid: float(a[sid]) - float(b[sid]) for sid in common}
    groups = _by_task(diffs, task_of)
    rng = np.random.default_rng(SEED)
    boot = _bootstrap_suite(groups, rng)
    lo, hi = np.quantile(boot, [ALPHA / 2, 1 - ALPHA / 2])
    binary = all(float(x[sid]) in (0.0, 100.0) for x in (a, b) for sid in common)
    if binary:
        n10 = sum(a[s] > b[s] for s in common)
        n01 = sum(a[s] < b[s] for s in common)
        p, test = mcnemar_p(n10, n01), "mcnemar"
    else:
        p, test = _sign_flip_p(groups, rng), "sign-flip"
    return {"n": len(common), "diff": suite_mean(diffs, task_of), "lo": float(lo), "hi": float(hi), "p": p,
            "test": test}
