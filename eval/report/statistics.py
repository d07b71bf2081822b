"""The statistics table of one table unit (benchmark, model, context): per method x budget the suite average with
its 95% bootstrap interval, the paired comparison with FullKV and with the best upper bound at that budget on the
same samples, the sample count, and the cost (attended tokens per KV head, bytes read per decode step). The tests
and intervals are eval/stats.py's; runs whose metrics.json has no per-sample scores get blank statistics."""
from __future__ import annotations

import pandas as pd

from eval.report.runs import ordered_labels
from eval.stats import bootstrap_ci, paired_comparison
from locks.core.registry import bounds

STATS_NOTE = ("mean = suite average (mean over tasks of the task means) with its 95% stratified bootstrap interval "
              "over samples; Δ = paired difference on the same samples with its 95% bootstrap interval and p-value "
              "(McNemar's exact test for 0/100 scores, else a paired sign-flip test); bound = the best upper-bound "
              "reference at that budget; tokens/KV head = distinct tokens whose K/V are read per KV head and step "
              "(union over its query heads); MB/step = metadata + K/V bytes over all layers per decode step.")


def sample_scores(row) -> tuple[dict, dict] | None:
    samples = row.get("samples")
    if not isinstance(samples, dict) or not samples:
        return None
    return {k: v["score"] for k, v in samples.items()}, {k: v["task"] for k, v in samples.items()}


def with_intervals(unit: pd.DataFrame) -> pd.DataFrame:
    """unit + ci_lo / ci_hi of each run's suite average (NaN without per-sample scores)."""
    unit = unit.copy()
    lo, hi = [], []
    for _, r in unit.iterrows():
        s = sample_scores(r)
        _, a, b = bootstrap_ci(*s) if s else (None, float("nan"), float("nan"))
        lo.append(a)
        hi.append(b)
    unit["ci_lo"], unit["ci_hi"] = lo, hi
    return unit


def _compare(row, ref) -> dict:
    a, b = sample_scores(row), sample_scores(ref) if ref is not None else None
    if a is None or b is None:
        return {"diff": None, "lo": None, "hi": None, "p": None, "n": None, "discordant": None}
    return paired_comparison(a[0], b[0], {**b[1], **a[1]})


def _best_bound(rows: pd.DataFrame):
    refs = rows[[bool(bounds(m)) for m in rows["method"]]]
    return None if refs.empty else refs.loc[refs["average"].astype(float).idxmax()]


def statistics_table(unit: pd.DataFrame) -> pd.DataFrame:
    """One row per run: method, budget, mean, ci_lo, ci_hi, n, vs FullKV (diff, lo, hi, p), the best bound's label
    and the comparison with it, tokens/KV head, MB/step. FullKV (no budget) is one row."""
    unit = with_intervals(unit)
    free = unit[unit["budget"].isna() & (unit["method"] == "fullkv")]
    full = free.iloc[0] if len(free) else None
    out = []
    for label in ordered_labels(unit):
        g = unit[unit["label"] == label].sort_values("budget", na_position="first")
        for _, r in g.iterrows():
            same_budget = unit[unit["budget"] == r["budget"]] if pd.notna(r["budget"]) else unit.iloc[0:0]
            bound = _best_bound(same_budget)
            if bound is not None and bound["path"] == r["path"]:
                bound = None
            vs_full = _compare(r, full) if full is not None and r["path"] != full["path"] else _compare(r, None)
            vs_bound = _compare(r, bound)
            out.append({
                "method": label, "budget": r["budget"], "mean": float(r["average"]), "ci_lo": r["ci_lo"],
                "ci_hi": r["ci_hi"], "n": int(r["n"]),
                "vs_fullkv": vs_full["diff"], "vs_fullkv_lo": vs_full["lo"], "vs_fullkv_hi": vs_full["hi"],
                "vs_fullkv_p": vs_full["p"], "vs_fullkv_discordant": vs_full["discordant"],
                "bound": None if bound is None else bound["label"], "vs_bound": vs_bound["diff"],
                "vs_bound_lo": vs_bound["lo"], "vs_bound_hi": vs_bound["hi"], "vs_bound_p": vs_bound["p"],
                "tokens_per_kv_head": r["attended_tokens_per_step"],
                "mb_per_step": None if pd.isna(r["bytes_read_per_step"]) else r["bytes_read_per_step"] / 1e6,
            })
    df = pd.DataFrame(out)
    df["budget"] = df["budget"].astype("Int64")
    return df


def _num(v, fmt="{:.1f}") -> str:
    return "" if v is None or pd.isna(v) else fmt.format(float(v))


def _p(v) -> str:
    if v is None or pd.isna(v):
        return ""
    return "<0.001" if v < 1e-3 else f"{v:.3f}"


def _delta(d, lo, hi, p) -> str:
    if d is None or pd.isna(d):
        return ""
    return f"{float(d):+.1f} [{float(lo):+.1f}, {float(hi):+.1f}] p={_p(p)}"


def display_table(stats: pd.DataFrame) -> pd.DataFrame:
    """The statistics table as text cells: `mean [lo, hi]`, `Δ [lo, hi] p=..`, for Markdown and LaTeX."""
    rows = []
    for _, r in stats.iterrows():
        ci = f" [{_num(r['ci_lo'])}, {_num(r['ci_hi'])}]" if pd.notna(r["ci_lo"]) else ""
        rows.append({
            "method": r["method"], "budget": "" if pd.isna(r["budget"]) else str(int(r["budget"])),
            "score [95% CI]": _num(r["mean"]) + ci, "n": str(int(r["n"])),
            "Δ vs FullKV": _delta(r["vs_fullkv"], r["vs_fullkv_lo"], r["vs_fullkv_hi"], r["vs_fullkv_p"]),
            "Δ vs best bound": (_delta(r["vs_bound"], r["vs_bound_lo"], r["vs_bound_hi"], r["vs_bound_p"])
                                + (f" ({r['bound']})" if r["bound"] and pd.notna(r["vs_bound"]) else "")),
            "tokens/KV head": _num(r["tokens_per_kv_head"], "{:.0f}"),
            "MB/step": _num(r["mb_per_step"], "{:.3f}"),
        })
    return pd.DataFrame(rows).set_index("method")
