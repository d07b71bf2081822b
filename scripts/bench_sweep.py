"""Sweep benchmark: the same sweep run job by job (Hydra's basic launcher: each job loads the model, reads its
samples and prefills every sample on its own) and grouped (hydra/launcher=
grouped: one process, one model load and one prefill per sample for all methods and budgets), on this machine, in
one run. It records wall times, model loads, prefills, the per-job start-up split (interpreter and imports, model
load, sample generation), and checks that both ways write identical predictions.jsonl files (every field but
`seconds`).

    python scripts/bench_sweep.py --out results/bench_sweep.json                 # every method x 64,128,256,512
    python scripts/bench_sweep.py --num-samples 1 --methods locks,quest --budgets 64,128
    python scripts/bench_sweep.py --repeats 2    # both ways twice, alternating; the ratio of the medians

A cell that a method rejects (LRQK at budget 64: its 64 lite tokens leave no top-k) is left out of both ways: the
per-job way runs one command per block of methods that share their valid budgets, the grouped way one command with
hydra.launcher.skip_invalid=true.

The sweep is the default run (conf/config.yaml: the embedded model, the default RULER tasks and context length)
with `benchmark.num_samples` = --num-samples; the model cache (model.cache_dir) is warmed first, so neither way
pays the GGUF dequantization, and RULER's generated samples come from its cache in both.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv=None):
    from locks.core.registry import discover, report_order

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "results" / "bench_sweep.json"))
    p.add_argument("--methods", default=",".join(sorted(discover(), key=report_order)))
    p.add_argument("--budgets", default="64,128,256,512")
    p.add_argument("--num-samples", type=int, default=1, help="benchmark.num_samples (per task)")
    p.add_argument("--extra", nargs="*", default=[], help="more overrides for both sweeps")
    p.add_argument("--workdir", default=None, help="where the two sweeps write (default: a temporary directory)")
    p.add_argument("--repeats", type=int, default=1,
                   help="run both ways this many times, alternating (a shared machine drifts by 10-30%% over "
                        "minutes); the speedup is the ratio of the median wall times")
    return p.parse_args(argv)


def valid_cells(args) -> list[tuple[str, str]]:
    """The sweep's (methods, budgets) blocks without the cells a method rejects (LRQK at a budget <= its lite
    tokens): one block per distinct list of valid budgets, as a researcher would split the command."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from eval.runner import rejected

    budgets: dict[str, list[str]] = {}
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        for method in args.methods.split(","):
            for b in args.budgets.split(","):
                cfg = compose("config", overrides=[f"method={method}", f"budget={b}", *args.extra])
                if (reason := rejected(OmegaConf.to_container(cfg, resolve=True))) is not None:
                    print(f"bench_sweep: skipped {method} b={b}: {reason}", flush=True)
                    continue
                budgets.setdefault(method, []).append(b)
    blocks: dict[str, list[str]] = {}
    for method, bs in budgets.items():
        blocks.setdefault(",".join(bs), []).append(method)
    return [(",".join(ms), bs) for bs, ms in blocks.items()]


def sweep(args, work: Path, name: str, launcher: list[str], cells: list[tuple[str, str]]) -> dict:
    events = work / f"{name}.events.jsonl"
    env = dict(os.environ, LOCKS_EVENTS=str(events), HF_HUB_OFFLINE="1", WANDB_SILENT="true")
    start = time.perf_counter()
    for i, (methods, budgets) in enumerate(cells):
        cmd = [sys.executable, str(ROOT / "run.py"), "-m", f"method={methods}", f"budget={budgets}",
               f"benchmark.num_samples={args.num_samples}", "logger=none", f"paths.runs_dir={work / name}",
               f"hydra.sweep.dir={work / (name + '_sweep') / str(i)}", *launcher, *args.extra]
        print(f"bench_sweep: {name}: {' '.join(cmd[2:])}", flush=True)
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"bench_sweep: the {name} sweep failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    wall = time.perf_counter() - start
    log = [json.loads(line) for line in events.read_text().splitlines()]

    def seconds(event):
        return [e["seconds"] for e in log if e["event"] == event and e.get("seconds") is not None]

    out = dict(wall_s=round(wall, 1), model_loads=len(seconds("model_load")),
               prefills=sum(e["event"] == "prefill" for e in log), runs=sum(e["event"] == "job_done" for e in log),
               processes=len({e["pid"] for e in log}),
               # each run's own work on its samples: per job its prefill and decode, grouped its replay and decode
               # (what grouping cannot share; the shared prefill is counted once, in prefill_s)
               # (the per-job prefill runs inside each run's own time and is not timed apart: None there)
               run_own_s=round(sum(seconds("run_sample")), 1),
               prefill_s=round(sum(timed), 1) if (timed := seconds("prefill")) else None)
    by_method: dict[str, float] = {}
    for e in log:
        if e["event"] == "run_sample":
            by_method[e.get("method")] = by_method.get(e.get("method"), 0.0) + e["seconds"]
    out["run_own_s_by_method"] = {m: round(s, 1) for m, s in sorted(by_method.items(), key=lambda kv: -kv[1])}
    for event, key in (("startup", "startup_s"), ("model_load", "model_load_s"), ("samples", "sample_generation_s")):
        values = seconds(event)
        out[key] = dict(median=round(statistics.median(values), 2), total=round(sum(values), 1)) if values else None
    print(f"bench_sweep: {name}: {out}", flush=True)
    return out


