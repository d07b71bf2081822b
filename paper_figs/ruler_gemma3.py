"""RULER at the write-up's budget-to-context ratio: Gemma 3 270M (the second embedded model, 3 of 18 layers full
attention) on niah_single_2 at 16,384 tokens in the World English Bible haystack, every method x budgets 64, 128,
256, 512, LOCKS and the page Oracle also at 1024 and 2048 (128 / 16K = 0.8 %, 256 / 16K = 1.6 % = 2048 / 128K). Tables with 95% bootstrap intervals and paired tests,
score and coverage vs budget, bytes and tokens, the efficiency table with the per-layer-type byte split.

Input: results/ruler_gemma3_16k/*.json (one metrics.json per run, named <method>[_b<budget>].json).
Output: paper_figs/out/ruler_gemma3_16k_* (the set eval.report writes for one table unit).
"""
from __future__ import annotations

import sys

from paper_figs.common import ruler_tables

NAME = "ruler_gemma3_16k"
DIR = "ruler_gemma3_16k"
COMMAND = ("make gemma; python run.py -m hydra/launcher=grouped hydra.launcher.skip_invalid=true model=gemma3_270m "
           "benchmark.context_length=16384 method=fullkv,oracle,oracle_token,locks,quest,shadowkv,rocketkv,lrqk "
           "budget=64,128,256,512 benchmark.num_samples=24 logger=none paths.runs_dir=outputs/ruler_gemma3_16k, the same "
           "with method=locks,oracle budget=1024,2048 and with method=doublesparsity,twilight,magicpig "
           "(then python scripts/collect_runs.py outputs/ruler_gemma3_16k results/ruler_gemma3_16k)")


def main(argv=None) -> int:
    return ruler_tables(NAME, DIR, COMMAND, argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())
