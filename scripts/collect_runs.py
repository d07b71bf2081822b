"""Copy the finished runs of a sweep into a results directory, one file per run named <method>[_b<budget>].json
(what paper_figs/ and the README tables read). Only complete runs are copied (metrics.json written and as many
predictions as it counts); an unfinished run is listed and makes the exit status 1. Two runs that would get the
same name (same method and budget, different configs) are an error: collect them into separate directories, or
name each file by what sets it apart with --distinct: <method>[_b<budget>]_<context lengths>[_<option>-<value>...],
the method options that differ from the method's defaults (a sweep over contexts and method options, e.g. the LOCKS
ablation).

    python scripts/collect_runs.py outputs/ruler_embedded results/ruler_embedded
    python scripts/collect_runs.py --distinct outputs/locks_ablation results/locks_ablation
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path


def main(argv=None) -> int:
    from eval.runner import finished_metrics

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs_dir", type=Path, help="the sweep's paths.runs_dir (one directory per run)")
    p.add_argument("dest", type=Path, help="results directory to write <method>[_b<budget>].json into")
    p.add_argument("--distinct", action="store_true",
                   help="also name files by context length and the method options that differ from the defaults")
    args = p.parse_args(argv)
    if not args.runs_dir.is_dir():
        p.error(f"{args.runs_dir}: no such directory (give the sweep's paths.runs_dir)")
    chosen, unfinished = {}, []
    for run in sorted(d for d in args.runs_dir.iterdir() if d.is_dir()):
        metrics = finished_metrics(run / "predictions.jsonl", run / "metrics.json")
        if metrics is None:
            unfinished.append(run.name)
            continue
        method, budget = metrics["method"]["name"], metrics["method"].get("budget")
        name = method if budget is None else f"{method}_b{budget}"
        if args.distinct:
            name += distinct_suffix(metrics)
        if name in chosen:
            sys.exit(f"collect_runs: {chosen[name].name} and {run.name} are both {name}; collect them separately")
        chosen[name] = run
    args.dest.mkdir(parents=True, exist_ok=True)
    for name, run in sorted(chosen.items()):
        shutil.copyfile(run / "metrics.json", args.dest / f"{name}.json")
    print(f"collect_runs: {len(chosen)} runs -> {args.dest}")
    for name in unfinished:
        print(f"collect_runs: not finished, not copied: {name}", file=sys.stderr)
    return 1 if unfinished else 0


def distinct_suffix(metrics: dict) -> str:
    """_<context lengths>[_<option>-<value>...]: the run's context lengths and the method options it sets away from
    the method's defaults (its selector's constructor defaults, which conf/method/<name>.yaml repeats)."""
    from eval.config_schema import method_schema

    method = metrics["method"]
    defaults, _ = method_schema(method["name"])
    bench = metrics.get("benchmark") or {}
    contexts = bench.get("context_lengths") or [bench.get("context_length")]
    changed = [f"{k}-{v}" for k, v in sorted(method.items())
               if k not in ("name", "budget", "backend") and k in defaults and v != defaults[k]]
    return "".join(f"_{part}" for part in ["-".join(str(c) for c in contexts if c is not None) or "ctx", *changed])


if __name__ == "__main__":
    sys.exit(main())
