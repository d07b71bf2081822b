"""One benchmark run: model + method + benchmark -> predictions.jsonl, metrics.json, a printed score table."""
from __future__ import annotations

import contextlib
import fcntl
import functools
import importlib.metadata
import json
import platform
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml
from tqdm import tqdm

from eval import events
from eval.benchmarks import build_benchmark
from eval.memory_plan import check_plan, run_plan
from eval.results import (
    append_prediction,
    efficiency_summary,
    read_predictions,
    run_dir_name,
    run_key,
    sample_id,
    sample_scores,
    suite_ci,
    score_table,
    write_json_atomic,
)
from eval.tracking import build_logger
from locks.core.cache import SelectorCache, prefill_backend
from locks.core.chunked_prefill import check_chunk_size
from locks.core.generation import Row, generate_rows
from locks.core.prefill import replay_prefill
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


@dataclass
class Job:
    """One (method, budget) run: its resolved config, method, run key and run directory."""

    config: dict
    cfg: object  # the same config as an OmegaConf object (group access: model, benchmark, logger)
    method: MethodSpec
    key: str
    out_dir: Path

    @property
    def label(self) -> str:
        return f"{self.config['method']['name']} b={self.config['method']['budget']}"


def check_method(config: dict) -> MethodSpec:
    """The job's method, its selector built once on a small layer so that its parameters are checked (ConfigError)
    before any expensive work; every layer takes the same arguments. The selector itself, not `method.build`, which
    gives a layer the method keeps dense (MagicPIG's layer 0) the core's dense attention and so checks nothing."""
    method = method_spec(config["method"])
    method.selector_class()(LayerInfo(0, 1, 1, 64, 0.125), budget=method.budget, **method.options)
    return method


def rejected(config: dict) -> str | None:
    """Why the job's method rejects its parameters (e.g. LRQK at a budget <= its lite_tokens), or None: what a sweep
    that skips invalid cells (hydra.launcher.skip_invalid, scripts/bench_sweep.py) leaves out."""
    try:
        check_method(config)
    except ConfigError as err:
        return str(err)
    return None


def prepare_job(config: dict, cfg) -> Job:
    """Validate the method's parameters before any expensive work (every layer takes the same arguments) and fix
    the run key and directory. FullKV's budget changes nothing, so it is left out of the key: one run serves a
    whole sweep."""
    method = check_method(config)
    batch_size(config)
    check_chunk_size(config.get("prefill_chunk_size"), auto=True)
    if not method.selector_class().uses_budget:
        method_cfg = {k: v for k, v in config["method"].items() if k != "budget_mode"}
        config = {**config, "budget": None, "method": {**method_cfg, "budget": None}}
    out_dir = Path(config["paths"]["runs_dir"]) / run_dir_name(config)
    out_dir.mkdir(parents=True, exist_ok=True)
    return Job(config, cfg, method, run_key(config), out_dir)


