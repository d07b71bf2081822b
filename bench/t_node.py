"""t_node, the device time one captured graph node costs beyond the bytes it reads, fitted from measured steps.

The launch model (docs/launches.md) prices a decode step as

    t_step = bytes / bandwidth + nodes * t_node

bench/e2e.py measures, per (shape, context, batch, method), the replayed CUDA-graph step (`ms_graph`), its byte floor
at the same bandwidth (`byte_floor_ms`, weights + K/V + metadata; host-to-device bytes have their own floor,
`h2d_floor_ms`) and, under torch.profiler, the kernels one replay runs (`kernels_per_step`, a "profile" record). So
each measured step gives excess_i = ms_graph_i - floor_ms_i and nodes_i, and the least-squares line through the
origin gives

    t_node = sum_i nodes_i * excess_i / sum_i nodes_i^2

with its residuals. It folds into t_node whatever a step loses beyond its byte floor in proportion to its kernel count
(launch gaps, small kernels that never reach the bandwidth), which is what the launch model needs it to price.

    python scripts/fit_t_node.py results/gpu/e2e.jsonl --out results/gpu/t_node.json
"""
from __future__ import annotations

import json
import math
from pathlib import Path

KEY = ("shape", "context", "batch", "method")


def load_steps(paths: list[Path]) -> list[dict]:
    """Measured steps: each e2e record timed from a CUDA graph, joined with its profile's kernel count. Raises
    ValueError when the files hold no such pair (a --dry-run's records are CPU timings and never count)."""
    e2e, kernels = {}, {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            if r.get("kind") == "e2e" and r.get("timing") == "cuda_graph":
                e2e[tuple(r[k] for k in KEY)] = r
            elif r.get("kind") == "profile" and r.get("time_unit") == "device_us":
                kernels[tuple(r[k] for k in KEY)] = float(r["kernels_per_step"])
    steps = [dict(zip(KEY, key), nodes=kernels[key], ms_graph=float(r["ms_graph"]), floor_ms=float(r["floor_ms"]),
                  excess_ms=float(r["ms_graph"]) - float(r["floor_ms"])) for key, r in e2e.items() if key in kernels]
    if not steps:
        raise ValueError(f"no CUDA-graph e2e step with a device profile in {', '.join(map(str, paths))}; run "
                         "scripts/bench_e2e.py on a GPU with --profile-reps > 0 (a --dry-run's records do not count)")
    return sorted(steps, key=lambda s: tuple(str(s[k]) for k in KEY))


def fit(steps: list[dict]) -> dict:
    """t_node (µs) by least squares through the origin, each step's own excess / nodes, and the fit's residuals."""
    nodes = [s["nodes"] for s in steps]
    excess_us = [1e3 * s["excess_ms"] for s in steps]
    t_node = sum(n * e for n, e in zip(nodes, excess_us)) / sum(n * n for n in nodes)
    residual_us = [e - t_node * n for n, e in zip(nodes, excess_us)]
    rms = math.sqrt(sum(r * r for r in residual_us) / len(steps))
    return dict(t_node_us=t_node, steps=len(steps), rms_residual_us=rms,
                per_step=[dict(s, t_node_us=1e3 * s["excess_ms"] / s["nodes"], residual_us=r)
                          for s, r in zip(steps, residual_us)])
