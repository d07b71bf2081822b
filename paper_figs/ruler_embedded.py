"""RULER on the embedded model (SmolLM2-135M-Instruct): the default suite (niah_single_2, 2048 tokens, natural-text
haystack) swept over every method x budgets 64, 128, 256, 512. Tables with 95% bootstrap intervals and paired tests
(statistics), score and coverage vs budget, vs bytes read per decode step and vs attended tokens per KV head (Pareto
fronts marked), efficiency table and the per-task heat map.

Input: results/ruler_embedded/*.json (one metrics.json per run, named <method>[_b<budget>].json).
Output: paper_figs/out/ruler_embedded_{scores.{csv,md,tex},statistics.{csv,md,tex},efficiency.{csv,md},
score_vs_budget,coverage_vs_budget,score_vs_bytes,coverage_vs_bytes,score_vs_tokens,coverage_vs_tokens,
task_heatmap}.{png,pdf} (the set eval.report writes for one table unit).
"""
from __future__ import annotations

import sys

from paper_figs.common import ruler_tables

NAME = "ruler_embedded"
DIR = "ruler_embedded"
COMMAND = ("python run.py -m hydra/launcher=grouped hydra.launcher.skip_invalid=true "
           "method=fullkv,oracle,oracle_token,locks,quest,shadowkv,rocketkv,lrqk budget=64,128,256,512 "
           "benchmark.num_samples=100 paths.runs_dir=outputs/ruler_embedded, the same with "
           "method=doublesparsity,twilight,magicpig "
           "(then python scripts/collect_runs.py outputs/ruler_embedded results/ruler_embedded)")


def main(argv=None) -> int:
    return ruler_tables(NAME, DIR, COMMAND, argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())