@contextlib.contextmanager
def locked(jobs: list[Job]):
    """One process at a time per run directory: FullKV's budgets share one key, and a requeued job may overlap its
    predecessor; a second one waits here, then finds the results complete and skips. Several directories are
    locked in one order (no deadlock between overlapping groups)."""
    with contextlib.ExitStack() as stack:
        for out_dir in sorted({j.out_dir for j in jobs}):
            f = stack.enter_context(open(out_dir / ".lock", "w"))
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def run_benchmark(config: dict, cfg) -> dict:
    """config: the resolved config as a plain dict; cfg: the same as an OmegaConf object (for group access)."""
    job = prepare_job(config, cfg)
    benchmark = build_benchmark(cfg.benchmark)
    if config.get("plan"):  # +plan=true: the memory plan as a table, nothing run
        check_files(cfg.model, benchmark)
        print(run_plan(job.config, cfg.model, [job.method]).table())
        return {}
    with locked([job]):
        stored = start_job(job)
        if stored is not None:
            return stored
        events.record("job_start", job=job.label)
        seed_everything(int(job.config["seed"]))
        plan = functools.cache(lambda: run_plan(job.config, cfg.model, [job.method]))
        loaded = load_checked(cfg.model, benchmark, plan, [job.method])
        job.config["prefill_chunk_size"] = plan().chunk  # what the plan was checked with (auto: resolved)
        check_context(job.config["benchmark"], loaded)
        with events.timed("samples"):
            samples = benchmark.samples(loaded.tokenizer, int(job.config["seed"]))
        done, todo = pending(job, samples)
        logger = build_logger(cfg.logger, job.config, job.key, job.out_dir, run_dir_name(job.config))
        size = batch_size(job.config)
        try:
            with open(job.out_dir / "predictions.jsonl", "a") as f, \
                    tqdm(total=len(todo), desc=job.label, unit="sample") as bar:
                def write(row: dict) -> None:
                    append_prediction(f, row)
                    done.append(row)
                    bar.update()

                for batch in batches(todo, size):
                    run_samples(loaded, job.method, batch, benchmark, job.config, write)
            return finish_job(job, loaded, benchmark, in_order(done, samples), logger)
        finally:
            logger.finish()


def batch_size(config: dict) -> int:
    """config["batch_size"]: samples decoded together (docs/batching.md), a positive integer."""
    size = config.get("batch_size", 1)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"batch_size must be a positive number of samples decoded together (got {size!r}); "
                          f"1 decodes one sample at a time")
    return size


def batches(samples: list, size: int) -> list[list]:
    """Consecutive groups of `size` samples, in the benchmark's order (the last one may be shorter)."""
    return [samples[i : i + size] for i in range(0, len(samples), size)]


def in_order(rows: list[dict], samples: list[dict]) -> list[dict]:
    """The rows in the benchmark's sample order (a batch writes each row when its sample finishes), so that a
    run's metrics do not depend on its batch size."""
    order = {sample_id(s): i for i, s in enumerate(samples)}
    return sorted(rows, key=lambda r: order.get(sample_id(r), len(order)))


def start_job(job: Job) -> dict | None:
    """Write the run's config.yaml; for a finished run (resubmitted or requeued sweep) (re)log and print its stored
    results and return them: nothing to do, no model load."""
    with open(job.out_dir / "config.yaml", "w") as f:
        yaml.safe_dump(job.config, f, sort_keys=False)
    stored = finished_metrics(job.out_dir / "predictions.jsonl", job.out_dir / "metrics.json")
    if stored is None:
        return None
    n = sum(stored["num_samples"].values())
    print(f"run directory: {job.out_dir}  ({n} samples done, 0 to go)")
    print(f"skipped: results exist in {job.out_dir}")
    logger = build_logger(job.cfg.logger, job.config, job.key, job.out_dir, run_dir_name(job.config))
    try:  # (re)log the stored results, so a sweep's W&B group is complete even when jobs were skipped
        logger.log_summary(stored)
        logger.log_results_dir()
    finally:
        logger.finish()
    print(score_table(stored))
    return stored


def pending(job: Job, samples: list[dict]) -> tuple[list[dict], list[dict]]:
    """(the rows already in predictions.jsonl, the samples still to run), in the benchmark's order."""
    done = read_predictions(job.out_dir / "predictions.jsonl")
    finished = {sample_id(r) for r in done}
    todo = [s for s in samples if sample_id(s) not in finished]
    print(f"run directory: {job.out_dir}  ({len(done)} samples done, {len(todo)} to go)")
    return done, todo


def decode_modes(rows: list[dict]) -> str:
    """How the rows were decoded, for a record of all of them: their decode modes, sorted and joined."""
    return ",".join(sorted({str(r.get("decode_mode", "eager")) for r in rows}))


