"""RULER on the embedded model (SmolLM2-135M-Instruct, 4096 tokens): score table per method x budget, efficiency
table, score vs budget, attention-mass coverage vs budget and the per-task heat map.

Input: results/ruler_4k/*.json (the five README runs) and results/ruler_4k_sweep/ (the budget sweep) when it is
committed; a run of the sweep in the same cell (method, budget, config) as one of ruler_4k supersedes it (printed).
Output: paper_figs/out/ruler_embedded_{scores.{csv,md,tex},scores_by_task.csv,efficiency.{csv,md},
score_vs_budget,coverage_vs_budget,task_heatmap}.{png,pdf}.
"""
from __future__ import annotations

import sys

from paper_figs.common import missing, parse_args, rel, report, runs_in

NAME = "ruler_embedded"
COMMAND = ("python run.py -m method=fullkv,oracle,locks,quest,shadowkv,rocketkv,lrqk budget=128,512 "
           "(copy each outputs/runs/<run>/metrics.json to results/ruler_4k_sweep/<method>[_b<budget>].json)")


def main(argv=None) -> int:
    args = parse_args(__doc__, argv)
    base, sweep = args.results / "ruler_4k", args.results / "ruler_4k_sweep"
    frames = [runs_in(base), runs_in(sweep)]
    if all(f is None for f in frames):
        return missing(NAME, f"{rel(base)}/*.json", COMMAND)
    df, notes = report.combine_runs(frames)
    for note in notes:
        print(f"{NAME}: {note}")
    df = df[(df["benchmark"] == "ruler") & (df["context"] == "4096")]
    if not len(df):
        return missing(NAME, f"RULER runs at 4096 tokens in {rel(base)}", COMMAND)
    written = []
    for (bench, model), group in report.groups(df):
        prefix = NAME + ("_" + model if df["model"].nunique() > 1 else "") + "_"
        written += report.write_unit(group, args.out, f"RULER 4K, {model}", prefix=prefix)
    print(f"{NAME}: {len(df)} runs from {', '.join(rel(d) for d, f in zip((base, sweep), frames) if f is not None)}"
          f" -> {len(written)} files in {rel(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
