"""Tables and plots from finished runs: every `metrics.json` under the given paths -> one pandas DataFrame -> CSV,
Markdown and LaTeX tables and matplotlib figures (PNG + PDF). It never runs a model.

    python -m eval.report results/                       # committed results
    python -m eval.report outputs/runs results/gpu --out outputs/report

What it reads (recursively under each path; `wandb/` folders and `predictions.jsonl` are skipped):
  * run metrics: files named `metrics.json` (`outputs/runs/<run>/metrics.json`) and any other `*.json` in the
    metrics.json schema (the copies committed as `results/<sweep>/<method>[_b<budget>].json`); other JSON files are
    counted and ignored;
  * decode latency: `*.jsonl` files of `scripts/bench_decode.py` (records of kind "measurement"; `results/gpu/`).
    CPU dry-run records (`timing == "cpu_wall"`) are ignored: their times mean nothing.

Runs are grouped by (benchmark, model); inside a group, tables are per context setting (RULER's context length(s),
LongBench / InfiniteBench `max_length`). A row is a method; when runs of one method differ in any option (method
options, seed, tasks, samples, benchmark settings, dtype), the options that differ are appended to its label, so two
rows never share a label (a field that only some runs record, e.g. from an older metrics format, does not count).
Two runs with the same (benchmark, model, context, method, budget, config) are an error listing the files, never
merged. FullKV attends every token and has no budget: it is one row with its single
value repeated in every budget column (marked with a dagger and a footnote).

Output, per (benchmark, model) in `<out>/<benchmark>_<model>/` (a group with several context settings gets one set
of per-context files, each name suffixed `_ctx<setting>`, e.g. scores_ctx4096.md):
  runs.csv                 one row per run of the group (all columns of the DataFrame)
  scores.{csv,md,tex}      rows = methods, columns = budgets, cell = average score, n = samples per run; the .md and
                           .tex files also hold one per-task table per budget (rows = methods, columns = tasks)
  scores_by_task.csv       the per-task scores in long form, one row per method x budget
  efficiency.{csv,md}      per method x budget: attended tokens, context tokens, bytes read per step and vs FullKV,
                           coverage, certificate, seconds per sample (and decode ms/step when a run recorded it)
  score_vs_budget.{png,pdf}      average score vs budget (log2 axis), one line per method, FullKV a horizontal line,
                                 the Oracle dashed
  task_heatmap.{png,pdf}         rows = method x budget, columns = tasks
  coverage_vs_budget.{png,pdf}   attention-mass coverage of the selection vs budget (when recorded)
  bytes_vs_context.{png,pdf}     bytes read per decode step vs context tokens per step, one series per method x
                                 budget, across the group's context settings
and in `<out>/`: runs.csv (every run), latency.{csv,md} and latency_vs_context.{png,pdf} when decode-latency records
exist (otherwise it prints why it skipped them). Every plot_* function returns its matplotlib Figure.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: E402
from tqdm import tqdm  # noqa: E402

METHOD_ORDER = ["fullkv", "oracle", "locks", "quest", "shadowkv", "rocketkv", "lrqk"]
DISPLAY = {"fullkv": "FullKV", "oracle": "Oracle", "locks": "LOCKS", "quest": "Quest", "shadowkv": "ShadowKV",
           "rocketkv": "RocketKV", "lrqk": "LRQK"}
FULLKV_NOTE = "FullKV attends every cached token and has no budget: its single run is repeated in every budget column."
# benchmark-record keys that describe the machine or package versions, not the experiment
IGNORED_RECORD_KEYS = {"name", "benchmark", "tokenizer", "tokenizer_revision", "tokenizer_class", "numpy", "nltk",
                       "wonderwords", "datasets", "versions", "metric_versions", "data", "data_source"}
METRICS_KEYS = {"scores", "method", "average", "num_samples"}
# decode-latency records (scripts/bench_decode.py): the end-to-end methods (components locks_score / topk /
# locks_decode are left out of the figures; they stay in latency.csv)
FULLKV_KERNELS = ["sdpa_cudnn", "sdpa_flash", "triton_full"]
SPARSE_KERNELS = ["locks_fused", "quest_fused", "quest_fused_per_head", "locks_torch"]
LATENCY_KEY = ["shape", "context", "batch", "method", "budget", "Hq", "Hkv", "d", "dtype", "summaries"]


class ReportError(Exception):
    """A problem with the inputs (nothing found, duplicate runs); the CLI prints it and exits 2."""


class DuplicateRunError(ReportError):
    pass


# ---------------------------------------------------------------------------------------------------------------
# collecting


def find_result_files(paths) -> tuple[list[Path], list[Path]]:
    """(json candidates, jsonl candidates) under the paths, each file once (resolved), sorted."""
    json_files, jsonl_files = set(), set()
    for p in map(Path, paths):
        if not p.exists():
            raise ReportError(f"{p}: no such file or directory")
        files = [p] if p.is_file() else (f for f in p.rglob("*") if f.is_file())
        for f in files:
            if "wandb" in f.parts or any(part.startswith(".") for part in f.parts[len(p.parts):]):
                continue
            if f.suffix == ".json":
                json_files.add(f.resolve())
            elif f.suffix == ".jsonl" and f.name != "predictions.jsonl":
                jsonl_files.add(f.resolve())
    return sorted(json_files), sorted(jsonl_files)


def is_metrics(obj) -> bool:
    return isinstance(obj, dict) and METRICS_KEYS <= obj.keys() and isinstance(obj.get("method"), dict)


def benchmark_name(m: dict) -> str:
    rec = m.get("benchmark") or {}
    if not isinstance(rec, dict):
        return str(rec)
    if rec.get("name"):
        return str(rec["name"])
    if rec.get("benchmark"):
        return str(rec["benchmark"])
    if ("context_lengths" in rec or "generator_versions" in rec or "generator_version" in rec
            or str(rec.get("truncation", "")).startswith("none (prompts sized")):
        return "ruler"
    if "template_family" in rec or "ib_scoring" in rec:
        return "infinitebench"
    if "e" in rec:
        return "longbench_e" if rec["e"] else "longbench"
    return "unknown"


def context_setting(bench: str, rec: dict) -> tuple[str, int | None]:
    """(label, longest length): RULER's context length(s), else the truncation length max_length."""
    if bench == "ruler":
        value = rec.get("context_lengths", rec.get("context_length"))
    else:
        value = rec.get("max_length", rec.get("context_length"))
    if value is None:
        return "na", None
    values = [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]
    return "+".join(map(str, values)), max(values)