def finish_job(job: Job, loaded, benchmark, done: list[dict], logger) -> dict:
    """Aggregate the rows into metrics.json (written atomically, last), log it and print the score table."""
    config = job.config
    metrics = benchmark.aggregate(done)
    metrics.update(efficiency_summary(done))
    metrics["samples"] = sample_scores(done)
    metrics["average_ci95"] = suite_ci(metrics["samples"])
    metrics.update(
        run_key=job.key, method=config["method"], model=loaded.name, device=str(loaded.device),
        dtype=str(loaded.dtype).replace("torch.", ""), seed=int(config["seed"]),
        budget=config["method"]["budget"], budget_mode=config["method"].get("budget_mode"),
        benchmark=benchmark.run_record(loaded.tokenizer),
        attn_backend=resolve_backend(job.method.backend, loaded.device),
        decode_mode=decode_modes(done),
        decode_instrumented=any(bool(r.get("decode_instrumented")) for r in done),
        batch_size=batch_size(config),
        prefill_backend=prefill_backend(loaded.device, loaded.dtype),
        model_license=model_license(config["model"]),
        versions={p: importlib.metadata.version(p) for p in ("torch", "transformers", "wonderwords")},
        python=platform.python_version(),
    )
    metrics_path = job.out_dir / "metrics.json"
    write_json_atomic(metrics_path, metrics)
    logger.log_samples(done)
    logger.log_summary(metrics)
    logger.log_results_dir()
    print(score_table(metrics))
    print(f"results: {metrics_path}")
    events.record("job_done", job=job.label, samples=len(done))
    return metrics


def model_license(model_cfg: dict) -> str | None:
    """The license terms of an embedded model's weights (locks/core/embedded_model.py), None for the others."""
    from locks.core.embedded_model import LICENSES

    if model_cfg.get("source") != "gguf_package":
        return None
    return LICENSES.get(model_cfg.get("gguf", "smollm2_135m"))


def check_files(model_cfg, benchmark) -> None:
    """What the run reads from disk, each error naming the key to fix: the benchmark's data files, then the
    checkpoint folder."""
    from locks.core.models import check_model_files

    benchmark.check_inputs()
    check_model_files(model_cfg)


def check_methods_fit(methods: list[MethodSpec], model_cfg) -> None:
    """Before the model loads: each method's options against the model's config.json (e.g. a calibration file made
    for another model), read only when some method checks it."""
    from locks.core.selector import Selector

    checking = [m for m in methods if m.selector_class().check_model_config.__func__
                is not Selector.check_model_config.__func__]
    if checking:
        from eval.memory_plan import model_config

        config = model_config(model_cfg)
        for method in checking:
            method.check_model_config(config)


def load_checked(model_cfg, benchmark, plan=None, methods: list[MethodSpec] = ()):
    """The model, once per process (a group of jobs shares it; timed in the event log), after everything the run
    needs from disk has been checked (`check_files`, then the methods against the model's config), then its memory
    plan (`plan()`, eval/memory_plan.py), then the tokenizer alone and what the benchmark needs of it (a chat
    template)."""
    from locks.core.models import load_model, load_tokenizer

    check_files(model_cfg, benchmark)
    check_methods_fit(list(methods), model_cfg)
    if plan is not None:
        check_plan(plan())
    with events.timed("tokenizer_load"):
        tokenizer = load_tokenizer(model_cfg)
    benchmark.check_tokenizer(tokenizer)
    with events.timed("model_load"):
        return load_model(model_cfg, tokenizer)


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


def prompt_ids(loaded, sample: dict) -> torch.Tensor:
    if sample.get("input_ids") is not None:
        return torch.tensor([sample["input_ids"]], dtype=torch.long, device=loaded.device)
    return loaded.tokenizer(sample["input"], add_special_tokens=False, return_tensors="pt").input_ids.to(loaded.device)


def new_cache(loaded, method: MethodSpec, config: dict) -> SelectorCache:
    return SelectorCache(loaded.model, method, kv_element_bytes=int(config["kv_element_bytes"]),
                         measure_coverage=bool(config["measure_coverage"]))


