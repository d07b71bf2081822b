"""One benchmark run: model + method + benchmark -> predictions.jsonl, metrics.json, a printed score table."""
from __future__ import annotations

import fcntl
import importlib.metadata
import json
import platform
import random
import time
from pathlib import Path

import numpy as np
import torch
import yaml
from tqdm import tqdm

from eval.benchmarks import build_benchmark
from eval.results import (
    append_prediction,
    efficiency_summary,
    read_predictions,
    run_dir_name,
    run_key,
    sample_id,
    score_table,
    write_json_atomic,
)
from eval.tracking import build_logger
from locks.core.cache import SelectorCache, prefill_backend
from locks.core.generation import generate
from locks.core.registry import MethodSpec
from locks.core.selector import LayerInfo, resolve_backend
from locks.errors import ConfigError


def method_spec(method_cfg: dict) -> MethodSpec:
    options = {k: v for k, v in method_cfg.items() if k not in ("name", "budget", "backend")}
    return MethodSpec(name=method_cfg["name"], budget=method_cfg["budget"], options=options,
                      backend=method_cfg.get("backend", "auto"))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def run_benchmark(config: dict, cfg) -> dict:
    """config: the resolved config as a plain dict; cfg: the same as an OmegaConf object (for group access)."""
    method = method_spec(config["method"])
    # Validate the method's parameters before any expensive work (every layer takes the same arguments).
    method.build(LayerInfo(0, 1, 1, 64, 0.125))
    if not method.selector_class().uses_budget:
        # FullKV: the budget changes nothing, so it is left out of the run key and one run serves a whole sweep
        method_cfg = {k: v for k, v in config["method"].items() if k != "budget_mode"}
        config = {**config, "budget": None, "method": {**method_cfg, "budget": None}}
    benchmark = build_benchmark(cfg.benchmark)
    key = run_key(config)
    out_dir = Path(config["paths"]["runs_dir"]) / run_dir_name(config)
    out_dir.mkdir(parents=True, exist_ok=True)
    # One job at a time per run directory: FullKV's budgets share one key, and a requeued job may overlap its
    # predecessor; the second waits here, then finds the results complete and skips.
    with open(out_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _run_in(out_dir, config, cfg, method, benchmark, key)


def _run_in(out_dir: Path, config: dict, cfg, method: MethodSpec, benchmark, key: str) -> dict:
    from locks.core.models import load_model

    with open(out_dir / "config.yaml", "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    pred_path, metrics_path = out_dir / "predictions.jsonl", out_dir / "metrics.json"
    stored = finished_metrics(pred_path, metrics_path)
    if stored is not None:  # a finished run (resubmitted or requeued sweep): nothing to do, no model load
        n = sum(stored["num_samples"].values())
        print(f"run directory: {out_dir}  ({n} samples done, 0 to go)")
        print(f"skipped: results exist in {out_dir}")
        logger = build_logger(cfg.logger, config, key, out_dir, run_dir_name(config))
        try:  # (re)log the stored results, so a sweep's W&B group is complete even when jobs were skipped
            logger.log_summary(stored)
            logger.log_results_dir()
        finally:
            logger.finish()
        print(score_table(stored))
        return stored

    seed_everything(int(config["seed"]))
    loaded = load_model(cfg.model)
    backend = resolve_backend(method.backend, loaded.device)
    check_context(config["benchmark"], loaded)
    samples = benchmark.samples(loaded.tokenizer, int(config["seed"]))
    done = read_predictions(pred_path)
    finished = {sample_id(r) for r in done}
    todo = [s for s in samples if sample_id(s) not in finished]
    print(f"run directory: {out_dir}  ({len(done)} samples done, {len(todo)} to go)")

    logger = build_logger(cfg.logger, config, key, out_dir, run_dir_name(config))
    try:
        with open(pred_path, "a") as f:
            for sample in tqdm(todo, desc=f"{config['method']['name']} b={config['method']['budget']}", unit="sample"):
                row = run_sample(loaded, method, sample, benchmark, config)
                append_prediction(f, row)
                done.append(row)
        metrics = benchmark.aggregate(done)
        metrics.update(efficiency_summary(done))
        metrics.update(
            run_key=key, method=config["method"], model=loaded.name, device=str(loaded.device),
            dtype=str(loaded.dtype).replace("torch.", ""), seed=int(config["seed"]),
            budget=config["method"]["budget"], budget_mode=config["method"].get("budget_mode"),
            benchmark=benchmark.run_record(loaded.tokenizer), attn_backend=backend,
            decode_mode=",".join(sorted({str(r.get("decode_mode", "eager")) for r in done})),
            prefill_backend=prefill_backend(loaded.device, loaded.dtype),
            versions={p: importlib.metadata.version(p) for p in ("torch", "transformers", "wonderwords")},
            python=platform.python_version(),
        )
        write_json_atomic(metrics_path, metrics)
        logger.log_samples(done)
        logger.log_summary(metrics)
        logger.log_results_dir()
    finally:
        logger.finish()
    print(score_table(metrics))
    print(f"results: {metrics_path}")
    return metrics


def finished_metrics(pred_path: Path, metrics_path: Path) -> dict | None:
    """metrics.json of a complete run (it is written only at the end, atomically) when predictions.jsonl holds as
    many samples as it counts; None otherwise (the run starts or resumes)."""
    if not metrics_path.exists():
        return None
    try:
        metrics = json.loads(metrics_path.read_text())
        expected = sum(int(n) for n in metrics["num_samples"].values())
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return metrics if len(read_predictions(pred_path)) == expected else None


def check_context(bench: dict, loaded) -> None:
    """The benchmark's prompt length (RULER context_length, possibly a list; LongBench/InfiniteBench max_length)
    must fit the model."""
    key = "context_length" if "context_length" in bench else "max_length"
    value = bench.get(key)
    longest = max(value) if isinstance(value, (list, tuple)) else value
    if longest is not None and int(longest) > loaded.max_context:
        raise ConfigError(f"benchmark.{key}={value} exceeds the maximum context of model {loaded.name} "
                          f"({loaded.max_context}); use a value <= {loaded.max_context}")


def run_sample(loaded, method: MethodSpec, sample: dict, benchmark, config: dict) -> dict:
    tok = loaded.tokenizer
    if sample.get("input_ids") is not None:
        ids = torch.tensor([sample["input_ids"]], dtype=torch.long, device=loaded.device)
    else:
        ids = tok(sample["input"], add_special_tokens=False, return_tensors="pt").input_ids.to(loaded.device)
    cache = SelectorCache(loaded.model, method, kv_element_bytes=int(config["kv_element_bytes"]),
                          measure_coverage=bool(config["measure_coverage"]))
    start = time.perf_counter()
    stop_ids = list(loaded.eos_token_ids) + [t for t in sample.get("stop_token_ids", []) if t not in loaded.eos_token_ids]
    out = generate(loaded.model, cache, ids, int(sample["max_new_tokens"]), stop_ids,
                   min_new_tokens=int(sample.get("min_new_tokens", 0)),
                   static_decode=config.get("static_decode", False))
    seconds = time.perf_counter() - start
    prediction = tok.decode(out[0], skip_special_tokens=True)
    stats = cache.stats.summary()
    return {
        "id": sample_id(sample),
        "task": sample["task"],
        "index": sample["index"],
        **{field: sample.get(field) for field in benchmark.row_fields},
        "prompt_tokens": int(ids.shape[1]),
        "prediction": prediction,
        "references": sample["outputs"],
        "score": benchmark.score(prediction, sample),
        "generated_tokens": int(out.shape[1]),
        "seconds": round(seconds, 3),
        "decode_mode": cache.decode_mode,
        **stats,
        "method_metrics": cache.extra_metrics(),
    }
