"""Markdown table of finished runs: one row per metrics.json (score per task, average, efficiency).

    python scripts/results_table.py results/ruler_niah_4k/*.json
"""
import argparse
import json
from pathlib import Path

import pandas as pd


def row(path: Path) -> dict:
    m = json.loads(path.read_text())
    method = m["method"]["name"] + ("" if m.get("budget") is None or m["method"]["name"] == "fullkv" else f" b={m['budget']}")
    out = {"method": method}
    out.update({task: score for task, score in m["scores"].items()})
    out.update({
        "average": m["average"],
        "n": sum(m["num_samples"].values()),
        "attended tokens/step": round(m["attended_tokens_per_step"], 1),
        "bytes vs FullKV": round(m["bytes_read_ratio"], 3),
        "coverage": None if m.get("coverage") is None else round(m["coverage"], 4),
        **{name: None if v is None else round(v, 4) for name, v in (m.get("diagnostics") or {}).items()},
        "s/sample (CPU)": round(m["seconds_per_sample"], 1),
    })
    if m.get("h2d_bytes_per_step"):
        out["host→device MB/step"] = round(m["h2d_bytes_per_step"] / 1e6, 2)
    extras = [f"{name} {value:.3f}" for name, value in (m.get("method_metrics") or {}).items()]
    if extras:
        out["method metrics"] = ", ".join(extras)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("metrics", nargs="+", type=Path)
    args = ap.parse_args()
    df = pd.DataFrame([row(p) for p in args.metrics])
    header = "| " + " | ".join(df.columns) + " |"
    lines = [header, "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join("" if pd.isna(v) else str(v) for v in r) + " |" for r in df.itertuples(index=False)]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