def stop_token_ids(loaded, sample: dict) -> list[int]:
    """The model's EOS tokens and the sample's own stop tokens."""
    return list(loaded.eos_token_ids) + [t for t in sample.get("stop_token_ids", []) if t not in loaded.eos_token_ids]


def sample_row(loaded, method: MethodSpec, sample: dict, config: dict, capture=None) -> tuple[Row, float]:
    """A sample ready to decode: its own cache, prompt and stopping rule, with the prompt replayed from `capture`
    (a group's PrefillCapture; without one, the model prefills it when it decodes) -> (row, replay seconds)."""
    ids = prompt_ids(loaded, sample)
    cache = new_cache(loaded, method, config)
    start = time.perf_counter()
    logits = None
    if capture is not None:
        logits = replay_prefill(cache, capture)
    else:
        events.record("prefill", tokens=int(ids.shape[1]))
    row = Row(cache, ids, int(sample["max_new_tokens"]), stop_token_ids(loaded, sample),
              int(sample.get("min_new_tokens", 0)), logits)
    return row, time.perf_counter() - start


def run_samples(loaded, method: MethodSpec, samples: list[dict], benchmark, config: dict, on_record,
                captures: list | None = None, prefill_seconds: list[float] | None = None) -> list[Row]:
    """The one sample driver: one batch of a run's samples (one sample at batch_size 1, docs/batching.md), each
    prefilled (or replayed from its capture, a group's PrefillCapture) on its own cache, then decoded together by
    `generate_rows`, whose rows stop on their own. `on_record(row)` receives each sample's predictions.jsonl row as
    soon as that sample has finished, with `seconds` counting its prefill (a group's shared one: `prefill_seconds`,
    plus its replay) and its share of the batched steps. Returns the decoded rows (their caches, for a benchmark's
    memory account)."""
    captures = captures or [None] * len(samples)
    prefill_seconds = prefill_seconds or [0.0] * len(samples)
    rows, replayed = [], []
    for sample, capture in zip(samples, captures):
        row, seconds = sample_row(loaded, method, sample, config, capture)
        rows.append(row)
        replayed.append(seconds)
    index = {id(row): i for i, row in enumerate(rows)}

    def finished(row: Row) -> None:
        i = index[id(row)]
        cache = row.cache
        own = replayed[i] + cache.prefill_seconds + row.decode_seconds
        events.record("run_sample", seconds=round(own, 4), method=method.name, shared_prefill=captures[i] is not None,
                      batch=len(rows))
        on_record(sample_record(loaded, samples[i], benchmark, row.input_ids, row.tokens, cache,
                                own + prefill_seconds[i], prefill_seconds[i] + replayed[i] + cache.prefill_seconds))

    return generate_rows(loaded.model, rows, static_decode=config.get("static_decode", False), on_finish=finished,
                         prefill_chunk_size=config.get("prefill_chunk_size"))


def sample_record(loaded, sample: dict, benchmark, ids, tokens: list[int], cache: SelectorCache, seconds: float,
                  prefill_seconds: float) -> dict:
    """A finished sample's predictions.jsonl row: prediction and score, its cache's accounting and its timings."""
    prediction = loaded.tokenizer.decode(tokens, skip_special_tokens=True)
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
        "generated_tokens": len(tokens),
        "seconds": round(seconds, 3),
        # the prefill (a group's shared one plus this run's replay, or the run's own) and the decode, apart
        "prefill_seconds": round(prefill_seconds, 3),
        "decode_seconds": round(cache.decode_seconds, 3),
        "capture_seconds": round(cache.capture_seconds, 3),  # a CUDA graph's capture (static decode on CUDA)
        # eager steps: coverage, diagnostics and accounting, timed apart; whether decode_seconds still includes any
        "instrumentation_seconds": round(cache.instrumentation_seconds, 3),
        "decode_instrumented": cache.decode_instrumented,
        "decode_mode": cache.decode_mode,
        **stats,
        "method_metrics": cache.extra_metrics(),
    }