def fingerprint(m: dict) -> dict:
    """Everything that makes two runs of one method different experiments, except the budget."""
    method = {f"{k}": v for k, v in m["method"].items() if k not in ("name", "budget", "backend")}
    rec = m.get("benchmark") if isinstance(m.get("benchmark"), dict) else {}
    fp = dict(method)
    fp.update({"seed": m.get("seed"), "dtype": m.get("dtype"), "tasks": sorted(m["scores"]),
               "num_samples": m.get("num_samples")})
    fp.update({f"benchmark.{k}": v for k, v in rec.items()
               if k not in IGNORED_RECORD_KEYS and k not in ("context_lengths", "context_length", "max_length")})
    return fp


def _canon(v) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def run_row(m: dict, path: Path) -> dict:
    method = m["method"]
    name = method["name"]
    budget = method.get("budget", m.get("budget"))
    if name == "fullkv" or budget is None:  # budget-free (files written before FullKV dropped its budget say 2048)
        budget = None
    bench = benchmark_name(m)
    rec = m.get("benchmark") if isinstance(m.get("benchmark"), dict) else {}
    ctx_label, ctx_len = context_setting(bench, rec)
    attended = m.get("attended_tokens_per_step")
    context_tokens = m.get("context_tokens_per_step")
    estimated = False
    if context_tokens is None and attended is not None and m.get("attended_fraction"):
        context_tokens, estimated = attended / m["attended_fraction"], True
    fp = fingerprint(m)
    row = {
        "path": str(path), "benchmark": bench, "model": m.get("model", "unknown"), "context": ctx_label,
        "context_length": ctx_len, "method": name, "budget": budget,
        "budget_mode": m.get("budget_mode", method.get("budget_mode")),
        "n": int(sum(v for v in m["num_samples"].values() if v)), "average": m["average"],
        "attended_tokens_per_step": attended, "context_tokens_per_step": context_tokens,
        "context_tokens_estimated": estimated, "attended_fraction": m.get("attended_fraction"),
        "bytes_read_per_step": m.get("bytes_read_per_step"), "full_bytes_per_step": m.get("full_bytes_per_step"),
        "bytes_read_ratio": m.get("bytes_read_ratio"), "coverage": m.get("coverage"),
        "certificate": m.get("certificate"), "plugin_coverage": m.get("plugin_coverage"),
        "seconds_per_sample": m.get("seconds_per_sample"),
        "latency_ms_per_step": m.get("decode_ms_per_step", m.get("ms_per_step")),
        "device": m.get("device"), "dtype": m.get("dtype"), "seed": m.get("seed"), "run_key": m.get("run_key"),
        "config": _canon(fp),
    }
    for task, score in m["scores"].items():
        row[f"task:{task}"] = score
    for k, v in (m.get("method_metrics") or {}).items():
        row[f"metric:{k}"] = v
    return row


