"""Regenerate every paper figure and table into paper_figs/out/ (`make figures`). Each script reads only committed
files under results/ and, when its inputs are not there yet, prints one line naming them and the command that
produces them. Exits non-zero only if a script fails.

    python paper_figs/make_all.py [--results results] [--out paper_figs/out]
"""
from __future__ import annotations

import sys
import traceback

from paper_figs import (bytes_per_step, claims, e2e_decode, infinitebench_table, latency_speedup, launches,
                        longbench_curve, locks_ablation, memory_table, ruler_embedded, ruler_gemma3, ruler_smollm2_8k,
                        twilight_topp)
from paper_figs.common import parse_args

SCRIPTS = [ruler_embedded, ruler_smollm2_8k, ruler_gemma3, infinitebench_table, longbench_curve, latency_speedup, bytes_per_step, e2e_decode,
           launches, memory_table, locks_ablation, twilight_topp, claims]


def main(argv=None) -> int:
    args = parse_args(__doc__, argv)
    forwarded = ["--results", str(args.results), "--out", str(args.out)]
    failed = []
    for mod in SCRIPTS:
        name = mod.__name__
        try:
            rc = mod.main(forwarded)
        except Exception:  # report every script, then fail
            traceback.print_exc()
            rc = 1
        if rc:
            failed.append(name)
    if failed:
        print(f"make_all: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
