"""Claims report: one row per claim of the LOCKS write-up that the harness can test, with the measured value, the
verdict (holds / does not hold / not measured) and the result file(s) it came from.

    python paper_figs/claims.py [--results results] [--out paper_figs/out]     # also run by make figures

Input: results/ruler_embedded/*.json (the README's RULER sweep: every method x budgets 64..512, per-sample
scores), results/gpu/*.jsonl when a GPU run is committed. The bytes rows use the harness's bytes model (the
selectors' own accounting) at 1M tokens for the GLM-4-9B and Llama-3.1-8B attention shapes; they need no results.
Output: paper_figs/out/claims.{md,csv}, and paper_figs/out/byte_ceiling.{md,csv}: the byte-bound ceiling at batch
1 / 4 / 16 for both shapes at 128K / 256K / 1M, with FullKV's device memory (weights read once per step, K/V per row).

Verdict rules (stated in each row):
- ranking: LOCKS's attention-mass coverage / the page Oracle's at the same budget >= 0.95 at every budget.
- collapse at budget b: the method's score <= half of FullKV's and lower with McNemar p < 0.05 on the same samples.
- bytes: FullKV's K/V bytes / LOCKS's (summaries + queries + scores + attended K/V) per decode step within 5% of 9.8.
- speedup: the whole-step CUDA-graph speedup over FullKV within 5% of the claim (results/gpu/ e2e records); without
  them "not measured", next to the byte-bound ceiling (FullKV's step bytes / LOCKS's, weights included) at batch 1
  and the smallest batch whose ceiling reaches the claim (and whether FullKV fits one H200 there).
- certificate: its soundness rate (certificate <= measured coverage, per step, layer and query head) is 1 in every
  LOCKS run.
- LOCKS's ablation claims (results/locks_ablation/, paper_figs/locks_ablation.py): int4 loses a few points against
  unquantized summaries (paired Δ in [-10, 0) at p < 0.05), int2 collapses (>= 20 points below unquantized at
  p < 0.01), the rank-8 term matters (rank 8 above centroid-only, p < 0.05), summaries cost about 10% of the page's
  KV (bytes per page / 2 n d s within 2 points at d = 128), Theorem 1 holds for unquantized summaries (soundness
  rate 1). A paired difference with p >= 0.05 is "not separated at n = ...", never "holds".
- every paired row also states what its n can resolve: the smallest difference McNemar's exact test detects with 80%
  power at p < 0.05, at the row's observed share of discordant pairs (eval/stats.detectable_difference).
- the anchors' own claims (Quest 1.74x end to end at 32K; RocketKV 3.7x decode speedup and 32.6% lower peak memory;
  ShadowKV 6x larger batch and 3.04x throughput at 122K; LOCKS "saves bandwidth, not VRAM"): the measured number
  from results/gpu/ e2e records when present; else "not measured" with the analytic value at that setting: the
  byte-bound whole-step ceiling from each selector's own step accounting after a prefill with random state
  (bench/prefill_state.py), the batch that fits and the design's device bytes from Selector.memory_bytes.
"""
from __future__ import annotations

import sys

import pandas as pd

from bench.byte_model import BYTES_BUDGET, byte_ceiling, step_bytes, weights_and_layers
from eval import report
from eval.report.runs import method_rank
from eval.report.statistics import statistics_table
from paper_figs.common import e2e_in, parse_args, rel

NAME = "claims"
SMALL_BUDGETS = (64, 128)
BYTES_CLAIM = 9.8
SPEEDUP_CLAIMS = {131072: 1.59, 262144: 1.80, 1048576: 2.0}
SHAPES = {"glm": "GLM-4-9B", "llama": "Llama-3.1-8B"}
TOL = 0.05
BATCHES = (1, 4, 16)
DEVICE_MEMORY = 139 * 2 ** 30  # one H200 as lent here (about 139 GiB)


def _row(claim, measured, verdict, source, rule, configuration):
    return {"claim": claim, "configuration": configuration, "measured": measured, "verdict": verdict, "rule": rule,
            "source": source}


MODEL_NAMES = {"smollm2_135m": "SmolLM2-135M-Instruct", "gemma3_270m": "Gemma 3 270M"}
# the RULER suites whose runs the accuracy claims read: results/<dir>/ (README, docs/results/)
SUITES = ("ruler_embedded", "ruler_smollm2_8k", "ruler_gemma3_16k")
PARITY_POINTS = 1.0  # "LOCKS within about a point of FullKV": a loss of at most this many points
PARITY_BELOW = 512  # "the others collapse below 512": the collapse rows cover every budget below this


def suite_name(df: pd.DataFrame) -> str:
    """"SmolLM2-135M-Instruct, RULER niah_single_2 at 2K tokens": the model, tasks and context of a suite's runs."""
    r = df.iloc[0]
    tasks = ", ".join(c[5:] for c in df.columns if c.startswith("task:") and df[c].notna().any())
    return (f"{MODEL_NAMES.get(r['model'], r['model'])}, RULER {tasks} at "
            f"{report.tokens_label(int(r['context_length']))} tokens")