def load_runs(paths, progress: bool = True, files: list[Path] | None = None) -> pd.DataFrame:
    """One row per metrics file under the paths (see run_row), with `label` (the table row name) assigned.
    Raises ReportError when nothing is found and DuplicateRunError on duplicate runs."""
    if files is None:
        files, _ = find_result_files(paths)
    rows, ignored = [], 0
    for f in tqdm(files, desc="reading metrics", unit="file", disable=not progress or len(files) < 2):
        try:
            m = json.loads(f.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            ignored += 1
            continue
        if not is_metrics(m):
            ignored += 1
            continue
        rows.append(run_row(m, f))
    if not rows:
        raise ReportError(f"no metrics.json (or metrics-schema *.json) under {_paths_text(paths)}")
    df = pd.DataFrame(rows)
    df["budget"] = df["budget"].astype("Int64")
    df = assign_labels(df)
    df.attrs["ignored_json"] = ignored
    check_duplicates(df)
    return df


def check_duplicates(df: pd.DataFrame) -> None:
    """Runs that land in the same table cell (benchmark, model, context, label, budget) have the same config (up to
    fields only some of them record): an error listing the files, never merged."""
    key = ["benchmark", "model", "context", "label", "budget"]
    dups = []
    for k, g in df.groupby(key, dropna=False, sort=True):
        if len(g) > 1:
            b = "no budget" if pd.isna(k[4]) else f"b={k[4]}"
            dups.append(f"  ({k[0]}, {k[1]}, context {k[2]}, {k[3]}, {b}): " + ", ".join(g["path"]))
    if dups:
        raise DuplicateRunError("duplicate runs (the same benchmark, model, method, budget and config); keep one "
                                "file of each, or pass only one of the directories:\n" + "\n".join(dups))


def _option_text(key: str, v) -> str:
    if key == "num_samples" and isinstance(v, dict) and v:
        counts = set(v.values())
        return f"n/task={counts.pop()}" if len(counts) == 1 else f"n={sum(x for x in v.values() if x)}"
    return f"{key}={_short(v)}"


def _short(v) -> str:
    if isinstance(v, (list, tuple)):
        return ",".join(map(str, v))
    if isinstance(v, dict):
        s = json.dumps(v, sort_keys=True, separators=(",", ":"))
        return s if len(s) <= 40 else s[:37] + "..."
    return str(v)


def assign_labels(df: pd.DataFrame) -> pd.DataFrame:
    """label = display name of the method + the options that differ between its runs in one table (an option
    differs when two runs record different values; a field that only some runs record does not tell them apart)."""
    df = df.copy()
    df["label"] = [DISPLAY.get(m, m) for m in df["method"]]
    for _, g in df.groupby(["benchmark", "model", "context", "method"], sort=False):
        fps = [json.loads(c) for c in g["config"]]
        keys = sorted(set().union(*fps))
        varying = [k for k in keys if len({_canon(fp[k]) for fp in fps if fp.get(k) is not None}) > 1]
        if not varying:
            continue
        for idx, fp in zip(g.index, fps):
            df.at[idx, "label"] = (DISPLAY.get(df.at[idx, "method"], df.at[idx, "method"]) + " ("
                                   + ", ".join(_option_text(k, fp.get(k)) for k in varying) + ")")
    return df


def method_rank(method: str) -> int:
    return METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER)


def ordered_labels(df: pd.DataFrame) -> list[str]:
    pairs = {(method_rank(m), lab) for m, lab in zip(df["method"], df["label"])}
    return [lab for _, lab in sorted(pairs)]


def task_columns(df: pd.DataFrame) -> list[str]:
    """Task names present in df (columns task:<name> with a value), in first-seen order."""
    return [c[5:] for c in df.columns if c.startswith("task:") and df[c].notna().any()]


