"""The InfiniteBench table: GLM-4-9B-Chat-1M, methods x budgets 512 and 2048, score per task and average.

Input: results/infinitebench_glm4_9b_chat_1m/ (the runs' metrics.json files, any depth).
Output: paper_figs/out/infinitebench_{scores.{csv,md,tex},scores_by_task.csv,efficiency.{csv,md}}.
"""
from __future__ import annotations

import sys

from paper_figs.common import ALL_METHODS, INFINITEBENCH_BUDGETS, missing, parse_args, rel, report, runs_in

NAME = "infinitebench_table"
MODEL = "glm4_9b_chat_1m"
COMMAND = (f"python run.py +experiment=paper_infinitebench  (= model={MODEL} benchmark=infinitebench -m "
           f"method={ALL_METHODS} budget={','.join(map(str, INFINITEBENCH_BUDGETS))}; copy the runs' metrics.json "
           f"files into results/infinitebench_{MODEL}/)")


def main(argv=None) -> int:
    args = parse_args(__doc__, argv)
    src = args.results / f"infinitebench_{MODEL}"
    df = runs_in(src)
    if df is not None:
        df = df[(df["benchmark"] == "infinitebench") & (df["model"] == MODEL)
                & (df["budget"].isna() | df["budget"].isin(INFINITEBENCH_BUDGETS))]
    if df is None or not len(df):
        return missing(NAME, f"{rel(src)}/**/metrics.json (InfiniteBench, {MODEL})", COMMAND)
    absent = [b for b in INFINITEBENCH_BUDGETS if b not in report.budgets_of(df)]
    if absent:
        print(f"{NAME}: no runs at budget(s) {absent} in {rel(src)}; the table shows the budgets present")
    written = []
    for context, unit in report.units(df):
        sfx = "" if df["context"].nunique() == 1 else f"_ctx{context}"
        title = f"InfiniteBench, GLM-4-9B-Chat-1M (max_length {context})"
        written += report.write_scores(unit, args.out / f"infinitebench_scores{sfx}", title)
        written += report.write_efficiency(unit, args.out / f"infinitebench_efficiency{sfx}", title)
    print(f"{NAME}: {len(df)} runs from {rel(src)} -> {len(written)} files in {rel(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