def warm_model_cache(extra: list[str]) -> None:
    """Load the run's model once in a process of its own, so that model.cache_dir holds its dequantized copy."""
    warm = [sys.executable, "-c", "from hydra import compose, initialize_config_dir; "
            f"initialize_config_dir(config_dir='{ROOT / 'conf'}', version_base='1.3'); "
            f"from locks.core.models import load_model; load_model(compose('config', overrides={extra!r}).model)"]
    subprocess.run(warm, cwd=ROOT, check=True, capture_output=True)


def predictions(runs: Path) -> dict:
    from eval.results import without_timings

    return {p.name: [without_timings(json.loads(line)) for line in (p / "predictions.jsonl").read_text().splitlines()]
            for p in sorted(runs.iterdir()) if (p / "predictions.jsonl").exists()}


def main(argv=None) -> int:
    args = parse_args(argv)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_sweep-"))
    work.mkdir(parents=True, exist_ok=True)
    warm_model_cache(args.extra)  # neither sweep dequantizes the GGUF
    cells = valid_cells(args)
    per_job, grouped, identical = [], [], True
    for r in range(args.repeats):
        tag = "" if args.repeats == 1 else f"_{r}"
        # Hydra's basic launcher, one command per block of cells; then grouped, one command
        per_job.append(sweep(args, work, "per_job" + tag, [], cells))
        grouped.append(sweep(args, work, "grouped" + tag, ["hydra/launcher=grouped",
                                                           "hydra.launcher.skip_invalid=true"],
                             [(args.methods, args.budgets)]))
        a, b = predictions(work / ("per_job" + tag)), predictions(work / ("grouped" + tag))
        identical = identical and a == b and len(a) > 0
    walls = {name: [w["wall_s"] for w in ways] for name, ways in (("per_job", per_job), ("grouped", grouped))}
    result = dict(kind="bench_sweep", time=time.strftime("%Y-%m-%d %H:%M:%S"), host=os.uname().nodename,
                  cpus=os.cpu_count(), methods=args.methods.split(","), budgets=[int(b) for b in args.budgets.split(",")],
                  num_samples=args.num_samples, extra=args.extra, repeats=args.repeats,
                  wall_s=walls, per_job=per_job[0], grouped=grouped[0],
                  speedup=round(statistics.median(walls["per_job"]) / statistics.median(walls["grouped"]), 2),
                  speedups=[round(p / g, 2) for p, g in zip(walls["per_job"], walls["grouped"])],
                  # the speedup if the grouped way spent nothing but its shared prefills and its runs' own replay and
                  # decode (no start-up, model load, samples or bookkeeping): what sharing the prefill can reach
                  # while each run's decode costs what it costs now
                  ceiling=round(statistics.median(walls["per_job"]) / statistics.median(
                      [g["prefill_s"] + g["run_own_s"] for g in grouped]), 2),
                  run_directories=len(a), identical_predictions=identical, argv=sys.argv[1:])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    p, g = per_job[0], grouped[0]
    print(f"bench_sweep: {len(a)} runs; per-job {walls['per_job']} s ({p['model_loads']} model loads, "
          f"{p['prefills']} prefills) vs grouped {walls['grouped']} s ({g['model_loads']} model load, "
          f"{g['prefills']} prefills): x{result['speedup']} (medians); the runs' own replay and decode "
          f"{g['run_own_s']} s of the grouped {g['wall_s']} s (ceiling with no other overhead: x{result['ceiling']}); "
          f"identical predictions: {identical}; -> {args.out}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