def run_configuration(r) -> str:
    """A run's method configuration as a claim row names it: label, budget and mode, and for a page selector its
    forced set (the partial page only by default; docs/budgets.md)."""
    import json

    if pd.isna(r["budget"]):
        return f"{r['label']}, n = {int(r['n'])}"
    text = f"{r['label']} b={int(r['budget'])} {r['budget_mode']}"
    fp = json.loads(r["config"])
    if r["method"] in ("locks", "oracle"):
        sink, recent = fp.get("sink_pages", 0), fp.get("recent_window", 0)
        text += (", forced: the partial page only" if not sink and not recent
                 else f", forced: the partial page, sink_pages={sink}, recent_window={recent}")
    if r["method"] == "locks":
        text += f", rank {fp.get('rank')}, quant={fp.get('quant')}"
    return text + f", n = {int(r['n'])}"


def detectable(n: int, discordant) -> str:
    """What a paired 0/100 comparison of n samples can resolve: the smallest |Δ| that McNemar's exact test detects
    with 80% power at p < 0.05, at the observed share of discordant pairs (eval/stats.detectable_difference)."""
    from eval.stats import detectable_difference

    if discordant is None or pd.isna(discordant):
        return "detectable difference: no paired 0/100 scores"
    if discordant == 0:
        return f"detectable difference: no discordant pair in n = {n}"
    d = detectable_difference(int(n), float(discordant))
    if d is None:
        return f"no difference detectable at n = {n} ({discordant:.0%} discordant pairs)"
    return f"smallest detectable difference {100 * d:.1f} points at n = {n} ({discordant:.0%} discordant, 80% power)"


def ranking_rows(df: pd.DataFrame, source: str) -> list[dict]:
    rule = "coverage(LOCKS) / coverage(page Oracle) >= 0.95 at every budget"
    claim = f"quantized rank-8 summaries rank pages almost like the exact-mass oracle ({suite_name(df)})"
    locks = df[df["method"] == "locks"].set_index("budget")["coverage"]
    oracle = df[df["method"] == "oracle"].set_index("budget")["coverage"]
    common = sorted(set(locks.dropna().index) & set(oracle.dropna().index))
    config = f"{suite_name(df)}; LOCKS and the page Oracle at each budget, their default forced set"
    if not common:
        return [_row(claim, "no LOCKS and page-Oracle runs at a common budget", "not measured", source, rule, config)]
    ratios = {int(b): float(locks[b]) / float(oracle[b]) for b in common}
    text = ", ".join(f"b={b}: {r:.3f}" for b, r in ratios.items())
    return [_row(claim, text, "holds" if min(ratios.values()) >= 0.95 else "does not hold", source, rule, config)]


def collapse_rows(df: pd.DataFrame, source: str) -> list[dict]:
    """Each selector at each budget below PARITY_BELOW: collapsed (<= half of FullKV's score, McNemar p < 0.05)."""
    rule = "score <= FullKV/2 and McNemar p < 0.05 (paired, same samples)"
    suite = suite_name(df)
    stats = statistics_table(df)
    full = stats[stats["budget"].isna()]
    if full.empty:
        return [_row(f"selectors collapse at small budgets ({suite})", "no FullKV run", "not measured", source, rule,
                     suite)]
    full_mean = float(full.iloc[0]["mean"])
    budgets = sorted(int(b) for b in df["budget"].dropna().unique() if b < PARITY_BELOW)
    out = []
    for method in [m for m in dict.fromkeys(df.sort_values("method", key=lambda s: s.map(method_rank))["method"])
                   if m not in ("fullkv", "oracle", "oracle_token")]:
        runs = df[df["method"] == method]
        label = runs["label"].iloc[0]
        for b in budgets:
            r = stats[(stats["method"] == label) & (stats["budget"] == b)]
            claim = f"{label} collapses at budget {b} ({suite})"
            run = runs[runs["budget"] == b]
            config = f"{suite}; " + (run_configuration(run.iloc[0]) if len(run) else f"{label} b={b}")
            if r.empty:
                out.append(_row(claim, "no run at this budget", "not measured", source, rule, config))
                continue
            r = r.iloc[0]
            p = r["vs_fullkv_p"]
            if p is None or pd.isna(p):  # runs without per-sample scores: no interval, no paired test
                out.append(_row(claim, f"{r['mean']:.1f} vs FullKV {full_mean:.1f} (no per-sample scores)",
                                "not measured", source, rule, config))
                continue
            measured = (f"{r['mean']:.1f} [{r['ci_lo']:.1f}, {r['ci_hi']:.1f}] vs FullKV {full_mean:.1f}, "
                        f"Δ {r['vs_fullkv']:+.1f}, p={p:.2g}, n={int(r['n'])}; "
                        f"{detectable(int(r['n']), r['vs_fullkv_discordant'])}")
            holds = r["mean"] <= full_mean / 2 and p < 0.05
            out.append(_row(claim, measured, "holds" if holds else "does not hold", source, rule, config))
    return out


def _vs_fullkv(df: pd.DataFrame, run) -> dict | None:
    """paired_comparison of a run against the suite's FullKV run on their common samples (None without both)."""
    from eval.report.statistics import sample_scores
    from eval.stats import paired_comparison

    full = df[df["method"] == "fullkv"]
    if full.empty:
        return None
    a, b = sample_scores(run), sample_scores(full.iloc[0])
    if a is None or b is None:
        return None
    c = paired_comparison(a[0], b[0], {**b[1], **a[1]})
    return c if c["n"] else None


