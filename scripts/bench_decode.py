"""Per-layer decode-attention benchmark: FullKV (cuDNN / flash SDPA, our Triton full decode) vs LOCKS and Quest
fused Triton paths vs the LOCKS PyTorch reference (issue 6; run on the GPU in the next issue).

For every shape (llama: 32 query / 8 KV heads, glm: 32 / 2; d = 128, bf16), context and batch it times one decode
step of one layer, all heads, with fresh random K/V (never zeros):
  sdpa_cudnn, sdpa_flash   F.scaled_dot_product_attention (enable_gqa, GQA-native) forced onto one backend with
                           torch.nn.attention.sdpa_kernel; a backend that refuses is recorded as a skip with the error
  flash_attn_kvcache       flash_attn.flash_attn_with_kvcache (the optional flash-attn package; a skip when absent)
  triton_full              locks.kernels.full_decode (the split-K kernel over all tokens)
  locks_fused              locks_aggregated_scores (norm, exact two-pass) + torch.topk + paged_decode
  locks_score / topk / locks_decode   the three parts of locks_fused timed alone (topk = torch.topk on the
                           aggregated scores [B, Hkv, P], P = 65,536 pages at 1M; its share of locks_fused is recorded:
                           a Triton top-k is only worth writing if that share is large)
  quest_fused              quest_group_scores (max over the group, one page set per KV head) + torch.topk +
                           paged_decode; Quest's kernel page rule: the last page is always attended, budget//16 - 1
                           pages chosen among the others
  quest_fused_per_head     quest_page_scores (one page set per query head, Quest's default gqa=per_head) + torch.topk
                           + paged_decode with Gs = G
  locks_torch              the PyTorch reference path: page_scores + aggregate_heads + torch.topk + forced set +
                           locks.attention.sparse_decode (gather + fp32 softmax)
LOCKS uses the harness's fair budget: budget tokens in all = sink page + recent 64 tokens (4 pages) + partial page +
top-k pages (123 at budget 2048); candidates are the pages between the sink and the recent pages.

Timing: CUDA events around each step, warm-up first, median of --reps (>= 20) steps; every method is captured in a
CUDA graph (one per rotation slot) and replayed (`ms`), and also timed eagerly (`ms_eager`, includes Python launch
overhead); when capture fails the eager time is used and the reason recorded. Inputs are rotated over several
copies (slots) whenever a per-step working set would fit twice in L2, so no step reads data cached by the previous
one: every slot has its own query; summaries, Quest min/max and K/V get per-slot copies when they are smaller than
2 x L2 (larger tensors cannot stay in L2 between steps).
Bytes per step (analytic, all KV heads and batch rows; s = 2 B for bf16):
  fullkv  2*L*d*s;  locks  summary_bytes_per_page * candidate pages + 2*d*s*attended + G*d*s (queries);
  quest   2*d*s * scored pages + 2*d*s*attended (per_head: the union over the group) + G*d*s;
plus `bytes_with_intermediates` for the fused paths (per-head score round trip, aggregated scores, top-k read),
achieved GB/s = bytes / time, and `speedup_vs_fastest_fullkv` = fastest FullKV time of the same configuration / time.
Correctness, once per configuration (records of kind "check"): triton_full and the SDPA backends against a chunked
fp32 dense reference; the fused scores against the PyTorch scores; the fused selections against the reference's
(`set_agreement`, ties allowed); the fused outputs against locks.attention.sparse_decode on the same pages.
Summaries: random values in the exact quantized layout (`--summaries random`, default on GPU: building 2M pages
with batched eigh costs minutes of GPU time and timing does not depend on the values, only on the layout), or
locks.summaries.build_summaries on the random keys in chunks of <= 32,768 pages per call (`--summaries build`,
default in --dry-run; cuSOLVER's batched eigh failed on 65,536 16x16 matrices in one call).
Not included here: the end-to-end CUDA-graph decode step of a random-weight model (the next issue's).

Every measurement is printed as soon as it is taken and appended to --out as one JSON object per line (flushed).
--dry-run runs everything on CPU at tiny sizes under the Triton interpreter (timings meaningless; plumbing and
correctness asserts only; exits non-zero if a check fails).

    python scripts/bench_decode.py --out results/bench_decode.jsonl
    python scripts/bench_decode.py --dry-run --out /tmp/dry.jsonl
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = {"llama": (32, 8, 128), "glm": (32, 2, 128)}  # (query heads, KV heads, head dim)
DRY_SHAPES = {"llama": (8, 2, 64), "glm": (16, 1, 64)}  # same GQA groups (4, 16), tiny
FULLKV_METHODS = ["sdpa_cudnn", "sdpa_flash", "flash_attn_kvcache", "triton_full"]
METHODS = FULLKV_METHODS + ["locks_fused", "locks_score", "topk", "locks_decode", "quest_fused",
                            "quest_fused_per_head", "locks_torch"]
CHECKED = ["triton_full", "sdpa_cudnn", "sdpa_flash", "flash_attn_kvcache", "locks_fused", "quest_fused", "quest_fused_per_head"]
TOL = {"out": 1e-2, "scores": 1e-3}  # bf16 outputs vs fp32 references; fp32 scores


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="tiny sizes on CPU under the Triton interpreter")
    p.add_argument("--out", default="results/bench_decode.jsonl", help="JSON-lines file, appended as it goes")
    p.add_argument("--contexts", type=int, nargs="+", default=[131072, 262144, 1048576])
    p.add_argument("--shapes", nargs="+", default=["llama", "glm"], choices=sorted(SHAPES))
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    p.add_argument("--budget", type=int, default=2048, help="tokens attended by LOCKS / Quest (fair mode)")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--recent", type=int, default=64, help="LOCKS recent window (tokens)")
    p.add_argument("--sink-pages", type=int, default=1)
    p.add_argument("--reps", type=int, default=30, help="timed steps per method (median; >= 20 on GPU)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    p.add_argument("--summaries", choices=["random", "build"], default=None,
                   help="random quantized layout (GPU default) or build_summaries on the keys (dry-run default)")
    p.add_argument("--no-graph", action="store_true", help="eager timing only")
    p.add_argument("--tune", action="store_true", help="also time a few block-size variants of the Triton kernels "
                                                       "at the largest context (records of kind 'tune')")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.dry_run:
        args.contexts = [1000]  # not a multiple of 16: a partial page
        args.batch = [2]
        args.budget = 256
        args.reps = 2
        args.warmup = 1
        args.summaries = args.summaries or "build"
    else:
        args.summaries = args.summaries or "random"
        if args.reps < 20:
            p.error("--reps must be >= 20 (median of at least 20 steps)")
    return args


# ----------------------------------------------------------------------------------------------------------------
# output


class Recorder:
    def __init__(self, path: str):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.failures: list[str] = []

    def write(self, rec: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(_finite(rec), default=_jsonable) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def emit(self, rec: dict) -> None:
        self.write(rec)
        print(_fmt(rec), flush=True)


def _finite(x):
    """Strict JSON: non-finite floats become the strings "inf", "-inf", "nan"."""
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x


def _jsonable(x):
    if isinstance(x, torch.Tensor):
        return _finite(x.tolist())
    return str(x)


def _fmt(rec: dict) -> str:
    where = f"[{rec.get('shape', '-')} B={rec.get('batch', '-')} L={rec.get('context', '-')}]"
    head = f"{where} {rec.get('method', ''):<22}"
    kind = rec["kind"]
    if kind == "measurement":
        s = f"{head} {rec['ms']:9.4f} ms ({rec['timing']})"
        if rec.get("ms_eager") is not None:
            s += f"  eager {rec['ms_eager']:.4f} ms"
        if rec.get("bytes"):
            s += f"  {rec['bytes'] / 1e6:9.2f} MB  {rec['gbps']:8.1f} GB/s"
        if rec.get("speedup_vs_fastest_fullkv") is not None:
            s += f"  x{rec['speedup_vs_fastest_fullkv']:.2f} vs {rec['fastest_fullkv']}"
        if rec.get("share_of_locks_fused") is not None:
            s += f"  ({100 * rec['share_of_locks_fused']:.1f} % of locks_fused)"
        return s
    if kind == "check":
        verdict = "ok" if rec["ok"] else "FAILED"
        return f"{head} check: max_rel_err {rec['max_rel_err']:.2e} {rec.get('details', '')} {verdict}"
    if kind == "skip":
        return f"{head} skipped: {rec['reason']}"
    if kind == "tune":
        return f"{head} tune {rec['config']}: {rec['ms']:.4f} ms"
    return json.dumps(rec, default=_jsonable)


# ----------------------------------------------------------------------------------------------------------------
# timing


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


# ----------------------------------------------------------------------------------------------------------------
# inputs


def random_summaries(B, H, P, d, rank, n, device, gen):
    """Random values in the exact quantized layout of locks.summaries (timing does not depend on the values)."""
    from locks.summaries import QuantizedPageSummaries

    def ri(lo, hi, shape, dtype):
        return torch.randint(lo, hi, shape, generator=gen, device=device, dtype=dtype)

    def rf(shape):
        return torch.rand(shape, generator=gen, device=device)

    return QuantizedPageSummaries(
        mu_int=ri(-127, 128, (B, H, P, d), torch.int8),
        mu_scale=(rf((B, H, P)) * 0.02 + 0.005).half(),
        head_mean=torch.randn(B, H, d, generator=gen, device=device) * 0.5,
        v_pack=ri(0, 256, (B, H, P, rank, d // 2), torch.uint8),
        c_int=ri(-127, 128, (B, H, P, n, rank), torch.int8),
        w=rf((B, H, P, rank)) * 2e-3 + 1e-4,
        rho=(rf((B, H, P)) + 0.5).half(),
    )


def build_summaries_chunked(keys, n, rank, max_pages_per_call=32768):
    """locks.summaries.build_summaries over slices of pages (<= max_pages_per_call pages per eigh call, all heads)
    against the head mean of all complete pages; equal to one build_summaries call on the whole cache."""
    from locks.summaries import QuantizedPageSummaries, build_summaries

    B, H, L, d = keys.shape
    P = L // n
    per = max(1, max_pages_per_call // (B * H))
    hm = torch.zeros(B, H, d, device=keys.device)
    for p0 in range(0, P, per):
        hm += keys[:, :, p0 * n:min(P, p0 + per) * n].float().sum(2)
    hm /= max(1, P * n)
    parts = [build_summaries(keys[:, :, p0 * n:min(P, p0 + per) * n], n, rank, "int", head_mean=hm)
             for p0 in range(0, P, per)]
    fields = ("mu_int", "mu_scale", "v_pack", "c_int", "w", "rho")
    return QuantizedPageSummaries(head_mean=hm, **{f: torch.cat([getattr(s, f) for s in parts], 2) for f in fields})


def quest_metadata(keys, n):
    """Per-page channel-wise max / min of the keys (the partial last page included), keys' dtype."""
    B, H, L, d = keys.shape
    full = L // n
    mx = keys[:, :, :full * n].view(B, H, full, n, d).amax(3)
    mn = keys[:, :, :full * n].view(B, H, full, n, d).amin(3)
    if L % n:
        mx = torch.cat([mx, keys[:, :, full * n:].amax(2, keepdim=True)], 2)
        mn = torch.cat([mn, keys[:, :, full * n:].amin(2, keepdim=True)], 2)
    return mx.contiguous(), mn.contiguous()


