"""InfiniteBench loader (docs/benchmarks/infinitebench.md).

Two sources, same schema:
* local ``<data_dir>/<task>.jsonl`` (the raw files of the HF dataset repo), read with
  ``datasets.load_dataset("json", data_files=..., features=FEATURES)`` -- the production path, so schema drift
  breaks; raw copies whose answers do not cast to ``Sequence(string)`` (bare strings/ints, nested math_calc
  lists) are read line by line instead, and the label is normalized later by ``scoring.normalize_label``;
* the HF hub dataset ``xinrongzhang2022/InfiniteBench``, one split per task, with the explicit features the
  maintainers prescribe (plain ``load_dataset`` fails with a cast error, issue #19).

When neither source works a single FileNotFoundError says which file is missing and how to provide it.
"""
from __future__ import annotations

import json
from pathlib import Path

HF_DATASET_ID = "xinrongzhang2022/InfiniteBench"
RAW_URL = "https://huggingface.co/datasets/xinrongzhang2022/InfiniteBench/resolve/main/{task}.jsonl"


def features():
    """The explicit features of spec §2 (a datasets.Features object, not a raw dict -- lm-eval-harness#3895)."""
    from datasets import Features, Sequence, Value

    return Features({
        "id": Value("int64"),
        "context": Value("string"),
        "input": Value("string"),
        "answer": Sequence(Value("string")),
        "options": Sequence(Value("string")),
    })


def _record(row: dict) -> dict:
    return {"id": int(row.get("id", 0)), "context": row.get("context", ""), "input": row.get("input", "") or "",
            "answer": row.get("answer"), "options": list(row.get("options") or [])}


def _read_jsonl_raw(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [_record(json.loads(line)) for line in f if line.strip()]


def load_local(path: Path) -> list[dict]:
    from datasets import load_dataset

    try:
        ds = load_dataset("json", data_files=str(path), features=features(), split="train")
    except Exception:  # noqa: BLE001 -- raw-typed copies (int / bare / nested answers) fail the cast
        return _read_jsonl_raw(path)
    return [_record(r) for r in ds]


def load_hub(task: str) -> list[dict]:
    from datasets import load_dataset

    ds = load_dataset(HF_DATASET_ID, features=features(), split=task)
    return [_record(r) for r in ds]


def load_task(task: str, data_dir: str | None = None) -> list[dict]:
    """All records of one task, in dataset order."""
    errors = []
    if data_dir:
        path = Path(data_dir).expanduser() / f"{task}.jsonl"
        if path.is_file():
            return load_local(path)
        errors.append(f"{path} does not exist")
    try:
        return load_hub(task)
    except Exception as e:  # noqa: BLE001 -- offline, no cache, or the hub is unreachable
        errors.append(f"HF dataset {HF_DATASET_ID!r} split {task!r} could not be loaded "
                      f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
    missing = (Path(data_dir).expanduser() / f"{task}.jsonl") if data_dir else Path(f"<data_dir>/{task}.jsonl")
    key = f"benchmark.data_dir={data_dir}" if data_dir else "benchmark.data_dir is not set"
    raise FileNotFoundError(
        f"{key}: InfiniteBench data for task {task!r} not found: missing file {missing}. "
        f"Download {RAW_URL.format(task=task)} into a folder and set benchmark.data_dir to it "
        f"(or make the HF dataset {HF_DATASET_ID} available in the datasets cache). Details: {'; '.join(errors)}")
