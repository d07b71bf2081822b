"""CPU benchmark: batched LOCKS summary construction (spec A6) vs the per-page `torch.linalg.svd` loop.

Times, on the same seeded keys of one layer-head ([1, 1, tokens, dim], bf16 values upcast to fp32):
  (a) `page_svd` (batched Gram/eigh path, unquantized summaries),
  (b) `build_summaries(quant="int")` (a + the 804 B/page quantization, C refit and rho^),
  (c) the reference algorithm as a plain Python loop over pages: center, thin `torch.linalg.svd`, V = W[:, :r],
      C = D V (compare with a),
  (d) the same loop producing the full quantized 804 B/page summary, one page at a time: the per-page SVD, then the
      library's own quantization (`quantize`) called page by page with the head mean of the pages (compare with b;
      both produce the same summary).
Reports wall-clock medians over --repeats (the loop is timed --loop-repeats times, default 1, since it is slow),
the process CPU time (all threads; MKL's SVD in the loop is multithreaded too), the ratios loop / batched, and the
load average (the machine may be shared); writes everything to a JSON file. On CPU the batched path is bounded by
torch's batched `eigh` (one LAPACK call per 16 x 16 Gram, ~10 us each), i.e. well under the GPU-oriented 20x target.

    python scripts/bench_summaries.py --tokens 65536 --dim 128 --repeats 3 [--out results/bench_summaries.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

from locks.method.summaries import PageSummaries, build_summaries, page_svd, quantize


def loop_svd(keys: torch.Tensor, page_size: int, rank: int):
    """The straightforward reference: one thin SVD per page in a Python loop."""
    x = keys[0, 0].float()
    P = x.shape[0] // page_size
    mus, vs, cs = [], [], []
    for j in range(P):
        page = x[j * page_size : (j + 1) * page_size]
        mu = page.mean(dim=0)
        D = page - mu
        _, _, Wh = torch.linalg.svd(D, full_matrices=False)
        V = Wh[:rank].T
        mus.append(mu)
        vs.append(V)
        cs.append(D @ V)
    return mus, vs, cs


def loop_svd_quantized(keys: torch.Tensor, page_size: int, rank: int):
    """(d): the per-page loop of (c), then per-page quantization of each page's summary (head mean = mean of mu)."""
    mus, vs, cs = loop_svd(keys, page_size, rank)
    head_mean = torch.stack(mus).mean(0).view(1, 1, -1)
    x = keys.float()
    out = []
    for j, (mu, v, c) in enumerate(zip(mus, vs, cs)):
        page = x[:, :, j * page_size : (j + 1) * page_size]
        one = PageSummaries(mu=mu.view(1, 1, 1, -1), v=v.view(1, 1, 1, *v.shape), c=c.view(1, 1, 1, *c.shape),
                            rho=torch.zeros(1, 1, 1), sigma=torch.zeros(1, 1, 1, page_size), head_mean=head_mean)
        out.append(quantize(one, page, head_mean))
    return out


def timed(fn, repeats: int) -> tuple[list[float], list[float]]:
    """Wall-clock and process CPU seconds (all threads) of each repeat."""
    wall, cpu = [], []
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


def loadavg():
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--loop-repeats", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's default)")
    ap.add_argument("--out", type=str, default=None, help="JSON output path")
    args = ap.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(args.seed)
    keys = torch.randn(1, 1, args.tokens, args.dim, generator=g).to(torch.bfloat16)
    n, r = args.page_size, args.rank
    pages = args.tokens // n

    # warm-up (allocator, LAPACK/BLAS init) on a small slice
    warm = keys[:, :, : min(args.tokens, 64 * n)]
    loop_svd(warm, n, r)
    loop_svd_quantized(warm, n, r)
    page_svd(warm, n, r)
    build_summaries(warm, n, r, "int")

    load_before = loadavg()
    runs = {}
    # the loop first, so that nothing the batched path does to the process (allocator, thread pools) can slow it
    runs["loop_svd"] = timed(lambda: loop_svd(keys, n, r), args.loop_repeats)
    runs["loop_svd_int"] = timed(lambda: loop_svd_quantized(keys, n, r), args.loop_repeats)
    runs["page_svd"] = timed(lambda: page_svd(keys, n, r), args.repeats)
    runs["build_int"] = timed(lambda: build_summaries(keys, n, r, "int"), args.repeats)
    load_after = loadavg()
    med = {k: statistics.median(w) for k, (w, _) in runs.items()}
    med_cpu = {k: statistics.median(c) for k, (_, c) in runs.items()}
    ratios = {"loop/page_svd": med["loop_svd"] / med["page_svd"], "loop/build_int": med["loop_svd"] / med["build_int"],
              "loop_int/build_int": med["loop_svd_int"] / med["build_int"]}

    la = "/".join("n/a" if x is None else f"{x[0]:.2f}" for x in (load_before, load_after))
    print(f"tokens={args.tokens} pages={pages} dim={args.dim} n={n} r={r} torch={torch.__version__} "
          f"threads={torch.get_num_threads()} loadavg(1m) before/after={la}")
    print(f"{'method':<44}{'median s':>10}{'cpu s':>9}{'us/page':>10}{'speedup':>9}")
    rows = [("(a) page_svd (batched, fp32) vs (c)", "page_svd", "loop_svd"),
            ("(b) build_summaries quant=int vs (d)", "build_int", "loop_svd_int"),
            ("(c) per-page torch.linalg.svd loop", "loop_svd", "loop_svd"),
            ("(d) per-page svd + quantize loop", "loop_svd_int", "loop_svd_int")]
    for label, key, ref in rows:
        ratio = med[ref] / med[key]
        print(f"{label:<44}{med[key]:>10.4f}{med_cpu[key]:>9.4f}{1e6 * med[key] / max(pages, 1):>10.2f}"
              f"{ratio:>8.1f}x")

    result = {
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]) if argv is None else argv,
        "tokens": args.tokens,
        "pages": pages,
        "dim": args.dim,
        "page_size": n,
        "rank": r,
        "seed": args.seed,
        "repeats": args.repeats,
        "loop_repeats": args.loop_repeats,
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "processor": platform.processor(),
        "wall_s": {k: w for k, (w, _) in runs.items()},
        "cpu_s": {k: c for k, (_, c) in runs.items()},
        "median_s": med,
        "median_cpu_s": med_cpu,
        "ratios": ratios,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "target_ratio": 20.0,
    }
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
