"""A group of runs that differ only in the method and its budget, run in one process (docs/architecture.md):
one model load, one sample generation, and one dense prefill per sample for all of them.

Every method prefills densely, so a sample's prompt K/V, the queries its selectors read and its first token are the
same for every method and budget. `run_group` captures them once per sample (locks/core/prefill.py) and replays
them into each run's cache before it decodes. Each run writes its own run directory, predictions.jsonl and
metrics.json as a separate `run_benchmark` would, token for token, and resumes the same way: a run that is complete
is skipped, and one that was killed carries on from its last line. A sample is prefilled only if some run still
needs it. Each run keeps its own random-number state, as it would in a process of its own.
"""
from __future__ import annotations

import functools
import json
import random
import time

import numpy as np
import torch
from tqdm import tqdm

from eval import events
from eval.memory_plan import run_plan
from eval.benchmarks import build_benchmark
from eval.results import append_prediction, run_dir_name, sample_id
from eval.runner import (
    batch_size,
    batches,
    check_context,
    finish_job,
    in_order,
    load_checked,
    locked,
    pending,
    prepare_job,
    prompt_ids,
    run_samples,
    seed_everything,
    start_job,
)
from eval.tracking import build_logger
from locks.core.prefill import capture_prefill, query_positions_needed
from locks.core.selector import LayerInfo
from locks.errors import ConfigError

VARYING = ("method", "budget")  # what may differ inside a group


def group_key(config: dict) -> str:
    """Everything but the method and its budget (the model, benchmark, seed, paths, ...): jobs with one key share a
    process, a model and their prefills."""
    return json.dumps({k: v for k, v in config.items() if k not in VARYING and k != "hydra"}, sort_keys=True,
                      default=str)


def group_jobs(configs: list[dict]) -> list[list[int]]:
    """Indices of `configs` grouped by `group_key`, groups and members in first-seen order."""
    groups: dict[str, list[int]] = {}
    for i, c in enumerate(configs):
        groups.setdefault(group_key(c), []).append(i)
    return list(groups.values())


class _RandomState:
    """A run's own random-number streams (python, numpy, torch), swapped in while it runs a sample."""

    def __init__(self):
        self.state = (random.getstate(), np.random.get_state(), torch.get_rng_state(),
                      torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)

    def restore(self) -> None:
        py, npy, cpu, cuda = self.state
        random.setstate(py)
        np.random.set_state(npy)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)

    def save(self) -> None:
        self.__init__()


def run_group(configs: list[dict], cfgs: list, progress: bool = True) -> list[dict]:
    """Run the jobs `configs` (resolved configs as dicts; `cfgs` the same as OmegaConf objects), which must differ
    only in method / budget, sharing the model and each sample's prefill. Returns each job's metrics."""
    if len({group_key(c) for c in configs}) != 1:
        raise ConfigError("a group's runs may differ only in method and budget; got runs that differ in "
                          + ", ".join(sorted({k for c in configs for k in c if c.get(k) != configs[0].get(k)}
                                             - set(VARYING))))
    jobs = [prepare_job(c, cfg) for c, cfg in zip(configs, cfgs)]
    unique = list({j.out_dir: j for j in jobs}.values())  # FullKV at several budgets: one run
    cfg = cfgs[0]
    benchmark = build_benchmark(cfg.benchmark)
    results: dict = {}
    with locked(unique):
        todo_jobs = []
        for job in unique:
            stored = start_job(job)
            if stored is None:
                todo_jobs.append(job)
            else:
                results[job.out_dir] = stored
        if todo_jobs:
            results.update(_run(todo_jobs, cfg, benchmark, progress))
    return [results[j.out_dir] for j in jobs]


def _run(jobs, cfg, benchmark, progress: bool) -> dict:
    config = jobs[0].config
    seed = int(config["seed"])
    for job in jobs:
        events.record("job_start", job=job.label, group=len(jobs))
    seed_everything(seed)  # what each separate run does first, then the model and the samples
    plan = functools.cache(lambda: run_plan(config, cfg.model, [job.method for job in jobs], group=len(jobs)))
    loaded = load_checked(cfg.model, benchmark, plan, [job.method for job in jobs])
    for job in jobs:  # what the plan was checked with (auto: resolved)
        job.config["prefill_chunk_size"] = plan().chunk
    check_context(config["benchmark"], loaded)
    with events.timed("samples"):
        samples = benchmark.samples(loaded.tokenizer, seed)
    state = {job.out_dir: _RandomState() for job in jobs}  # every run starts from the state after the samples
    done, todo = {}, {}
    for job in jobs:
        done[job.out_dir], rest = pending(job, samples)
        todo[job.out_dir] = {sample_id(s) for s in rest}
    cfg_model = loaded.model.config
    layers = cfg_model.num_hidden_layers  # every layer's selector: a method's dense layers read no query
    infos = [LayerInfo(i, cfg_model.num_attention_heads, cfg_model.num_key_value_heads,
                       getattr(cfg_model, "head_dim", None) or cfg_model.hidden_size // cfg_model.num_attention_heads,
                       1.0, num_layers=layers) for i in range(layers)]
    positions = query_positions_needed([job.method.build(info) for job in jobs for info in infos])
    files = {job.out_dir: open(job.out_dir / "predictions.jsonl", "a") for job in jobs}
    size = batch_size(config)
    peak = 0
    try:
        needed = [s for s in samples if any(sample_id(s) in todo[j.out_dir] for j in jobs)]
        bar = tqdm(total=len(needed), desc=f"group of {len(jobs)} runs", unit="sample", disable=not progress)
        for batch in batches(needed, size):
            captures, prefill_seconds = [], []
            for sample in batch:
                ids = prompt_ids(loaded, sample)
                start = time.perf_counter()
                with events.timed("prefill", tokens=int(ids.shape[1]), shared_by=len(jobs)):
                    captures.append(capture_prefill(loaded.model, ids, int(sample["max_new_tokens"]), positions,
                                                    config.get("prefill_chunk_size")))
                prefill_seconds.append(time.perf_counter() - start)
            for job in jobs:
                mine = [i for i, s in enumerate(batch) if sample_id(s) in todo[job.out_dir]]
                if not mine:
                    continue
                rng = state[job.out_dir]
                rng.restore()

                def write(row: dict, job=job) -> None:
                    append_prediction(files[job.out_dir], row)
                    done[job.out_dir].append(row)

                run_samples(loaded, job.method, [batch[i] for i in mine], benchmark, job.config, write,
                            captures=[captures[i] for i in mine], prefill_seconds=[prefill_seconds[i] for i in mine])
                rng.save()
            # the captures and their memos, after every run of the batch
            peak = max(peak, sum(capture.nbytes for capture in captures))
            bar.update(len(batch))
            del captures
        bar.close()
        for f in files.values():
            f.close()
        events.record("group_done", runs=len(jobs), prefills=len(needed), capture_peak_bytes=peak)
        print(f"group: {len(jobs)} runs, {len(needed)} prefills (one per sample), peak prefill capture "
              f"{peak / 2**20:.1f} MiB")
        results = {}
        for job in jobs:  # one W&B run at a time
            logger = build_logger(cfg.logger, job.config, job.key, job.out_dir, run_dir_name(job.config))
            try:
                results[job.out_dir] = finish_job(job, loaded, benchmark, in_order(done[job.out_dir], samples),
                                                  logger)
            finally:
                logger.finish()
        return results
    finally:
        for f in files.values():
            f.close()
