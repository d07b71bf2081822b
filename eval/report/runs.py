"""Collecting finished runs: every metrics.json under the given paths -> one DataFrame, one row per run, with
method labels that tell runs of one method apart (eval/report/__init__.py)."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import pandas as pd  # noqa: E402
from tqdm import tqdm  # noqa: E402

from locks.core.registry import display_name, report_order

# benchmark-record keys that describe the machine or package versions, not the experiment
IGNORED_RECORD_KEYS = {"name", "benchmark", "tokenizer", "tokenizer_revision", "tokenizer_class", "numpy", "nltk",
                       "wonderwords", "datasets", "versions", "metric_versions", "data", "data_source"}
METRICS_KEYS = {"scores", "method", "average", "num_samples"}


class ReportError(Exception):
    """A problem with the inputs (nothing found, duplicate runs); the CLI prints it and exits 2."""


class DuplicateRunError(ReportError):
    pass



def find_result_files(paths) -> tuple[list[Path], list[Path]]:
    """(json candidates, jsonl candidates) under the paths, each file once (resolved), sorted."""
    json_files, jsonl_files = set(), set()
    for p in map(Path, paths):
        if not p.exists():
            raise ReportError(f"{p}: no such file or directory")
        files = [p] if p.is_file() else (f for f in p.rglob("*") if f.is_file())
        for f in files:
            if "wandb" in f.parts or any(part.startswith(".") for part in f.parts[len(p.parts):]):
                continue
            if f.suffix == ".json":
                json_files.add(f.resolve())
            elif f.suffix == ".jsonl" and f.name != "predictions.jsonl":
                jsonl_files.add(f.resolve())
    return sorted(json_files), sorted(jsonl_files)


def is_metrics(obj) -> bool:
    return isinstance(obj, dict) and METRICS_KEYS <= obj.keys() and isinstance(obj.get("method"), dict)


def benchmark_name(m: dict) -> str:
    rec = m.get("benchmark") or {}
    if not isinstance(rec, dict):
        return str(rec)
    if rec.get("name"):
        return str(rec["name"])
    if rec.get("benchmark"):
        return str(rec["benchmark"])
    if ("context_lengths" in rec or "generator_versions" in rec or "generator_version" in rec
            or str(rec.get("truncation", "")).startswith("none (prompts sized")):
        return "ruler"
    if "template_family" in rec or "ib_scoring" in rec:
        return "infinitebench"
    if "e" in rec:
        return "longbench_e" if rec["e"] else "longbench"
    return "unknown"


def context_setting(bench: str, rec: dict) -> tuple[str, int | None]:
    """(label, longest length): RULER's context length(s), else the truncation length max_length."""
    if bench == "ruler":
        value = rec.get("context_lengths", rec.get("context_length"))
    else:
        value = rec.get("max_length", rec.get("context_length"))
    if value is None:
        return "na", None
    values = [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]
    return "+".join(map(str, values)), max(values)


def fingerprint(m: dict) -> dict:
    """Everything that makes two runs of one method different experiments, except the budget."""
    method = {f"{k}": v for k, v in m["method"].items() if k not in ("name", "budget", "backend")}
    rec = m.get("benchmark") if isinstance(m.get("benchmark"), dict) else {}
    fp = dict(method)
    fp.update({"seed": m.get("seed"), "dtype": m.get("dtype"), "tasks": sorted(m["scores"]),
               "num_samples": m.get("num_samples")})
    fp.update({f"benchmark.{k}": v for k, v in rec.items()
               if k not in IGNORED_RECORD_KEYS and k not in ("context_lengths", "context_length", "max_length")})
    return fp


def _canon(v) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def run_row(m: dict, path: Path) -> dict:
    method = m["method"]
    name = method["name"]
    budget = method.get("budget", m.get("budget"))
    if name == "fullkv" or budget is None:  # budget-free (files written before FullKV dropped its budget say 2048)
        budget = None
    bench = benchmark_name(m)
    rec = m.get("benchmark") if isinstance(m.get("benchmark"), dict) else {}
    ctx_label, ctx_len = context_setting(bench, rec)
    attended = m.get("attended_tokens_per_step")
    context_tokens = m.get("context_tokens_per_step")
    estimated = False
    if context_tokens is None and attended is not None and m.get("attended_fraction"):
        context_tokens, estimated = attended / m["attended_fraction"], True
    fp = fingerprint(m)
    row = {
        "path": str(path), "benchmark": bench, "model": m.get("model", "unknown"), "context": ctx_label,
        "context_length": ctx_len, "method": name, "budget": budget,
        "budget_mode": m.get("budget_mode", method.get("budget_mode")),
        "n": int(sum(v for v in m["num_samples"].values() if v)), "average": m["average"],
        "attended_tokens_per_step": attended, "forced_tokens_per_step": m.get("forced_tokens_per_step"),
        "context_tokens_per_step": context_tokens,
        "context_tokens_estimated": estimated, "attended_fraction": m.get("attended_fraction"),
        "bytes_read_per_step": m.get("bytes_read_per_step"), "full_bytes_per_step": m.get("full_bytes_per_step"),
        "bytes_read_ratio": m.get("bytes_read_ratio"), "coverage": m.get("coverage"),
        "seconds_per_sample": m.get("seconds_per_sample"),
        "prefill_seconds_per_sample": m.get("prefill_seconds_per_sample"),
        "decode_seconds_per_sample": m.get("decode_seconds_per_sample"),
        "latency_ms_per_step": m.get("decode_ms_per_step", m.get("ms_per_step")),
        "device": m.get("device"), "dtype": m.get("dtype"), "seed": m.get("seed"), "run_key": m.get("run_key"),
        "config": _canon(fp),
        "samples": m.get("samples"),  # {sample id: {"task", "score"}}: what the CIs and paired tests use
    }
    for task, score in m["scores"].items():
        row[f"task:{task}"] = score
    for k, v in (m.get("method_metrics") or {}).items():
        row[f"metric:{k}"] = v
    for k, v in (m.get("diagnostics") or {}).items():  # the methods' own per-step diagnostics, by name
        row[f"diag:{k}"] = v
    for kind, values in (m.get("by_layer_type") or {}).items():  # hybrid models: the sliding layers' share
        row[f"layers:{kind}:bytes_read_per_step"] = values.get("bytes_read_per_step")
    return row


