"""The write-up's budget ladder on the embedded model at its full context: SmolLM2-135M-Instruct on RULER
niah_single_2 at 8,192 tokens (World English Bible haystack), LOCKS at budgets 64 ... 2048 against FullKV, 50 samples
per cell: what the claim "LOCKS stays within about a point of FullKV from b = 64 to b = 2048" is tested on
(paper_figs/claims.py). Tables with 95% bootstrap intervals and paired tests, score and coverage vs budget and bytes.

Input: results/ruler_smollm2_8k/*.json (one metrics.json per run, named <method>[_b<budget>].json; fullkv.json is
the LOCKS ablation study's FullKV run at 8K, the same run key).
Output: paper_figs/out/ruler_smollm2_8k_* (the set eval.report writes for one table unit).
"""
from __future__ import annotations

import sys

from paper_figs.common import ruler_tables

NAME = "ruler_smollm2_8k"
DIR = "ruler_smollm2_8k"
COMMAND = ("python run.py -m hydra/launcher=grouped benchmark.context_length=8192 method=fullkv,locks "
           "budget=64,128,256,512,1024,2048 benchmark.num_samples=50 logger=none paths.runs_dir=outputs/ruler_smollm2_8k "
           "(then python scripts/collect_runs.py outputs/ruler_smollm2_8k results/ruler_smollm2_8k)")


def main(argv=None) -> int:
    return ruler_tables(NAME, DIR, COMMAND, argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())
