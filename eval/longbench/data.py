"""LongBench / LongBench-E loader (docs/benchmarks/longbench.md).

Sources, in this order of preference:
  * `data_dir` given: `<data_dir>/<config>.jsonl` (the raw JSONL of the official `data.zip`, i.e. `data/<config>.jsonl`),
  * otherwise the HF Hub: `datasets.load_dataset("THUDM/LongBench", config, split="test")` (Parquet configs).
`config` is the task name for LongBench and `<task>_e` for LongBench-E. Every record is checked against the schema
of spec §2 on both paths, so a schema drift fails loudly.
"""
from __future__ import annotations

import json
from pathlib import Path

HF_DATASET_ID = "THUDM/LongBench"
FIELDS = ("input", "context", "answers", "length", "dataset", "language", "all_classes", "_id")


def config_name(task: str, e: bool) -> str:
    return f"{task}_e" if e else task


def _check_record(rec: dict, where: str) -> dict:
    missing = [k for k in FIELDS if k not in rec]
    if missing:
        raise ValueError(f"{where}: record lacks field(s) {missing}; expected the LongBench schema {list(FIELDS)}")
    for key in ("input", "context", "dataset", "language", "_id"):
        if not isinstance(rec[key], str):
            raise ValueError(f"{where}: field {key!r} must be a string, got {type(rec[key]).__name__}")
    answers = rec["answers"]
    if not isinstance(answers, (list, tuple)) or not answers or not all(isinstance(a, str) for a in answers):
        raise ValueError(f"{where}: field 'answers' must be a non-empty list of strings, got {answers!r}")
    classes = rec["all_classes"]
    if classes is not None and (not isinstance(classes, (list, tuple)) or not all(isinstance(c, str) for c in classes)):
        raise ValueError(f"{where}: field 'all_classes' must be null or a list of strings, got {classes!r}")
    length = rec["length"]
    if isinstance(length, bool) or not isinstance(length, int):
        raise ValueError(f"{where}: field 'length' must be an integer, got {length!r}")
    out = {k: rec[k] for k in FIELDS}
    out["answers"] = list(answers)
    out["all_classes"] = list(classes) if classes is not None else None
    return out


def _read_jsonl(path: Path) -> list[dict]:
    records = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                records.append(_check_record(json.loads(line), f"{path}:{lineno}"))
    return records


def _load_hub(config: str) -> list[dict]:
    try:
        import datasets

        ds = datasets.load_dataset(HF_DATASET_ID, config, split="test")
    except Exception as exc:  # offline, unknown config, hub layout change: one clear message
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise FileNotFoundError(
            f"benchmark.data_dir is not set and LongBench config {config!r} could not be loaded from the HF Hub "
            f"({HF_DATASET_ID!r}, split 'test': {type(exc).__name__}: {first}); allow Hub access, or unzip the "
            f"official data.zip and pass benchmark.data_dir=<dir> so that <dir>/{config}.jsonl exists."
        ) from None
    return [_check_record(dict(r), f"{HF_DATASET_ID}/{config}[{i}]") for i, r in enumerate(ds)]


def load_task(task: str, e: bool = False, data_dir: str | None = None) -> list[dict]:
    """All test records of one LongBench (or LongBench-E, `e=True`) task, in dataset order."""
    config = config_name(task, e)
    if data_dir:
        path = Path(data_dir).expanduser() / f"{config}.jsonl"
        if not path.is_file():
            raise FileNotFoundError(
                f"benchmark.data_dir={data_dir}: LongBench data file {path} not found; put the official "
                f"data/{config}.jsonl (from LongBench's data.zip) there, or set benchmark.data_dir=null to load "
                f"{HF_DATASET_ID!r} from the HF Hub."
            )
        return _read_jsonl(path)
    return _load_hub(config)
