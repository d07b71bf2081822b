"""Score and efficiency tables of one table unit (benchmark, model, context setting): pandas pivots written as
CSV, Markdown and LaTeX."""
from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from eval.report.runs import budgets_of, ordered_labels, task_columns

FULLKV_NOTE = "FullKV attends every cached token and has no budget: its single run is repeated in every budget column."



def _n_text(values) -> int | str:
    vals = sorted({int(v) for v in values})
    return vals[0] if len(vals) == 1 else "/".join(map(str, vals))


def score_pivot(unit: pd.DataFrame) -> pd.DataFrame:
    """rows = method labels, columns = budgets (str) + n; FullKV's value repeated in every budget column."""
    budgets = budgets_of(unit)
    cols = [str(b) for b in budgets] or ["average"]
    rows = {}
    for label in ordered_labels(unit):
        g = unit[unit["label"] == label]
        free = g["budget"].isna()
        row = {}
        if free.any():
            value = float(g.loc[free, "average"].iloc[0])
            row = {c: value for c in cols}
        for _, r in g[~free].iterrows():
            row[str(int(r["budget"]))] = float(r["average"])
        row["n"] = _n_text(g["n"])
        rows[label] = row
    out = pd.DataFrame.from_dict(rows, orient="index", columns=cols + ["n"])
    out.index.name = "method"
    return out


def score_pivot_with_ci(unit: pd.DataFrame) -> pd.DataFrame:
    """score_pivot with text cells `mean [lo, hi]` where the runs carry ci_lo / ci_hi (eval/report/statistics.py)."""
    piv = score_pivot(unit)
    if "ci_lo" not in unit or unit["ci_lo"].isna().all():
        return piv
    out = piv.astype(object)
    for label in piv.index:
        g = unit[unit["label"] == label]
        for c in piv.columns[:-1]:
            r = g[g["budget"].isna()] if g["budget"].isna().any() else g[g["budget"].astype("string") == c]
            if len(r) and pd.notna(r["ci_lo"].iloc[0]) and pd.notna(piv.at[label, c]):
                out.at[label, c] = f"{piv.at[label, c]:.2f} [{r['ci_lo'].iloc[0]:.1f}, {r['ci_hi'].iloc[0]:.1f}]"
    return out


def _budget_pivot(unit: pd.DataFrame, cell) -> pd.DataFrame:
    """Rows = method labels, columns `b=<budget>`, each run's `cell(row)` (None: left empty) in its budget's column;
    a run without a budget (FullKV) fills every column."""
    cols = [str(b) for b in budgets_of(unit)]
    rows = {}
    for label in ordered_labels(unit):
        row = {}
        for _, r in unit[unit["label"] == label].iterrows():
            text = cell(r)
            if text is not None:
                row.update({c: text for c in cols} if pd.isna(r["budget"]) else {str(int(r["budget"])): text})
        rows[label] = row
    out = pd.DataFrame.from_dict(rows, orient="index", columns=cols)
    out.index.name = "method"
    return out.rename(columns=lambda c: f"b={c}")


def score_bytes_pivot(unit: pd.DataFrame) -> pd.DataFrame:
    """The compact headline: cells `score · MB read per decode step` (FullKV's one run in every column, as in
    score_pivot)."""
    def cell(r):
        mb = _div(r["bytes_read_per_step"], 1e6)
        return f"{r['average']:.1f}" + ("" if mb is None else f" · {mb:.1f}")

    return _budget_pivot(unit, cell)


def score_bytes_markdown(unit: pd.DataFrame, title: str) -> str:
    piv = score_bytes_pivot(unit)
    n = _n_text(unit["n"])
    return (f"## {title}: score · MB read per decode step\n\n" + to_markdown(piv, mark=_fullkv_marks(piv, unit, False))
            + f"\n\nscore = suite average (0-100) over n = {n} samples per run; MB = metadata + K/V bytes read per "
              f"decode step over all layers. † {FULLKV_NOTE}\n")


def forced_scored_pivot(unit: pd.DataFrame) -> pd.DataFrame:
    """Cells `forced + scored` tokens per KV head and decode step (means over steps and layers; scored = attended -
    forced: what the method chose by score). FullKV's run in every column."""
    def cell(r):
        forced, attended = r.get("forced_tokens_per_step"), r["attended_tokens_per_step"]
        if forced is None or pd.isna(forced) or pd.isna(attended):
            return None
        return f"all {attended:.0f}" if pd.isna(r["budget"]) else f"{forced:.0f} + {attended - forced:.0f}"

    return _budget_pivot(unit, cell)


