"""The LOCKS ablation study: one factor of the summaries at a time around the default, plus unquantized and
centroid-only summaries, on RULER niah_single_2 (World English Bible haystack) with SmolLM2-135M at budget 128.

Cells are the files of conf/locks_ablation/ (each sets the method and its options; FullKV and the page Oracle are
references). Per context and cell: the score with its 95% bootstrap interval, the paired difference against the
default layout on the same samples (McNemar / sign-flip p-value, eval/stats.py), the attention-mass coverage and its
ratio to the page Oracle's, the mean certificate and its soundness rate, the summary bytes per page and the bytes
read per decode step.

    python run.py -m hydra/launcher=grouped budget=128 benchmark.context_length=8192,2048 benchmark.num_samples=50 \\
        +locks_ablation=fullkv,oracle,default,unquantized,centroid,v_bits_8,v_bits_2,v_group_32,c_bits_4,mu_page_int8,mu_fp16,w_fp16,rank_4,rank_15,page_8,page_32,log_z_previous,sink_pages_1,recent_16,recent_64 \\
        logger=none paths.runs_dir=outputs/locks_ablation
    python scripts/collect_runs.py --distinct outputs/locks_ablation results/locks_ablation
    python paper_figs/locks_ablation.py          # also run by make figures

Input: results/locks_ablation/*.json. Output: paper_figs/out/locks_ablation.{md,csv,png,pdf}.
"""
from __future__ import annotations

import functools
import json
import sys

import pandas as pd

from eval import report
from eval.report.statistics import sample_scores
from eval.stats import paired_comparison
from paper_figs.common import ROOT, missing, parse_args, rel, runs_in

NAME = "locks_ablation"
RESULTS = "locks_ablation"
CELLS_DIR = ROOT / "conf" / "locks_ablation"
FIRST = ("fullkv", "oracle", "default", "unquantized", "centroid")  # table order: references, then the factors
COMMAND = (f"the sweep in paper_figs/{NAME}.py's docstring (python run.py -m hydra/launcher=grouped ... "
           f"+locks_ablation=...), then python scripts/collect_runs.py --distinct outputs/locks_ablation "
           f"results/locks_ablation")


@functools.cache
def cells() -> dict[str, tuple[str, dict, str]]:
    """name -> (method, options set by the cell, what it is), from conf/locks_ablation/*.yaml."""
    from omegaconf import OmegaConf

    out = {}
    for path in sorted(CELLS_DIR.glob("*.yaml")):
        cfg = OmegaConf.to_container(OmegaConf.load(path))
        method = next(d["override /method"] for d in cfg["defaults"] if isinstance(d, dict) and "override /method" in d)
        what = path.read_text().splitlines()[1].split("): ", 1)[-1]
        out[path.stem] = (method, dict(cfg.get("method") or {}), what)
    order = [c for c in FIRST if c in out] + sorted(c for c in out if c not in FIRST)
    return {c: out[c] for c in order}


def cell_of(method: str, config: str) -> str | None:
    """The cell a run belongs to: its method, and every option of the method's schema equal to the defaults updated
    with the cell's options (an option a run does not record counts as its default)."""
    from eval.config_schema import method_schema

    defaults, _ = method_schema(method)
    fp = json.loads(config)
    for name, (m, options, _) in cells().items():
        if m != method:
            continue
        want = {**defaults, **options}
        if all(fp.get(k, defaults[k]) == want[k] for k in defaults if k not in ("name", "budget", "backend")):
            return name
    return None


def runs_by_cell(df: pd.DataFrame) -> dict[int, dict[str, pd.Series]]:
    """context length -> cell -> its run (report.load_runs rows of the conf/locks_ablation/ cells)."""
    df = df.assign(cell=[cell_of(m, c) for m, c in zip(df["method"], df["config"])])
    df = df[df["cell"].notna()]
    return {int(context): {r["cell"]: r for _, r in g.iterrows()}
            for context, g in df.groupby("context_length", sort=True)}


def compare(by_cell: dict, a: str, b: str) -> dict | None:
    """Paired comparison of cell a against cell b on their common samples (diff = a - b, lo, hi, p, n), or None."""
    if a not in by_cell or b not in by_cell:
        return None
    a_scores, b_scores = sample_scores(by_cell[a]), sample_scores(by_cell[b])
    if a_scores is None or b_scores is None:
        return None
    (sa, ta), (sb, tb) = a_scores, b_scores
    return paired_comparison(sa, sb, {**tb, **ta})


def ablation_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (context, cell) of the runs in df (report.load_runs rows)."""
    from eval.stats import bootstrap_ci

    rows = []
    for context, by_cell in runs_by_cell(df).items():
        oracle = by_cell.get("oracle")
        for cell in [c for c in cells() if c in by_cell]:
            r = by_cell[cell]
            per_sample = sample_scores(r)
            mean, lo, hi = bootstrap_ci(*per_sample) if per_sample else (float(r["average"]), None, None)
            vs = (compare(by_cell, cell, "default") or {}) if cell != "default" else {}
            cov = r.get("coverage")
            rows.append({
                "context": int(context), "cell": cell, "what": cells()[cell][2], "score": mean, "ci_lo": lo,
                "ci_hi": hi, "n": int(r["n"]), "vs_default": vs.get("diff"), "vs_default_lo": vs.get("lo"),
                "vs_default_hi": vs.get("hi"), "vs_default_p": vs.get("p"), "coverage": cov,
                "coverage_vs_oracle": (cov / oracle["coverage"] if oracle is not None and cov is not None
                                       and oracle["coverage"] else None),
                "certificate": r.get("diag:certificate"), "certificate_sound": r.get("diag:certificate_sound"),
                "bytes_per_page": r.get("metric:summary_bytes_per_page"),
                "mb_per_step": None if pd.isna(r["bytes_read_per_step"]) else r["bytes_read_per_step"] / 1e6,
            })
    return pd.DataFrame(rows)


def absent(v) -> bool:
    """The table has no value here (None, or NaN once read back from its CSV)."""
    return v is None or pd.isna(v)


def num(v, fmt: str) -> str:
    return "" if absent(v) else fmt.format(v)


def score_ci(r, digits: int) -> str:
    """A row's score with its 95% interval, e.g. "62.0 [48.0, 74.0]" (no interval: the score alone)."""
    return f"{r.score:.{digits}f}" + ("" if absent(r.ci_lo) else f" [{r.ci_lo:.{digits}f}, {r.ci_hi:.{digits}f}]")