def budgets_of(df: pd.DataFrame) -> list[int]:
    return sorted(int(b) for b in df["budget"].dropna().unique())


def groups(df: pd.DataFrame):
    """(benchmark, model) -> DataFrame, sorted."""
    return [((b, m), g) for (b, m), g in df.groupby(["benchmark", "model"], sort=True)]


def units(df: pd.DataFrame):
    """Table units of one (benchmark, model) group: context setting -> DataFrame, by context length."""
    out = [(c, g) for c, g in df.groupby("context", sort=False)]
    return sorted(out, key=lambda cg: (cg[1]["context_length"].fillna(-1).max(), cg[0]))


# ---------------------------------------------------------------------------------------------------------------
# tables


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
                "coverage": _round(r["coverage"], 4), "certificate": _round(r["certificate"], 4),
                "s/sample": _round(r["seconds_per_sample"], 2), "n": int(r["n"]),
            }
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


def _unit_title(bench, model, context) -> str:
    return f"{bench} / {model} / context {context}"


def scores_markdown(unit: pd.DataFrame, title: str) -> str:
    piv = score_pivot(unit)
    has_free = unit["budget"].isna().any()
    parts = [f"## {title}: average score by budget", "",
             to_markdown(piv.rename(columns=lambda c: f"b={c}" if c.isdigit() else c),
                         mark=_fullkv_marks(piv, unit, False))]
    if has_free:
        parts += ["", f"† {FULLKV_NOTE}"]
    parts += ["", "n = samples per run (a/b: the runs of that row have different sample counts)."]
    for b, t in task_tables(unit).items():
        parts += ["", f"### {'no budget' if b is None else f'budget {b}'}: score per task", "",
                  to_markdown(t, mark=_fullkv_marks(t, unit, False))]
    return "\n".join(parts) + "\n"


def scores_latex(unit: pd.DataFrame, title: str) -> str:
    piv = score_pivot(unit)
    note = (r"$^\dagger$ " + latex_escape(FULLKV_NOTE)) if unit["budget"].isna().any() else None
    parts = [f"% {title}: average score by budget (generated by eval/report/)",
             to_latex(piv, caption=f"{title}: average score by token budget (n = samples per run)",
                      mark=_fullkv_marks(piv, unit, True), footnote=note, header_prefix="b=")]
    for b, t in task_tables(unit).items():
        parts += ["", to_latex(t, caption=f"{title}: score per task, {'no budget' if b is None else f'budget {b}'}",
                               mark=_fullkv_marks(t, unit, True), footnote=note)]
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------------------------------------------------------
# figures


def _style(label: str, method: str) -> dict:
    if method == "oracle":
        return {"linestyle": "--", "marker": "s"}
    return {"linestyle": "-", "marker": "o"}


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


def plot_score_vs_budget(unit: pd.DataFrame, title: str = "", value: str = "average",
                         ylabel: str = "average score (0-100)"):
    """One line per method (log2 budget axis), FullKV a horizontal line, the Oracle dashed. Returns the Figure."""
    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    budgets = budgets_of(unit)
    for label in ordered_labels(unit):
        g = unit[(unit["label"] == label)]
        if g["budget"].isna().all():
            y = g[value].iloc[0]
            if y is not None and not pd.isna(y):
                ax.axhline(float(y), color="black", linestyle=":", linewidth=1.5, label=label)
            continue
        g = g[g["budget"].notna() & g[value].notna()].sort_values("budget")
        if len(g):
            ax.plot(g["budget"].astype(int).to_numpy(), g[value].astype(float).to_numpy(), label=label,
                    **_style(label, g["method"].iloc[0]))
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


# ---------------------------------------------------------------------------------------------------------------
# decode latency (scripts/bench_decode.py JSON lines)