def load_runs(paths, progress: bool = True, files: list[Path] | None = None) -> pd.DataFrame:
    """One row per metrics file under the paths (see run_row), with `label` (the table row name) assigned.
    Raises ReportError when nothing is found and DuplicateRunError on duplicate runs."""
    if files is None:
        files, _ = find_result_files(paths)
    rows, ignored = [], 0
    for f in tqdm(files, desc="reading metrics", unit="file", disable=not progress or len(files) < 2):
        try:
            m = json.loads(f.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            ignored += 1
            continue
        if not is_metrics(m):
            ignored += 1
            continue
        rows.append(run_row(m, f))
    if not rows:
        raise ReportError(f"no metrics.json (or metrics-schema *.json) under {paths_text(paths)}")
    df = pd.DataFrame(rows)
    df["budget"] = df["budget"].astype("Int64")
    df = assign_labels(df)
    df.attrs["ignored_json"] = ignored
    check_duplicates(df)
    return df


def check_duplicates(df: pd.DataFrame) -> None:
    """Runs that land in the same table cell (benchmark, model, context, label, budget) have the same config (up to
    fields only some of them record): an error listing the files, never merged."""
    key = ["benchmark", "model", "context", "label", "budget"]
    dups = []
    for k, g in df.groupby(key, dropna=False, sort=True):
        if len(g) > 1:
            b = "no budget" if pd.isna(k[4]) else f"b={k[4]}"
            dups.append(f"  ({k[0]}, {k[1]}, context {k[2]}, {k[3]}, {b}): " + ", ".join(g["path"]))
    if dups:
        raise DuplicateRunError("duplicate runs (the same benchmark, model, method, budget and config); keep one "
                                "file of each, or pass only one of the directories:\n" + "\n".join(dups))


def _option_text(key: str, v) -> str:
    if key == "num_samples" and isinstance(v, dict) and v:
        counts = set(v.values())
        return f"n/task={counts.pop()}" if len(counts) == 1 else f"n={sum(x for x in v.values() if x)}"
    return f"{key}={_short(v)}"


def _short(v) -> str:
    if isinstance(v, (list, tuple)):
        return ",".join(map(str, v))
    if isinstance(v, dict):
        s = json.dumps(v, sort_keys=True, separators=(",", ":"))
        return s if len(s) <= 40 else s[:37] + "..."
    return str(v)


def assign_labels(df: pd.DataFrame) -> pd.DataFrame:
    """label = display name of the method + the options that differ between its runs in one table (an option
    differs when two runs record different values; a field that only some runs record does not tell them apart)."""
    df = df.copy()
    df["label"] = [display_name(m) for m in df["method"]]
    for _, g in df.groupby(["benchmark", "model", "context", "method"], sort=False):
        fps = [json.loads(c) for c in g["config"]]
        keys = sorted(set().union(*fps))
        varying = [k for k in keys if len({_canon(fp[k]) for fp in fps if fp.get(k) is not None}) > 1]
        if not varying:
            continue
        for idx, fp in zip(g.index, fps):
            df.at[idx, "label"] = (display_name(df.at[idx, "method"]) + " ("
                                   + ", ".join(_option_text(k, fp.get(k)) for k in varying) + ")")
    return df


def method_rank(method: str) -> int:
    """Where a method's rows go in tables and legends: its selector's `report_order` (unknown names last)."""
    return report_order(method)


def ordered_labels(df: pd.DataFrame) -> list[str]:
    pairs = {(method_rank(m), lab) for m, lab in zip(df["method"], df["label"])}
    return [lab for _, lab in sorted(pairs)]


def task_columns(df: pd.DataFrame) -> list[str]:
    """Task names present in df (columns task:<name> with a value), in first-seen order."""
    return [c[5:] for c in df.columns if c.startswith("task:") and df[c].notna().any()]


def budgets_of(df: pd.DataFrame) -> list[int]:
    return sorted(int(b) for b in df["budget"].dropna().unique())


def groups(df: pd.DataFrame):
    """(benchmark, model) -> DataFrame, sorted."""
    return [((b, m), g) for (b, m), g in df.groupby(["benchmark", "model"], sort=True)]


def units(df: pd.DataFrame):
    """Table units of one (benchmark, model) group: context setting -> DataFrame, by context length."""
    out = [(c, g) for c, g in df.groupby("context", sort=False)]
    return sorted(out, key=lambda cg: (cg[1]["context_length"].fillna(-1).max(), cg[0]))


def paths_text(paths) -> str:
    paths = [str(p) for p in paths]
    return ", ".join(paths) if len(paths) <= 3 else ", ".join(paths[:3]) + f" and {len(paths) - 3} more"
