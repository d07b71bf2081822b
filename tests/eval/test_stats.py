"""eval/stats.py against hand-computed values and by simulation: the bootstrap interval covers the true mean about
95% of the time, McNemar's exact p-values, the sign-flip test, stratification by task."""
import math

import numpy as np
import pytest

from eval.stats import bootstrap_ci, mcnemar_p, paired_comparison, suite_mean


def test_suite_mean_is_the_mean_of_task_means():
    scores = {"a/0": 100, "a/1": 0, "a/2": 100, "b/0": 0}
    tasks = {k: k.split("/")[0] for k in scores}
    assert suite_mean(scores, tasks) == pytest.approx((200 / 3 + 0) / 2)


def test_mcnemar_exact_values():
    assert mcnemar_p(0, 0) == 1.0
    assert mcnemar_p(5, 5) == 1.0
    assert mcnemar_p(6, 0) == pytest.approx(2 / 64)  # 2 * 0.5^6
    assert mcnemar_p(8, 2) == pytest.approx(2 * sum(math.comb(10, i) for i in range(3)) / 1024)


def test_bootstrap_interval_covers_the_true_mean_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    hits = 0
    for trial in range(200):
        scores = {f"t{t}/{i}": float(100 * (rng.random() < 0.5)) for t in range(2) for i in range(50)}
        tasks = {k: k.split("/")[0] for k in scores}
        mean, lo, hi = bootstrap_ci(scores, tasks)
        assert lo <= mean <= hi and hi - lo < 30
        hits += lo <= 50.0 <= hi
    assert 0.88 <= hits / 200 <= 0.99  # nominal 95 %, percentile bootstrap at n = 100 slightly under


def test_paired_comparison_uses_mcnemar_for_0_100_scores_and_pairs_by_sample():
    a = {f"t/{i}": 100.0 for i in range(20)}
    b = {f"t/{i}": (0.0 if i < 8 else 100.0) for i in range(20)}
    tasks = {k: "t" for k in a}
    r = paired_comparison(a, b, tasks)
    assert r["test"] == "mcnemar" and r["n"] == 20 and r["diff"] == pytest.approx(40.0)
    assert r["p"] == pytest.approx(2 / 2 ** 8) and r["lo"] > 0
    same = paired_comparison(a, dict(a), tasks)
    assert same["p"] == 1.0 and same["diff"] == 0
    assert paired_comparison(a, {"other/0": 1.0}, tasks)["n"] == 0


def test_sign_flip_test_for_graded_scores():
    a = {f"t/{i}": 60.0 + i for i in range(10)}
    b = {f"t/{i}": 50.0 + i for i in range(10)}  # always 10 better: the exact test's smallest p
    r = paired_comparison(a, b, {k: "t" for k in a})
    assert r["test"] == "sign-flip" and r["diff"] == pytest.approx(10.0)
    assert r["p"] == pytest.approx(2 / 2 ** 10)
    noisy = {k: v + (5 if i % 2 else -5) for i, (k, v) in enumerate(b.items())}
    assert paired_comparison(noisy, b, {k: "t" for k in a})["p"] > 0.5
