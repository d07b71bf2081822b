"""Batch benchmark (docs/batching.md): what decoding several samples together buys on this machine, in one run.

1. Throughput of one run per method and batch size: the default suite (the embedded model, RULER niah_single_2 at
   2K, budget 128) with --num-samples samples. Each sample is prefilled once (timed: a run pays it per sample at
   any batch size, since rows prefill one at a time), then every method decodes all of them at each batch size,
   through the runner's own sample driver (`run_samples`) at each batch size. Reported per (method, batch):
   decode seconds (replay + decode), decode samples/s, the run's samples/s with its prefills, the ratio to batch 1,
   whether every prediction equals batch 1's, and the decode state held at once (K/V and selector state of the
   rows in flight; on CUDA also torch.cuda.max_memory_allocated).
2. The default-suite sweep (every method x 64-512, scripts/bench_sweep.py's sweep): per-job (Hydra's basic
   launcher), grouped, and grouped with batch_size = --sweep-batch, in one run: wall times, ratios against
   per-job, and whether the batched sweep predicts what the per-job one does (every prediction, by sample).

    python scripts/bench_batch.py --out results/bench_batch.json
    python scripts/bench_batch.py --num-samples 4 --batches 1 2 --methods fullkv,locks --no-sweep   # a quick look
    python scripts/bench_batch.py --table results/bench_batch.json   # the markdown tables of a finished run

Both parts write the JSON file (--out) and its tables next to it (the same name with .md).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

METHODS = "fullkv,locks,quest,shadowkv,rocketkv,lrqk"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "results" / "bench_batch.json"))
    p.add_argument("--methods", default=METHODS)
    p.add_argument("--budget", type=int, default=128)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8, 16])
    p.add_argument("--num-samples", type=int, default=16, help="samples of the throughput part")
    p.add_argument("--extra", nargs="*", default=[], help="more overrides of the default run (both parts)")
    p.add_argument("--no-sweep", action="store_true", help="the throughput part only")
    p.add_argument("--sweep-samples", type=int, default=4, help="benchmark.num_samples of the sweep part")
    p.add_argument("--sweep-batch", type=int, default=4, help="batch_size of the grouped + batched sweep")
    p.add_argument("--workdir", default=None, help="where the sweeps write (default: a temporary directory)")
    p.add_argument("--table", default=None, metavar="JSON", help="print the tables of this finished run, run nothing")
    args = p.parse_args(argv)
    if any(b < 1 for b in args.batches) or 1 not in args.batches:
        p.error("--batches must be positive and include 1 (the reference of every ratio)")
    return args


def compose_config(overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    return OmegaConf.to_container(cfg, resolve=True), cfg


class AttentionWork:
    """Wall time inside the decode attention function (the selection, the attention and the accounting), by
    wrapping the registered attention function: once per row and layer in an eager batch (a loop over its rows),
    once per layer for all rows in a stacked static step."""

    def __init__(self):
        from transformers import AttentionInterface

        import locks.core.attention as attention
        from locks.core.batch import RowBatch

        self.seconds = 0.0
        original = attention.sparse_kv_attention

        def timed(module, *args, **kwargs):
            cache = kwargs.get("sparse_cache")
            if isinstance(cache, RowBatch) or cache is None or cache.phase == "prefill":
                return original(module, *args, **kwargs)
            start = time.perf_counter()
            try:
                return original(module, *args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        attention.sparse_kv_attention = timed  # what an eager batch's rows call (locks/core/batch.py: row_attention)
        AttentionInterface.register(attention.ATTENTION_NAME, timed)  # what the model calls


def throughput(args) -> list[dict]:
    from eval.benchmarks import build_benchmark
    from eval.results import sample_id
    from eval.runner import batches, decode_modes, load_checked, method_spec, prompt_ids, run_samples
    from locks.core.prefill import capture_prefill, tensor_bytes

    base = [f"benchmark.num_samples={args.num_samples}", "logger=none", f"budget={args.budget}", *args.extra]
    config, cfg = compose_config(base)
    benchmark = build_benchmark(cfg.benchmark)
    loaded = load_checked(cfg.model, benchmark)
    samples = benchmark.samples(loaded.tokenizer, int(config["seed"]))[: args.num_samples]
    captures, prefill_s = [], []
    for sample in samples:
        start = time.perf_counter()
        captures.append(capture_prefill(loaded.model, prompt_ids(loaded, sample), int(sample["max_new_tokens"]), None))
        prefill_s.append(time.perf_counter() - start)
    print(f"bench_batch: {len(samples)} prefills, {sum(prefill_s):.1f} s", flush=True)
    cuda = loaded.device.type == "cuda"
    work = AttentionWork()
    records = []
    for name in args.methods.split(","):
        job, _ = compose_config(base + [f"method={name}"])
        method = method_spec(job["method"])
        reference = None
        state: dict[str, int] = {}  # per sample: the bytes its row holds (K/V buffers and selector state)
        for size in sorted(args.batches):
            rows: list[dict] = []
            peak = 0
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            start, work.seconds = time.perf_counter(), 0.0
            for group in batches(list(range(len(samples))), size):
                decoded = run_samples(loaded, method, [samples[i] for i in group], benchmark, job, rows.append,
                                      captures=[captures[i] for i in group])
                # stacked rows (static decode) hold views of one storage per tensor: each storage counts once, and
                # each row then holds the batch's mean
                total = tensor_bytes([row.cache for row in decoded])
                held = [tensor_bytes(row.cache) for row in decoded]
                held = held if sum(held) == total else [total // len(group)] * len(group)
                peak = max(peak, total)
                state.update({sample_id(samples[i]): b for i, b in zip(group, held)})
            if cuda:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            predictions = {r["id"]: r["prediction"] for r in rows}
            if size == 1:
                reference = predictions
            record = dict(method=name, budget=args.budget, batch=size, samples=len(rows),
                          decode_s=round(seconds, 2), prefill_s=round(sum(prefill_s), 2),
                          decode_samples_per_s=round(len(rows) / seconds, 3),
                          run_samples_per_s=round(len(rows) / (seconds + sum(prefill_s)), 3),
                          identical_predictions=predictions == reference,
                          decode_mode=decode_modes(rows),
                          # the selection + attention (+ accounting), and its share of the decode time
                          attention_s=round(work.seconds, 2), attention_share=round(work.seconds / seconds, 3),
                          state_bytes=peak or None,
                          cuda_max_memory_allocated=torch.cuda.max_memory_allocated() if cuda else None)
            records.append(record)
            print(f"bench_batch: {record}", flush=True)
        one = next(r for r in records if r["method"] == name and r["batch"] == 1)
        largest = max(state.values(), default=None)
        for r in records:
            if r["method"] != name:
                continue
            r["decode_speedup"] = round(one["decode_s"] / r["decode_s"], 2)
            r["run_speedup"] = round(r["run_samples_per_s"] / one["run_samples_per_s"], 2)
            if r["batch"] == 1 and largest is not None:
                r["state_bytes"] = largest  # one row at a time: the largest sample's row
    return records


def sweeps(args) -> dict:
    import bench_sweep

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_batch-"))
    work.mkdir(parents=True, exist_ok=True)
    sweep_args = bench_sweep.parse_args(["--num-samples", str(args.sweep_samples), "--extra", *args.extra]
                                        if args.extra else ["--num-samples", str(args.sweep_samples)])
    bench_sweep.warm_model_cache(args.extra)
    cells = bench_sweep.valid_cells(sweep_args)
    grouped = ["hydra/launcher=grouped", "hydra.launcher.skip_invalid=true"]
    ways = {"per_job": bench_sweep.sweep(sweep_args, work, "per_job", [], cells),
            "grouped": bench_sweep.sweep(sweep_args, work, "grouped", grouped, [(sweep_args.methods, sweep_args.budgets)]),
            "grouped_batched": bench_sweep.sweep(sweep_args, work, "grouped_batched",
                                                 grouped + [f"batch_size={args.sweep_batch}"],
                                                 [(sweep_args.methods, sweep_args.budgets)])}

    def by_sample(runs: Path) -> dict:
        return {run: {r["id"]: r["prediction"] for r in rows} for run, rows in bench_sweep.predictions(runs).items()}

    per_job = by_sample(work / "per_job")
    wall = {name: way["wall_s"] for name, way in ways.items()}
    return dict(num_samples=args.sweep_samples, batch_size=args.sweep_batch, methods=sweep_args.methods.split(","),
                budgets=[int(b) for b in sweep_args.budgets.split(",")], wall_s=wall, ways=ways,
                speedup_grouped=round(wall["per_job"] / wall["grouped"], 2),
                speedup_grouped_batched=round(wall["per_job"] / wall["grouped_batched"], 2),
                run_directories=len(per_job),
                identical_predictions=bool(per_job) and by_sample(work / "grouped") == per_job
                and by_sample(work / "grouped_batched") == per_job)


def share(record: dict) -> float:
    """The decode time's share inside the attention function (records before 2026-12-07 named it per row)."""
    return record.get("attention_share", record.get("row_attention_share", 0))


