"""Writing the report: every table and figure of every (benchmark, model) group into an output directory, and the
command line (`python -m eval.report`)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import pandas as pd  # noqa: E402

from eval.report.bench import latency_table, load_latency, plot_latency_vs_context
from eval.report.figures import (
    plot_bytes_vs_context,
    plot_coverage_vs_budget,
    plot_score_vs_budget,
    plot_task_heatmap,
    plot_vs_cost,
    save_figure,
)
from eval.report.runs import (
    ReportError,
    assign_labels,
    check_duplicates,
    find_result_files,
    groups,
    load_runs,
    paths_text,
    units,
)
from eval.report.statistics import STATS_NOTE, display_table, statistics_table, with_intervals
from eval.report.tables import (
    efficiency_table,
    forced_scored_markdown,
    score_bytes_markdown,
    score_pivot,
    scores_latex,
    scores_long,
    scores_markdown,
    to_latex,
    to_markdown,
    unit_title,
)


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
    unit = with_intervals(unit)
    written = write_scores(unit, out_dir / f"{prefix}scores{suffix}", title,
                           by_task=out_dir / f"{prefix}scores_by_task{suffix}")
    written += write_statistics(unit, out_dir / f"{prefix}statistics{suffix}", title)
    if unit["bytes_read_per_step"].notna().any():
        written.append(out_dir / f"{prefix}score_bytes{suffix}.md")
        written[-1].write_text(score_bytes_markdown(unit, title))
    if unit["forced_tokens_per_step"].notna().any():
        written.append(out_dir / f"{prefix}forced_tokens{suffix}.md")
        written[-1].write_text(forced_scored_markdown(unit, title))
    written += write_efficiency(unit, out_dir / f"{prefix}efficiency{suffix}", title)
    written += save_figure(plot_score_vs_budget(unit, title), out_dir / f"{prefix}score_vs_budget{suffix}")
    written += save_figure(plot_task_heatmap(unit, title), out_dir / f"{prefix}task_heatmap{suffix}")
    has_coverage = unit.loc[unit["budget"].notna(), "coverage"].notna().any()
    if has_coverage:
        written += save_figure(plot_coverage_vs_budget(unit, title), out_dir / f"{prefix}coverage_vs_budget{suffix}")
    else:
        print(f"{title}: coverage_vs_budget skipped: no budgeted run recorded coverage")
    for cost, name in (("bytes_read_per_step", "bytes"), ("attended_tokens_per_step", "tokens")):
        if unit[cost].notna().any():
            written += save_figure(plot_vs_cost(unit, cost, "average", title),
                                   out_dir / f"{prefix}score_vs_{name}{suffix}")
            if has_coverage:
                written += save_figure(plot_vs_cost(unit, cost, "coverage", title),
                                       out_dir / f"{prefix}coverage_vs_{name}{suffix}")
    return written


def write_statistics(unit: pd.DataFrame, stem: Path, title: str) -> list[Path]:
    """<stem>.csv (numbers), <stem>.md and <stem>.tex (text cells): eval/report/statistics.py's table."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    out = [stem.with_name(stem.name + s) for s in (".csv", ".md", ".tex")]
    stats = statistics_table(unit)
    stats.to_csv(out[0], index=False)
    shown = display_table(stats)
    out[1].write_text(f"## {title}: scores with 95% intervals and paired tests\n\n" + to_markdown(shown)
                      + f"\n\n{STATS_NOTE}\n")
    out[2].write_text(f"% {title}: statistics (generated by eval/report/)\n"
                      + to_latex(shown, caption=f"{title}: score with 95% CI, paired differences", footnote=None)
                      + "\n")
    return out


def write_group(group: pd.DataFrame, out_dir: Path) -> list[Path]:
    """All tables and figures of one (benchmark, model) group into out_dir (suffix _ctx<setting> per unit when the
    group has several context settings)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    bench, model = group["benchmark"].iloc[0], group["model"].iloc[0]
    group.drop(columns=["config", "samples"]).dropna(axis=1, how="all").to_csv(out_dir / "runs.csv", index=False)
    written = [out_dir / "runs.csv"]
    unit_list = units(group)
    for context, unit in unit_list:
        sfx = "" if len(unit_list) == 1 else f"_ctx{context}"
        written += write_unit(unit, out_dir, unit_title(bench, model, context), suffix=sfx)
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
    df.drop(columns=["config", "samples"]).to_csv(out / "runs.csv", index=False)
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
               "a GPU, e.g. results/gpu/*.jsonl) under " + paths_text(paths))
        if lat.attrs.get("cpu_dry_run"):
            why += f" ({lat.attrs['cpu_dry_run']} CPU dry-run records ignored: their times mean nothing)"
        skipped.append(why)
        print(why)
    return {"runs": df, "latency": lat, "written": written, "skipped": skipped}


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
