"""Decode latency and speedup vs context (128K / 256K / 1M): one decode step of one layer, all heads, per kernel
(FullKV: cuDNN / flash SDPA and our Triton split-K; LOCKS and Quest fused Triton paths; the LOCKS PyTorch
reference), median CUDA-graph time, and the speedup over the fastest FullKV kernel of the same configuration.

Input: results/gpu/*.jsonl (scripts/bench_decode.py on a GPU; CPU dry-run records are ignored).
Output: paper_figs/out/latency_{vs_context,speedup}.{png,pdf}, latency_table.{csv,md}.
"""
from __future__ import annotations

import sys

from paper_figs.common import BENCH_DECODE_CMD, latency_in, missing, parse_args, rel, report

NAME = "latency_speedup"


def main(argv=None) -> int:
    args = parse_args(__doc__, argv)
    src = args.results / "gpu"
    lat = latency_in(src)
    if lat is None:
        return missing(NAME, f"{rel(src)}/*.jsonl (GPU decode-latency records)", BENCH_DECODE_CMD)
    args.out.mkdir(parents=True, exist_ok=True)
    written = report.save_figure(report.plot_latency_vs_context(lat), args.out / "latency_vs_context")
    written += report.save_figure(report.plot_speedup_vs_context(lat), args.out / "latency_speedup")
    table = report.latency_table(lat)
    table.to_csv(args.out / "latency_table.csv")
    gpus = ", ".join(sorted(set(lat["gpu"].dropna().astype(str)))) or "GPU"
    (args.out / "latency_table.md").write_text(
        f"Decode step of one layer on {gpus}: median ms (CUDA graph unless the record says eager) and speedup vs "
        f"the fastest FullKV kernel.\n\n" + report.to_markdown(table, floatfmt="{:.4g}") + "\n")
    written += [args.out / "latency_table.csv", args.out / "latency_table.md"]
    print(f"{NAME}: {len(lat)} measurements from {rel(src)} -> {len(written)} files in {rel(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