def parity_rows(df: pd.DataFrame, source: str) -> list[dict]:
    """The write-up's accuracy claims in its own configuration, one row per LOCKS budget: within about a point of
    FullKV (a loss of at most PARITY_POINTS), and above FullKV at the largest budget (one-sided)."""
    suite = suite_name(df)
    full = df[df["method"] == "fullkv"]
    locks = df[df["method"] == "locks"].sort_values("budget")
    rule = (f"paired Δ(LOCKS - FullKV) 95% interval: lower end >= -{PARITY_POINTS:g} point holds, upper end "
            f"< -{PARITY_POINTS:g} does not hold, else not separated at n")
    if full.empty or locks.empty:
        return [_row(f"LOCKS within about {PARITY_POINTS:g} point of FullKV ({suite})", "no LOCKS and FullKV runs",
                     "not measured", source, rule, suite)]
    full_mean = float(full.iloc[0]["average"])
    out = []
    for _, r in locks.iterrows():
        b = int(r["budget"])
        claim = f"LOCKS within about {PARITY_POINTS:g} point of FullKV at budget {b} ({suite})"
        config = f"{suite}; {run_configuration(r)}; FullKV n = {int(full.iloc[0]['n'])}"
        c = _vs_fullkv(df, r)
        if c is None:
            out.append(_row(claim, "no paired per-sample scores", "not measured", source, rule, config))
            continue
        text = (f"{r['average']:.1f} vs FullKV {full_mean:.1f}: Δ {c['diff']:+.1f} [{c['lo']:+.1f}, {c['hi']:+.1f}], "
                f"p={c['p']:.2g}, n={c['n']}; {detectable(c['n'], c.get('discordant'))}")
        verdict = ("holds" if c["lo"] >= -PARITY_POINTS else "does not hold" if c["hi"] < -PARITY_POINTS
                   else "not separated")
        out.append(_row(claim, text + ("; not separated at n = %d" % c["n"] if verdict == "not separated" else ""),
                        verdict, source, rule, config))
    r = locks.iloc[-1]
    b = int(r["budget"])
    claim = f"LOCKS above FullKV at its largest budget, {b} ({suite})"
    rule = ("one-sided exact McNemar p(LOCKS > FullKV) < 0.05 holds; two-sided p < 0.05 with LOCKS below does not "
            "hold; else not separated at n")
    config = f"{suite}; {run_configuration(r)}; FullKV n = {int(full.iloc[0]['n'])}"
    c = _vs_fullkv(df, r)
    if c is None or c.get("p_greater") is None:
        return out + [_row(claim, "no paired 0/100 per-sample scores", "not measured", source, rule, config)]
    text = (f"Δ {c['diff']:+.1f} [{c['lo']:+.1f}, {c['hi']:+.1f}], one-sided p={c['p_greater']:.2g}, n={c['n']}; "
            f"{detectable(c['n'], c.get('discordant'))}")
    verdict = ("holds" if c["p_greater"] < 0.05 else "does not hold" if c["diff"] < 0 and c["p"] < 0.05
               else "not separated")
    return out + [_row(claim, text, verdict, source, rule, config)]


def bytes_rows() -> list[dict]:
    rule = f"FullKV K/V bytes / LOCKS bytes per step within {TOL:.0%} of {BYTES_CLAIM}"
    out = []
    for shape, name in SHAPES.items():
        full, locks = step_bytes(shape, 1048576)
        ratio = full / locks
        out.append(_row(f"bytes per decode step ≈ {BYTES_CLAIM}x fewer at 1M tokens ({name}, budget {BYTES_BUDGET})",
                        f"{ratio:.2f}x ({full / 1e6:.0f} MB vs {locks / 1e6:.1f} MB per layer)",
                        "holds" if abs(ratio / BYTES_CLAIM - 1) <= TOL else "does not hold",
                        "bytes model (LocksSelector.static_step_cost)", rule,
                        f"{name} attention shape, 1M tokens, LOCKS b={BYTES_BUDGET} fair (forced: the partial page "
                        f"only), rank 8, 804 B/page, bf16 K/V, one layer"))
    return out


def fullkv_memory(shape: str, context: int, batch: int) -> float:
    """Bytes FullKV holds on the device at batch B: the bf16 weights and every row's K/V cache."""
    weights, layers = weights_and_layers(shape)
    return weights + batch * layers * step_bytes(shape, context)[0]


def reachable_batch(shape: str, context: int, claimed: float, largest: int = 4096) -> int | None:
    """The smallest batch (a power of two) whose byte ceiling reaches `claimed`; None when none up to `largest` does
    (the ceiling tends to full / locks, the K/V ratio, as B grows)."""
    batch = 1
    while batch <= largest:
        if byte_ceiling(shape, context, batch) >= claimed:
            return batch
        batch *= 2
    return None


