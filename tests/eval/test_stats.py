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


def test_mcnemar_power_against_simulation():
    """The exact power against 20,000 simulated studies: n pairs drawn with P(a right, b wrong) = p10 and P(a wrong,
    b right) = p01, each tested by mcnemar_p at 0.05."""
    from eval.stats import mcnemar_power

    rng = np.random.default_rng(0)
    for n, p10, p01 in ((60, 0.15, 0.03), (120, 0.06, 0.02), (40, 0.05, 0.05)):
        counts = rng.multinomial(n, [p10, p01, 1 - p10 - p01], size=20000)
        simulated = np.mean([mcnemar_p(int(a), int(b)) < 0.05 for a, b, _ in counts])
        exact = mcnemar_power(n, p10 + p01, p10 - p01)
        assert abs(simulated - exact) < 4 * np.sqrt(exact * (1 - exact) / 20000) + 1e-3, (n, p10, p01)


def test_detectable_difference_is_the_smallest_with_80_percent_power():
    from eval.stats import detectable_difference, mcnemar_power

    for n, psi in ((100, 0.1), (300, 0.08), (50, 0.5)):
        d = detectable_difference(n, psi)
        assert mcnemar_power(n, psi, d) >= 0.8 > mcnemar_power(n, psi, d - 2e-4)
    # large n: close to the normal approximation n = (z_.975 sqrt(psi) + z_.8 sqrt(psi - d^2))^2 / d^2
    d = detectable_difference(500, 0.1)
    approx = ((1.959964 * 0.1 ** 0.5 + 0.841621 * (0.1 - d * d) ** 0.5) / d) ** 2
    assert abs(approx - 500) < 40 and 0.035 < d < 0.047
    assert detectable_difference(50, 0.08) is None  # 4 discordant pairs: even all one way is not enough
    assert detectable_difference(100, 0.99) < detectable_difference(100, 0.1) * 4


def test_paired_comparison_reports_the_discordant_share():
    a = {f"t/{i}": 100.0 if i < 7 else 0.0 for i in range(20)}
    b = {f"t/{i}": 100.0 if 2 <= i < 10 else 0.0 for i in range(20)}
    out = paired_comparison(a, b, {k: "t" for k in a})
    assert out["discordant"] == (2 + 3) / 20 and out["test"] == "mcnemar"
    graded = paired_comparison({"t/0": 50.0, "t/1": 20.0}, {"t/0": 10.0, "t/1": 20.0}, {"t/0": "t", "t/1": "t"})
    assert graded["discordant"] is None and graded["test"] == "sign-flip"


def test_one_sided_mcnemar_is_the_upper_binomial_tail():
    """P(X >= n10) for X ~ Bin(n10 + n01, 1/2), from exact fractions; the two-sided p is twice the smaller tail."""
    from fractions import Fraction

    from eval.stats import mcnemar_p_greater

    for n10, n01 in [(0, 0), (6, 0), (0, 6), (8, 2), (2, 8), (5, 5), (30, 12)]:
        n = n10 + n01
        want = sum(Fraction(math.comb(n, i), 2 ** n) for i in range(n10, n + 1))
        assert mcnemar_p_greater(n10, n01) == pytest.approx(float(want), rel=1e-12)
        assert mcnemar_p(n10, n01) == pytest.approx(min(1.0, 2 * min(mcnemar_p_greater(n10, n01),
                                                                     mcnemar_p_greater(n01, n10))), rel=1e-12)
    a = {f"s{i}": 100.0 for i in range(10)}
    b = {f"s{i}": (0.0 if i < 7 else 100.0) for i in range(10)}
    c = paired_comparison(a, b, {s: "t" for s in a})
    assert c["p_greater"] == pytest.approx(1 / 128) and paired_comparison(b, a, {s: "t" for s in a})["p_greater"] == 1.0


@pytest.mark.parametrize("discordant,diff", [(0.3, 0.15), (0.2, 0.1), (0.04, 0.03)])
def test_mcnemar_sample_size_is_close_to_the_exact_power(discordant, diff):
    """Connor's approximate n reaches about 80% exact power (McNemar's exact test is a little conservative), and
    half of it far less."""
    from eval.stats import mcnemar_power, mcnemar_sample_size

    n = mcnemar_sample_size(discordant, diff)
    assert 0.7 <= mcnemar_power(n, discordant, diff) <= 0.9
    assert mcnemar_power(n // 2, discordant, diff) < 0.5
    with pytest.raises(ValueError):
        mcnemar_sample_size(0.02, 0.03)
