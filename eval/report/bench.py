"""The GPU benchmarks' JSON lines: per-layer decode latency (bench/decode.py) and the end-to-end CUDA-graph decode
step (bench/e2e.py) -> tables and figures."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: E402
from tqdm import tqdm  # noqa: E402

from eval.report.figures import tokens_label
from eval.report.runs import DuplicateRunError

# decode-latency records (bench/decode.py): the end-to-end methods (components locks_score / topk / locks_decode
# are left out of the figures; they stay in latency.csv)
FULLKV_KERNELS = ["sdpa_cudnn", "sdpa_flash", "triton_full"]
SPARSE_KERNELS = ["locks_fused", "quest_fused", "quest_fused_per_head", "locks_torch"]
LATENCY_KEY = ["shape", "context", "batch", "method", "budget", "Hq", "Hkv", "d", "dtype", "summaries"]



def load_bench_records(files, kind: str, gpu_timing, key: list[str], what: str, progress: bool = True) -> pd.DataFrame:
    """Records of one `kind` from benchmark JSON-lines files (other files are ignored: reading a file stops at its
    first line that is not a JSON object with a "kind"), flat fields only, plus the run's device ("gpu") and the
    source file:line. Records whose timing fails `gpu_timing` (CPU dry runs) are dropped and counted in
    df.attrs['cpu_dry_run']; two records with the same `key` are a DuplicateRunError naming both places."""
    rows, cpu = [], 0
    files = list(files)
    for f in tqdm(files, desc=f"reading {what}", unit="file", disable=not progress or len(files) < 2):
        f = Path(f)
        gpu = None
        try:
            lines = f.read_text().splitlines()
        except UnicodeDecodeError:
            continue
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                break  # not a bench file (or a torn last line)
            if not isinstance(r, dict) or "kind" not in r:
                break
            if r["kind"] == "run":
                gpu = r.get("device")
            if r["kind"] != kind:
                continue
            if not gpu_timing(r.get("timing")):
                cpu += 1
                continue
            rows.append({**{k: v for k, v in r.items() if not isinstance(v, (dict, list))}, "gpu": gpu,
                         "file": str(f), "line": i + 1})
    df = pd.DataFrame(rows)
    df.attrs["cpu_dry_run"] = cpu
    if len(df):
        cols = [k for k in key if k in df.columns]
        dups = [f"  {dict(zip(cols, k))}: " + ", ".join(f"{a}:{b}" for a, b in zip(g['file'], g['line']))
                for k, g in df.groupby(cols, dropna=False) if len(g) > 1]
        if dups:
            raise DuplicateRunError(f"duplicate {what} measurements (same {', '.join(cols)}); keep one run per "
                                    "configuration:\n" + "\n".join(dups))
    return df


def load_latency(files, progress: bool = True) -> pd.DataFrame:
    """Measurement records of bench_decode.py from the given *.jsonl files (non-bench files are ignored). CPU
    dry-run records are dropped (df.attrs['cpu_dry_run'] counts them). Duplicates are a DuplicateRunError."""
    df = load_bench_records(files, "measurement", lambda t: t != "cpu_wall", LATENCY_KEY, "decode-latency", progress)
    return df[df["ms"].notna()] if "ms" in df.columns else df


def _latency_panels(lat: pd.DataFrame):
    shapes = sorted(lat["shape"].unique())
    batches = sorted(lat["batch"].unique())
    fig, axes = plt.subplots(len(batches), len(shapes), figsize=(5 * len(shapes), 3.6 * len(batches)),
                             squeeze=False, layout="constrained")
    for i, b in enumerate(batches):
        for j, s in enumerate(shapes):
            sub = lat[(lat["batch"] == b) & (lat["shape"] == s)]
            heads = ""
            if len(sub) and {"Hq", "Hkv"} <= set(sub.columns):
                heads = f" ({int(sub['Hq'].iloc[0])} q / {int(sub['Hkv'].iloc[0])} KV heads)"
            yield fig, axes[i][j], sub, f"{s}{heads}, batch {b}"


def _context_axis(ax, contexts) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(sorted(contexts)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: tokens_label(x)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("context length (tokens, log2 scale)")
    ax.grid(True, alpha=0.3)


def _latency_methods(sub: pd.DataFrame) -> list[str]:
    return [m for m in FULLKV_KERNELS + SPARSE_KERNELS if m in set(sub["method"])]


def plot_latency_vs_context(lat: pd.DataFrame):
    """Decode latency of one layer (ms, median) vs context, one panel per shape x batch, one line per method
    (FullKV kernels dashed). Returns the Figure."""
    fig = None
    for fig, ax, sub, title in _latency_panels(lat):
        for m in _latency_methods(sub):
            s = sub[sub["method"] == m].sort_values("context")
            ax.plot(s["context"].to_numpy(float), s["ms"].to_numpy(float), label=m, marker="o",
                    linestyle="--" if m in FULLKV_KERNELS else "-")
        _context_axis(ax, lat["context"].unique())
        ax.set_yscale("log")
        ax.set_ylabel("decode latency per layer (ms)")
        ax.set_title(title, fontsize=9)
        if ax.get_lines():
            ax.legend(fontsize=7)
    return fig


def plot_speedup_vs_context(lat: pd.DataFrame):
    """speedup_vs_fastest_fullkv of the sparse methods vs context; 1 = the fastest FullKV kernel. Returns the Figure."""
    fig = None
    for fig, ax, sub, title in _latency_panels(lat):
        for m in [m for m in SPARSE_KERNELS if m in set(sub["method"])]:
            s = sub[(sub["method"] == m)].dropna(subset=["speedup_vs_fastest_fullkv"]).sort_values("context")
            ax.plot(s["context"].to_numpy(float), s["speedup_vs_fastest_fullkv"].to_numpy(float), label=m,
                    marker="o")
        ax.axhline(1.0, color="black", linestyle=":", label="fastest FullKV")
        _context_axis(ax, lat["context"].unique())
        ax.set_ylabel("speedup vs fastest FullKV kernel")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    return fig


def plot_bench_bytes_vs_context(lat: pd.DataFrame):
    """Analytic bytes read per decode step (all KV heads and batch rows, one layer) vs context, per method.
    Returns the Figure."""
    fig = None
    for fig, ax, sub, title in _latency_panels(lat):
        for m in ["triton_full"] + SPARSE_KERNELS:
            s = sub[sub["method"] == m].dropna(subset=["bytes"]).sort_values("context")
            if len(s):
                ax.plot(s["context"].to_numpy(float), s["bytes"].to_numpy(float) / 1e6,
                        label="FullKV" if m == "triton_full" else m, marker="o",
                        linestyle=":" if m == "triton_full" else "-", color="black" if m == "triton_full" else None)
        _context_axis(ax, lat["context"].unique())
        ax.set_yscale("log")
        ax.set_ylabel("bytes read per decode step (MB)")
        ax.set_title(title, fontsize=9)
        if ax.get_lines():
            ax.legend(fontsize=7)
    return fig


def latency_table(lat: pd.DataFrame) -> pd.DataFrame:
    """rows = (shape, batch, method), columns = ms at each context and the speedup vs the fastest FullKV kernel."""
    rows = {}
    for (shape, batch, method), g in lat.groupby(["shape", "batch", "method"], sort=True):
        row = {}
        for _, r in g.sort_values("context").iterrows():
            c = tokens_label(r["context"])
            row[f"ms@{c}"] = r["ms"]
            if pd.notna(r.get("speedup_vs_fastest_fullkv")):
                row[f"speedup@{c}"] = r["speedup_vs_fastest_fullkv"]
        rows[(shape, int(batch), method)] = row
    out = pd.DataFrame.from_dict(rows, orient="index")
    order = sorted(out.columns, key=lambda c: (c.split("@")[0] != "ms", _ctx_value(c.split("@")[1])))
    out = out[order]
    out.index = pd.MultiIndex.from_tuples(out.index, names=["shape", "batch", "method"])
    return out


def _ctx_value(label: str) -> int:
    mult = {"K": 1024, "M": 2**20}.get(label[-1], 1)
    return int(label[:-1] if label[-1] in "KM" else label) * mult


# ---------------------------------------------------------------------------------------------------------------

E2E_KEY = ["shape", "context", "method", "budget", "batch", "summaries"]


def load_e2e(files, progress: bool = True) -> pd.DataFrame:
    """Records of kind "e2e" of scripts/bench_e2e.py (the CUDA-graph decode step of a whole model) from *.jsonl
    files; CPU dry-run records (timing "eager_static") are dropped (df.attrs['cpu_dry_run'] counts them).
    Duplicates are a DuplicateRunError."""
    return load_bench_records(files, "e2e", lambda t: t == "cuda_graph", E2E_KEY, "end-to-end decode", progress)


def e2e_table(df: pd.DataFrame) -> pd.DataFrame:
    """rows = (shape, batch, method); per context: ms per step (graph replay), tokens/s (all rows), speedup vs
    FullKV at the same batch and the byte-bound ceiling (FullKV bytes / the method's bytes, weights included), GB
    read per step."""
    rows = {}
    df = df.assign(batch=_batches(df))
    for (shape, batch, method), g in df.groupby(["shape", "batch", "method"], sort=True):
        row = {}
        for _, r in g.sort_values("context").iterrows():
            c = tokens_label(r["context"])
            row[f"ms@{c}"] = r["ms_graph"]
            row[f"tok/s@{c}"] = r["tokens_per_s"]
            if pd.notna(r.get("speedup_vs_fullkv")):
                row[f"speedup@{c}"] = r["speedup_vs_fullkv"]
                row[f"ceiling@{c}"] = r["byte_ceiling"]
            row[f"GB@{c}"] = r["bytes_per_step"] / 1e9
        rows[(shape, batch, method)] = row
    out = pd.DataFrame.from_dict(rows, orient="index")
    kinds = ["ms", "tok/s", "speedup", "ceiling", "GB"]
    out = out[sorted(out.columns, key=lambda c: (kinds.index(c.split("@")[0]), _ctx_value(c.split("@")[1])))]
    out.index = pd.MultiIndex.from_tuples(out.index, names=["shape", "batch", "method"])
    return out


def _batches(df: pd.DataFrame) -> pd.Series:
    """Each record's batch (rows per step); records written before bench_e2e.py took --batch were batch 1."""
    return df["batch"].fillna(1).astype(int) if "batch" in df else pd.Series(1, index=df.index)


def plot_e2e_speedup(df: pd.DataFrame):
    """Whole-step speedup over FullKV vs context, one panel per model shape, one colour per method: measured
    (solid) and the byte-bound ceiling (dashed). Returns the Figure."""
    shapes = sorted(df["shape"].unique())
    df = df.assign(batch=_batches(df))
    several = df["batch"].nunique() > 1
    fig, axes = plt.subplots(1, len(shapes), figsize=(5 * len(shapes), 3.6), squeeze=False, layout="constrained")
    for ax, shape in zip(axes[0], shapes):
        sub = df[(df["shape"] == shape)].dropna(subset=["speedup_vs_fullkv"])
        for (method, batch), s in sub.groupby(["method", "batch"], sort=True):
            s = s.sort_values("context")
            x = s["context"].to_numpy(float)
            label = f"{method} B={batch}" if several else method
            line, = ax.plot(x, s["speedup_vs_fullkv"].to_numpy(float), marker="o", label=label)
            ax.plot(x, s["byte_ceiling"].to_numpy(float), linestyle="--", color=line.get_color(),
                    label=f"{label} byte ceiling")
        ax.axhline(1.0, color="black", linestyle=":", label="FullKV")
        _context_axis(ax, df["context"].unique())
        ax.set_ylabel("decode-step speedup vs FullKV")
        ax.set_title(f"{shape}: whole decode step, CUDA graph", fontsize=9)
        ax.legend(fontsize=7)
    return fig


