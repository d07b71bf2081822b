"""Figures of one table unit: score / coverage vs budget, the task heat map, bytes read vs context."""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: E402

from eval.report.runs import budgets_of, ordered_labels, task_columns
from eval.report.statistics import with_intervals
from locks.core.registry import bounds, plot_style


def _style(label: str, method: str) -> dict:
    """The method's line style: its selector's `plot_style` (linestyle, marker, ...)."""
    return {"linestyle": "-", "marker": "o", **plot_style(method)}


def _log2_budget_axis(ax, budgets) -> None:
    ax.set_xscale("log", base=2)
    if budgets:
        ax.xaxis.set_major_locator(FixedLocator(budgets))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{int(round(x))}"))
        ax.xaxis.set_minor_locator(NullLocator())


def tokens_label(n) -> str:
    n = int(n)
    if n >= 2**20 and n % 2**20 == 0:
        return f"{n // 2**20}M"
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024}K"
    return str(n)


def _pow2_axis(ax, values) -> None:
    """log2 x axis from the power of two below the smallest value to the one above the largest, ticked at each."""
    lo = 2 ** math.floor(math.log2(max(1.0, float(min(values)))))
    hi = 2 ** math.ceil(math.log2(max(2.0, float(max(values)))))
    hi = hi * 2 if hi == lo else hi
    ax.set_xscale("log", base=2)
    ax.set_xlim(lo / 1.15, hi * 1.15)
    ax.xaxis.set_major_locator(FixedLocator([2 ** k for k in range(int(math.log2(lo)), int(math.log2(hi)) + 1)]))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: tokens_label(x)))
    ax.xaxis.set_minor_locator(NullLocator())


def _yerr(g: pd.DataFrame, y: np.ndarray) -> np.ndarray:
    """Asymmetric error bars [y - ci_lo, ci_hi - y] (0 where a run has no interval)."""
    lo = np.nan_to_num(y - g["ci_lo"].astype(float).to_numpy(), nan=0.0)
    hi = np.nan_to_num(g["ci_hi"].astype(float).to_numpy() - y, nan=0.0)
    return np.vstack([np.maximum(lo, 0), np.maximum(hi, 0)])


