"""Device-resident and host-resident bytes of every method at 128K and 1M tokens, GLM-4-9B and Llama-3.1-8B
shapes, budget 2048, bf16: the K/V each method keeps on the device, its selection state there (summaries, min/max,
factors, landmarks) and what it keeps in host memory, per sequence, in each method's own design
(`Selector.memory_bytes`, docs/memory.md; tests/methods/test_memory_bytes.py checks each formula against the tensors
a real prefill leaves). It needs no results: it is the analytic side of "LOCKS saves bandwidth, not VRAM" and of
RocketKV's and ShadowKV's memory claims, before any GPU run.

    python paper_figs/memory_table.py [--out paper_figs/out]     # also run by make figures

Output: paper_figs/out/memory.{md,csv}.
"""
from __future__ import annotations

import functools
import sys

import pandas as pd

from paper_figs.common import parse_args, rel

NAME = "memory"
CONTEXTS = (131072, 1048576)
BUDGET = 2048
METHODS = ("fullkv", "locks", "quest", "shadowkv", "rocketkv", "lrqk", "doublesparsity", "twilight", "magicpig")
GIB = 2 ** 30


@functools.cache
def model_bytes(shape: str, method: str, context: int, budget: int = BUDGET) -> dict[str, float]:
    """{kv, state, host} bytes of one sequence over every layer of a model shape (bench/shapes.py FULL_MODELS)."""
    from bench.shapes import FULL_MODELS
    from locks.core.registry import MethodSpec
    from locks.core.selector import LayerInfo

    _, layers, hq, hkv, d = FULL_MODELS[shape]
    spec = MethodSpec(method, budget)
    total = {"kv": 0.0, "state": 0.0, "host": 0.0}
    for layer in range(layers):
        info = LayerInfo(layer, hq, hkv, d, d ** -0.5, kv_element_bytes=2, num_layers=layers)
        part = spec.build(info).memory_bytes(context)
        for k in total:
            total[k] += part[k]
    return total


def memory_table(contexts=CONTEXTS, methods=METHODS) -> pd.DataFrame:
    from bench.shapes import FULL_MODELS
    from locks.core.registry import display_name

    rows = []
    for shape, (model, *_) in FULL_MODELS.items():
        for context in contexts:
            full = model_bytes(shape, "fullkv", context)
            for method in methods:
                b = model_bytes(shape, method, context)
                device = b["kv"] + b["state"]
                rows.append({"model": model, "context": context, "method": display_name(method),
                             "kv_gib": b["kv"] / GIB, "state_gib": b["state"] / GIB, "device_gib": device / GIB,
                             "host_gib": b["host"] / GIB, "device_vs_fullkv": device / (full["kv"] + full["state"])})
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame) -> str:
    lines = [f"Bytes per sequence in each method's own design, budget {BUDGET}, bf16 (GiB; device = K/V + state)", "",
             "| model | context | method | K/V on device | state on device | device | host | device vs FullKV |",
             "|---|---|---|---|---|---|---|---|"]
    for r in table.itertuples():
        ctx = f"{r.context // 1024}K" if r.context < 2 ** 20 else f"{r.context // 2 ** 20}M"
        lines.append(f"| {r.model} | {ctx} | {r.method} | {r.kv_gib:.3f} | {r.state_gib:.3f} | {r.device_gib:.3f} "
                     f"| {r.host_gib:.3f} | {r.device_vs_fullkv:.3f} |")
    return "\n".join(lines) + "\n"


def compact_markdown(table: pd.DataFrame) -> str:
    """One row per method, one column per model and context: 'K/V + state on the device · host' in GiB (README)."""
    cols = list(dict.fromkeys(zip(table["model"], table["context"])))

    def ctx(c):
        return f"{c // 1024}K" if c < 2 ** 20 else f"{c // 2 ** 20}M"

    lines = ["| GiB per sequence: device K/V + state · host | " + " | ".join(f"{m} {ctx(c)}" for m, c in cols) + " |",
             "|---|" + "---|" * len(cols)]
    for method, group in table.groupby("method", sort=False):
        cells = {(r.model, r.context): f"{r.kv_gib:.2f} + {r.state_gib:.2f} · {r.host_gib:.2f}"
                 for r in group.itertuples()}
        lines.append(f"| {method} | " + " | ".join(cells[c] for c in cols) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(__doc__, argv)
    table = memory_table()
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "memory.csv", index=False)
    (args.out / "memory.md").write_text(markdown(table) + "\n" + compact_markdown(table))
    print(f"{NAME}: {len(table)} rows (2 models x {len(CONTEXTS)} contexts x {len(METHODS)} methods) -> "
          f"{rel(args.out / 'memory.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
