"""Fit t_node, the device time per captured graph node, from measured end-to-end steps (bench/t_node.py says how):

    python scripts/fit_t_node.py results/gpu/e2e.jsonl --out results/gpu/t_node.json
    python scripts/bench_launches.py --t-node-us <the fitted value> --out results/launches.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.t_node import fit, load_steps


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("records", nargs="+", type=Path, help="JSON-lines files of scripts/bench_e2e.py")
    p.add_argument("--out", type=Path, help="write the fit here as JSON")
    args = p.parse_args(argv)
    missing = [str(path) for path in args.records if not path.is_file()]
    if missing:
        print(f"fit_t_node: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        result = fit(load_steps(args.records))
    except ValueError as e:
        print(f"fit_t_node: {e}", file=sys.stderr)
        return 1
    for s in result["per_step"]:
        print(f"{s['shape']} L={s['context']} B={s['batch']} {s['method']:<11} {s['nodes']:6.0f} nodes, "
              f"{s['ms_graph']:.3f} ms vs floor {s['floor_ms']:.3f} ms: {s['t_node_us']:.2f} us/node")
    print(f"t_node = {result['t_node_us']:.2f} us per node over {result['steps']} steps "
          f"(rms residual {result['rms_residual_us']:.0f} us)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