def ceiling_table() -> pd.DataFrame:
    """The byte-bound whole-step ceiling of LOCKS over FullKV per model shape, context and batch (BATCHES), with
    FullKV's device memory and whether it fits one DEVICE_MEMORY accelerator."""
    rows = []
    for shape, name in SHAPES.items():
        for context in SPEEDUP_CLAIMS:
            for batch in BATCHES:
                memory = fullkv_memory(shape, context, batch)
                rows.append({"model": name, "context": context, "batch": batch,
                             "byte_ceiling": byte_ceiling(shape, context, batch),
                             "fullkv_memory_gb": memory / 1e9, "fits_one_h200": memory <= DEVICE_MEMORY})
    return pd.DataFrame(rows)


def _reachable(shape: str, name: str, context: int, claimed: float) -> str:
    batch = reachable_batch(shape, context, claimed)
    if batch is None:
        return f"no batch ({name})"
    fits = fullkv_memory(shape, context, batch) <= DEVICE_MEMORY
    return f"batch {batch} ({name}; FullKV {'fits' if fits else 'does not fit'} one H200)"


def speedup_rows(results) -> list[dict]:
    rule = f"measured whole-step speedup within {TOL:.0%} of the claim"
    src = results / "gpu"
    e2e = e2e_in(src)
    out = []
    for context, claimed in SPEEDUP_CLAIMS.items():
        ctx = f"{context // 1024}K" if context < 1048576 else "1M"
        ceiling = {name: byte_ceiling(shape, context) for shape, name in SHAPES.items()}
        ceilings = ", ".join(f"{name} ceiling {c:.2f}x" for name, c in ceiling.items())
        above = [name for name, c in ceiling.items() if claimed > c]
        if above:  # no batch-1 decode step can beat the bytes it must read
            ceilings += f" (the claim exceeds the batch-1 ceiling of {' and '.join(above)})"
        ceilings += "; reachable from " + ", ".join(_reachable(shape, name, context, claimed)
                                                    for shape, name in SHAPES.items())
        claim = f"{claimed}x decode speedup at {ctx}"
        config = (f"LOCKS b={BYTES_BUDGET} (default configuration) vs FullKV, the whole decode step as a CUDA graph, "
                  f"GLM-4-9B and Llama-3.1-8B shapes with random bf16 weights, {ctx} tokens, batch 1")
        rows = None if e2e is None else e2e[(e2e["method"] == "locks") & (e2e["context"] == context)
                                            & e2e["speedup_vs_fullkv"].notna()]
        if rows is None or rows.empty:
            out.append(_row(claim, f"not measured (no GPU record); byte-bound {ceilings}", "not measured",
                            f"{rel(src)}/*.jsonl (absent)", rule, config))
            continue
        measured = ", ".join(f"{SHAPES.get(r['shape'], r['shape'])} {r['speedup_vs_fullkv']:.2f}x "
                             f"(ceiling {r['byte_ceiling']:.2f}x)" for _, r in rows.iterrows())
        holds = any(abs(r["speedup_vs_fullkv"] / claimed - 1) <= TOL or r["speedup_vs_fullkv"] >= claimed
                    for _, r in rows.iterrows())
        out.append(_row(claim, measured, "holds" if holds else "does not hold", rel(src), rule, config))
    return out


def selector_step_bytes_at(shape: str, method: str, context: int, budget: int = BYTES_BUDGET,
                           layer: int = 0) -> tuple[float, float]:
    """(HBM bytes, host-to-device bytes) of one decode step of one layer at `context` tokens (bf16 accounting), from
    the selector's own static step after its own prefill (random state in the exact layout, bench/prefill_state.py)
    on random keys, on CPU; host bytes are those of the first step, a worst case for a buffer."""
    import torch

    from bench.decode import selector_step_bytes
    from bench.prefill_state import prefill_selector
    from bench.shapes import ATTENTION
    from locks.core.registry import MethodSpec
    from locks.core.selector import LayerInfo

    hq, hkv, d = ATTENTION[shape]
    info = LayerInfo(layer, hq, hkv, d, d ** -0.5, kv_element_bytes=2)
    selector = MethodSpec(method, budget).build(info)
    gen = torch.Generator().manual_seed(0)
    keys = torch.randn(1, hkv, context, d, generator=gen, dtype=torch.float32).to(torch.bfloat16)
    values = torch.randn(1, hkv, context, d, generator=gen, dtype=torch.float32).to(torch.bfloat16)
    with torch.no_grad():
        prefill_selector(selector, keys[:, :, :-1], values[:, :, :-1], gen, "random", max_new_tokens=1)
        selector.start_static(context)
        query = torch.randn(1, hq, d, generator=gen).to(torch.bfloat16)
        sel = selector.select_static(query, keys, values, torch.tensor([context]))
        hbm, h2d, _ = selector_step_bytes(selector, sel, context)
    return hbm, h2d


def whole_step_ceiling(shape: str, method: str, context: int, batch: int = 1, budget: int = BYTES_BUDGET) -> float:
    """FullKV's whole-step bytes / the method's at batch B (weights once per step, each row's K/V or reads per layer;
    Quest's first two layers dense, its default), host-to-device bytes counted as HBM bytes (an optimistic floor:
    host reads are slower)."""
    weights, layers = weights_and_layers(shape)
    full = step_bytes(shape, context)[0]
    hbm, h2d = selector_step_bytes_at(shape, method, context, budget, layer=2)
    dense = 2 if method == "quest" else 0
    per_row = dense * full + (layers - dense) * (hbm + h2d)
    return (weights + batch * layers * full) / (weights + batch * per_row)