def forced_scored_markdown(unit: pd.DataFrame, title: str) -> str:
    return (f"## {title}: forced + scored tokens per KV head and decode step\n\n" + to_markdown(forced_scored_pivot(unit))
            + "\n\nforced = tokens attended without being chosen by score (the method's always-attended set, "
              "docs/budgets.md); scored = the rest of the attended tokens; means over decode steps and full-attention "
              "layers (for a per-query-head method, the union over its query heads).\n")


def task_tables(unit: pd.DataFrame) -> dict:
    """budget (or None when the unit has no budgets) -> rows = method labels, columns = tasks + average + n; FullKV's
    run appears in every budget's table."""
    tasks = task_columns(unit)
    budgets = budgets_of(unit) or [None]
    free = unit[unit["budget"].isna()]
    out = {}
    for b in budgets:
        sel = pd.concat([free, unit[unit["budget"] == b]]) if b is not None else free
        rows = {}
        for label in ordered_labels(sel):
            r = sel[sel["label"] == label].iloc[0]
            rows[label] = {**{t: r.get(f"task:{t}") for t in tasks}, "average": r["average"], "n": int(r["n"])}
        t = pd.DataFrame.from_dict(rows, orient="index", columns=tasks + ["average", "n"])
        t.index.name = "method"
        out[b] = t
    return out


def scores_long(unit: pd.DataFrame) -> pd.DataFrame:
    tasks = task_columns(unit)
    rows = []
    for label in ordered_labels(unit):
        g = unit[unit["label"] == label].sort_values("budget", na_position="first")
        for _, r in g.iterrows():
            rows.append({"method": label, "budget": r["budget"], **{t: r.get(f"task:{t}") for t in tasks},
                         "average": r["average"], "n": int(r["n"])})
    return pd.DataFrame(rows)


def efficiency_table(unit: pd.DataFrame) -> pd.DataFrame:
    """Per method x budget: tokens, bytes, coverage, every diagnostic a method reported (column = its name), time."""
    diagnostics = [c for c in unit.columns if c.startswith("diag:") and unit[c].notna().any()]
    rows = []
    for label in ordered_labels(unit):
        g = unit[unit["label"] == label].sort_values("budget", na_position="first")
        for _, r in g.iterrows():
            row = {
                "method": label, "budget": r["budget"],
                "attended tokens/step": _round(r["attended_tokens_per_step"], 1),
                "context tokens/step": _round(r["context_tokens_per_step"], 1),
                "bytes read/step (MB)": _round(_div(r["bytes_read_per_step"], 1e6), 3),
                "bytes vs FullKV": _round(r["bytes_read_ratio"], 4),
                "coverage": _round(r["coverage"], 4),
                **{c[5:]: _round(r[c], 4) for c in diagnostics},
                "s/sample": _round(r["seconds_per_sample"], 2), "n": int(r["n"]),
            }
            if unit["decode_seconds_per_sample"].notna().any():  # recorded since the prefill/decode split
                row["prefill s/sample"] = _round(r["prefill_seconds_per_sample"], 2)
                row["decode s/sample"] = _round(r["decode_seconds_per_sample"], 2)
            if "layers:sliding_attention:bytes_read_per_step" in unit and \
                    unit["layers:sliding_attention:bytes_read_per_step"].notna().any():
                row["full-attention layers MB/step"] = _round(_div(r.get("layers:full_attention:bytes_read_per_step"),
                                                                   1e6), 3)
                row["sliding layers MB/step"] = _round(_div(r["layers:sliding_attention:bytes_read_per_step"], 1e6), 3)
            if unit["latency_ms_per_step"].notna().any():
                row["decode ms/step"] = _round(r["latency_ms_per_step"], 3)
            rows.append(row)
    out = pd.DataFrame(rows)
    out["budget"] = out["budget"].astype("Int64")
    return out


def _div(a, b):
    return None if a is None or pd.isna(a) else a / b


def _round(v, nd):
    return None if v is None or pd.isna(v) else round(float(v), nd)


def _cell(v, floatfmt: str = "{:.2f}") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
        return ""
    if isinstance(v, (float, np.floating)):
        return floatfmt.format(v)
    return str(v)


