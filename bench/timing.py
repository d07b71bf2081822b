"""Median step times: CUDA events around each step, eager and replayed from CUDA graphs; wall clock on CPU."""
from __future__ import annotations

import statistics
import time

import torch


class Timer:
    """Median step time. CUDA: events around each step, graph replay (one graph per rotation slot) and eager.
    CPU (dry run): wall clock, meaningless except as plumbing."""

    def __init__(self, device: torch.device, reps: int, warmup: int, graphs: bool):
        self.device, self.reps, self.warmup, self.graphs = device, reps, warmup, graphs

    def _events(self, steps) -> list[float]:
        times = []
        for i in range(self.reps):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            steps[i % len(steps)]()
            end.record()
            times.append((start, end))
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in times]

    def time(self, fns: list) -> dict:
        if self.device.type != "cuda":
            for i in range(self.warmup):
                fns[i % len(fns)]()
            ts = []
            for i in range(self.reps):
                t0 = time.perf_counter()
                fns[i % len(fns)]()
                ts.append((time.perf_counter() - t0) * 1e3)
            return {"ms": statistics.median(ts), "ms_min": min(ts), "timing": "cpu_wall", "reps": self.reps,
                    "ms_eager": None}
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up (Triton compiles, cuBLAS/cuDNN plans) on a side stream
            for i in range(max(self.warmup, len(fns))):
                fns[i % len(fns)]()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        eager = self._events(fns)
        out = {"ms_eager": statistics.median(eager), "reps": self.reps}
        graph_error = None
        if self.graphs:
            try:
                pool = torch.cuda.graph_pool_handle()
                graphs = []
                for f in fns:
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g, pool=pool):
                        f()
                    graphs.append(g)
                for g in graphs:
                    g.replay()
                torch.cuda.synchronize()
                ts = self._events([g.replay for g in graphs])
                out.update(ms=statistics.median(ts), ms_min=min(ts), timing="cuda_graph")
                del graphs
                return out
            except Exception as e:  # record why and fall back to eager
                graph_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                torch.cuda.synchronize()
        out.update(ms=out["ms_eager"], ms_min=min(eager), timing="eager")
        if graph_error:
            out["graph_error"] = graph_error
        return out


def h2d_bandwidth(device: torch.device, nbytes: int | None = None, reps: int = 5) -> float:
    """Host-to-device copy bandwidth in bytes/s: the median of `reps` copies of `nbytes` (default 256 MiB on CUDA)
    from pinned host memory, timed with CUDA events; the floor of the offloading methods' host reads. On CPU (dry
    runs) a plain copy of 8 MiB by the wall clock, meaningless except as plumbing."""
    if device.type != "cuda":
        nbytes = nbytes or 2**23
        src, dst = torch.empty(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            dst.copy_(src)
            ts.append(time.perf_counter() - t0)
        return nbytes / max(statistics.median(ts), 1e-9)
    nbytes = nbytes or 2**28
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst.copy_(src, non_blocking=True)  # warm-up
    torch.cuda.synchronize()
    ms = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
        ms.append(start.elapsed_time(end))
    return nbytes / (statistics.median(ms) * 1e-3)


def step_peak_bytes(fn, device: torch.device) -> int | None:
    """CUDA: the most memory one run of a step allocates above what was allocated before it (None off CUDA)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before