def tables(result: dict) -> str:
    """Markdown: decode samples/s per method and batch (x batch 1), and the sweep's wall times and ratios."""
    records = result["throughput"]
    sizes = sorted({r["batch"] for r in records})
    methods = list(dict.fromkeys(r["method"] for r in records))
    cell = {(r["method"], r["batch"]): r for r in records}
    lines = ["| method | " + " | ".join(f"batch {b}" for b in sizes) + " | identical predictions | state at batch "
             f"{sizes[-1]} | decode mode at batch 1 / {sizes[-1]} | selection + attention at batch 1 / {sizes[-1]} |",
             "|---" * (len(sizes) + 5) + "|"]
    for m in methods:
        row = [cell[m, b] for b in sizes if (m, b) in cell]
        lines.append(f"| {m} | " + " | ".join(f"{r['decode_samples_per_s']:.2f} ({r['decode_speedup']:.2f}x)"
                                                for r in row)
                     + f" | {'yes' if all(r['identical_predictions'] for r in row) else 'NO'} | "
                     f"{(row[-1]['state_bytes'] or 0) / 2**20:.0f} MiB | "
                     f"{row[0].get('decode_mode', '?')} / {row[-1].get('decode_mode', '?')} | "
                     f"{share(row[0]):.0%} / {share(row[-1]):.0%} |")
    one = records[0]
    text = [f"Decode samples/s of one run ({one['samples']} samples, budget {one['budget']}; prefill "
            f"{one['prefill_s'] / one['samples']:.2f} s per sample on top, at every batch size):", "", *lines]
    if "sweep" in result:
        s = result["sweep"]
        w = s["wall_s"]
        text += ["", f"The default-suite sweep ({len(s['methods'])} methods x {len(s['budgets'])} budgets, "
                 f"{s['num_samples']} samples, {s['run_directories']} runs):", "",
                 "| way | wall | vs per-job | identical predictions |", "|---|---|---|---|",
                 f"| per-job (basic launcher) | {w['per_job']} s | 1.00x | |",
                 f"| grouped | {w['grouped']} s | {s['speedup_grouped']:.2f}x | "
                 f"{'yes' if s['identical_predictions'] else 'NO'} |",
                 f"| grouped + batch_size={s['batch_size']} | {w['grouped_batched']} s | "
                 f"{s['speedup_grouped_batched']:.2f}x | {'yes' if s['identical_predictions'] else 'NO'} |"]
    return "\n".join(text) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.table:
        print(tables(json.loads(Path(args.table).read_text())), end="")
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    result = dict(kind="bench_batch", time=time.strftime("%Y-%m-%d %H:%M:%S"), host=os.uname().nodename,
                  cpus=os.cpu_count(), torch=torch.__version__, argv=sys.argv[1:],
                  throughput=throughput(args))
    if not args.no_sweep:
        result["sweep"] = sweeps(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    Path(args.out).with_suffix(".md").write_text(tables(result))
    print(tables(result), end="")
    ok = all(r["identical_predictions"] for r in result["throughput"]) and result.get("sweep", {}).get(
        "identical_predictions", True)
    if "sweep" in result:
        s = result["sweep"]
        print(f"bench_batch: sweep per-job {s['wall_s']['per_job']} s, grouped {s['wall_s']['grouped']} s "
              f"(x{s['speedup_grouped']}), grouped + batch {s['batch_size']} {s['wall_s']['grouped_batched']} s "
              f"(x{s['speedup_grouped_batched']}); identical predictions: {s['identical_predictions']}")
    print(f"bench_batch: -> {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
