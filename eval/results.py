"""Run directories, crash-safe predictions.jsonl, atomic metrics.json, and the per-task score table.

A run directory is keyed by a hash of the resolved config without logging/paths, so rerunning the same config
resumes it. `predictions.jsonl` is appended one line per finished sample and flushed + fsynced, so a SIGKILL loses
only the sample in flight; a torn last line is cut off on the next start, and finished (task, index) pairs are
skipped, so nothing is lost or duplicated.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
from pathlib import Path

import pandas as pd

from eval.stats import bootstrap_ci

# static_decode (eager steps or one captured CUDA graph) computes the same selections and attention up to float
# rounding, like method.backend below; both are recorded in metrics.json (decode_mode, attn_backend)
NOT_HASHED = ("logger", "paths", "hydra", "static_decode", "batch_size", "prefill_chunk_size", "plan")
# wall-clock fields of predictions rows and metrics.json: the only ones that differ between identical runs
TIMING_FIELDS = frozenset({"seconds", "prefill_seconds", "decode_seconds", "capture_seconds", "seconds_per_sample",
                           "prefill_seconds_per_sample", "decode_seconds_per_sample", "instrumentation_seconds"})


def without_timings(record: dict) -> dict:
    """A predictions row or metrics.json without its wall-clock fields (TIMING_FIELDS), to compare runs."""
    return {k: v for k, v in record.items() if k not in TIMING_FIELDS}


def run_key(config: dict) -> str:
    """sha1 of the canonical JSON of the resolved config minus logging, paths and the compute backend."""
    kept = {k: v for k, v in config.items() if k not in NOT_HASHED}
    if isinstance(kept.get("method"), dict):
        # method.backend (torch reference or fused Triton kernels) computes the same selections and attention up to
        # float rounding; it is recorded in metrics.json (attn_backend), not a separate experiment
        kept["method"] = {k: v for k, v in kept["method"].items() if k != "backend"}
    return hashlib.sha1(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()


def run_dir_name(config: dict) -> str:
    m, b = config["method"], config["benchmark"]
    budget = "full" if m["budget"] is None else f"b{m['budget']}"
    return f"{b['name']}_{config['model']['name']}_{m['name']}_{budget}_{run_key(config)[:10]}"


def read_predictions(path: Path) -> list[dict]:
    """All complete lines; a torn final line (killed mid-write) is removed from the file."""
    if not path.exists():
        return []
    data = path.read_bytes()
    good_end = data.rfind(b"\n") + 1
    if good_end < len(data):
        with open(path, "r+b") as f:
            f.truncate(good_end)
    rows = [json.loads(line) for line in data[:good_end].decode().splitlines() if line.strip()]
    seen, unique = set(), []
    for row in rows:
        key = sample_id(row)
        if key not in seen:
            seen.add(key)
            unique.append(row)
    return unique


KILL_AFTER_ROWS = "LOCKS_KILL_AFTER_ROWS"  # the resume test's crash point: SIGKILL after this many rows written
_rows_written = [0]


def append_prediction(f, row: dict) -> None:
    f.write(json.dumps(row, ensure_ascii=False) + "\n")
    f.flush()
    os.fsync(f.fileno())
    _rows_written[0] += 1
    kill_after = os.environ.get(KILL_AFTER_ROWS)
    if kill_after and _rows_written[0] >= int(kill_after):
        os.kill(os.getpid(), signal.SIGKILL)  # a preempted job, dying at a point the test chooses (no timing)


def write_json_atomic(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def sample_id(row: dict) -> str:
    """The resume key of a sample or prediction row (benchmarks give "id"; "task/index" otherwise)."""
    return row.get("id") or f"{row['task']}/{row['index']}"


def sample_scores(rows: list[dict]) -> dict:
    """Every sample's score by its id, with its task: what the report's confidence intervals and paired tests
    (eval/stats.py) resample and pair across methods."""
    return {sample_id(r): {"task": r["task"], "score": float(r["score"])} for r in rows}


def suite_ci(samples: dict) -> list[float] | None:
    """[lower, upper] of the 95% stratified bootstrap interval of the suite average (eval/stats.py), 2 decimals."""
    if not samples:
        return None
    _, lo, hi = bootstrap_ci({k: v["score"] for k, v in samples.items()}, {k: v["task"] for k, v in samples.items()})
    return [round(lo, 2), round(hi, 2)]


def per_task_scores(rows: list[dict], tasks: list[str]) -> dict:
    """Mean sample score per task (0-100, 2 decimals, in `tasks` order), their average and the sample counts."""
    df = pd.DataFrame(rows)
    scores = {t: round(float(df.loc[df.task == t, "score"].mean()), 2) for t in tasks if (df.task == t).any()}
    return {
        "scores": scores,
        "average": round(sum(scores.values()) / len(scores), 2) if scores else None,
        "num_samples": {t: int((df.task == t).sum()) for t in scores},
    }


def _mean_or_none(df: pd.DataFrame, column: str) -> float | None:
    values = df[column].dropna() if column in df else pd.Series(dtype=float)
    return float(values.mean()) if len(values) else None


def full_layer_ratio(row: dict) -> float:
    """A sample's bytes read over FullKV's for the same steps, on the full-attention layers (where the selectors
    act; a hybrid model's sliding layers read their window under every method): all layers when the row has no
    per-layer-type split or no full-attention layer."""
    full = (row.get("by_layer_type") or {}).get("full_attention")
    if full and full["full_bytes_per_step"]:
        return full["bytes_read_per_step"] / full["full_bytes_per_step"]
    return row["bytes_read_per_step"] / row["full_bytes_per_step"]


def _by_layer_type(rows: list[dict]) -> dict:
    """Means over samples of each layer type's layers, bytes read and FullKV's bytes per step."""
    out: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        for kind, values in (r.get("by_layer_type") or {}).items():
            for name, v in values.items():
                out.setdefault(kind, {}).setdefault(name, []).append(float(v))
    return {kind: {name: sum(v) / len(v) for name, v in values.items()} for kind, values in sorted(out.items())}


def efficiency_summary(rows: list[dict]) -> dict:
    """Means over samples of the per-step accounting: attended fraction, bytes ratio vs FullKV (full-attention
    layers; all layers too), coverage, time, and the per-layer-type split."""
    df = pd.DataFrame(rows)
    return {
        "attended_fraction": float((df["attended_tokens_per_step"] / df["context_tokens_per_step"]).mean()),
        "attended_tokens_per_step": float(df["attended_tokens_per_step"].mean()),
        "bytes_read_ratio": float(sum(full_layer_ratio(r) for r in rows) / len(rows)),
        "bytes_read_ratio_all_layers": float((df["bytes_read_per_step"] / df["full_bytes_per_step"]).mean()),
        "by_layer_type": _by_layer_type(rows),
        "bytes_read_per_step": float(df["bytes_read_per_step"].mean()),
        "full_bytes_per_step": float(df["full_bytes_per_step"].mean()),
        "metadata_bytes_per_step": _mean_or_none(df, "metadata_bytes_per_step"),
        "h2d_bytes_per_step": _mean_or_none(df, "h2d_bytes_per_step"),
        "forced_tokens_per_step": _mean_or_none(df, "forced_tokens_per_step"),
        "coverage": _mean_or_none(df, "coverage"),
        "seconds_per_sample": float(df["seconds"].mean()),
        "prefill_seconds_per_sample": _mean_or_none(df, "prefill_seconds"),
        "decode_seconds_per_sample": _mean_or_none(df, "decode_seconds"),
        "method_metrics": _named_means(rows, "method_metrics"),
        "diagnostics": _named_means(rows, "diagnostics"),
    }


def _named_means(rows: list[dict], field: str) -> dict:
    """Means over samples of each named number a method reports per sample (`method_metrics`: e.g. ShadowKV's chunk
    hit rate; `diagnostics`: e.g. the LOCKS coverage certificate), skipping samples where it is None."""
    values: dict[str, list[float]] = {}
    for r in rows:
        for name, v in (r.get(field) or {}).items():
            if v is not None:
                values.setdefault(name, []).append(float(v))
    return {name: sum(v) / len(v) for name, v in sorted(values.items())}


def score_table(metrics: dict) -> str:
    rows = [{"task": t, "score": s, "n": metrics["num_samples"].get(t)} for t, s in metrics["scores"].items()]
    rows.append({"task": "average", "score": metrics["average"], "n": sum(v for v in metrics["num_samples"].values() if v)})
    table = pd.DataFrame(rows).to_string(index=False)
    if metrics.get("average_ci95"):
        lo, hi = metrics["average_ci95"]
        table += f"\naverage 95% bootstrap CI [{lo:.2f}, {hi:.2f}] over samples"
    extra = (f"attended fraction {metrics['attended_fraction']:.3f} | bytes read vs FullKV "
             f"{metrics['bytes_read_ratio']:.3f}")
    if metrics.get("coverage") is not None:
        extra += f" | attention-mass coverage {metrics['coverage']:.4f}"
    for name, value in {**(metrics.get("diagnostics") or {}), **(metrics.get("method_metrics") or {})}.items():
        extra += f" | {name} {value:.4f}"
    return f"{table}\n{extra}"