def max_batch(shape: str, method: str, context: int, device_bytes: float) -> int:
    """Rows of `context` tokens that fit next to the bf16 weights in `device_bytes`, each row holding what the
    method's design keeps on the device (paper_figs/memory_table.py)."""
    from paper_figs.memory_table import model_bytes

    weights, _ = weights_and_layers(shape)
    b = model_bytes(shape, method, context)
    return int((device_bytes - weights) // (b["kv"] + b["state"]))


def _e2e_rows(results, method: str, context: int | None = None):
    e2e = e2e_in(results / "gpu")
    if e2e is None:
        return None
    rows = e2e[e2e["method"] == method]
    if context is not None:
        rows = rows[(rows["context"] - context).abs() <= 0.05 * context]
    return rows if len(rows) else None


def anchor_rows(results) -> list[dict]:
    """The anchors' own speed and memory claims: measured from results/gpu/ e2e records when present, else the
    analytic ceiling at that setting with "not measured"."""
    src = f"{rel(results / 'gpu')}/*.jsonl"
    analytic = "bytes model + Selector.memory_bytes (no GPU record)"
    out = []
    rule = f"measured whole-step speedup within {TOL:.0%} of the claim, or above it"

    def speed_row(claim, method, context, claimed, batch=1, shape="llama"):
        config = (f"{method} b={BYTES_BUDGET} (its official defaults, fair) vs FullKV, {SHAPES[shape]} shape, "
                  f"{context // 1024}K tokens, batch {batch}, bf16")
        rows = _e2e_rows(results, method, context)
        rows = None if rows is None else rows[rows["speedup_vs_fullkv"].notna()]
        if rows is None or rows.empty:
            ceiling = whole_step_ceiling(shape, method, context, batch)
            verb = "reaches" if ceiling >= claimed * (1 - TOL) else "is below"
            return _row(claim, f"not measured; the byte-bound ceiling at {SHAPES[shape]} shape, "
                               f"{context // 1024}K, batch {batch} is {ceiling:.2f}x ({verb} the claim)",
                        "not measured", analytic, rule, config)
        best = rows.loc[rows["speedup_vs_fullkv"].idxmax()]
        holds = best["speedup_vs_fullkv"] >= claimed * (1 - TOL)
        return _row(claim, f"{best['speedup_vs_fullkv']:.2f}x ({SHAPES.get(best['shape'], best['shape'])}, "
                           f"{int(best['context']) // 1024}K, batch {int(best.get('batch', 1))}; ceiling "
                           f"{best['byte_ceiling']:.2f}x)", "holds" if holds else "does not hold", src, rule, config)

    out.append(speed_row("Quest: 1.74x end-to-end at 32K tokens, budget 2048 (RTX 6000 Ada, FP16 weights, "
                         "LongChat-7B: 32 KV heads, 4x the K/V per token of the Llama-3.1-8B shape)",
                         "quest", 32768, 1.74))
    out.append(speed_row("RocketKV: 3.7x end-to-end decode speedup (A100; v1: 3x on H100)", "rocketkv", 131072, 3.7))

    # ShadowKV: up to 6x larger batches and 3.04x throughput, Llama-3.1-8B at 122K on an A100 80GB
    context, a100 = 124928, 80e9
    claim = "ShadowKV: 6x larger batch and 3.04x throughput (Llama-3.1-8B, 122K, A100 80GB)"
    config_b = f"ShadowKV b={BYTES_BUDGET} (official defaults) vs FullKV, Llama-3.1-8B shape, 122K tokens, 80 GB, bf16"
    rule_b = "max batch ratio >= 6 (analytic) and measured tokens/s ratio at each method's largest batch >= 3.04"
    full_b, shadow_b = max_batch("llama", "fullkv", context, a100), max_batch("llama", "shadowkv", context, a100)
    batches = f"{shadow_b} vs FullKV's {full_b} rows fit 80 GB next to the weights ({shadow_b / max(full_b, 1):.1f}x)"
    fk, sk = _e2e_rows(results, "fullkv", context), _e2e_rows(results, "shadowkv", context)
    if fk is None or sk is None:
        out.append(_row(claim, f"throughput not measured; analytic: {batches}", "not measured", analytic, rule_b,
                        config_b))
    else:
        ratio = sk["tokens_per_s"].max() / fk["tokens_per_s"].max()
        holds = ratio >= 3.04 * (1 - TOL) and shadow_b >= 6 * full_b
        out.append(_row(claim, f"{ratio:.2f}x tokens/s (largest measured batches); {batches}",
                        "holds" if holds else "does not hold", src, rule_b, config_b))

    # RocketKV: 32.6 % lower peak memory in the decode phase
    claim = "RocketKV: 32.6% lower peak memory than FullKV in the decode phase"
    config_m = f"RocketKV b={BYTES_BUDGET} (official defaults) vs FullKV, Llama-3.1-8B shape, 128K tokens, batch 1, bf16"
    rule_m = "1 - peak(RocketKV) / peak(FullKV) within 5 points of 32.6% (weights + K/V + state, batch 1)"
    weights, _ = weights_and_layers("llama")
    full, rocket = (model_bytes_sum("llama", m, 131072) for m in ("fullkv", "rocketkv"))
    design = 1 - (weights + rocket) / (weights + full)
    rk, fk = _e2e_rows(results, "rocketkv", 131072), _e2e_rows(results, "fullkv", 131072)
    text = (f"design: {100 * design:.1f}% lower (Llama-3.1-8B shape, 128K, budget {BYTES_BUDGET}: SnapKV++ drops the "
            f"evicted tokens); the harness keeps every token in the transformers cache, so its measured peak shows "
            f"the state only")
    if rk is None or fk is None or "peak_allocated_bytes" not in rk:
        out.append(_row(claim, "not measured; " + text, "not measured", analytic, rule_m, config_m))
    else:
        measured = 1 - rk["peak_allocated_bytes"].min() / fk["peak_allocated_bytes"].min()
        holds = 100 * measured >= 32.6 - 5
        out.append(_row(claim, f"measured {100 * measured:.1f}% lower; " + text, "holds" if holds else "does not hold",
                        src, rule_m, config_m))

    # LOCKS: "saves bandwidth, not VRAM"
    claim = "LOCKS saves bandwidth, not VRAM"
    rule_v = "LOCKS's device bytes >= FullKV's (it keeps every K/V plus summaries) and its step reads <= 1/5 of FullKV's"
    cells = []
    ok = True
    for shape, name in SHAPES.items():
        f, lk = model_bytes_sum(shape, "fullkv", 1048576), model_bytes_sum(shape, "locks", 1048576)
        full_step, locks_step = step_bytes(shape, 1048576)
        ok &= lk >= f and locks_step <= full_step / 5
        cells.append(f"{name} 1M: device {lk / f:.3f}x FullKV's, bytes per step {locks_step / full_step:.3f}x")
    out.append(_row(claim, "; ".join(cells), "holds" if ok else "does not hold",
                    "Selector.memory_bytes + bytes model", rule_v,
                    f"LOCKS b={BYTES_BUDGET} (default configuration) vs FullKV, 1M tokens, both shapes, bf16"))
    return out


SEPARATED_P = 0.05  # a paired difference with p >= this is reported as "not separated at n = ..."
FEW_POINTS = 10  # "int4 loses a few recall points": a loss of more than 0 and at most this many points
COLLAPSE_POINTS, COLLAPSE_P = 20, 0.01  # "int2 collapses": at least this many points below unquantized, p below this
PAGE_KV_SHARE, PAGE_KV_TOL = 0.10, 0.02  # "about 10 % of the page's KV": within 2 points
POWER_RESULTS = "locks_int4_power"  # int4 vs unquantized over several RULER niah tasks, sized for a few points
POWER_POINTS = 3  # the loss the power run states the needed pairs for


UNQUANTIZED = "LOCKS quant=none b=128 (conf/locks_ablation/unquantized.yaml), SmolLM2-135M-Instruct, RULER niah_single_2"


def int4_power_rows(results) -> list[dict]:
    """"int4 loses a few points" on several hundred paired samples over several RULER niah tasks at 2K
    (results/locks_int4_power/): the paired Δ, what this n resolves, and the pairs a POWER_POINTS-point loss needs
    at the observed share of discordant pairs."""
    from eval.report.statistics import sample_scores
    from eval.stats import mcnemar_sample_size
    from paper_figs.common import runs_in
    from paper_figs.locks_ablation import compare, runs_by_cell

    src = results / POWER_RESULTS
    source = f"{rel(src)}/*.json"
    rule = f"paired Δ(int4 - unquantized) in [-{FEW_POINTS}, 0) at p < {SEPARATED_P}"
    df = runs_in(src)
    contexts = runs_by_cell(df) if df is not None else {}
    if len(contexts) != 1:
        return [_row("int4 summaries lose a few recall points against unquantized ones (several RULER tasks)",
                     f"{source} missing", "not measured", source, rule, "conf/locks_ablation/ default, unquantized")]
    [(context, by_cell)] = contexts.items()
    tasks = sorted(set(sample_scores(by_cell["default"])[1].values())) if "default" in by_cell else []
    claim = (f"int4 summaries lose a few recall points against unquantized ones ({report.tokens_label(context)} "
             f"tokens, {len(tasks)} RULER tasks)")
    config = (f"SmolLM2-135M-Instruct, RULER {', '.join(tasks)} at {report.tokens_label(context)} tokens; LOCKS "
              f"b=128 fair, forced: the partial page only; cells default vs unquantized (conf/locks_ablation/)")
    c = compare(by_cell, "default", "unquantized")
    if c is None or c["diff"] is None:
        return [_row(claim, "no paired default / unquantized runs", "not measured", source, rule, config)]
    text = (f"default - unquantized: {c['diff']:+.1f} [{c['lo']:+.1f}, {c['hi']:+.1f}], p={c['p']:.2g}, "
            f"n={c['n']}; {detectable(c['n'], c.get('discordant'))}")
    if c.get("discordant") is not None:
        # a loss of POWER_POINTS on top of the observed disagreement: discordance psi + delta, all of delta one way
        psi = c["discordant"] + POWER_POINTS / 100
        need = mcnemar_sample_size(psi, POWER_POINTS / 100)
        text += (f"; a {POWER_POINTS}-point loss (then {100 * psi:.1f}% discordant) needs about {need} pairs for 80% "
                 f"power, and the interval {'excludes' if c['lo'] > -POWER_POINTS else 'does not exclude'} it")
    if c["p"] >= SEPARATED_P:
        return [_row(claim, f"{text}; not separated at n = {c['n']}", "not separated", source, rule, config)]
    return [_row(claim, text, "holds" if -FEW_POINTS <= c["diff"] < 0 else "does not hold", source, rule, config)]


def ablation_rows(results) -> list[dict]:
    """The write-up's claims about its own design, from the LOCKS ablation study (paper_figs/locks_ablation.py,
    results/locks_ablation/): one row per claim and context; the bytes claim is analytic at d = 128 as well."""
    from locks.core.selector import LayerInfo
    from locks.method.selector import LocksSelector
    from paper_figs.common import runs_in
    from paper_figs.locks_ablation import RESULTS, compare, runs_by_cell

    src = results / RESULTS
    source = f"{rel(src)}/*.json"
    df = runs_in(src)
    contexts = runs_by_cell(df) if df is not None else {}
    out = []

    def paired(claim, a, b, rule, decide):
        """One row per context: a vs b (diff = a - b); p >= SEPARATED_P is "not separated at n = ..."."""
        rows = []
        for context, by_cell in contexts.items():
            c = compare(by_cell, a, b)
            name = f"{claim} ({report.tokens_label(context)} tokens)"
            config = (f"SmolLM2-135M-Instruct, RULER niah_single_2 at {report.tokens_label(context)} tokens; LOCKS "
                      f"b=128 fair, forced: the partial page only; cells {a} vs {b} (conf/locks_ablation/)")
            if c is None or c["diff"] is None:
                rows.append(_row(name, f"no paired {a} / {b} runs", "not measured", source, rule, config))
                continue
            text = (f"{a} - {b}: {c['diff']:+.1f} [{c['lo']:+.1f}, {c['hi']:+.1f}], p={c['p']:.2g}, n={c['n']}; "
                    f"{detectable(c['n'], c.get('discordant'))}")
            if c["p"] >= SEPARATED_P:
                rows.append(_row(name, f"{text}; not separated at n = {c['n']}", "not separated", source, rule, config))
            else:
                rows.append(_row(name, text, "holds" if decide(c) else "does not hold", source, rule, config))
        return rows or [_row(claim, f"{source} missing", "not measured", source, rule, "conf/locks_ablation/")]

    out += paired("int4 summaries lose a few recall points against unquantized ones", "default", "unquantized",
                  f"paired Δ(int4 - unquantized) in [-{FEW_POINTS}, 0) at p < {SEPARATED_P}",
                  lambda c: -FEW_POINTS <= c["diff"] < 0)
    out += int4_power_rows(results)
    out += paired("int2 summaries collapse", "v_bits_2", "unquantized",
                  f"paired Δ(int2 - unquantized) <= -{COLLAPSE_POINTS} points at p < {COLLAPSE_P}",
                  lambda c: c["diff"] <= -COLLAPSE_POINTS and c["p"] < COLLAPSE_P)
    out += paired("the rank-8 term matters", "default", "centroid",
                  f"paired Δ(rank 8 - centroid only) > 0 at p < {SEPARATED_P}", lambda c: c["diff"] > 0)

    # about 10 % of the page's KV: the layout's bytes per page over 2 n d s (n = 16 tokens, bf16)
    rule = f"summary bytes per page / (2 * 16 * d * 2 B) within {PAGE_KV_TOL:.0%} of {PAGE_KV_SHARE:.0%}"
    parts, ok = [], True
    for d in (128, 64):
        per_page = LocksSelector(LayerInfo(0, 4, 1, d, d ** -0.5), 2048).bytes_per_page
        share = per_page / (2 * 16 * d * 2)
        ok &= d != 128 or abs(share - PAGE_KV_SHARE) <= PAGE_KV_TOL
        parts.append(f"d={d}: {per_page} B / {2 * 16 * d * 2} B = {100 * share:.1f}%")
    out.append(_row("summaries cost about 10% of the page's KV", "; ".join(parts) + " (the claim's d = 128 decides)",
                    "holds" if ok else "does not hold", "locks/method/layouts.py (the layout's stored bytes)", rule,
                    "LOCKS's default quantized layout (int4 V, int8 C, head_int8 mu, fp32 w), page 16, rank 8"))

    # Theorem 1 for unquantized summaries: the certificate never exceeds the measured coverage, at any step
    rule = "certificate_sound = 1 (certificate <= coverage at every step, layer and query head) in every unquantized run"
    runs = [by_cell["unquantized"] for by_cell in contexts.values() if "unquantized" in by_cell]
    rates = [float(r["diag:certificate_sound"]) for r in runs if pd.notna(r.get("diag:certificate_sound"))]
    if not rates:
        out.append(_row("Theorem 1 holds for unquantized summaries", "no unquantized run logged certificate_sound",
                        "not measured", source, rule, UNQUANTIZED))
    else:
        out.append(_row("Theorem 1 holds for unquantized summaries",
                        f"soundness rate {min(rates):.6f} (lowest of {len(rates)} runs, "
                        f"{sum(int(r['n']) for r in runs)} samples)", "holds" if min(rates) == 1.0 else "does not hold",
                        source, rule, UNQUANTIZED))
    return out


def model_bytes_sum(shape: str, method: str, context: int) -> float:
    """Device bytes (K/V + state) of one sequence over every layer in the method's design."""
    from paper_figs.memory_table import model_bytes

    b = model_bytes(shape, method, context)
    return b["kv"] + b["state"]


def certificate_rows(df: pd.DataFrame, source: str) -> list[dict]:
    rule = "certificate <= measured coverage (+1e-5) at every logged step, layer and query head, in every LOCKS run"
    claim = "Theorem 1 coverage bound (the per-step certificate is a lower bound on coverage)"
    config = "every LOCKS run of the RULER suites (" + "; ".join(
        suite_name(g) for _, g in df.groupby(["model", "context_length"], sort=False)) + "), each budget"
    col = "diag:certificate_sound"
    runs = df[(df["method"] == "locks")]
    runs = runs[runs[col].notna()] if col in runs else runs.iloc[0:0]
    if runs.empty:
        return [_row(claim, "no LOCKS run logged certificate_sound", "not measured", source, rule, config)]
    rates = runs[col].astype(float)
    measured = (f"soundness rate {rates.min():.6f} (lowest run) over {len(runs)} runs, "
                f"{int(runs['n'].sum())} samples; mean certificate {runs['diag:certificate'].mean():.3f} "
                f"vs mean coverage {runs['coverage'].mean():.3f}")
    return [_row(claim, measured, "holds" if rates.min() == 1.0 else "does not hold", source, rule, config)]


def suite_runs(results) -> dict[str, pd.DataFrame]:
    """results/<suite>/ -> its RULER runs, for every suite of SUITES that is committed."""
    from paper_figs.common import runs_in

    out = {}
    for name in SUITES:
        df = runs_in(results / name)
        if df is not None and (df["benchmark"] == "ruler").any():
            out[name] = df[df["benchmark"] == "ruler"]
    return out


def claims_table(results) -> pd.DataFrame:
    suites = suite_runs(results)
    rows = []
    if not suites:
        rows.append(_row("RULER claims (parity, collapse, ranking, certificate)",
                         f"none of results/{{{','.join(SUITES)}}}/*.json", "not measured", rel(results),
                         "README: the RULER sweep commands", "the RULER suites of README.md"))
    sources = {name: f"{rel(results / name)}/*.json" for name in suites}
    for name, df in suites.items():
        rows += parity_rows(df, sources[name])
    for name, df in suites.items():
        rows += collapse_rows(df, sources[name])
    for name, df in suites.items():
        if (df["method"] == "oracle").any():
            rows += ranking_rows(df, sources[name])
    rows += bytes_rows() + speedup_rows(results) + anchor_rows(results) + ablation_rows(results)
    if suites:
        rows += certificate_rows(pd.concat(list(suites.values())), ", ".join(sources.values()))
    return pd.DataFrame(rows)


def ceiling_markdown(table: pd.DataFrame) -> str:
    """Models x contexts rows, one column per batch: 'ceiling (FullKV GB)', a dagger where FullKV does not fit."""
    lines = ["## Byte-bound whole-step ceiling of LOCKS over FullKV (budget 2048, bf16) by batch", "",
             "| model | context | " + " | ".join(f"B={b}" for b in BATCHES) + " |",
             "|---|---|" + "---|" * len(BATCHES)]
    for (model, context), group in table.groupby(["model", "context"], sort=False):
        ctx = f"{context // 1024}K" if context < 1048576 else "1M"
        cells = [f"{r.byte_ceiling:.2f}x ({r.fullkv_memory_gb:.0f} GB{'' if r.fits_one_h200 else ' †'})"
                 for r in group.sort_values("batch").itertuples()]
        lines.append(f"| {model} | {ctx} | " + " | ".join(cells) + " |")
    lines += ["", "ceiling = (W + B·n·FullKV K/V bytes) / (W + B·n·LOCKS bytes) per decode step, weights W read once per "
              "step; GB = FullKV's weights + K/V cache at that batch; † = more than one H200 holds (139 GiB = 149 GB)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(__doc__, argv)
    table = claims_table(args.results)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "claims.csv", index=False)
    md = ["| claim | configuration | measured | verdict | rule | source |", "|---|---|---|---|---|---|"]
    md += [f"| {r.claim} | {r.configuration} | {r.measured} | **{r.verdict}** | {r.rule} | `{r.source}` |"
           for r in table.itertuples()]
    (args.out / "claims.md").write_text("\n".join(md) + "\n")
    ceilings = ceiling_table()
    ceilings.to_csv(args.out / "byte_ceiling.csv", index=False)
    (args.out / "byte_ceiling.md").write_text(ceiling_markdown(ceilings))
    counts = table["verdict"].value_counts().to_dict()
    print(f"{NAME}: {len(table)} claims ({', '.join(f'{v} {k}' for k, v in counts.items())}) -> "
          f"{rel(args.out / 'claims.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
