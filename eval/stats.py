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

What a paired 0/100 comparison can resolve at its n: with psi the share of discordant pairs and delta = p10 - p01
the difference (score points / 100), the exact McNemar test rejects with power

    power(delta) = sum_D P[Bin(n, psi) = D] * P[reject | D],   n10 | D ~ Bin(D, (psi + delta) / (2 psi)),

and the smallest detectable difference is the smallest delta with power >= 80% at level 0.05 (`detectable_difference`,
at the observed psi). The pairs a given delta needs at a given psi (`mcnemar_sample_size`) use Connor's (1987)
normal approximation, n = (z_{1-alpha/2} sqrt(psi) + z_{power} sqrt(psi - delta^2))^2 / delta^2, since the exact
power costs O(n^2) at the several thousand pairs small differences need.
"""
from __future__ import annotations

import functools
import itertools
import math
from collections import defaultdict

import numpy as np

B_RESAMPLES = 2000
SEED = 20250101
ALPHA = 0.05
POWER = 0.8


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


def mcnemar_p_greater(n10: int, n01: int) -> float:
    """Exact one-sided McNemar p-value for "a is better than b": P(X >= n10), X ~ Binomial(n10 + n01, 1/2)."""
    n = n10 + n01
    return sum(math.comb(n, i) for i in range(n10, n + 1)) / 2 ** n


def _log_factorials(n: int) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n + 1)))])


def _log_binom_pmf(n: int, p: float, log_fact: np.ndarray) -> np.ndarray:
    """log P[Bin(n, p) = k] for k = 0..n."""
    k = np.arange(n + 1)
    with np.errstate(divide="ignore"):
        return (log_fact[n] - log_fact[k] - log_fact[n - k] + k * np.log(p) + (n - k) * np.log1p(-p)
                if 0 < p < 1 else np.where(k == (n if p >= 1 else 0), 0.0, -np.inf))


@functools.lru_cache(maxsize=64)
def _mcnemar_critical(n: int, alpha: float) -> tuple[int, ...]:
    """For D = 0..n discordant pairs, the largest min(n10, n01) that McNemar's exact test rejects at `alpha` (-1:
    none): from the Bin(D, 1/2) cdf, settled at the boundary by mcnemar_p itself."""
    log_fact = _log_factorials(n)
    out = [-1]
    for d in range(1, n + 1):
        cdf = np.cumsum(np.exp(_log_binom_pmf(d, 0.5, log_fact)))[: d // 2 + 1]
        k = int(np.searchsorted(2 * cdf, alpha)) - 1  # the last k with 2 * cdf[k] < alpha (float)
        while k >= 0 and mcnemar_p(k, d - k) >= alpha:
            k -= 1
        while k + 1 <= d // 2 and mcnemar_p(k + 1, d - k - 1) < alpha:
            k += 1
        out.append(k)
    return tuple(out)


def mcnemar_power(n: int, discordant: float, diff: float, alpha: float = ALPHA) -> float:
    """Power of McNemar's exact two-sided test at level `alpha` in n pairs with discordant share `discordant` (psi)
    and paired difference `diff` = p10 - p01 (|diff| <= psi), exactly (module docstring)."""
    if not 0 < discordant <= 1 or abs(diff) > discordant + 1e-12:
        raise ValueError(f"need 0 < discordant <= 1 and |diff| <= discordant (got {discordant}, {diff})")
    log_fact = _log_factorials(n)
    critical = _mcnemar_critical(n, float(alpha))
    p_d = np.exp(_log_binom_pmf(n, discordant, log_fact))
    q = min(1.0, max(0.0, (discordant + diff) / (2 * discordant)))
    power = 0.0
    for d in range(1, n + 1):
        k = critical[d]
        if k < 0 or p_d[d] == 0:
            continue
        pmf = np.exp(_log_binom_pmf(d, q, log_fact))
        power += p_d[d] * (pmf[: k + 1].sum() + pmf[d - k:].sum())
    return float(power)


def mcnemar_sample_size(discordant: float, diff: float, alpha: float = ALPHA, power: float = POWER) -> int:
    """Pairs McNemar's test needs to detect |p10 - p01| = diff with `power` at level `alpha` when a share
    `discordant` of the pairs is discordant (Connor's approximation, module docstring)."""
    from statistics import NormalDist

    if not 0 < abs(diff) <= discordant <= 1:
        raise ValueError(f"need 0 < |diff| <= discordant <= 1 (got {discordant}, {diff})")
    z = NormalDist()
    root = z.inv_cdf(1 - alpha / 2) * math.sqrt(discordant) + z.inv_cdf(power) * math.sqrt(discordant - diff ** 2)
    return math.ceil(root ** 2 / diff ** 2)


def detectable_difference(n: int, discordant: float, alpha: float = ALPHA, power: float = POWER) -> float | None:
    """The smallest |p10 - p01| that McNemar's exact test detects with `power` at level `alpha` in n pairs with
    discordant share `discordant`, to 1e-4 (x 100: score points); None when even |diff| = discordant (every
    discordant pair one way) falls short."""
    if n < 1 or not 0 < discordant <= 1 or mcnemar_power(n, discordant, discordant, alpha) < power:
        return None
    lo, hi = 0.0, discordant
    while hi - lo > 1e-4:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if mcnemar_power(n, discordant, mid, alpha) >= power else (mid, hi)
    return hi


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
    its p-value and the number of paired samples; for 0/100 scores also the share of discordant pairs and the
    one-sided p-value of "a above b" (`p_greater`, exact McNemar)."""
    common = sorted(set(a) & set(b))
    if not common:
        return {"n": 0, "diff": None, "lo": None, "hi": None, "p": None, "test": None, "p_greater": None}
    diffs = {sid: float(a[sid]) - float(b[sid]) for sid in common}
    groups = _by_task(diffs, task_of)
    rng = np.random.default_rng(SEED)
    boot = _bootstrap_suite(groups, rng)
    lo, hi = np.quantile(boot, [ALPHA / 2, 1 - ALPHA / 2])
    binary = all(float(x[sid]) in (0.0, 100.0) for x in (a, b) for sid in common)
    discordant = p_greater = None
    if binary:
        n10 = sum(a[s] > b[s] for s in common)
        n01 = sum(a[s] < b[s] for s in common)
        p, test = mcnemar_p(n10, n01), "mcnemar"
        discordant = (n10 + n01) / len(common)
        p_greater = mcnemar_p_greater(n10, n01)
    else:
        p, test = _sign_flip_p(groups, rng), "sign-flip"
    return {"n": len(common), "diff": suite_mean(diffs, task_of), "lo": float(lo), "hi": float(hi), "p": p,
            "test": test, "discordant": discordant, "p_greater": p_greater}