def longest_first(table: pd.DataFrame) -> list[int]:
    """The table's context lengths, the study's main (longest) one first."""
    return sorted(table["context"].unique(), reverse=True)


def markdown(table: pd.DataFrame) -> str:
    lines = []
    for context in longest_first(table):
        g = table[table["context"] == context]
        lines += [f"### RULER niah_single_2, {report.tokens_label(context)} tokens, budget 128", "",
                  "| cell | score [95% CI] | Δ vs default [95% CI], p | coverage (vs page Oracle) | certificate "
                  "(sound) | B/page | MB/step |", "|---|---|---|---|---|---|---|"]
        for r in g.itertuples():
            delta = ("" if absent(r.vs_default) else
                     f"{r.vs_default:+.1f} [{r.vs_default_lo:+.1f}, {r.vs_default_hi:+.1f}], p={r.vs_default_p:.2g}")
            cov = num(r.coverage, "{:.3f}") + num(r.coverage_vs_oracle, " ({:.3f})")
            cert = num(r.certificate, "{:.3f}") + num(r.certificate_sound, " ({:.4f})")
            lines.append(f"| {r.cell} | {score_ci(r, 1)} | {delta} | {cov} | {cert} | "
                         f"{num(r.bytes_per_page, '{:.0f}')} | {num(r.mb_per_step, '{:.2f}')} |")
        lines.append("")
    return "\n".join(lines)


def compact_markdown(table: pd.DataFrame, contexts=None) -> str:
    """The README's copy: per cell its bytes per page, then at each context (default: all, longest first) the score
    [95% CI] and the paired difference from the default; a context the table lacks is left out."""
    contexts = [c for c in (contexts or longest_first(table)) if (table["context"] == c).any()]
    head = "| cell | B/page |" + "".join(f" {report.tokens_label(c)}: score [95% CI] | Δ vs default, p |"
                                         for c in contexts)
    lines = [head, "|---|---|" + "---|---|" * len(contexts)]
    rows = {c: {r.cell: r for r in table[table["context"] == c].itertuples()} for c in contexts}
    for cell in dict.fromkeys(cell for c in contexts for cell in rows[c]):
        page_bytes = next(rows[c][cell].bytes_per_page for c in contexts if cell in rows[c])  # the layout's, any length
        line = f"| {cell} | {num(page_bytes, '{:.0f}')} |"
        for c in contexts:
            r = rows[c].get(cell)
            delta = "" if r is None or absent(r.vs_default) else f"{r.vs_default:+.0f}, p={r.vs_default_p:.2g}"
            line += f" {'' if r is None else score_ci(r, 0)} | {delta} |"
        lines.append(line)
    return "\n".join(lines)


def figure(table: pd.DataFrame):
    """Score (95% interval) against summary bytes per page, one panel per context, every LOCKS cell labelled."""
    import matplotlib.pyplot as plt

    contexts = longest_first(table)
    fig, axes = plt.subplots(1, len(contexts), figsize=(6 * len(contexts), 4.5), squeeze=False)
    for ax, context in zip(axes[0], contexts):
        g = table[(table["context"] == context) & table["bytes_per_page"].notna()]
        err = [(g["score"] - g["ci_lo"]).fillna(0), (g["ci_hi"] - g["score"]).fillna(0)]
        ax.errorbar(g["bytes_per_page"], g["score"], yerr=err, fmt="o", capsize=3)
        for r in g.itertuples():
            ax.annotate(r.cell, (r.bytes_per_page, r.score), fontsize=7, xytext=(3, 3), textcoords="offset points")
        full = table[(table["context"] == context) & (table["cell"] == "fullkv")]
        if len(full):
            ax.axhline(float(full["score"].iloc[0]), color="grey", linestyle="--", label="FullKV")
            ax.legend(loc="lower right")
        if len(g):  # a context whose LOCKS cells have no runs yet keeps a linear, empty axis
            ax.set_xscale("log")
        ax.set_xlabel("summary bytes per page and KV head")
        ax.set_ylabel("score")
        ax.set_title(f"LOCKS ablations, {report.tokens_label(context)} tokens, budget 128")
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    args = parse_args(__doc__, argv)
    src = args.results / RESULTS
    df = runs_in(src)
    if df is None:
        return missing(NAME, f"{rel(src)}/*.json (the LOCKS ablation sweep)", COMMAND)
    table = ablation_table(df)
    if table.empty:
        return missing(NAME, f"runs of the conf/locks_ablation/ cells in {rel(src)}", COMMAND)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / f"{NAME}.csv", index=False)
    (args.out / f"{NAME}.md").write_text(markdown(table))
    written = report.save_figure(figure(table), args.out / NAME)
    print(f"{NAME}: {len(table)} cells from {rel(src)} -> {len(written) + 2} files in {rel(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