def load_bench_records(files, kind: str, gpu_timing, key: list[str], what: str, progress: bool = True) -> pd.DataFrame:
    """Records of one `kind` from benchmark JSON-lines files (other files are ignored: reading a file stops at its
    first line that is not a JSON object with a "kind"), flat fields only, plus the run's device ("gpu") and the
    source file:line. Records whose timing fails `gpu_timing` (CPU dry runs) are dropped and counted in
    df.attrs['cpu_dry_run']; two records with the same `key` are a DuplicateRunError naming both places."""
    rows, cpu = [], 0
    files = list(files)
    for f in tqdm(files, desc=f"reading {what}", unit="file", disable=not progress or len(files) < 2):
        f = Path(f)
        gpu = None
        try:
            lines = f.read_text().splitlines()
        except UnicodeDecodeError:
            continue
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                break  # not a bench file (or a torn last line)
            if not isinstance(r, dict) or "kind" not in r:
                break
            if r["kind"] == "run":
                gpu = r.get("device")
            if r["kind"] != kind:
                continue
            if not gpu_timing(r.get("timing")):
                cpu += 1
                continue
            rows.append({**{k: v for k, v in r.items() if not isinstance(v, (dict, list))}, "gpu": gpu,
                         "file": str(f), "line": i + 1})
    df = pd.DataFrame(rows)
    df.attrs["cpu_dry_run"] = cpu
    if len(df):
        cols = [k for k in key if k in df.columns]
        dups = [f"  {dict(zip(cols, k))}: " + ", ".join(f"{a}:{b}" for a, b in zip(g['file'], g['line']))
                for k, g in df.groupby(cols, dropna=False) if len(g) > 1]
        if dups:
            raise DuplicateRunError(f"duplicate {what} measurements (same {', '.join(cols)}); keep one run per "
                                    "configuration:\n" + "\n".join(dups))
    return df


def load_latency(files, progress: bool = True) -> pd.DataFrame:
    """Measurement records of bench_decode.py from the given *.jsonl files (non-bench files are ignored). CPU
    dry-run records are dropped (df.attrs['cpu_dry_run'] counts them). Duplicates are a DuplicateRunError."""
    df = load_bench_records(files, "measurement", lambda t: t != "cpu_wall", LATENCY_KEY, "decode-latency", progress)
    return df[df["ms"].notna()] if "ms" in df.columns else df


def _latency_panels(lat: pd.DataFrame):
    shapes = sorted(lat["shape"].unique())
    batches = sorted(lat["batch"].unique())
    fig, axes = plt.subplots(len(batches), len(shapes), figsize=(5 * len(shapes), 3.6 * len(batches)),
                             squeeze=False, layout="constrained")
    for i, b in enumerate(batches):
        for j, s in enumerate(shapes):
            sub = lat[(lat["batch"] == b) & (lat["shape"] == s)]
            heads = ""
            if len(sub) and {"Hq", "Hkv"} <= set(sub.columns):
                heads = f" ({int(sub['Hq'].iloc[0])} q / {int(sub['Hkv'].iloc[0])} KV heads)"
            yield fig, axes[i][j], sub, f"{s}{heads}, batch {b}"


