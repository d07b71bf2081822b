"""End-to-end decode step of a random-weight model, captured as a CUDA graph: FullKV against every selector.

An eager transformers step hides any attention saving at batch 1 (issue 7's anchor: a GLM-4-9B-shaped stock step at
128K takes 28 ms eager against a 5.4 ms byte floor), so every method runs the harness's static decode step
(`locks/core/static_decode.py`): the cache preallocated for the whole run, the step captured once as a CUDA graph and
replayed. FullKV runs twice, through our split-K kernel over the valid length (`fullkv`) and through PyTorch's
SDPA with a length mask (`fullkv_sdpa`); LOCKS, Quest, ShadowKV, RocketKV and LRQK run their own static steps
(fixed shapes; ShadowKV's and LRQK's misses read from pinned host memory inside the graph); the speedups are against
the faster FullKV. The oracles are accuracy references that read every key to choose and are not timed here: the
cost of the token Oracle's exact top-k is timed per layer by bench/decode.py. Models are built from their config with random bf16 weights (no download):
  glm    GLM-4-9B   (transformers GlmConfig defaults: 40 layers, 32 query / 2 KV heads, d = 128, 151,552 vocab)
  llama  Llama-3.1-8B (32 layers, 32 / 8 heads, d = 128, 128,256 vocab; contexts whose cache does not fit are skipped)
The KV cache of every layer is filled with random values (never zeros) at the context length, without a model
prefill, and each selector's own `prefill` runs on it (bench/prefill_state.py): its expensive budget-independent
parts (LOCKS's summaries, ShadowKV's SVD, RocketKV's SnapKV++ scores, LRQK's ALS factors) are random values in the
exact layout (`--prefill-state random`, GPU default: timing depends on the layout, not the values, and these cost
minutes of GPU time at 1M tokens) or computed (`--prefill-state real`, dry-run default); everything else (Quest's
min/max, ShadowKV's outliers and landmarks, RocketKV's survivors, the host stores) is the selector's own.

`--batch 1 4 16` runs each (shape, context) at B equal-length rows per step, each row a cache of its own as the eval
runner batches samples (one static step captured per batch shape, over the rows stacked: locks/core/batch.py): the
weights are read once per step and every row's K/V, so KV bytes outweigh weight bytes as B grows.

Per (shape, context, batch, method), records of kind "e2e":
  ms_graph      median of --reps replays of the captured step at one position (CUDA events; a replay at a fixed
                position rewrites the same slot, so repeating it is exact), captured without the device-side count
                of attended tokens (Quest's per-head union: accounting, not part of the method)
  ms_eager      median of a few eager runs of the same static step (Python + kernel launches)
  ms_per_token  wall time per step over --tokens steps of the harness's own decode loop (locks/core/generation.py:
                generate_rows, the capture excluded): replay + host upkeep (LOCKS summarizes each completed page) +
                the greedy pick read to the host + the accounting; tokens_per_s = B * 1000 / ms_per_token
  bytes_per_step = weight bytes + B x the method's K/V + metadata bytes per row (the harness's accounting),
                byte_floor_ms at --bandwidth; h2d_bytes_per_step (B x the host-to-device bytes per row: ShadowKV's
                missed values, LRQK's missed rows) with h2d_floor_ms at the pinned-copy bandwidth measured at the
                start of the same run (a record of kind "bandwidth"); floor_ms = byte_floor_ms + h2d_floor_ms (the
                step copies its misses, then attends); speedup_vs_fullkv (FullKV ms_graph / ms_graph) next to the
                byte-bound ceiling byte_ceiling (FullKV floor_ms / floor_ms) for the same shape and context
  memory        CUDA only: cache_and_state_bytes (allocated after the cache, its preallocation for the run and the
                selectors' state, less before: the K/V as this harness keeps it plus the method's state),
                step_peak_bytes (max_memory_allocated during one replay above what was allocated before it),
                peak_allocated_bytes (over the method's whole run, weights included); on every device
                design_bytes: Selector.memory_bytes summed over layers and rows, the method's own design
                (docs/memory.md: ShadowKV and LRQK keep most K/V in host memory, RocketKV drops evicted tokens)
and one "check" per method: the replayed step's logits against an eager run of the same static step (max rel err),
and one "profile" per method: the --profile-top kernels of --profile-reps replays by device time (torch.profiler;
CPU time in --dry-run), with the number of kernels launched per step -- where the step's time goes.

Every record is printed as soon as it is taken and appended to --out (JSON lines, flushed). --dry-run runs the whole
script on CPU at tiny sizes under the Triton interpreter (the static step runs eagerly; no graph, timings
meaningless; LRQK at rank 4) and exits non-zero if a check fails.

    python scripts/bench_e2e.py --out results/gpu/bench_e2e.jsonl
    python scripts/bench_e2e.py --batch 1 4 16 --contexts 131072 --out results/gpu/bench_e2e_batch.jsonl
    python scripts/bench_e2e.py --dry-run --out /tmp/e2e.jsonl
"""
from __future__ import annotations

