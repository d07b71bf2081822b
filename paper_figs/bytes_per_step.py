"""Bytes read per decode step vs context (128K / 256K / 1M): FullKV's K/V read against LOCKS (804 B summaries per
page + attended K/V + queries) and Quest (min/max pages + attended K/V), one layer, all KV heads, analytic counts
recorded by the decode benchmark for each measured configuration.

Input: results/gpu/*.jsonl (scripts/bench_decode.py on a GPU; CPU dry-run records are ignored).
Output: paper_figs/out/bytes_per_step.{png,pdf}, bytes_per_step.{csv,md}.
"""
from __future__ import annotations

import sys

from paper_figs.common import BENCH_DECODE_CMD, latency_in, missing, parse_args, rel, report

NAME = "bytes_per_step"
METHODS = ["triton_full"] + report.SPARSE_KERNELS


def main(argv=None) -> int:
    args = parse_args(__doc__, argv)
    src = args.results / "gpu"
    lat = latency_in(src)
    if lat is None:
        return missing(NAME, f"{rel(src)}/*.jsonl (GPU decode benchmark records)", BENCH_DECODE_CMD)
    lat = lat[lat["method"].isin(METHODS)]
    args.out.mkdir(parents=True, exist_ok=True)
    written = report.save_figure(report.plot_bench_bytes_vs_context(lat), args.out / "bytes_per_step")
    cols = [c for c in ("bytes", "bytes_with_intermediates") if c in lat.columns]
    table = lat.pivot_table(index=["shape", "batch", "method"], columns="context", values=cols[0]) / 1e6
    table.columns = [f"MB@{report.tokens_label(c)}" for c in table.columns]
    table.to_csv(args.out / "bytes_per_step.csv")
    (args.out / "bytes_per_step.md").write_text(
        "Bytes read per decode step (MB, one layer, all KV heads and batch rows; triton_full = FullKV).\n\n"
        + report.to_markdown(table, floatfmt="{:.3f}") + "\n")
    written += [args.out / "bytes_per_step.csv", args.out / "bytes_per_step.md"]
    print(f"{NAME}: {len(lat)} measurements from {rel(src)} -> {len(written)} files in {rel(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
