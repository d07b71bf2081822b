"""eval/report/statistics.py and the cost figures: per-sample scores in metrics.json -> intervals, paired tests
against FullKV and the best upper bound, the Pareto front; checked against eval/stats.py computed by hand on the
same samples and against a brute-force dominance check."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from eval import report
from eval.report.figures import pareto_front, plot_vs_cost
from eval.report.statistics import display_table, statistics_table
from eval.stats import bootstrap_ci, mcnemar_p, paired_comparison

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = json.loads((ROOT / "tests" / "fixtures" / "report" / "metrics_template.json").read_text())
TASKS = ["niah_single_2", "niah_multikey_1"]
N = 20


def metrics(method: str, budget, correct: dict[str, set[int]], tokens: float, mb: float) -> dict:
    """A metrics.json whose per-sample scores are 100 for the indices in correct[task], else 0."""
    m = copy.deepcopy(TEMPLATE)
    m["method"] = {"name": method, "budget": budget} if method == "fullkv" else {**m["method"], "name": method,
                                                                                 "budget": budget}
    m["budget"] = budget
    samples = {f"{t}/4096/{i}": {"task": t, "score": 100.0 if i in correct[t] else 0.0} for t in TASKS
               for i in range(N)}
    m["samples"] = samples
    m["scores"] = {t: 100.0 * len(correct[t]) / N for t in TASKS}
    m["average"] = sum(m["scores"].values()) / len(TASKS)
    m["num_samples"] = {t: N for t in TASKS}
    m["attended_tokens_per_step"], m["bytes_read_per_step"] = tokens, mb * 1e6
    m["coverage"] = 0.5 + m["average"] / 250
    return m


def write_runs(root: Path) -> None:
    runs = {
        "fullkv": ("fullkv", None, {t: set(range(N)) for t in TASKS}, 3900.0, 20.0),
        "oracle_b128": ("oracle", 128, {t: set(range(18)) for t in TASKS}, 128.0, 20.0),
        "oracle_token_b128": ("oracle_token", 128, {t: set(range(19)) for t in TASKS}, 300.0, 20.0),
        "locks_b128": ("locks", 128, {t: set(range(12)) for t in TASKS}, 128.0, 1.0),
        "quest_b128": ("quest", 128, {t: set(range(4, 14)) for t in TASKS}, 436.0, 2.5),
        "locks_b256": ("locks", 256, {t: set(range(16)) for t in TASKS}, 256.0, 1.6),
    }
    for name, args in runs.items():
        (root / f"{name}.json").write_text(json.dumps(metrics(*args)))


@pytest.fixture
def unit(tmp_path):
    write_runs(tmp_path)
    (ctx, unit), = report.units(report.load_runs([tmp_path], progress=False))
    return unit


def _scores(path: Path):
    s = json.loads(path.read_text())["samples"]
    return {k: v["score"] for k, v in s.items()}, {k: v["task"] for k, v in s.items()}


def test_statistics_match_eval_stats_on_the_same_samples(unit, tmp_path):
    stats = statistics_table(unit).set_index(["method", "budget"])
    locks = stats.loc[("LOCKS", 128)]
    a, task_of = _scores(tmp_path / "locks_b128.json")
    full, _ = _scores(tmp_path / "fullkv.json")
    token, _ = _scores(tmp_path / "oracle_token_b128.json")
    mean, lo, hi = bootstrap_ci(a, task_of)
    assert (locks["mean"], locks["ci_lo"], locks["ci_hi"], locks["n"]) == (pytest.approx(mean), lo, hi, 2 * N)
    assert lo < mean < hi
    assert locks["vs_fullkv"] == pytest.approx(60.0 - 100.0)
    assert locks["vs_fullkv_p"] == pytest.approx(mcnemar_p(0, 2 * 8))  # 8 misses per task, no gains
    # the best bound at 128 is the token oracle (95 > 90), compared on the same samples
    assert locks["bound"] == "Oracle: tokens/query head"
    assert locks["vs_bound"] == pytest.approx(paired_comparison(a, token, task_of)["diff"]) == pytest.approx(-35.0)
    assert locks["vs_bound_p"] == pytest.approx(mcnemar_p(0, 14))
    # Quest answers 10 samples per task right: 10 misses per task against FullKV
    assert stats.loc[("Quest", 128)]["vs_fullkv_p"] == pytest.approx(mcnemar_p(0, 20))
    # the bound itself is not compared with itself; the page oracle is compared with the token oracle
    assert pd.isna(stats.loc[("Oracle: tokens/query head", 128)]["bound"])
    assert stats.loc[("Oracle: pages/KV head", 128)]["vs_bound"] == pytest.approx(-5.0)
    # FullKV: one row, no budget, no self-comparison; a budget with no bound has none
    full_row = statistics_table(unit).iloc[0]
    assert full_row["method"] == "FullKV" and pd.isna(full_row["vs_fullkv"]) and pd.isna(full_row["bound"])
    assert pd.isna(stats.loc[("LOCKS", 256)]["bound"])
    assert stats.loc[("LOCKS", 256)]["tokens_per_kv_head"] == 256.0 and stats.loc[("LOCKS", 256)]["mb_per_step"] == 1.6


def test_display_and_written_files(unit, tmp_path):
    shown = display_table(statistics_table(unit))
    cell = shown.loc["LOCKS"].iloc[0]["score [95% CI]"]
    assert cell.startswith("60.0 [") and "p=" in shown.loc["LOCKS"].iloc[0]["Δ vs FullKV"]
    out = tmp_path / "report"
    report.write_report([tmp_path], out, progress=False)
    (d,) = [p for p in out.iterdir() if p.is_dir()]
    for name in ("statistics.csv", "statistics.md", "statistics.tex", "score_vs_bytes.png", "score_vs_tokens.png",
                 "coverage_vs_bytes.png", "coverage_vs_tokens.png"):
        assert (d / name).exists(), name
    assert "95%" in (d / "statistics.md").read_text()
    assert "[" in (d / "scores.md").read_text().split("\n")[4]  # the pivot's cells carry the interval


def test_runs_without_samples_have_blank_statistics(unit):
    unit = unit.copy()
    unit["samples"] = None
    stats = statistics_table(unit)
    assert stats["ci_lo"].isna().all() and stats["vs_fullkv"].isna().all()


def _dominated(p, q) -> bool:
    return q[0] <= p[0] and q[1] >= p[1] and (q[0] < p[0] or q[1] > p[1])


def test_pareto_front_is_the_set_of_undominated_points():
    rng = np.random.default_rng(0)
    for _ in range(50):
        pts = [tuple(map(float, x)) for x in rng.integers(0, 6, size=(8, 2))]
        pts = list(dict.fromkeys(pts))
        front = set(pareto_front(pts))
        brute = {i for i, p in enumerate(pts) if not any(_dominated(p, q) for q in pts)}
        assert front == brute


def test_cost_plot_front_leaves_out_the_bounds(unit):
    fig = plot_vs_cost(unit, "bytes_read_per_step", "average")
    ax = fig.axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    front = lines["Pareto front"]
    xs, ys = front.get_xdata(), front.get_ydata()
    # implementable points: FullKV (20 MB, 100), LOCKS (1.0, 60), (1.6, 80), Quest (2.5, 50) -> front LOCKS, LOCKS,
    # FullKV; the oracles (20 MB, 90/95) are plotted but never on it
    assert list(zip(xs, ys)) == [(1.0, 60.0), (1.6, 80.0), (20.0, 100.0)]
    assert {"Oracle: pages/KV head", "Oracle: tokens/query head", "LOCKS", "Quest", "FullKV"} <= set(lines)
    assert ax.get_xscale() == "log"
    fig2 = plot_vs_cost(unit, "attended_tokens_per_step", "coverage")
    assert fig2.axes[0].get_xscale() == "log"
    assert any(len(c.get_segments()) for c in fig.axes[0].collections if hasattr(c, "get_segments"))  # error bars