def _context_axis(ax, contexts) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(sorted(contexts)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: tokens_label(x)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("context length (tokens, log2 scale)")
    ax.grid(True, alpha=0.3)


def _latency_methods(sub: pd.DataFrame) -> list[str]:
    return [m for m in FULLKV_KERNELS + SPARSE_KERNELS if m in set(sub["method"])]


def plot_latency_vs_context(lat: pd.DataFrame):
    """Decode latency of one layer (ms, median) vs context, one panel per shape x batch, one line per method
    (FullKV kernels dashed). Returns the Figure."""
    fig = None
    for fig, ax, sub, title in _latency_panels(lat):
        for m in _latency_methods(sub):
            s = sub[sub["method"] == m].sort_values("context")
            ax.plot(s["context"].to_numpy(float), s["ms"].to_numpy(float), label=m, marker="o",
                    linestyle="--" if m in FULLKV_KERNELS else "-")
        _context_axis(ax, lat["context"].unique())
        ax.set_yscale("log")
        ax.set_ylabel("decode latency per layer (ms)")
        ax.set_title(title, fontsize=9)
        if ax.get_lines():
            ax.legend(fontsize=7)
    return fig


def plot_speedup_vs_context(lat: pd.DataFrame):
    """speedup_vs_fastest_fullkv of the sparse methods vs context; 1 = the fastest FullKV kernel. Returns the Figure."""
    fig = None
    for fig, ax, sub, title in _latency_panels(lat):
        for m in [m for m in SPARSE_KERNELS if m in set(sub["method"])]:
            s = sub[(sub["method"] == m)].dropna(subset=["speedup_vs_fastest_fullkv"]).sort_values("context")
            ax.plot(s["context"].to_numpy(float), s["speedup_vs_fastest_fullkv"].to_numpy(float), label=m,
                    marker="o")
        ax.axhline(1.0, color="black", linestyle=":", label="fastest FullKV")
        _context_axis(ax, lat["context"].unique())
        ax.set_ylabel("speedup vs fastest FullKV kernel")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    return fig


def plot_bench_bytes_vs_context(lat: pd.DataFrame):
    """Analytic bytes read per decode step (all KV heads and batch rows, one layer) vs context, per method.
    Returns the Figure."""
    fig = None
    for fig, ax, sub, title in _latency_panels(lat):
        for m in ["triton_full"] + SPARSE_KERNELS:
            s = sub[sub["method"] == m].dropna(subset=["bytes"]).sort_values("context")
            if len(s):
                ax.plot(s["context"].to_numpy(float), s["bytes"].to_numpy(float) / 1e6,
                        label="FullKV" if m == "triton_full" else m, marker="o",
                        linestyle=":" if m == "triton_full" else "-", color="black" if m == "triton_full" else None)
        _context_axis(ax, lat["context"].unique())
        ax.set_yscale("log")
        ax.set_ylabel("bytes read per decode step (MB)")
        ax.set_title(title, fontsize=9)
        if ax.get_lines():
            ax.legend(fontsize=7)
    return fig


def latency_table(lat: pd.DataFrame) -> pd.DataFrame:
    """rows = (shape, batch, method), columns = ms at each context and the speedup vs the fastest FullKV kernel."""
    rows = {}
    for (shape, batch, method), g in lat.groupby(["shape", "batch", "method"], sort=True):
        row = {}
        for _, r in g.sort_values("context").iterrows():
            c = tokens_label(r["context"])
            row[f"ms@{c}"] = r["ms"]
            if pd.notna(r.get("speedup_vs_fastest_fullkv")):
                row[f"speedup@{c}"] = r["speedup_vs_fastest_fullkv"]
        rows[(shape, int(batch), method)] = row
    out = pd.DataFrame.from_dict(rows, orient="index")
    order = sorted(out.columns, key=lambda c: (c.split("@")[0] != "ms", _ctx_value(c.split("@")[1])))
    out = out[order]
    out.index = pd.MultiIndex.from_tuples(out.index, names=["shape", "batch", "method"])
    return out


def _ctx_value(label: str) -> int:
    mult = {"K": 1024, "M": 2**20}.get(label[-1], 1)
    return int(label[:-1] if label[-1] in "KM" else label) * mult


# ---------------------------------------------------------------------------------------------------------------
# end-to-end decode step (scripts/bench_e2e.py JSON lines)

E2E_KEY = ["shape", "context", "method", "budget", "batch", "summaries"]


def load_e2e(files, progress: bool = True) -> pd.DataFrame:
    """Records of kind "e2e" of scripts/bench_e2e.py (the CUDA-graph decode step of a whole model) from *.jsonl
    files; CPU dry-run records (timing "eager_static") are dropped (df.attrs['cpu_dry_run'] counts them).
    Duplicates are a DuplicateRunError."""
    return load_bench_records(files, "e2e", lambda t: t == "cuda_graph", E2E_KEY, "end-to-end decode", progress)


def e2e_table(df: pd.DataFrame) -> pd.DataFrame:
    """rows = (shape, method); per context: ms per step (graph replay), tokens/s, speedup vs FullKV and the
    byte-bound ceiling (FullKV bytes / the method's bytes, weights included), GB read per step."""
    rows = {}
    for (shape, method), g in df.groupby(["shape", "method"], sort=True):
        row = {}
        for _, r in g.sort_values("context").iterrows():
            c = tokens_label(r["context"])
            row[f"ms@{c}"] = r["ms_graph"]
            row[f"tok/s@{c}"] = r["tokens_per_s"]
            if pd.notna(r.get("speedup_vs_fullkv")):
                row[f"speedup@{c}"] = r["speedup_vs_fullkv"]
                row[f"ceiling@{c}"] = r["byte_ceiling"]
            row[f"GB@{c}"] = r["bytes_per_step"] / 1e9
        rows[(shape, method)] = row
    out = pd.DataFrame.from_dict(rows, orient="index")
    kinds = ["ms", "tok/s", "speedup", "ceiling", "GB"]
    out = out[sorted(out.columns, key=lambda c: (kinds.index(c.split("@")[0]), _ctx_value(c.split("@")[1])))]
    out.index = pd.MultiIndex.from_tuples(out.index, names=["shape", "method"])
    return out


def plot_e2e_speedup(df: pd.DataFrame):
    """Whole-step speedup over FullKV vs context, one panel per model shape, one colour per method: measured
    (solid) and the byte-bound ceiling (dashed). Returns the Figure."""
    shapes = sorted(df["shape"].unique())
    fig, axes = plt.subplots(1, len(shapes), figsize=(5 * len(shapes), 3.6), squeeze=False, layout="constrained")
    for ax, shape in zip(axes[0], shapes):
        sub = df[(df["shape"] == shape)].dropna(subset=["speedup_vs_fullkv"])
        for method in sorted(sub["method"].unique()):
            s = sub[sub["method"] == method].sort_values("context")
            x = s["context"].to_numpy(float)
            line, = ax.plot(x, s["speedup_vs_fullkv"].to_numpy(float), marker="o", label=method)
            ax.plot(x, s["byte_ceiling"].to_numpy(float), linestyle="--", color=line.get_color(),
                    label=f"{method} byte ceiling")
        ax.axhline(1.0, color="black", linestyle=":", label="FullKV")
        _context_axis(ax, df["context"].unique())
        ax.set_ylabel("decode-step speedup vs FullKV")
        ax.set_title(f"{shape}: whole decode step, CUDA graph", fontsize=9)
        ax.legend(fontsize=7)
    return fig


# ---------------------------------------------------------------------------------------------------------------
# the report


def write_scores(unit: pd.DataFrame, stem: Path, title: str, by_task: Path | None = None) -> list[Path]:
    """<stem>.csv (average pivot), <by_task>.csv (long form; default <stem>_by_task), <stem>.md and <stem>.tex
    (pivot + per-task tables per budget)."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    by_task = by_task or stem.with_name(stem.name + "_by_task")
    out = [stem.with_name(stem.name + ".csv"), by_task.with_name(by_task.name + ".csv"),
           stem.with_name(stem.name + ".md"), stem.with_name(stem.name + ".tex")]
    score_pivot(unit).to_csv(out[0])
    scores_long(unit).to_csv(out[1], index=False)
    out[2].write_text(scores_markdown(unit, title))
    out[3].write_text(scores_latex(unit, title))
    return out


def write_efficiency(unit: pd.DataFrame, stem: Path, title: str) -> list[Path]:
    stem.parent.mkdir(parents=True, exist_ok=True)
    out = [stem.with_name(stem.name + s) for s in (".csv", ".md")]
    eff = efficiency_table(unit)
    eff.to_csv(out[0], index=False)
    out[1].write_text(
        f"## {title}: efficiency per method and budget\n\n"
        + to_markdown(eff.set_index("method"), floatfmt="{:g}")
        + "\n\nbytes per decode step over all layers and KV heads; bytes vs FullKV = the same step's dense read; "
          "coverage = attention mass of the attended tokens; s/sample = wall time on the run's device."
        + (" context tokens/step is estimated (attended tokens / attended fraction: these metrics files do not "
           "record it)." if unit["context_tokens_estimated"].astype(bool).any() else "") + "\n")
    return out


def write_unit(unit: pd.DataFrame, out_dir: Path, title: str, prefix: str = "", suffix: str = "") -> list[Path]:
    """Tables and per-unit figures of one (benchmark, model, context) unit: <prefix>scores<suffix>.*,
    <prefix>efficiency<suffix>.*, <prefix>score_vs_budget<suffix>, <prefix>task_heatmap<suffix>,
    <prefix>coverage_vs_budget<suffix> (when coverage was recorded)."""
    written = write_scores(unit, out_dir / f"{prefix}scores{suffix}", title,
                           by_task=out_dir / f"{prefix}scores_by_task{suffix}")
    written += write_efficiency(unit, out_dir / f"{prefix}efficiency{suffix}", title)
    written += save_figure(plot_score_vs_budget(unit, title), out_dir / f"{prefix}score_vs_budget{suffix}")
    written += save_figure(plot_task_heatmap(unit, title), out_dir / f"{prefix}task_heatmap{suffix}")
    if unit.loc[unit["budget"].notna(), "coverage"].notna().any():
        written += save_figure(plot_coverage_vs_budget(unit, title), out_dir / f"{prefix}coverage_vs_budget{suffix}")
    else:
        print(f"{title}: coverage_vs_budget skipped: no budgeted run recorded coverage")
    return written


def write_group(group: pd.DataFrame, out_dir: Path) -> list[Path]:
    """All tables and figures of one (benchmark, model) group into out_dir (suffix _ctx<setting> per unit when the
    group has several context settings)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    bench, model = group["benchmark"].iloc[0], group["model"].iloc[0]
    group.drop(columns=["config"]).dropna(axis=1, how="all").to_csv(out_dir / "runs.csv", index=False)
    written = [out_dir / "runs.csv"]
    unit_list = units(group)
    for context, unit in unit_list:
        sfx = "" if len(unit_list) == 1 else f"_ctx{context}"
        written += write_unit(unit, out_dir, _unit_title(bench, model, context), suffix=sfx)
    if group["bytes_read_per_step"].notna().any():
        written += save_figure(plot_bytes_vs_context(group, f"{bench} / {model}"), out_dir / "bytes_vs_context")
    return written


def combine_runs(frames: list[pd.DataFrame]) -> tuple[pd.DataFrame, list[str]]:
    """Concatenate run tables (each already free of duplicates); a run of a later table that lands in the same cell
    (benchmark, model, context, method label, budget) as a run of an earlier one supersedes it. Returns the combined
    table (labels recomputed) and one line per superseded file -- never a silent merge."""
    frames = [f.assign(_source=i) for i, f in enumerate(frames) if f is not None and len(f)]
    if not frames:
        return pd.DataFrame(), []
    df = assign_labels(pd.concat(frames, ignore_index=True))
    keep, notes = [], []
    for _, g in df.groupby(["benchmark", "model", "context", "label", "budget"], dropna=False, sort=False):
        g = g.sort_values("_source")
        keep.append(g.index[-1])
        notes += [f"{p} superseded by {g['path'].iloc[-1]}" for p in g["path"].iloc[:-1]]
    out = assign_labels(df.loc[sorted(keep)].drop(columns="_source"))
    out["budget"] = out["budget"].astype("Int64")
    check_duplicates(out)
    return out, notes


def write_report(paths, out: Path, progress: bool = True) -> dict:
    """Collect, then write every table and figure. Returns {"runs": DataFrame, "latency": DataFrame,
    "written": [paths], "skipped": [reasons]}."""
    out = Path(out)
    json_files, jsonl_files = find_result_files(paths)
    df = load_runs(paths, progress=progress, files=json_files)
    lat = load_latency(jsonl_files, progress=progress)
    out.mkdir(parents=True, exist_ok=True)
    written, skipped = [], []
    df.drop(columns=["config"]).to_csv(out / "runs.csv", index=False)
    written.append(out / "runs.csv")
    for (bench, model), g in groups(df):
        written += write_group(g, out / f"{bench}_{model}")
    if len(lat):
        lat.to_csv(out / "latency.csv", index=False)
        (out / "latency.md").write_text(to_markdown(latency_table(lat), floatfmt="{:.4g}") + "\n")
        written += [out / "latency.csv", out / "latency.md"]
        written += save_figure(plot_latency_vs_context(lat), out / "latency_vs_context")
    else:
        why = ("latency_vs_context skipped: no decode-latency records (JSON lines of scripts/bench_decode.py run on "
               "a GPU, e.g. results/gpu/*.jsonl) under " + _paths_text(paths))
        if lat.attrs.get("cpu_dry_run"):
            why += f" ({lat.attrs['cpu_dry_run']} CPU dry-run records ignored: their times mean nothing)"
        skipped.append(why)
        print(why)
    return {"runs": df, "latency": lat, "written": written, "skipped": skipped}


def _paths_text(paths) -> str:
    paths = [str(p) for p in paths]
    return ", ".join(paths) if len(paths) <= 3 else ", ".join(paths[:3]) + f" and {len(paths) - 3} more"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eval.report", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", help="results directories (searched recursively) or metrics files")
    ap.add_argument("--out", default="outputs/report", help="output directory (default: outputs/report)")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    try:
        res = write_report(args.paths, Path(args.out), progress=not args.no_progress)
    except ReportError as e:
        print(f"eval.report: {e}", file=sys.stderr)
        return 2
    df = res["runs"]
    print(f"{len(df)} runs ({df.attrs.get('ignored_json', 0)} other JSON files ignored), "
          f"{len(res['latency'])} latency records; wrote {len(res['written'])} files under {args.out}")
    for (bench, model), g in groups(df):
        print(f"  {bench} / {model}: {len(g)} runs -> {Path(args.out) / f'{bench}_{model}'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