def clone_summaries(s):
    from dataclasses import fields

    return type(s)(**{f.name: getattr(s, f.name).clone() for f in fields(s)})


def summaries_bytes(s) -> int:
    from dataclasses import fields

    return sum(getattr(s, f.name).nbytes for f in fields(s))


def dense_reference(q, k, v, scaling, chunk=65536):
    """Exact fp32 attention of q [B, Hq, d] over all of k/v [B, Hkv, L, d], in chunks of tokens (bounded memory)."""
    B, Hq, d = q.shape
    H, L = k.shape[1], k.shape[2]
    qf = q.float().view(B, H, Hq // H, d)
    m = torch.full((B, H, Hq // H), float("-inf"), device=q.device)
    lsum = torch.zeros_like(m)
    acc = torch.zeros(B, H, Hq // H, d, device=q.device)
    for c0 in range(0, L, chunk):
        kc, vc = k[:, :, c0:c0 + chunk].float(), v[:, :, c0:c0 + chunk].float()
        s = torch.einsum("bhgd,bhld->bhgl", qf, kc) * scaling
        m_new = torch.maximum(m, s.amax(-1))
        alpha = torch.exp(m - m_new)
        p = torch.exp(s - m_new.unsqueeze(-1))
        lsum = lsum * alpha + p.sum(-1)
        acc = acc * alpha.unsqueeze(-1) + torch.einsum("bhgl,bhld->bhgd", p, vc)
        m = m_new
    return (acc / lsum.unsqueeze(-1)).reshape(B, Hq, d), (m + lsum.log()).reshape(B, Hq)


def rel_err(out, ref) -> float:
    out, ref = out.float(), ref.float()
    fin = torch.isfinite(ref)
    if not torch.equal(fin, torch.isfinite(out)):
        return float("inf")
    if not bool(fin.any()):
        return 0.0
    return float((out[fin] - ref[fin]).abs().max() / ref[fin].abs().max().clamp(min=1e-30))


def set_agreement(a, b, ref_scores, tol=1e-5) -> float:
    """Fraction of rows whose selected page sets are equal, counting as equal sets that differ only by pages whose
    reference score ties the k-th largest (within tol)."""
    k = a.shape[-1]
    a2 = a.reshape(-1, k).sort(-1).values.cpu()
    b2 = b.reshape(-1, k).sort(-1).values.cpu()
    sc = ref_scores.reshape(a2.shape[0], -1).float().cpu()
    kth = torch.topk(sc, k, dim=-1).values[:, -1]
    same = 0
    for r in range(a2.shape[0]):
        diff = set(a2[r].tolist()) ^ set(b2[r].tolist())
        if all(abs(float(sc[r, p] - kth[r])) <= tol * max(1.0, abs(float(kth[r]))) for p in diff):
            same += 1
    return same / max(1, a2.shape[0])


# ----------------------------------------------------------------------------------------------------------------
# one configuration


def run_config(args, rec: Recorder, timer: Timer, device, shape_name, dims, L, B, l2_bytes):
    import torch.nn.functional as F

    from locks import kernels as K
    from locks.attention import sparse_decode as ref_sparse_decode
    from locks.pages import aggregate_heads, pages_to_tokens
    from locks.selector import Selection
    from locks.summaries import page_scores, summary_bytes_per_page

    Hq, H, d = dims
    G = Hq // H
    n = args.page_size
    dtype = torch.bfloat16
    s_el = 2
    scaling = d ** -0.5
    base = dict(shape=shape_name, context=L, batch=B, Hq=Hq, Hkv=H, d=d, budget=args.budget, dtype="bf16",
                device=str(device))
    gen = torch.Generator(device=device).manual_seed(args.seed + L + 7 * B + sum(map(ord, shape_name)))

    # ----- inputs: fresh random K/V, summaries, Quest min/max
    gen_dtype = torch.float32 if device.type == "cpu" else dtype  # CPU randn has no bf16 generator path
    keys = torch.randn(B, H, L, d, generator=gen, device=device, dtype=gen_dtype).to(dtype)
    values = torch.randn(B, H, L, d, generator=gen, device=device, dtype=gen_dtype).to(dtype)
    P, tail = divmod(L, n)
    if args.summaries == "build":
        summ = build_summaries_chunked(keys, n, 8)
    else:
        summ = random_summaries(B, H, P, d, 8, n, device, gen)
    qmax, qmin = quest_metadata(keys, n)

    # ----- LOCKS fair budget: partial page, sink pages, recent pages (newest first) while they fit, then top-k
    room = (args.budget - tail) // n
    recent = -(-args.recent // n)
    forced = list(range(min(args.sink_pages, P)))
    forced += [p for p in range(P - 1, max(P - 1 - recent, -1), -1) if p not in forced]
    forced = sorted(forced[:room])
    kp = room - len(forced)
    lo, hi = min(args.sink_pages, P), P - recent  # candidate range [lo, hi) (sink pages, recent pages excluded)
    assert hi - lo == P - len(forced) and kp > 0, "context too short for the budget"
    forced_pages = torch.tensor(forced + ([P] if tail else []), device=device)  # page P = the partial page
    attended_locks = (kp + len(forced)) * n + tail
    # Quest kernel rule: budget // n pages including the last (possibly partial) one
    nq = -(-L // n)
    kq = args.budget // n - 1
    last_page = torch.tensor([nq - 1], device=device)
    attended_quest = kq * n + (L - (nq - 1) * n)

    # ----- rotation slots: a new query per slot; per-slot copies of whatever fits twice in L2
    sb = summaries_bytes(summ)
    qb = qmax.nbytes + qmin.nbytes
    kvb = keys.nbytes + values.nbytes
    smallest = min(sb, qb, kvb)
    n_rot = 2 if device.type == "cpu" else max(1, min(8, math.ceil(2 * l2_bytes / max(1, smallest))))
    slots = []
    for i in range(n_rot):
        sl = dict(q=torch.randn(B, Hq, d, generator=gen, device=device).to(dtype))
        sl["summ"] = summ if (i == 0 or sb >= 2 * l2_bytes) else clone_summaries(summ)
        sl["qmax"], sl["qmin"] = (qmax, qmin) if (i == 0 or qb >= 2 * l2_bytes) else (qmax.clone(), qmin.clone())
        sl["k"], sl["v"] = (keys, values) if (i == 0 or kvb >= 2 * l2_bytes) else (keys.clone(), values.clone())
        slots.append(sl)
    base.update(rotation_slots=n_rot, summaries=args.summaries, locks_pages_selected=kp, locks_forced_pages=len(forced),
                quest_pages_selected=kq)
    cand = torch.zeros(B, H, P, dtype=torch.bool, device=device)
    cand[..., lo:hi] = True
    tail_idx = torch.arange(P * n, L, device=device).expand(B, H, tail)
    forced_complete = torch.tensor(forced, device=device, dtype=torch.long)

    # ----- the steps
    def sdpa(backend):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]

        def step(sl):
            with sdpa_kernel([be]):
                return F.scaled_dot_product_attention(sl["q"].unsqueeze(2), sl["k"], sl["v"], scale=scaling,
                                                      enable_gqa=True)[:, :, 0]
        return step

    def triton_full(sl):
        return K.full_decode(sl["q"], sl["k"], sl["v"], scaling)

    def flash_attn_kvcache(sl):
        # the optional flash-attn package (pip install '.[gpu]'): its decode kernel over the [B, L, H_kv, d] cache
        from flash_attn import flash_attn_with_kvcache

        return flash_attn_with_kvcache(sl["q"].unsqueeze(1), sl["k"].transpose(1, 2), sl["v"].transpose(1, 2),
                                       softmax_scale=scaling, causal=False)[:, 0]

    def locks_score(sl):
        return K.locks_aggregated_scores(sl["q"], sl["summ"], scaling, G, "norm", lo, hi)

    def locks_fused(sl):
        agg = K.locks_aggregated_scores(sl["q"], sl["summ"], scaling, G, "norm", lo, hi)
        pages = K.select_pages(agg, kp, forced_pages)
        return K.paged_decode(sl["q"], sl["k"], sl["v"], pages, scaling, page_size=n, length=L)

    def quest_fused(sl):
        U = K.quest_group_scores(sl["q"], sl["qmax"][:, :, :nq - 1], sl["qmin"][:, :, :nq - 1], "max")
        pages = K.select_pages(U, kq, last_page)
        return K.paged_decode(sl["q"], sl["k"], sl["v"], pages, scaling, page_size=n, length=L)

    def quest_per_head_pages(sl):
        U = K.quest_page_scores(sl["q"], sl["qmax"][:, :, :nq - 1], sl["qmin"][:, :, :nq - 1])
        top = K.topk_pages(U, kq).view(B, H, G, kq)
        return torch.cat([top, last_page.expand(B, H, G, 1)], -1)

    def quest_fused_per_head(sl):
        pages = quest_per_head_pages(sl)
        return K.paged_decode(sl["q"], sl["k"], sl["v"], pages, scaling, page_size=n, length=L)

    def locks_torch_selection(sl):
        S = page_scores(sl["q"], sl["summ"], scaling)
        agg = aggregate_heads(S, G, "norm", cand)
        top = torch.topk(agg, kp, dim=-1).indices
        chosen = torch.cat([top, forced_complete.expand(B, H, len(forced))], -1).sort(dim=-1).values
        tokens = torch.cat([pages_to_tokens(chosen, n), tail_idx], -1)
        return Selection(indices=tokens.unsqueeze(2), valid=torch.ones_like(tokens, dtype=torch.bool).unsqueeze(2)), agg

    def locks_torch(sl):
        sel, _ = locks_torch_selection(sl)
        return ref_sparse_decode(sl["q"], sl["k"], sl["v"], sel, scaling)

    # fixed inputs of the component timings (computed once per slot, outside the timed region)
    fixed_agg = [locks_score(sl) for sl in slots]
    fixed_pages = [K.select_pages(a, kp, forced_pages) for a in fixed_agg]

    steps = {
        "sdpa_cudnn": sdpa("cudnn"), "sdpa_flash": sdpa("flash"), "triton_full": triton_full,
        "flash_attn_kvcache": flash_attn_kvcache,
        "locks_fused": locks_fused, "locks_score": locks_score,
        "topk": None, "locks_decode": None,
        "quest_fused": quest_fused, "quest_fused_per_head": quest_fused_per_head, "locks_torch": locks_torch,
    }
    per_slot = {
        "topk": [lambda a=a: K.topk_pages(a, kp) for a in fixed_agg],
        "locks_decode": [lambda sl=sl, pg=pg: K.paged_decode(sl["q"], sl["k"], sl["v"], pg, scaling, page_size=n,
                                                                length=L) for sl, pg in zip(slots, fixed_pages)],
    }

    # ----- analytic bytes per step (all KV heads and batch rows)
    spp = summary_bytes_per_page(summ)
    qbytes = G * d * s_el
    full_bytes = 2 * L * d * s_el * H * B
    locks_bytes = (spp * (hi - lo) + 2 * d * s_el * attended_locks + qbytes) * H * B
    locks_inter = (8 * G + 4 + 4) * (hi - lo) * H * B  # S written + read, aggregated written, read by top-k
    quest_union = None
    with torch.no_grad():
        pg = quest_per_head_pages(slots[0])  # union of the group's pages per KV head (what per_head reads)
        seen = torch.zeros(B, H, nq, dtype=torch.bool, device=device)
        seen.scatter_(2, pg.reshape(B, H, -1), True)
        union_pages = seen.sum(-1).float()
        page_len = torch.full((nq,), float(n), device=device)
        page_len[-1] = L - (nq - 1) * n
        quest_union = float((seen.float() * page_len).sum(-1).mean())
        del union_pages
    score_bytes = (spp * (hi - lo) + qbytes) * H * B
    quest_group_bytes = (2 * d * s_el * (nq - 1) + 2 * d * s_el * attended_quest + qbytes) * H * B
    quest_head_bytes = (2 * d * s_el * (nq - 1) + 2 * d * s_el * quest_union + qbytes) * H * B
    bytes_of = {
        "sdpa_cudnn": (full_bytes, None, L), "sdpa_flash": (full_bytes, None, L), "triton_full": (full_bytes, None, L),
        "flash_attn_kvcache": (full_bytes, None, L),
        "locks_fused": (locks_bytes, locks_bytes + locks_inter, attended_locks),
        "locks_torch": (locks_bytes, None, attended_locks),
        "locks_score": (score_bytes, score_bytes + (8 * G + 4) * (hi - lo) * H * B, None),
        "topk": (4 * (hi - lo) * H * B, None, None),
        "locks_decode": (2 * d * s_el * attended_locks * H * B, None, attended_locks),
        "quest_fused": (quest_group_bytes, quest_group_bytes + 4 * (nq - 1) * H * B * 2, attended_quest),
        "quest_fused_per_head": (quest_head_bytes, quest_head_bytes + 4 * (nq - 1) * Hq * B * 2, quest_union),
    }

    # ----- correctness, once per configuration (slot 0)
    sl0 = slots[0]
    with torch.no_grad():
        ref_out, ref_lse = dense_reference(sl0["q"], keys, values, scaling)
        for m in ("triton_full", "sdpa_cudnn", "sdpa_flash", "flash_attn_kvcache"):
            if m not in args.methods:
                continue
            try:
                o = steps[m](sl0)
                o = o[0] if isinstance(o, tuple) else o
                details = {}
                err = rel_err(o, ref_out)
                if m == "triton_full":
                    lse_err = rel_err(K.full_decode(sl0["q"], keys, values, scaling)[1], ref_lse)
                    details["lse_rel_err"] = lse_err
                    err = max(err, lse_err)
                _check(rec, base, m, err, TOL["out"], "dense fp32 reference", details)
            except Exception as e:
                if m == "triton_full":
                    raise
                steps[m] = _skip(rec, base, m, e)
        if "locks_fused" in args.methods:
            sel_ref, agg_ref = locks_torch_selection(sl0)
            agg = locks_score(sl0)
            score_err = rel_err(agg, agg_ref)
            pages = K.select_pages(agg, kp, forced_pages)
            agree = set_agreement(pages[..., :kp], torch.topk(agg_ref, kp, dim=-1).indices, agg_ref)
            o, lse = K.paged_decode(sl0["q"], keys, values, pages, scaling, page_size=n, length=L)
            tok = pages_to_tokens(pages.clamp(max=-(-L // n) - 1), n)
            tsel = Selection(indices=tok.clamp(max=L - 1).unsqueeze(2), valid=(tok < L).unsqueeze(2))
            ro, rl = ref_sparse_decode(sl0["q"].float(), keys, values, tsel, scaling)
            out_err = max(rel_err(o, ro), rel_err(lse, rl))
            _check(rec, base, "locks_fused", max(out_err, score_err / TOL["scores"] * TOL["out"]), TOL["out"],
                   "locks_torch (scores: page_scores + aggregate_heads; output: sparse_decode on the same pages)",
                   {"score_rel_err": score_err, "output_rel_err": out_err, "set_agreement": agree},
                   ok=score_err <= TOL["scores"] and out_err <= TOL["out"] and agree == 1.0)
        for m, per_head in (("quest_fused", False), ("quest_fused_per_head", True)):
            if m not in args.methods:
                continue
            qf = sl0["q"].float().view(B, H, G, d)
            Mx, Mn = qmax[:, :, :nq - 1].float(), qmin[:, :, :nq - 1].float()
            Uref = qf.clamp(min=0) @ Mx.transpose(-1, -2) + qf.clamp(max=0) @ Mn.transpose(-1, -2)  # [B,H,G,P]
            if per_head:
                U = K.quest_page_scores(sl0["q"], qmax[:, :, :nq - 1], qmin[:, :, :nq - 1]).view(B, H, G, -1)
                pages = quest_per_head_pages(sl0)
                agree = set_agreement(pages[..., :kq], torch.topk(Uref, kq, dim=-1).indices, Uref)
            else:
                Uref = Uref.amax(2)
                U = K.quest_group_scores(sl0["q"], qmax[:, :, :nq - 1], qmin[:, :, :nq - 1], "max")
                pages = K.select_pages(U, kq, last_page)
                agree = set_agreement(pages[..., :kq], torch.topk(Uref, kq, dim=-1).indices, Uref)
            score_err = rel_err(U, Uref)
            o, lse = K.paged_decode(sl0["q"], keys, values, pages, scaling, page_size=n, length=L)
            pg4 = pages if pages.dim() == 4 else pages.unsqueeze(2)
            tok = pages_to_tokens(pg4, n)
            tsel = Selection(indices=tok.clamp(max=L - 1), valid=tok < L)
            ro, rl = ref_sparse_decode(sl0["q"].float(), keys, values, tsel, scaling)
            out_err = max(rel_err(o, ro), rel_err(lse, rl))
            _check(rec, base, m, max(out_err, score_err / TOL["scores"] * TOL["out"]), TOL["out"],
                   "PyTorch q+.M + q-.m bound; sparse_decode on the same pages",
                   {"score_rel_err": score_err, "output_rel_err": out_err, "set_agreement": agree},
                   ok=score_err <= TOL["scores"] and out_err <= TOL["out"] and agree == 1.0)
        del ref_out, ref_lse

    # ----- timings: FullKV first (speedups are against the fastest of them)
    fastest = None
    locks_fused_ms = None
    for m in args.methods:
        fns = per_slot.get(m) or ([(lambda sl=sl, f=steps[m]: f(sl)) for sl in slots] if steps.get(m) else None)
        if fns is None:
            continue  # skipped above
        try:
            with torch.no_grad():
                t = timer.time(fns)
        except Exception as e:
            _skip(rec, base, m, e)
            continue
        b, b_inter, attended = bytes_of[m]
        r = dict(kind="measurement", method=m, **base, **t, bytes=b, gbps=b / (t["ms"] * 1e-3) / 1e9,
                 attended_tokens=attended)
        if b_inter is not None:
            r["bytes_with_intermediates"] = b_inter
        if m in FULLKV_METHODS:
            if fastest is None or t["ms"] < fastest[1]:
                fastest = (m, t["ms"])
        if fastest is not None and m not in ("locks_score", "topk", "locks_decode"):
            r["speedup_vs_fastest_fullkv"] = fastest[1] / t["ms"]
            r["fastest_fullkv"] = fastest[0]
        if m == "locks_fused":
            locks_fused_ms = t["ms"]
        if m in ("topk", "locks_score", "locks_decode") and locks_fused_ms:
            r["share_of_locks_fused"] = t["ms"] / locks_fused_ms
        if m == "topk":
            r["topk_shape"] = [B, H, P]
            r["k"] = kp
        rec.emit(r)

    if args.tune and L == max(args.contexts):
        _tune(args, rec, timer, base, slots, K, scaling, G, lo, hi, n, L)
    del slots, keys, values, summ, qmax, qmin, fixed_agg, fixed_pages


def _tune(args, rec, timer, base, slots, K, scaling, G, lo, hi, n, L):
    """A few block-size variants of the Triton kernels (to pick defaults on the GPU)."""
    from locks.kernels.tuning import TUNING_VARIANTS

    def label(method, kw):
        return f"{method} " + " ".join(f"{k}={v}" for k, v in kw.items())

    calls = {
        "locks_aggregated_scores": ("locks_score", lambda sl, kw: K.locks_aggregated_scores(
            sl["q"], sl["summ"], scaling, G, "norm", lo, hi, **kw)),
        "full_decode": ("triton_full", lambda sl, kw: K.full_decode(sl["q"], sl["k"], sl["v"], scaling, **kw)),
        "quest_group_scores": ("quest_group", lambda sl, kw: K.quest_group_scores(sl["q"], sl["qmax"], sl["qmin"],
                                                                                  "max", **kw)),
    }
    variants = []
    for entry, kws in TUNING_VARIANTS.items():
        method, call = calls[entry]
        variants += [(label(method, kw), lambda sl, call=call, kw=kw: call(sl, kw)) for kw in kws]
    for name, f in variants:
        try:
            with torch.no_grad():
                t = timer.time([lambda sl=sl, f=f: f(sl) for sl in slots])
            rec.emit(dict(kind="tune", method=name.split()[0], config=name, **base, **t))
        except Exception as e:
            _skip(rec, base, name, e)


def _check(rec, base, method, err, tol, compared_to, details=None, ok=None):
    ok = (err <= tol) if ok is None else ok
    r = dict(kind="check", method=method, **base, max_rel_err=err, tolerance=tol, ok=bool(ok), compared_to=compared_to,
             **(details or {}))
    r["details"] = " ".join(f"{k}={v:.3g}" for k, v in (details or {}).items() if isinstance(v, float))
    rec.emit(r)
    if not ok:
        rec.failures.append(f"{base['shape']} L={base['context']} B={base['batch']} {method}: {err:.3g}")


def _skip(rec, base, method, e):
    msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    rec.emit(dict(kind="skip", method=method, **base, reason=msg[:500]))
    return None


# ----------------------------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before locks.kernels is imported: kernels run on CPU tensors
        device = torch.device("cpu")
    else:
        if not torch.cuda.is_available():
            print("bench_decode: no CUDA device (use --dry-run for the CPU plumbing check)", file=sys.stderr)
            return 2
        device = torch.device("cuda")
    import triton

    from locks import kernels as K  # noqa: F401  (imported after TRITON_INTERPRET is settled)

    rec = Recorder(args.out)
    l2 = 0
    dev_name = platform.processor() or "cpu"
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        l2 = int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)
        dev_name = props.name
        torch.backends.cuda.matmul.allow_tf32 = False
    rec.emit(dict(kind="run", device=dev_name, torch=torch.__version__, triton=triton.__version__,
                  cuda=torch.version.cuda, l2_bytes=l2, args=vars(args), argv=sys.argv[1:],
                  time=time.strftime("%Y-%m-%d %H:%M:%S"), host=platform.node()))
    timer = Timer(device, args.reps, args.warmup, graphs=not args.no_graph and device.type == "cuda")
    shapes = DRY_SHAPES if args.dry_run else SHAPES
    for L in args.contexts:
        for shape in args.shapes:
            for B in args.batch:
                try:
                    run_config(args, rec, timer, device, shape, shapes[shape], L, B, l2)
                except torch.cuda.OutOfMemoryError as e:
                    _skip(rec, dict(shape=shape, context=L, batch=B), "config", e)
                finally:
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
    if rec.failures:
        print("bench_decode: correctness checks failed:\n  " + "\n  ".join(rec.failures), file=sys.stderr)
        return 1 if args.dry_run else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