def plot_score_vs_budget(unit: pd.DataFrame, title: str = "", value: str = "average",
                         ylabel: str = "average score (0-100)"):
    """One line per method (log2 budget axis), FullKV a horizontal line, the Oracle dashed; with ci_lo / ci_hi
    columns (eval/report/statistics.py) the scores carry 95% error bars (FullKV a band). Returns the Figure."""
    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    budgets = budgets_of(unit)
    unit = unit if "ci_lo" in unit or value != "average" else with_intervals(unit)
    for label in ordered_labels(unit):
        g = unit[(unit["label"] == label)]
        bars = value == "average" and "ci_lo" in g and g["ci_lo"].notna().any()
        if g["budget"].isna().all():
            y = g[value].iloc[0]
            if y is not None and not pd.isna(y):
                ax.axhline(float(y), color="black", linestyle=":", linewidth=1.5, label=label)
                if bars:
                    ax.axhspan(float(g["ci_lo"].iloc[0]), float(g["ci_hi"].iloc[0]), color="black", alpha=0.08)
            continue
        g = g[g["budget"].notna() & g[value].notna()].sort_values("budget")
        if len(g):
            x, y = g["budget"].astype(int).to_numpy(), g[value].astype(float).to_numpy()
            line, = ax.plot(x, y, label=label, **_style(label, g["method"].iloc[0]))
            if bars:
                ax.errorbar(x, y, yerr=_yerr(g, y), fmt="none", ecolor=line.get_color(), capsize=3, linewidth=1)
    _log2_budget_axis(ax, budgets)
    ax.set_xlabel("token budget (log2 scale)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if ax.get_lines():
        ax.legend(fontsize=8)
    return fig


def plot_coverage_vs_budget(unit: pd.DataFrame, title: str = ""):
    return plot_score_vs_budget(unit, title=title, value="coverage",
                                ylabel="attention-mass coverage of the selection")


COST_AXES = {"bytes_read_per_step": "bytes read per decode step (MB, metadata + K/V, all layers; log scale)",
             "attended_tokens_per_step": "attended tokens per KV head and step (log2 scale)"}


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point dominates (cost <= and score >= with one strict), by cost."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], -np.inf
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def plot_vs_cost(unit: pd.DataFrame, cost: str = "bytes_read_per_step", value: str = "average", title: str = ""):
    """Score (or coverage) against measured cost, one line per method through its budgets, FullKV one point, the
    Pareto front of the implementable runs (upper-bound references excluded: they read every key to choose) a grey
    step line with circled points. Returns the Figure."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2), layout="constrained")
    unit = unit if "ci_lo" in unit or value != "average" else with_intervals(unit)
    g = unit[unit[cost].notna() & unit[value].notna()]
    scale = 1e6 if cost == "bytes_read_per_step" else 1.0
    points = []
    for label in ordered_labels(g):
        s = g[g["label"] == label].sort_values(cost)
        x, y = s[cost].astype(float).to_numpy() / scale, s[value].astype(float).to_numpy()
        method = s["method"].iloc[0]
        if s["budget"].isna().all():
            line, = ax.plot(x, y, linestyle="none", marker="*", markersize=11, color="black", label=label)
        else:
            line, = ax.plot(x, y, label=label, **_style(label, method))
        if value == "average" and "ci_lo" in s and s["ci_lo"].notna().any():
            ax.errorbar(x, y, yerr=_yerr(s, y), fmt="none", ecolor=line.get_color(), capsize=2, linewidth=0.8)
        if not bounds(method):
            points += list(zip(x, y))
    if points:
        front = [points[i] for i in pareto_front(points)]
        fx, fy = zip(*front)
        ax.step(fx, fy, where="post", color="grey", linewidth=4, alpha=0.35, zorder=0, label="Pareto front")
        ax.scatter(fx, fy, s=160, facecolors="none", edgecolors="grey", zorder=0)
    if cost == "bytes_read_per_step":
        ax.set_xscale("log")
    elif len(g):
        _pow2_axis(ax, g[cost].astype(float))
    ax.set_xlabel(COST_AXES[cost])
    ax.set_ylabel("average score (0-100)" if value == "average" else "attention-mass coverage of the selection")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if ax.get_lines():
        ax.legend(fontsize=7)
    return fig


def heatmap_rows(unit: pd.DataFrame) -> list[tuple[str, pd.Series]]:
    rows = []
    for label in ordered_labels(unit):
        g = unit[unit["label"] == label].sort_values("budget", na_position="first")
        for _, r in g.iterrows():
            rows.append((label if pd.isna(r["budget"]) else f"{label} b={int(r['budget'])}", r))
    return rows


def plot_task_heatmap(unit: pd.DataFrame, title: str = ""):
    """Rows = method x budget, columns = tasks, cell = score (annotated). Returns the Figure."""
    tasks = task_columns(unit)
    rows = heatmap_rows(unit)
    data = np.array([[float(r.get(f"task:{t}")) if pd.notna(r.get(f"task:{t}")) else np.nan for t in tasks]
                     for _, r in rows], dtype=float).reshape(len(rows), len(tasks))
    longest = max((len(name) for name, _ in rows), default=10)
    fig, ax = plt.subplots(figsize=(2.5 + 0.07 * longest + 1.0 * max(3, len(tasks)), 1.5 + 0.38 * max(3, len(rows))),
                           layout="constrained")
    im = ax.imshow(np.ma.masked_invalid(data), cmap="viridis", vmin=0, vmax=100, aspect="auto")
    ax.set_xticks(range(len(tasks)), labels=tasks, rotation=35, ha="right", fontsize=8)
    ax.set_yticks(range(len(rows)), labels=[name for name, _ in rows], fontsize=8)
    for i in range(data.shape[0]):
        for j in range(data.shape[1]):
            if not np.isnan(data[i, j]):
                ax.text(j, i, f"{data[i, j]:.0f}", ha="center", va="center", fontsize=7,
                        color="white" if data[i, j] < 60 else "black")
    ax.set_xlabel("task")
    ax.set_ylabel("method, budget")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label="score (0-100)")
    return fig


def plot_bytes_vs_context(group: pd.DataFrame, title: str = ""):
    """Bytes read per decode step vs context tokens per step, one series per method x budget. Returns the Figure."""
    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    g = group[group["bytes_read_per_step"].notna() & group["context_tokens_per_step"].notna()]
    for label in ordered_labels(g):
        s = g[g["label"] == label]
        for b, sb in s.groupby("budget", dropna=False, sort=True):
            sb = sb.sort_values("context_tokens_per_step")
            name = label if pd.isna(b) else f"{label} b={int(b)}"
            style = {"color": "black", "linestyle": ":", "marker": "D"} if pd.isna(b) else _style(
                label, sb["method"].iloc[0])
            ax.plot(sb["context_tokens_per_step"].to_numpy(float), sb["bytes_read_per_step"].to_numpy(float) / 1e6,
                    label=name, **style)
    if len(g):
        _pow2_axis(ax, g["context_tokens_per_step"].astype(float))
    else:
        ax.set_xscale("log", base=2)
    ax.set_xlabel("context tokens per decode step (log2 scale)")
    ax.set_ylabel("bytes read per decode step (MB)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if ax.get_lines():
        ax.legend(fontsize=7)
    if g["context_tokens_estimated"].astype(bool).any():
        ax.set_xlabel("context tokens per decode step (log2 scale)\n"
                      "estimated as attended tokens / attended fraction (not recorded by these runs)", fontsize=8)
    return fig


def save_figure(fig, stem: Path) -> list[Path]:
    stem.parent.mkdir(parents=True, exist_ok=True)
    out = []
    for ext in ("png", "pdf"):
        path = stem.with_name(stem.name + f".{ext}")
        fig.savefig(path, dpi=150)
        out.append(path)
    plt.close(fig)
    return out


