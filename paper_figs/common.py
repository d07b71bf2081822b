"""Shared by the paper_figs scripts: argument parsing, input lookup and the "missing results" line. All loading,
tables and plotting come from eval/report/. Scripts read only result files under --results (default results/)."""
from __future__ import annotations

import argparse
from pathlib import Path

from eval import report
from locks.core.registry import discover, report_order

ROOT = Path(__file__).resolve().parents[1]

LONGBENCH_BUDGETS = [64, 128, 256, 512, 1024, 2048]
INFINITEBENCH_BUDGETS = [512, 2048]
ALL_METHODS = ",".join(sorted(discover(), key=report_order))  # every registered method, in table order
BENCH_DECODE_CMD = ("python run.py +experiment=paper_latency   # on a GPU: scripts/bench_decode.py at 128K/256K/1M, "
                    "llama and glm shapes, batch 1 and 4, into results/gpu/decode.jsonl")

BENCH_E2E_CMD = ("python run.py +experiment=paper_latency   # on a GPU: then scripts/bench_e2e.py, the CUDA-graph "
                 "decode step of random GLM-4-9B / Llama-3.1-8B models, into results/gpu/e2e.jsonl")


def parse_args(doc: str, argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=ROOT / "results", help="the results directory (default results/)")
    ap.add_argument("--out", type=Path, default=ROOT / "paper_figs" / "out", help="default paper_figs/out/")
    return ap.parse_args(argv)


def missing(name: str, what: str, command: str) -> int:
    """The one line a script prints when its results are not committed yet; it then exits 0 (no numbers invented)."""
    print(f"{name}: skipped, missing {what}; produce it with: {command}")
    return 0


def runs_in(directory: Path):
    """The runs (report.load_runs) under a directory, or None when it does not exist or holds no metrics files."""
    if not directory.is_dir():
        return None
    files, _ = report.find_result_files([directory])
    try:
        return report.load_runs([directory], progress=False, files=files)
    except report.DuplicateRunError:
        raise
    except report.ReportError:
        return None


def latency_in(directory: Path):
    """bench_decode.py measurement records under a directory (GPU only), or None when there are none."""
    if not directory.is_dir():
        return None
    files = sorted(directory.rglob("*.jsonl"))
    lat = report.load_latency(files, progress=False) if files else None
    return lat if lat is not None and len(lat) else None


def e2e_in(directory: Path):
    """bench_e2e.py records under a directory (GPU only), or None when there are none."""
    if not directory.is_dir():
        return None
    files = sorted(directory.rglob("*.jsonl"))
    df = report.load_e2e(files) if files else None
    return df if df is not None and len(df) else None


def rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def ruler_tables(name: str, directory: str, command: str, argv=None, doc: str = "") -> int:
    """The RULER tables and figures (eval/report's unit set) of the runs in results/<directory>/*.json, named
    paper_figs/out/<name>_*; the one missing-results line when they are not committed."""
    args = parse_args(doc or __doc__, argv)
    src = args.results / directory
    df = runs_in(src)
    if df is None:
        return missing(name, f"{rel(src)}/*.json", command)
    df = df[df["benchmark"] == "ruler"]
    if not len(df):
        return missing(name, f"RULER runs in {rel(src)}", command)
    written = []
    for (bench, model), group in report.groups(df):
        for context, unit in report.units(group):
            prefix = name + ("_" + model if df["model"].nunique() > 1 else "") + (
                "_" + context if group["context"].nunique() > 1 else "") + "_"
            written += report.write_unit(unit, args.out, f"RULER {context} tokens, {model}", prefix=prefix)
    print(f"{name}: {len(df)} runs from {rel(src)} -> {len(written)} files in {rel(args.out)}")
    return 0