import argparse
import itertools
import os
import platform
import statistics
import sys
import time

import torch

from bench.inputs import rel_err
from bench.prefill_state import prefill_selector
from bench.records import Recorder, out_path
from bench.shapes import MODELS, MODELS_DRY
from bench.timing import h2d_bandwidth, step_peak_bytes

# method -> (registry name, backend): FullKV twice, through our split-K kernel over the valid length and through
# PyTorch's SDPA with a length mask (whichever backend PyTorch picks); speedups are against the faster of the two
METHODS = {"fullkv": ("fullkv", "triton"), "fullkv_sdpa": ("fullkv", "torch"), "locks": ("locks", "triton"),
           "quest": ("quest", "triton"), "shadowkv": ("shadowkv", "triton"), "rocketkv": ("rocketkv", "triton"),
           "lrqk": ("lrqk", "triton"), "doublesparsity": ("doublesparsity", "triton"), "twilight": ("twilight", "triton"),
           "magicpig": ("magicpig", "triton")}
FULLKV = ("fullkv", "fullkv_sdpa")
# --dry-run only: the interpreter runs LRQK's r x r sweeps op by op, so its plumbing check runs at rank 4, and
# MagicPIG's collision counts table by table, so it runs with 16 tables
DRY_OPTIONS = {"lrqk": {"rank": 4}, "magicpig": {"tables": 16}}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="tiny sizes on CPU under the Triton interpreter")
    p.add_argument("--out", default=None, help="JSON-lines file, appended as it goes (default results/gpu/bench_e2e.jsonl; "
                                               "with --dry-run a scratch file in the temporary directory)")
    p.add_argument("--shapes", nargs="+", default=["glm", "llama"], choices=sorted(MODELS))
    p.add_argument("--contexts", type=int, nargs="+", default=[131072, 262144, 1048576])
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--budget", type=int, default=2048)
    p.add_argument("--batch", type=int, nargs="+", default=[1],
                   help="rows per step: B equal-length rows (weights read once per step, K/V per row)")
    p.add_argument("--reps", type=int, default=30, help="timed replays (median; >= 20 on GPU)")
    p.add_argument("--tokens", type=int, default=32, help="tokens generated for the per-token wall time")
    p.add_argument("--eager-reps", type=int, default=3)
    p.add_argument("--prefill-state", choices=["random", "real"], default=None,
                   help="the selectors' expensive prefill parts: random values in their exact layout (GPU default) "
                        "or computed (dry-run default); bench/prefill_state.py")
    p.add_argument("--profile-reps", type=int, default=3, help="replays under torch.profiler (0: no profile)")
    p.add_argument("--profile-top", type=int, default=15)
    p.add_argument("--bandwidth", type=float, default=4.5e12, help="bytes/s for the byte floor (H200 measured)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if any(b < 1 for b in args.batch):
        p.error("--batch takes positive row counts, e.g. --batch 1 4 16")
    if args.dry_run:
        args.contexts = [700]  # not a multiple of 16
        args.batch = [b for b in args.batch if b <= 2] or [1]  # rows are equal: 2 exercise the batched step
        args.budget = 128
        # generated at 701 .. 703 (703 completes page 44), timed and profiled at 704: past the page boundary
        args.reps, args.tokens, args.eager_reps, args.profile_reps = 1, 3, 1, 1
        args.prefill_state = args.prefill_state or "real"
    else:
        args.prefill_state = args.prefill_state or "random"
        if args.reps < 20:
            p.error("--reps must be >= 20 (median of at least 20 steps)")
    return args


def build_model(kind: str, overrides: dict, device, dtype):
    from transformers import GlmConfig, GlmForCausalLM, LlamaConfig, LlamaForCausalLM

    from locks.core.attention import register_attention

    config_cls, model_cls = (GlmConfig, GlmForCausalLM) if kind == "glm" else (LlamaConfig, LlamaForCausalLM)
    config = config_cls(**overrides, attn_implementation=register_attention())
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = model_cls(config)
    finally:
        torch.set_default_dtype(default)
    return model.eval()


def kv_bytes(model, L: int, batch: int = 1) -> int:
    c = model.config
    return 2 * batch * L * c.num_key_value_heads * c.head_dim * c.num_hidden_layers * 2


def fill_cache(cache, L: int, gen, prefill_state: str, device, dtype, max_new_tokens: int = 0) -> None:
    """Random K/V at every layer for one row of L tokens (what a prefill would leave), then each selector's own
    prefill on them, its expensive parts as `prefill_state` says (bench/prefill_state.py), with the model's RoPE."""
    import functools

    cache.phase = "prefill"
    cache.max_new_tokens = max_new_tokens
    for i, (layer, info) in enumerate(zip(cache.layers, cache.infos)):
        shape = (1, info.num_kv_heads, L, info.head_dim)
        k = torch.randn(shape, generator=gen, device=device, dtype=dtype)
        v = torch.randn(shape, generator=gen, device=device, dtype=dtype)
        layer.update(k, v)
        prefill_selector(layer.selector, k, v, gen, prefill_state, max_new_tokens=max_new_tokens,
                         rotate=functools.partial(cache.rotation.rotate, layer_idx=i),
                         unrotate=functools.partial(cache.rotation.unrotate, layer_idx=i), rotation=cache.rotation)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_ms(fn, device, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            out.append(1e3 * (time.perf_counter() - t0))
    return out


def profile_step(args, rec: Recorder, base: dict, replay, device) -> None:
    """The top kernels (device time; CPU ops off CUDA) of a few replays, per step."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(args.profile_reps):
            replay()
        sync(device)
    n = args.profile_reps
    rows = []
    for e in prof.key_averages():
        us = (e.self_device_time_total if cuda else e.self_cpu_time_total) / n
        if us > 0 and (cuda or not e.key.startswith("ProfilerStep")):
            rows.append(dict(name=e.key[:120], us_per_step=us, calls_per_step=e.count / n))
    rows.sort(key=lambda r: -r["us_per_step"])
    total = sum(r["us_per_step"] for r in rows)
    calls = sum(r["calls_per_step"] for r in rows)
    rec.write(dict(kind="profile", **base, time_unit="device_us" if cuda else "cpu_us", total_us_per_step=total,
                   kernels_per_step=calls, top=rows[: args.profile_top]))
    head = ", ".join(f"{r['name'][:40]} {r['us_per_step']:.0f}" for r in rows[:3])
    print(f"[{base['shape']} L={base['context']} B={base['batch']}] {base['method']:<7} profile: {calls:.0f} kernels/step, "
          f"{total:.0f} us; top: {head}", flush=True)


def run_method(args, rec: Recorder, model, shape: str, L: int, method: str, device, dtype, weights: int,
               fullkv: dict | None, batch: int = 1, h2d_bps: float | None = None) -> dict | None:
    from locks.core.cache import SelectorCache
    from locks.core.generation import Row, generate_rows, static_step
    from locks.core.registry import MethodSpec

    base = dict(shape=shape, context=L, method=method, budget=args.budget, batch=batch)
    tag = f"[{shape} L={L} B={batch}]"
    gen = torch.Generator(device=device).manual_seed(args.seed)
    name, backend = METHODS[method]
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    allocated = torch.cuda.memory_allocated() if cuda else 0
    options = DRY_OPTIONS.get(method, {}) if args.dry_run else {}
    vocab = model.config.vocab_size
    rows = []
    for _ in range(batch):  # each row its own cache, as the eval runner batches samples (docs/batching.md)
        cache = SelectorCache(model, MethodSpec(name, args.budget, options, backend=backend))
        fill_cache(cache, L, gen, args.prefill_state, device, dtype, max_new_tokens=args.tokens + 1)
        # the random K/V stand for a prompt of L tokens (its ids are never read) and random logits for its last one
        rows.append(Row(cache, torch.zeros((1, L), dtype=torch.long, device=device), args.tokens + 1,
                        prefill_logits=torch.randn(1, vocab, generator=gen, device=device)))
    step = static_step(model, rows, cuda_graph=cuda)
    caches = [row.cache for row in rows]
    memory = dict(cache_and_state_bytes=torch.cuda.memory_allocated() - allocated if cuda else None)
    design = [layer.selector.memory_bytes(L) for layer in caches[0].layers]
    memory["design_bytes"] = {part: batch * sum(m[part] for m in design) for part in ("kv", "state", "host")}

    with torch.inference_mode():
        # --tokens steps of the harness's decode loop; the first captures the graph on CUDA (not decode time)
        generate_rows(model, rows, static_decode=True, step=step)
        per_token = 1e3 * sum(row.decode_seconds for row in rows) / args.tokens
        # the next position: the step replayed (the decode's graph) against the same static step run eagerly;
        # each block leaves the counters and the selectors' static_state as they were, so runs of a step at one
        # position repeat the first one exactly (LRQK's solver and ShadowKV's buffer carry over otherwise)
        position = L + args.tokens
        step.place(torch.tensor([row.tokens[-1] for row in rows], device=device), [position] * batch)
        with step.cache.static_counters_kept():
            eager_logits = step.forward().float().clone()
        with step.cache.static_counters_kept():
            logits = step.replay().float().clone()
        err = rel_err(logits, eager_logits)
        ok = bool(torch.isfinite(logits).all()) and err <= 1e-2
        rec.write(dict(kind="check", **base, check="graph_vs_eager_logits", max_rel_err=err, ok=ok))
        print(f"{tag} {method:<7} check: replayed vs eager logits max_rel_err {err:.2e} "
              f"{'ok' if ok else 'FAILED'}", flush=True)
        if not ok:
            rec.failures.append(f"{shape} L={L} {method}: graph vs eager logits {err:.2e}")
        with step.cache.static_counters_kept():
            eager = time_ms(step.forward, device, args.eager_reps)
        # the step alone: recaptured without the device-side accounting, replayed at one position
        for cache in (*caches, step.step_cache):
            cache.device_accounting = False
        if step.cuda_graph:
            step.recapture()
        with step.cache.static_counters_kept():
            graph = time_ms(step.replay, device, args.reps)
            if cuda:  # one replay's transient memory above what the run holds
                memory["step_peak_bytes"] = step_peak_bytes(step.replay, device)
            if args.profile_reps > 0:
                profile_step(args, rec, base, step.replay, device)
    summaries = [cache.stats.summary() for cache in caches]
    stats = {key: statistics.fmean(s[key] for s in summaries)  # per row, averaged over the rows
             for key in ("bytes_read_per_step", "h2d_bytes_per_step", "attended_tokens_per_step")}
    step_bytes = weights + batch * stats["bytes_read_per_step"]
    h2d = batch * stats["h2d_bytes_per_step"]
    h2d_floor = 1e3 * h2d / h2d_bps if h2d_bps else 0.0
    floor = 1e3 * step_bytes / args.bandwidth + h2d_floor
    ms = statistics.median(graph)
    out = dict(kind="e2e", **base, ms_graph=ms, ms_graph_min=min(graph), ms_eager=statistics.median(eager),
               timing="cuda_graph" if step.graph is not None else "eager_static", ms_per_token=per_token,
               tokens_per_s=batch * 1e3 / per_token, weights_bytes=weights,
               kv_and_metadata_bytes_per_step=stats["bytes_read_per_step"], bytes_per_step=step_bytes,
               byte_floor_ms=1e3 * step_bytes / args.bandwidth, h2d_bytes_per_step=h2d, h2d_floor_ms=h2d_floor,
               h2d_bandwidth=h2d_bps, floor_ms=floor, attended_tokens=stats["attended_tokens_per_step"],
               prefill_state=args.prefill_state, **memory)
    if cuda:
        out["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
    if fullkv is not None:
        out.update(speedup_vs_fullkv=fullkv["ms_graph"] / ms, byte_ceiling=fullkv["floor_ms"] / floor,
                   fullkv_reference=fullkv["method"])
    rec.write(out)
    line = (f"{tag} {method:<7} {ms:8.3f} ms/step ({out['timing']}), eager {out['ms_eager']:.3f} ms, "
            f"{out['tokens_per_s']:.1f} tok/s, {step_bytes / 1e9:.2f} GB/step, floor {out['byte_floor_ms']:.3f} ms")
    if h2d:
        line += f" + h2d {h2d / 1e6:.2f} MB/step, {h2d_floor:.3f} ms"
    if memory.get("cache_and_state_bytes") is not None:
        line += f", cache+state {memory['cache_and_state_bytes'] / 2**30:.2f} GiB"
    if fullkv is not None:
        line += (f", x{out['speedup_vs_fullkv']:.2f} vs {fullkv['method']} "
                 f"(byte ceiling x{out['byte_ceiling']:.2f})")
    print(line, flush=True)
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before locks.kernels is imported: kernels run on CPU tensors
        device, dtype = torch.device("cpu"), torch.float32
    else:
        if not torch.cuda.is_available():
            print("bench_e2e: no CUDA device (use --dry-run for the CPU plumbing check)", file=sys.stderr)
            return 2
        device, dtype = torch.device("cuda"), torch.bfloat16
    import transformers
    import triton

    rec = Recorder(out_path(args.out, args.dry_run, "results/gpu/bench_e2e.jsonl"))
    print(f"records -> {rec.path}", flush=True)
    name = torch.cuda.get_device_properties(device).name if device.type == "cuda" else platform.processor() or "cpu"
    rec.write(dict(kind="run", script="bench_e2e", device=name, torch=torch.__version__, triton=triton.__version__,
                   transformers=transformers.__version__, args=vars(args), argv=sys.argv[1:],
                   time=time.strftime("%Y-%m-%d %H:%M:%S")))
    print(f"bench_e2e on {name}: torch {torch.__version__}, triton {triton.__version__}", flush=True)
    h2d_bps = h2d_bandwidth(device)
    rec.write(dict(kind="bandwidth", what="pinned host-to-device copy", bytes_per_s=h2d_bps, device=name))
    print(f"pinned host-to-device copy: {h2d_bps / 1e9:.1f} GB/s", flush=True)
    shapes = MODELS_DRY if args.dry_run else MODELS
    for shape in args.shapes:
        kind, overrides = shapes[shape]
        model = build_model(kind, overrides, device, dtype)
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        for L, batch in itertools.product(args.contexts, args.batch):
            need = kv_bytes(model, L + args.tokens + 2, batch) * 1.3  # + selector state and the preallocation copy
            if device.type == "cuda" and need > torch.cuda.mem_get_info()[0]:
                rec.write(dict(kind="skip", shape=shape, context=L, batch=batch,
                               reason=f"cache needs ~{need / 2**30:.0f} GiB"))
                print(f"[{shape} L={L} B={batch}] skipped: the cache needs ~{need / 2**30:.0f} GiB", flush=True)
                continue
            fullkv = None  # the fastest FullKV variant measured so far at this (L, B) (they run first)
            for method in sorted(args.methods, key=lambda m: m not in FULLKV):
                try:
                    result = run_method(args, rec, model, shape, L, method, device, dtype, weights,
                                        None if method in FULLKV else fullkv, batch, h2d_bps)
                    if method in FULLKV and (fullkv is None or result["ms_graph"] < fullkv["ms_graph"]):
                        fullkv = result
                except Exception as e:  # out of device or pinned host memory, a capture that fails: recorded
                    if args.dry_run:
                        raise
                    reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
                    rec.write(dict(kind="skip", shape=shape, context=L, batch=batch, method=method, reason=reason[:500]))
                    print(f"[{shape} L={L} B={batch}] {method}: skipped, {reason[:200]}", flush=True)
                finally:
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
        del model
    if rec.failures:
        print("bench_e2e: checks failed:\n  " + "\n  ".join(rec.failures), file=sys.stderr)
        return 1 if args.dry_run else 0
    return 0
