"""The LongBench score-vs-budget curve: Llama-3.1-8B-Instruct, average LongBench score at budgets 64 ... 2048 (log2
axis), one line per method, FullKV a horizontal line, the Oracle dashed; plus the table behind it.

Input: results/longbench_llama3_1_8b_instruct/ (the runs' metrics.json files, any depth).
Output: paper_figs/out/longbench_{curve.{png,pdf},scores.{csv,md,tex},scores_by_task.csv}.
"""
from __future__ import annotations

import sys

from paper_figs.common import ALL_METHODS, LONGBENCH_BUDGETS, missing, parse_args, rel, report, runs_in

NAME = "longbench_curve"
MODEL = "llama3_1_8b_instruct"
COMMAND = (f"python run.py +experiment=paper_longbench model.path=<Llama-3.1-8B-Instruct checkpoint>  (= "
           f"benchmark=longbench -m method={ALL_METHODS} budget={','.join(map(str, LONGBENCH_BUDGETS))}; copy the "
           f"runs' metrics.json files into results/longbench_{MODEL}/)")


def main(argv=None) -> int:
    args = parse_args(__doc__, argv)
    src = args.results / f"longbench_{MODEL}"
    df = runs_in(src)
    if df is not None:
        df = df[(df["benchmark"] == "longbench") & (df["model"] == MODEL)]
    if df is None or not len(df):
        return missing(NAME, f"{rel(src)}/**/metrics.json (LongBench, {MODEL})", COMMAND)
    absent = [b for b in LONGBENCH_BUDGETS if b not in report.budgets_of(df)]
    if absent:
        print(f"{NAME}: no runs at budget(s) {absent} in {rel(src)}; the curve shows the budgets present")
    written = []
    for context, unit in report.units(df):
        sfx = "" if df["context"].nunique() == 1 else f"_ctx{context}"
        title = f"LongBench, Llama-3.1-8B-Instruct (max_length {context})"
        written += report.save_figure(report.plot_score_vs_budget(unit, title), args.out / f"longbench_curve{sfx}")
        written += report.write_scores(unit, args.out / f"longbench_scores{sfx}", title)
    print(f"{NAME}: {len(df)} runs from {rel(src)} -> {len(written)} files in {rel(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
