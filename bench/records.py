"""JSON-lines records of the GPU benchmarks: every measurement printed as it is taken and appended to one file
(flushed, fsynced), strict JSON (non-finite floats as strings)."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch


def out_path(out: str | None, dry_run: bool, committed: str) -> str:
    """--out, or where a run writes without one: the committed GPU results file (`committed`), and for a --dry-run
    (CPU records, meaningless timings) a scratch file outside the repository, never the committed one."""
    if out is not None:
        return out
    if dry_run:
        import tempfile

        return str(Path(tempfile.gettempdir()) / "locks-bench-dry-run" / Path(committed).name)
    return committed


class Recorder:
    def __init__(self, path: str):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.failures: list[str] = []

    def write(self, rec: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(_finite(rec), default=_jsonable) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def emit(self, rec: dict) -> None:
        self.write(rec)
        print(_fmt(rec), flush=True)


def _finite(x):
    """Strict JSON: non-finite floats become the strings "inf", "-inf", "nan"."""
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x


def _jsonable(x):
    if isinstance(x, torch.Tensor):
        return _finite(x.tolist())
    return str(x)


def _fmt(rec: dict) -> str:
    where = f"[{rec.get('shape', '-')} B={rec.get('batch', '-')} L={rec.get('context', '-')}]"
    head = f"{where} {rec.get('method', ''):<22}"
    kind = rec["kind"]
    if kind == "measurement":
        s = f"{head} {rec['ms']:9.4f} ms ({rec['timing']})"
        if rec.get("ms_eager") is not None:
            s += f"  eager {rec['ms_eager']:.4f} ms"
        if rec.get("bytes"):
            s += f"  {rec['bytes'] / 1e6:9.2f} MB  {rec['gbps']:8.1f} GB/s"
        if rec.get("speedup_vs_fastest_fullkv") is not None:
            s += f"  x{rec['speedup_vs_fastest_fullkv']:.2f} vs {rec['fastest_fullkv']}"
        if rec.get("share_of_locks_fused") is not None:
            s += f"  ({100 * rec['share_of_locks_fused']:.1f} % of locks_fused)"
        return s
    if kind == "check":
        verdict = "ok" if rec["ok"] else "FAILED"
        return f"{head} check: max_rel_err {rec['max_rel_err']:.2e} {rec.get('details', '')} {verdict}"
    if kind == "skip":
        return f"{head} skipped: {rec['reason']}"
    if kind == "tune":
        return f"{head} tune {rec['config']}: {rec['ms']:.4f} ms"
    return json.dumps(rec, default=_jsonable)
