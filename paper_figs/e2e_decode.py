"""The whole decode step vs context (128K / 256K / 1M): random-weight GLM-4-9B / Llama-3.1-8B models, the step
captured as a CUDA graph for FullKV, LOCKS and Quest; ms per step, tokens/s, and the speedup over FullKV next to the
byte-bound ceiling (weights + K/V + metadata read per step).

Input: results/gpu/*.jsonl (scripts/bench_e2e.py on a GPU; CPU dry-run records are ignored).
Output: paper_figs/out/e2e_speedup.{png,pdf}, e2e_table.{csv,md}.
"""
from __future__ import annotations

import sys

from paper_figs.common import BENCH_E2E_CMD, e2e_in, missing, parse_args, rel, report

NAME = "e2e_decode"


def main(argv=None) -> int:
    args = parse_args(__doc__, argv)
    src = args.results / "gpu"
    df = e2e_in(src)
    if df is None:
        return missing(NAME, f"{rel(src)}/*.jsonl (end-to-end decode-step records)", BENCH_E2E_CMD)
    args.out.mkdir(parents=True, exist_ok=True)
    written = report.save_figure(report.plot_e2e_speedup(df), args.out / "e2e_speedup")
    table = report.e2e_table(df)
    table.to_csv(args.out / "e2e_table.csv")
    gpus = ", ".join(sorted(set(df["gpu"].dropna().astype(str)))) or "GPU"
    (args.out / "e2e_table.md").write_text(
        f"Whole decode step (CUDA graph; batch = rows per step) on {gpus}: ms per step, tokens/s, speedup vs FullKV and the "
        f"byte-bound ceiling, GB read per step.\n\n" + report.to_markdown(table, floatfmt="{:.4g}") + "\n")
    written += [args.out / "e2e_table.csv", args.out / "e2e_table.md"]
    print(f"{NAME}: {len(df)} measurements from {rel(src)} -> {len(written)} files in {rel(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
