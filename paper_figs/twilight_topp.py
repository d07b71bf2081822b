"""Top-p over LOCKS against top-p over Quest at equal attended tokens: Twilight's pruning (exact top-p of 4-bit
estimated weights) on the candidates of each base at B0 = 512, on RULER niah_single_2 at 2048 tokens with
SmolLM2-135M, 100 samples per cell (docs/results/twilight_topp.md). Does LOCKS's better ranking survive adaptive
pruning?

    python run.py -m hydra/launcher=grouped method=twilight method.base=quest,locks method.top_p=0.5,0.7,0.85,0.95,1.0 \\
        method.top_p_mode=exact budget=512 benchmark.num_samples=100 logger=none paths.runs_dir=outputs/twilight_topp \\
        batch_size=8
    python scripts/collect_runs.py --distinct outputs/twilight_topp results/twilight_topp
    python paper_figs/twilight_topp.py          # also run by make figures

Per cell: the score with its 95% bootstrap interval, the tokens a query head kept per step (mean: Twilight's
budget; and the most at one step, averaged over layers), the tokens a KV head read (the union of its query heads'),
the bytes per step. Then each LOCKS cell against the Quest cell whose mean kept tokens are nearest, paired on the
same samples (McNemar, eval/stats.py), and against Quest's score interpolated at LOCKS's kept tokens.

Input: results/twilight_topp/*.json. Output: paper_figs/out/twilight_topp.{md,csv}.
"""
from __future__ import annotations

import json
import sys

import numpy as np
import pandas as pd

from eval.stats import bootstrap_ci, paired_comparison
from paper_figs.common import missing, parse_args, rel

NAME = "twilight_topp"
COMMAND = "the sweep in paper_figs/twilight_topp.py's docstring, then scripts/collect_runs.py --distinct"


def cells(results) -> pd.DataFrame:
    rows = []
    for path in sorted((results / NAME).glob("*.json")):
        m = json.loads(path.read_text())
        if m["method"]["name"] != "twilight":
            continue
        samples = {k: v["score"] for k, v in m["samples"].items()}
        tasks = {k: v["task"] for k, v in m["samples"].items()}
        mean, lo, hi = bootstrap_ci(samples, tasks)
        metrics = m.get("method_metrics") or {}
        rows.append({"base": m["method"]["base"], "top_p": m["method"]["top_p"], "mode": m["method"]["top_p_mode"],
                     "b0": m["budget"], "score": mean, "ci_lo": lo, "ci_hi": hi, "n": len(samples),
                     "kept": metrics.get("twilight_tokens"), "kept_max": metrics.get("twilight_tokens_max"),
                     "read": m["attended_tokens_per_step"], "mb_per_step": m["bytes_read_per_step"] / 1e6,
                     "samples": samples, "tasks": tasks})
    return pd.DataFrame(rows).sort_values(["base", "top_p"]) if rows else pd.DataFrame()


def matched(table: pd.DataFrame) -> pd.DataFrame:
    """Each LOCKS cell against the Quest cell of nearest mean kept tokens (paired) and Quest's score interpolated
    linearly in kept tokens at LOCKS's (None outside Quest's range)."""
    locks, quest = table[table["base"] == "locks"], table[table["base"] == "quest"].sort_values("kept")
    rows = []
    for r in locks.itertuples():
        q = quest.iloc[int(np.argmin(np.abs(quest["kept"].to_numpy() - r.kept)))]
        vs = paired_comparison(r.samples, q["samples"], {**q["tasks"], **r.tasks})
        inside = quest["kept"].min() <= r.kept <= quest["kept"].max()
        rows.append({"locks_top_p": r.top_p, "locks_kept": r.kept, "locks_score": r.score, "quest_top_p": q["top_p"],
                     "quest_kept": q["kept"], "quest_score": q["score"], "diff": vs["diff"], "lo": vs["lo"],
                     "hi": vs["hi"], "p": vs["p"],
                     "quest_interpolated": float(np.interp(r.kept, quest["kept"], quest["score"])) if inside else None})
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame, pairs: pd.DataFrame) -> str:
    lines = ["| base | top-p | score [95% CI] | n | kept tokens / query head (max) | read tokens / KV head | MB/step |",
             "|---|---|---|---|---|---|---|"]
    for r in table.itertuples():
        lines.append(f"| {r.base} | {r.top_p:g} | {r.score:.1f} [{r.ci_lo:.1f}, {r.ci_hi:.1f}] | {r.n} "
                     f"| {r.kept:.1f} ({r.kept_max:.0f}) | {r.read:.1f} | {r.mb_per_step:.2f} |")
    lines += ["", "| LOCKS top-p: kept, score | nearest Quest top-p: kept, score | Δ LOCKS − Quest [95% CI], p "
                  "| Quest interpolated at LOCKS's kept tokens |", "|---|---|---|---|"]
    for r in pairs.itertuples():
        interp = "outside Quest's range" if r.quest_interpolated is None or pd.isna(r.quest_interpolated) else \
            f"{r.quest_interpolated:.1f}"
        lines.append(f"| {r.locks_top_p:g}: {r.locks_kept:.1f}, {r.locks_score:.1f} | {r.quest_top_p:g}: "
                     f"{r.quest_kept:.1f}, {r.quest_score:.1f} | {r.diff:+.1f} [{r.lo:+.1f}, {r.hi:+.1f}], "
                     f"p={r.p:.2g} | {interp} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(__doc__, argv)
    table = cells(args.results)
    if table.empty:
        return missing(NAME, f"{rel(args.results / NAME)}/*.json", COMMAND)
    pairs = matched(table) if {"locks", "quest"} <= set(table["base"]) else pd.DataFrame()
    args.out.mkdir(parents=True, exist_ok=True)
    table.drop(columns=["samples", "tasks"]).to_csv(args.out / f"{NAME}.csv", index=False)
    (args.out / f"{NAME}.md").write_text(markdown(table, pairs))
    print(f"{NAME}: {len(table)} cells -> {rel(args.out / f'{NAME}.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
