"""Kernels per static decode step and the GPU step time they imply (docs/launches.md): each method's kernels per
selecting layer beyond FullKV's, fused and reference backends, batch 1 and 8, coverage off and on; and LOCKS's
modeled whole-step speedup over FullKV next to the byte-bound ceiling, GLM-4-9B and Llama-3.1-8B shapes.

Input: results/launches.json (scripts/bench_launches.py, CPU). Output: paper_figs/out/launches.{md,csv} and
paper_figs/out/launches_modeled.csv; the README shows the two compact tables of launches.md.
"""
from __future__ import annotations

import json
import sys

import pandas as pd

from paper_figs.common import missing, parse_args, rel

NAME = "launches"
COMMAND = "python scripts/bench_launches.py --out results/launches.json"


def counts_table(counts: list[dict]) -> pd.DataFrame:
    """One row per record: kernels and aten ops of the last (selecting) layer, and the kernels beyond FullKV's
    layer on the same backend and batch."""
    df = pd.DataFrame(counts)
    df["kernels"] = df["kernels_per_layer"].map(lambda v: v[-1])
    df["aten_ops"] = df["aten_per_layer"].map(lambda v: v[-1])
    df["triton"] = df["triton_per_layer"].map(lambda v: v[-1])
    full = df[df["method"] == "fullkv"].set_index(["backend", "batch"])["kernels"]
    df["extra_over_fullkv"] = [k - full[(b, n)] for k, b, n in zip(df["kernels"], df["backend"], df["batch"])]
    return df[["method", "backend", "batch", "coverage", "kernels", "extra_over_fullkv", "aten_ops", "triton"]]


def compact_counts(table: pd.DataFrame) -> str:
    """Rows: methods; columns: kernels beyond FullKV's per selecting layer at each (backend, batch, coverage)."""
    from locks.core.registry import display_name, report_order

    cols = [("triton", 1, False), ("triton", 8, False), ("triton", 1, True), ("torch", 1, False), ("torch", 8, False)]
    names = {"triton": "fused", "torch": "reference"}
    head = ["kernels per layer beyond FullKV's"] + [
        f"{names[be]} B={b}" + (" + coverage" if cov else "") for be, b, cov in cols]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    key = table.set_index(["method", "backend", "batch", "coverage"])
    for method in sorted(table["method"].unique(), key=report_order):
        cells = []
        for be, b, cov in cols:
            if (method, be, b, cov) in key.index:
                r = key.loc[(method, be, b, cov)]
                cells.append(f"{int(r['kernels'])}" if method == "fullkv" else f"+{int(r['extra_over_fullkv'])}")
            else:
                cells.append("")
        label = display_name(method) + (" (its own)" if method == "fullkv" else "")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def compact_modeled(modeled: pd.DataFrame) -> str:
    """Rows: shape and context; columns: batch; cells 'modeled speedup (byte ceiling)', coverage off."""
    names = {"glm": "GLM-4-9B", "llama": "Llama-3.1-8B"}
    m = modeled[~modeled["coverage"]]
    batches = sorted(m["batch"].unique())
    t_node = float(m["t_node_us"].iloc[0])
    lines = [f"| LOCKS vs FullKV, modeled at t_node = {t_node:g} µs (byte ceiling) | "
             + " | ".join(f"B={b}" for b in batches) + " |", "|---" * (1 + len(batches)) + "|"]
    for (shape, context), g in m.groupby(["shape", "context"], sort=False):
        ctx = f"{context // 1024}K" if context < 2 ** 20 else f"{context // 2 ** 20}M"
        cells = {r.batch: f"{r.modeled_speedup:.2f}x ({r.byte_ceiling:.2f}x)" for r in g.itertuples()}
        lines.append(f"| {names[shape]} {ctx} | " + " | ".join(cells[b] for b in batches) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(__doc__, argv)
    src = args.results / "launches.json"
    if not src.is_file():
        return missing(NAME, rel(src), COMMAND)
    data = json.loads(src.read_text())
    table = counts_table(data["counts"])
    modeled = pd.DataFrame(data["modeled"])
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "launches.csv", index=False)
    modeled.to_csv(args.out / "launches_modeled.csv", index=False)
    text = (f"Kernels of one static decode step per selecting layer, counted on {data['device']} with "
            f"torch {data['torch']} (`{COMMAND}`; FullKV's column is its own count)\n\n" + compact_counts(table)
            + "\n" + compact_modeled(modeled))
    (args.out / "launches.md").write_text(text)
    print(f"{NAME}: {len(table)} counted steps, {len(modeled)} modeled settings -> {rel(args.out / 'launches.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