def to_markdown(df: pd.DataFrame, index: bool = True, floatfmt: str = "{:.2f}", mark: dict | None = None) -> str:
    """A GitHub Markdown table; `mark` appends a marker to index labels (e.g. the FullKV footnote)."""
    mark = mark or {}
    multi = isinstance(df.index, pd.MultiIndex)
    names = [n or "" for n in df.index.names] if multi else [df.index.name or ""]
    head = (names if index else []) + [str(c) for c in df.columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for idx, row in zip(df.index, df.astype(object).itertuples(index=False)):
        first = [str(i) for i in idx] if multi else [f"{idx}{mark.get(idx, '')}"]
        cells = (first if index else []) + [_cell(v, floatfmt) for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def latex_escape(s) -> str:
    s = str(s)
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("$", r"\$"), ("#", r"\#"),
                 ("_", r"\_"), ("{", r"\{"), ("}", r"\}"), ("~", r"\textasciitilde{}"), ("^", r"\^{}")):
        s = s.replace(a, b) if a != "\\" else s.replace(a, "\x00")
    return s.replace("\x00", r"\textbackslash{}")


def to_latex(df: pd.DataFrame, caption: str | None = None, floatfmt: str = "{:.2f}", mark: dict | None = None,
             footnote: str | None = None, header_prefix: str = "") -> str:
    """A booktabs tabular (inside a table environment when caption is given); `mark` adds $^\\dagger$-style marks."""
    mark = mark or {}
    ncols = len(df.columns) + 1
    head = [latex_escape(df.index.name or "")] + [latex_escape(f"{header_prefix}{c}" if str(c).isdigit() else c)
                                                  for c in df.columns]
    lines = [r"\begin{tabular}{l" + "r" * len(df.columns) + "}", r"\toprule", " & ".join(head) + r" \\", r"\midrule"]
    for idx, row in zip(df.index, df.astype(object).itertuples(index=False)):
        cells = [latex_escape(idx) + mark.get(idx, "")] + [latex_escape(_cell(v, floatfmt)) for v in row]
        lines.append(" & ".join(cells) + r" \\")
    lines.append(r"\bottomrule")
    if footnote:
        lines.append(r"\multicolumn{" + str(ncols) + r"}{l}{\footnotesize " + footnote + r"} \\")
    lines.append(r"\end{tabular}")
    if caption:
        lines = [r"\begin{table}[t]", r"\centering", r"\caption{" + latex_escape(caption) + "}"] + lines + [
            r"\end{table}"]
    return "\n".join(lines)


def _fullkv_marks(df: pd.DataFrame, unit: pd.DataFrame, latex: bool) -> dict:
    free = set(unit.loc[unit["budget"].isna(), "label"])
    return {lab: (r"$^\dagger$" if latex else "†") for lab in df.index if lab in free}


def unit_title(bench, model, context) -> str:
    return f"{bench} / {model} / context {context}"


def scores_markdown(unit: pd.DataFrame, title: str) -> str:
    piv = score_pivot_with_ci(unit)
    has_free = unit["budget"].isna().any()
    parts = [f"## {title}: average score by budget", "",
             to_markdown(piv.rename(columns=lambda c: f"b={c}" if c.isdigit() else c),
                         mark=_fullkv_marks(piv, unit, False))]
    if has_free:
        parts += ["", f"† {FULLKV_NOTE}"]
    parts += ["", "n = samples per run (a/b: the runs of that row have different sample counts)."
              + (" [lo, hi] = 95% stratified bootstrap interval over samples." if "ci_lo" in unit
                 and unit["ci_lo"].notna().any() else "")]
    for b, t in task_tables(unit).items():
        parts += ["", f"### {'no budget' if b is None else f'budget {b}'}: score per task", "",
                  to_markdown(t, mark=_fullkv_marks(t, unit, False))]
    return "\n".join(parts) + "\n"


def scores_latex(unit: pd.DataFrame, title: str) -> str:
    piv = score_pivot_with_ci(unit)
    note = (r"$^\dagger$ " + latex_escape(FULLKV_NOTE)) if unit["budget"].isna().any() else None
    parts = [f"% {title}: average score by budget (generated by eval/report/)",
             to_latex(piv, caption=f"{title}: average score by token budget (n = samples per run)",
                      mark=_fullkv_marks(piv, unit, True), footnote=note, header_prefix="b=")]
    for b, t in task_tables(unit).items():
        parts += ["", to_latex(t, caption=f"{title}: score per task, {'no budget' if b is None else f'budget {b}'}",
                               mark=_fullkv_marks(t, unit, True), footnote=note)]
    return "\n".join(parts) + "\n"


